//! Splitting a reply into its reasoning section (`<think>…</think>`) and the
//! answer, as text streams in, so reasoning can be sent and counted apart.

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
}

impl ReasoningSpec {
    pub fn think(started: bool, budget: Option<usize>) -> Self {
        ReasoningSpec {
            open: "<think>".into(),
            close: "</think>".into(),
            started,
            budget,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not yet known whether the reply opens a reasoning section.
    Pending,
    Thinking,
    Answer,
}

/// What one piece of text turned into.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

pub struct ReasoningSplitter {
    phase: Phase,
    open: String,
    close: String,
    buf: String,
    /// Drop whitespace that separates the closed section from the answer.
    trim: bool,
}

impl ReasoningSplitter {
    pub fn new(spec: &ReasoningSpec) -> Self {
        ReasoningSplitter {
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
                content: String::new(),
            },
            _ => Split {
                reasoning: String::new(),
                content: rest,
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
