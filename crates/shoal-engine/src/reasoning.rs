//! Splitting a reply into its reasoning and the answer as it streams, so
//! reasoning can be sent and counted apart: a `<think>…</think>` section
//! in the text, or harmony's `analysis` channel ([`crate::harmony`]).
use crate::harmony::{self, Harmony, Markers};
pub use crate::section::{Phase, Split};

/// How a request reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningSpec {
    pub open: String,
    pub close: String,
    /// The prompt already opened the section (the template or the server did),
    /// so output starts inside it; otherwise the model may open it itself.
    pub started: bool,
    /// Reasoning tokens allowed before the engine closes the section itself.
    pub budget: Option<usize>,
    /// The reply is in harmony's channels, not `<think>` text.
    pub harmony: Option<Markers>,
}

impl ReasoningSpec {
    pub fn think(started: bool, budget: Option<usize>) -> Self {
        ReasoningSpec {
            open: "<think>".into(),
            close: "</think>".into(),
            started,
            budget,
            harmony: None,
        }
    }

    /// A harmony reply; `started` when the prompt opened the analysis channel.
    pub fn harmony(markers: Markers, started: bool, budget: Option<usize>) -> Self {
        ReasoningSpec {
            open: harmony::OPEN_ANALYSIS.into(),
            close: harmony::CLOSE_ANALYSIS.into(),
            started,
            budget,
            harmony: Some(markers),
        }
    }

    /// The text the engine inserts to end reasoning early.
    pub fn forced_close(&self) -> String {
        match self.harmony {
            Some(_) => self.close.clone(),
            None => format!("{}\n\n", self.close),
        }
    }
}

/// Splits a reply by the request's [`ReasoningSpec`].
pub enum ReasoningSplitter {
    Think(Think),
    Harmony(Harmony),
}

impl ReasoningSplitter {
    pub fn new(spec: &ReasoningSpec) -> Self {
        match spec.harmony {
            Some(m) => ReasoningSplitter::Harmony(Harmony::new(m, spec.started)),
            None => ReasoningSplitter::Think(Think::new(spec)),
        }
    }

    pub fn phase(&self) -> Phase {
        match self {
            ReasoningSplitter::Think(t) => t.phase(),
            ReasoningSplitter::Harmony(h) => h.phase(),
        }
    }

    /// One sampled token and its decoded text (empty for special tokens):
    /// harmony's markers are read from the token, text from the text.
    pub fn token(&mut self, token: u32, text: &str) -> Split {
        match self {
            ReasoningSplitter::Think(t) => t.push(text),
            ReasoningSplitter::Harmony(h) => {
                let mut out = h.marker(token).unwrap_or_default();
                if !text.is_empty() {
                    out.append(h.push(text));
                }
                out
            }
        }
    }

    /// Whether `token` moves the reply to another section (a harmony
    /// marker): text held back before it belongs to the section it closes.
    pub fn is_boundary(&self, token: u32) -> bool {
        match self {
            ReasoningSplitter::Think(_) => false,
            ReasoningSplitter::Harmony(h) => h.is_marker(token),
        }
    }

    /// Text with no token of its own (the detokenizer's held tail).
    pub fn push(&mut self, text: &str) -> Split {
        match self {
            ReasoningSplitter::Think(t) => t.push(text),
            ReasoningSplitter::Harmony(h) => h.push(text),
        }
    }

    pub fn close_now(&mut self) -> String {
        match self {
            ReasoningSplitter::Think(t) => t.close_now(),
            ReasoningSplitter::Harmony(h) => h.close_now(),
        }
    }

    pub fn flush(&mut self) -> Split {
        match self {
            ReasoningSplitter::Think(t) => t.flush(),
            ReasoningSplitter::Harmony(h) => h.flush(),
        }
    }

    /// Tool calls the reply made in its own format (harmony).
    pub fn calls(&self) -> usize {
        match self {
            ReasoningSplitter::Think(_) => 0,
            ReasoningSplitter::Harmony(h) => h.calls(),
        }
    }
}

/// The `<think>` section splitter.
pub struct Think {
    phase: Phase,
    open: String,
    close: String,
    buf: String,
    /// Drop whitespace that separates the closed section from the answer.
    trim: bool,
}

impl Think {
    pub fn new(spec: &ReasoningSpec) -> Self {
        Think {
            phase: if spec.started {
                Phase::Thinking
            } else {
                Phase::Pending
            },
            open: spec.open.clone(),
            close: spec.close.clone(),
            buf: String::new(),
            trim: false,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn push(&mut self, text: &str) -> Split {
        self.buf.push_str(text);
        let mut out = Split::default();
        if self.phase == Phase::Pending {
            let t = self.buf.trim_start();
            if let Some(rest) = t.strip_prefix(self.open.as_str()) {
                self.buf = rest.to_string();
                self.phase = Phase::Thinking;
            } else if self.open.starts_with(t) {
                return out;
            } else {
                self.phase = Phase::Answer;
            }
        }
        match self.phase {
            Phase::Thinking => {
                if let Some(i) = self.buf.find(self.close.as_str()) {
                    out.reasoning = self.buf[..i].to_string();
                    out.content = self.buf[i + self.close.len()..].to_string();
                    self.buf.clear();
                    self.phase = Phase::Answer;
                    self.trim = true;
                } else {
                    let keep = held_suffix(&self.buf, &self.close);
                    let cut = self.buf.len() - keep;
                    out.reasoning = self.buf[..cut].to_string();
                    self.buf.drain(..cut);
                }
            }
            Phase::Answer => out.content.push_str(&std::mem::take(&mut self.buf)),
            Phase::Pending => {}
        }
        if self.trim {
            out.content = out.content.trim_start().to_string();
            self.trim = out.content.is_empty();
        }
        out
    }

    /// Ends the section early (budget spent): returns reasoning still held.
    pub fn close_now(&mut self) -> String {
        self.phase = Phase::Answer;
        self.trim = true;
        std::mem::take(&mut self.buf)
    }

    /// End of generation: whatever is held goes where its phase says.
    pub fn flush(&mut self) -> Split {
        let rest = std::mem::take(&mut self.buf);
        match self.phase {
            Phase::Thinking => Split {
                reasoning: rest,
                ..Split::default()
            },
            _ => Split {
                content: rest,
                ..Split::default()
            },
        }
    }
}

/// Length of the longest suffix of `buf` that begins `marker` (on char boundaries).
fn held_suffix(buf: &str, marker: &str) -> usize {
    (1..marker.len().min(buf.len() + 1))
        .rev()
        .find(|&n| buf.is_char_boundary(buf.len() - n) && marker.starts_with(&buf[buf.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(spec: &ReasoningSpec, pieces: &[&str]) -> (String, String, Phase) {
        let mut s = ReasoningSplitter::new(spec);
        let (mut r, mut c) = (String::new(), String::new());
        for p in pieces {
            let o = s.push(p);
            r += &o.reasoning;
            c += &o.content;
        }
        let o = s.flush();
        (r + &o.reasoning, c + &o.content, s.phase())
    }

    #[test]
    fn model_opened_section_is_split_across_pieces() {
        let spec = ReasoningSpec::think(false, None);
        let (r, c, p) = feed(
            &spec,
            &["<th", "ink>Let me", " think.</th", "ink>\n\nParis."],
        );
        assert_eq!(
            (r.as_str(), c.as_str(), p),
            ("Let me think.", "Paris.", Phase::Answer)
        );
    }

    #[test]
    fn no_section_means_all_content() {
        let spec = ReasoningSpec::think(false, None);
        let (r, c, _) = feed(&spec, &["<", "b>Hello</b>"]);
        assert_eq!((r.as_str(), c.as_str()), ("", "<b>Hello</b>"));
    }

    #[test]
    fn prompt_opened_section_and_early_close() {
        let spec = ReasoningSpec::think(true, Some(3));
        let mut s = ReasoningSplitter::new(&spec);
        assert_eq!(s.push("one two </").reasoning, "one two ");
        assert_eq!(s.close_now(), "</");
        assert_eq!(s.push("Answer").content, "Answer");
        let (r, c, p) = feed(&spec, &["still thinking"]);
        assert_eq!(
            (r.as_str(), c.as_str(), p),
            ("still thinking", "", Phase::Thinking)
        );
    }
}
