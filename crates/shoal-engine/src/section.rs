//! The parts of a reply a reasoning splitter tells apart: which section a
//! token is in, and what a piece of text became. Shared by the `<think>`
//! splitter in [`crate::reasoning`] and harmony's in [`crate::harmony`].
use crate::tools::ToolOut;

/// The section a reply is in.
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
    /// Tool-call events (harmony's commentary channel).
    pub calls: Vec<ToolOut>,
}

impl Split {
    pub(crate) fn append(&mut self, more: Split) {
        self.reasoning.push_str(&more.reasoning);
        self.content.push_str(&more.content);
        self.calls.extend(more.calls);
    }
}
