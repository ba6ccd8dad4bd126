//! The harmony reply format (gpt-oss): a reply is a run of messages, each
//! `<|start|>assistant<|channel|>NAME[ to=RECIPIENT][<|constrain|>TYPE]<|message|>BODY<|end|>`
//! (the first one's `<|start|>assistant` is in the prompt). The `analysis`
//! channel is reasoning, `final` is the answer, and a `commentary` message
//! addressed `to=functions.NAME` is a tool call whose body is its JSON
//! arguments. `<|return|>` and `<|call|>` end the reply (they are EOS).
//!
//! The markers are special tokens, so this parser is driven by token ids
//! for them ([`Harmony::marker`]) and by decoded text for everything else
//! ([`Harmony::push`]).
use crate::section::{Phase, Split};
use crate::tools::ToolOut;

/// The ids of the harmony markers in a model's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Markers {
    pub start: u32,
    pub end: u32,
    pub message: u32,
    pub channel: u32,
    pub constrain: Option<u32>,
}

impl Markers {
    /// Finds the markers among a vocabulary's special tokens.
    pub fn find(special: &[(u32, String)]) -> Option<Markers> {
        let id = |text: &str| special.iter().find(|(_, t)| t == text).map(|(i, _)| *i);
        Some(Markers {
            start: id("<|start|>")?,
            end: id("<|end|>")?,
            message: id("<|message|>")?,
            channel: id("<|channel|>")?,
            constrain: id("<|constrain|>"),
        })
    }
}

/// What the engine appends to end an analysis message early (a spent
/// reasoning budget) and open the answer.
pub const CLOSE_ANALYSIS: &str = "<|end|><|start|>assistant<|channel|>final<|message|>";

/// What the prompt appends to open the analysis channel itself.
pub const OPEN_ANALYSIS: &str = "<|channel|>analysis<|message|>";

/// Header text longer than this without a `<|message|>` is not a header:
/// the model is writing plain text, which is then the answer.
const MAX_HEADER: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Channel {
    Analysis,
    Final,
    Commentary,
    Other,
}

#[derive(Debug)]
enum State {
    /// Reading a message header (role, channel, recipient) up to `<|message|>`.
    Header(String),
    /// In a message body.
    Body(Channel),
}

pub struct Harmony {
    m: Markers,
    state: State,
    /// The tool call this body is the arguments of.
    call: Option<usize>,
    calls: usize,
    /// A message body has begun in this reply.
    any_body: bool,
}

impl Harmony {
    /// `in_analysis`: the prompt already opened the analysis channel.
    pub fn new(m: Markers, in_analysis: bool) -> Self {
        Harmony {
            m,
            state: if in_analysis {
                State::Body(Channel::Analysis)
            } else {
                State::Header(String::new())
            },
            call: None,
            calls: 0,
            any_body: in_analysis,
        }
    }

    pub fn phase(&self) -> Phase {
        match self.state {
            State::Header(_) => Phase::Pending,
            State::Body(Channel::Analysis) => Phase::Thinking,
            State::Body(_) => Phase::Answer,
        }
    }

    /// Tool calls seen so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Takes token `t` if it is a marker: `None` for ordinary tokens.
    /// Whether `t` is one of the markers that frame a message.
    pub fn is_marker(&self, t: u32) -> bool {
        let m = self.m;
        [m.start, m.end, m.message, m.channel].contains(&t) || Some(t) == m.constrain
    }

    pub fn marker(&mut self, t: u32) -> Option<Split> {
        let m = self.m;
        let mut out = Split::default();
        if t == m.start || t == m.end {
            self.state = State::Header(String::new());
            self.call = None;
        } else if t == m.message {
            let header = match &self.state {
                State::Header(h) => h.clone(),
                // A stray `<|message|>` inside a body: keep the channel.
                State::Body(_) => return Some(out),
            };
            let (channel, recipient) = parse_header(&header);
            if let Some(name) = recipient
                .as_deref()
                .and_then(|r| r.strip_prefix("functions."))
            {
                let index = self.calls;
                self.calls += 1;
                self.call = Some(index);
                out.calls.push(ToolOut::Start {
                    index,
                    name: name.to_string(),
                });
            }
            self.state = State::Body(channel);
            self.any_body = true;
        } else if t == m.channel || Some(t) == m.constrain {
            if let State::Header(h) = &mut self.state {
                h.push_str(if t == m.channel {
                    "<|channel|>"
                } else {
                    "<|constrain|>"
                });
            }
        } else {
            return None;
        }
        Some(out)
    }

    /// Decoded text of an ordinary token.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        match &mut self.state {
            State::Header(h) => {
                h.push_str(text);
                if h.len() > MAX_HEADER {
                    out.content = std::mem::take(h);
                    self.state = State::Body(Channel::Final);
                    self.any_body = true;
                }
            }
            State::Body(Channel::Analysis) => out.reasoning.push_str(text),
            State::Body(_) => match self.call {
                Some(index) => out.calls.push(ToolOut::Args {
                    index,
                    delta: text.to_string(),
                }),
                None => out.content.push_str(text),
            },
        }
        out
    }

    /// A spent budget: the analysis ends and the answer begins.
    pub fn close_now(&mut self) -> String {
        self.state = State::Body(Channel::Final);
        self.call = None;
        String::new()
    }

    /// End of generation. Text that never became a header (a reply with no
    /// message at all) is the answer.
    pub fn flush(&mut self) -> Split {
        let mut out = Split::default();
        if let State::Header(h) = &mut self.state {
            if !self.any_body && !h.contains("<|channel|>") {
                out.content = std::mem::take(h);
            }
        }
        out
    }
}

/// The channel and recipient of a header such as
/// `assistant<|channel|>commentary to=functions.get_weather <|constrain|>json`
/// (the recipient may also stand before the channel).
fn parse_header(h: &str) -> (Channel, Option<String>) {
    let channel = h
        .split("<|channel|>")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next())
        .map_or(Channel::Other, |name| match name {
            "analysis" => Channel::Analysis,
            "final" => Channel::Final,
            "commentary" => Channel::Commentary,
            _ => Channel::Other,
        });
    let recipient = h
        .split(|c: char| c.is_whitespace() || c == '<' || c == '>' || c == '|')
        .find_map(|w| w.strip_prefix("to="))
        .map(str::to_string);
    (channel, recipient)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Markers = Markers {
        start: 1,
        end: 2,
        message: 3,
        channel: 4,
        constrain: Some(5),
    };

    #[test]
    fn headers_name_the_channel_and_the_recipient() {
        assert_eq!(
            parse_header(
                "assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
            ),
            (Channel::Commentary, Some("functions.get_weather".into()))
        );
        assert_eq!(
            parse_header("assistant to=functions.f<|channel|>commentary"),
            (Channel::Commentary, Some("functions.f".into()))
        );
        assert_eq!(
            parse_header("<|channel|>analysis"),
            (Channel::Analysis, None)
        );
        assert_eq!(parse_header("assistant"), (Channel::Other, None));
    }

    #[test]
    fn plain_text_with_no_header_is_the_answer() {
        let mut h = Harmony::new(M, false);
        assert!(h.marker(99).is_none());
        assert_eq!(h.push("Hello").content, "");
        assert_eq!(h.flush().content, "Hello");
        let mut long = Harmony::new(M, false);
        let text = "x".repeat(MAX_HEADER + 1);
        assert_eq!(long.push(&text).content, text);
        assert_eq!(long.phase(), Phase::Answer);
    }
}
