//! The record every API adapter renders: what was produced, why it stopped,
//! and exactly what it cost. Adapters translate; they never recount.
use serde::{Deserialize, Serialize};

/// Why a generation ended. Kept finer-grained than any API dialect so each
/// adapter can map it in its own words without losing information.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "detail", rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Stop,
    /// A caller-supplied stop sequence matched (the string that matched).
    StopSequence(String),
    /// `max_tokens` was reached.
    Length,
    /// Prompt plus output filled the model's context window.
    ContextWindow,
    /// The model called one or more tools.
    ToolCalls,
    /// Output was withheld by a content filter.
    ContentFilter,
    /// The caller went away (or asked to stop) before the end.
    Cancelled,
    /// Generation failed part-way; the message says why.
    Error(String),
    /// The server's time limit for the request ran out, and the server
    /// stopped the generation (the engine itself has no clock).
    Timeout { limit_secs: u64 },
}

impl FinishReason {
    /// Short machine name, used by the CLI and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::StopSequence(_) => "stop_sequence",
            FinishReason::Length => "length",
            FinishReason::ContextWindow => "context_window",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error(_) => "error",
            FinishReason::Timeout { .. } => "timeout",
        }
    }

    /// What the reason carries beside its name, as text: the stop sequence,
    /// the error's message, or a timeout's limit in seconds.
    pub fn detail(&self) -> Option<String> {
        match self {
            FinishReason::StopSequence(s) | FinishReason::Error(s) => Some(s.clone()),
            FinishReason::Timeout { limit_secs } => Some(limit_secs.to_string()),
            _ => None,
        }
    }

    /// The reason [`Self::as_str`] and [`Self::detail`] describe (as a
    /// store keeps it); `None` for an unknown name.
    pub fn from_parts(name: &str, detail: Option<&str>) -> Option<Self> {
        let text = || detail.unwrap_or_default().to_string();
        Some(match name {
            "stop" => FinishReason::Stop,
            "stop_sequence" => FinishReason::StopSequence(text()),
            "length" => FinishReason::Length,
            "context_window" => FinishReason::ContextWindow,
            "tool_calls" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            "cancelled" => FinishReason::Cancelled,
            "error" => FinishReason::Error(text()),
            "timeout" => FinishReason::Timeout {
                limit_secs: detail.and_then(|d| d.parse().ok()).unwrap_or(0),
            },
            _ => return None,
        })
    }

    /// Whether the reply ended in failure (an error or a timeout): a client
    /// gets the dialect's error instead of a finish.
    pub fn is_failure(&self) -> bool {
        matches!(self, FinishReason::Error(_) | FinishReason::Timeout { .. })
    }
}

/// Token accounting for one generation. `total` is derived, never stored, so
/// it cannot disagree with its parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every token of the rendered prompt, whether or not it came from cache.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV state was reused instead of computed, from the
    /// prefix cache's RAM and disk tiers alike.
    pub cached_tokens: usize,
    /// The part of `cached_tokens` read back from the disk tier.
    #[serde(default)]
    pub cached_disk_tokens: usize,
    /// Prompt tokens newly stored at the client's cache breakpoints
    /// (Anthropic's `cache_creation_input_tokens`): those after the cached
    /// part up to the last breakpoint. Never more than the uncached prompt.
    #[serde(default)]
    pub cache_write_tokens: usize,
    /// The part of `cache_write_tokens` kept for an hour (the rest: 5 minutes).
    #[serde(default)]
    pub cache_write_1h_tokens: usize,
    /// Every sampled token, including an EOS or the tokens of a matched stop sequence.
    pub completion_tokens: usize,
    /// Completion tokens spent inside a reasoning section.
    pub reasoning_tokens: usize,
    /// Prompt positions taken by images (part of `prompt_tokens`).
    #[serde(default)]
    pub image_tokens: usize,
    /// Images in the prompt.
    #[serde(default)]
    pub images: usize,
}

impl Usage {
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }
}

/// Sums of whole requests' usage (a ledger's totals); never a way to
/// combine choices that share one prompt (see `wire::combined_usage`).
impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.cached_disk_tokens += o.cached_disk_tokens;
        self.cache_write_tokens += o.cache_write_tokens;
        self.cache_write_1h_tokens += o.cache_write_1h_tokens;
        self.completion_tokens += o.completion_tokens;
        self.reasoning_tokens += o.reasoning_tokens;
        self.image_tokens += o.image_tokens;
        self.images += o.images;
    }
}

/// Wall-clock figures for one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Time spent waiting for the engine before work began.
    pub queue_ms: f64,
    /// From submission to the first sampled token.
    pub ttft_ms: f64,
    /// Prompt tokens actually computed (not cached) per second of prefill.
    pub prefill_tokens_per_s: f64,
    /// Tokens per second after the first one.
    pub decode_tokens_per_s: f64,
    /// From submission to the end.
    pub total_ms: f64,
    /// Speculative decoding: draft tokens the model checked, and how many it
    /// confirmed (each confirmed one is a completion token that took no step
    /// of its own). Drafts are never counted as completion tokens.
    #[serde(default)]
    pub draft_tokens: usize,
    #[serde(default)]
    pub draft_accepted: usize,
}

/// The final record of a generation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub finish: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
}

/// Probability facts about one sampled token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    /// The token's text (lossy for byte fragments).
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The most likely alternatives, best first (empty unless asked for).
    pub top: Vec<(u32, String, f32)>,
}

/// What the engine streams to a caller.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Prefill is done; the prompt's size is known exactly.
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
        /// Written at the request's cache breakpoints (see [`Usage`]).
        cache_write_tokens: usize,
        cache_write_1h_tokens: usize,
    },
    /// New visible text (never a partial UTF-8 character, never part of a
    /// stop sequence), with logprobs for the tokens it came from when asked.
    Delta {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// New reasoning text (inside the model's thinking section).
    Reasoning { text: String },
    /// A tool call begins; its name is known. Arguments follow.
    ToolCallStart { index: usize, name: String },
    /// More of tool call `index`'s arguments: JSON text whose deltas,
    /// concatenated, are the whole arguments object.
    ToolCallArgs { index: usize, delta: String },
    /// Always the last event.
    Done(Completion),
}

#[cfg(test)]
mod tests {
    use super::FinishReason;

    #[test]
    fn finish_reasons_round_trip_through_name_and_detail() {
        for f in [
            FinishReason::Stop,
            FinishReason::StopSequence("END".into()),
            FinishReason::Length,
            FinishReason::ContextWindow,
            FinishReason::ToolCalls,
            FinishReason::ContentFilter,
            FinishReason::Cancelled,
            FinishReason::Error("out of memory".into()),
            FinishReason::Timeout { limit_secs: 600 },
        ] {
            let back = FinishReason::from_parts(f.as_str(), f.detail().as_deref());
            assert_eq!(back.as_ref(), Some(&f));
        }
        assert_eq!(FinishReason::from_parts("exploded", None), None);
    }
}
