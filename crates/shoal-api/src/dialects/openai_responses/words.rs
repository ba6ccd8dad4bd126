//! Responses' words for the engine's records: the usage object and a
//! finish's `status`, `incomplete_details` and `error`.
use serde_json::{json, Value};
use shoal_engine::{FinishReason, Usage};

/// The one usage builder for this dialect.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": u.cached_tokens,
            "cached_disk_tokens": u.cached_disk_tokens,
            "image_tokens": u.image_tokens,
        },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens(),
    })
}

/// `status` and `incomplete_details.reason` of a finish.
pub fn outcome(f: &FinishReason) -> (&'static str, Option<&'static str>) {
    match f {
        FinishReason::Stop | FinishReason::StopSequence(_) | FinishReason::ToolCalls => {
            ("completed", None)
        }
        FinishReason::Length | FinishReason::ContextWindow => {
            ("incomplete", Some("max_output_tokens"))
        }
        FinishReason::ContentFilter => ("incomplete", Some("content_filter")),
        FinishReason::Cancelled => ("cancelled", None),
        FinishReason::Error(_) | FinishReason::Timeout { .. } => ("failed", None),
    }
}

/// `status`, `incomplete_details` and `error` of a finish, as JSON.
pub fn status(f: &FinishReason) -> (&'static str, Value, Value) {
    let (status, reason) = outcome(f);
    let incomplete = reason.map_or(Value::Null, |r| json!({ "reason": r }));
    let error = crate::wire::failure(f).map_or(
        Value::Null,
        |e| json!({"code": e.code.unwrap_or("server_error"), "message": e.message}),
    );
    (status, incomplete, error)
}
