//! OpenAI's words for the engine's records in Chat Completions, legacy
//! Completions and Embeddings: the finish reason and the usage object,
//! shared by those three dialects (and the conversation store).
use serde_json::{json, Value};
use shoal_engine::{FinishReason, Usage};

/// The dialect's word for why a choice ended.
pub fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::StopSequence(_) | FinishReason::Cancelled => "stop",
        FinishReason::Length | FinishReason::ContextWindow => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Error(_) | FinishReason::Timeout { .. } => "error",
    }
}

/// The one usage builder for this dialect, streaming or not.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens(),
        // `cached_disk_tokens` (of `cached_tokens`, those read back from
        // the prefix cache's disk tier) is Shoal's own, beside OpenAI's;
        // `image_tokens` (of `prompt_tokens`, those images took) as vLLM
        // reports it.
        "prompt_tokens_details": {
            "cached_tokens": u.cached_tokens,
            "cached_disk_tokens": u.cached_disk_tokens,
            "image_tokens": u.image_tokens,
        },
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    })
}
