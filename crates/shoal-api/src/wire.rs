//! The engine's own records in a dialect's words: finish reasons, usage
//! objects and the reserved metadata a recorder stores, through the words
//! each dialect declares in its own module (`Words`). The ledger, the
//! metrics and the conversation store keep records typed and word them here
//! when they are read, so usage is computed once (in the engine) and the
//! dialects only rename it.
use serde_json::Value;
use shoal_client::ProviderMeta;

pub use crate::dialect::Dialect;
use shoal_engine::{Completion, FinishReason, Usage};

use crate::error::ApiError;

/// One choice's finish in the dialect's words, as the ledger lists it.
pub fn finish_words(d: Dialect, f: &FinishReason) -> String {
    d.finish_words(f)
}

/// The usage object exactly as the dialect sends it.
pub fn usage_json(d: Dialect, u: &Usage) -> Value {
    d.usage_json(u)
}

/// What a recorder client of `d` stores under its reserved keys for a reply
/// that ended with `finish` and used `u`.
pub fn provider_meta(d: Dialect, finish: Option<&FinishReason>, u: &Usage) -> ProviderMeta {
    d.provider_meta(finish, u)
}

/// The reserved metadata of a dialect that reports its finish as
/// `finish_reason` in its own words (Ollama, whose words are not [`crate::dialect::Described`]).
pub fn finish_reason_meta(
    d: crate::dialect::Dialect,
    finish: Option<&FinishReason>,
    u: &Usage,
) -> ProviderMeta {
    let mut p = crate::dialect::base_meta(finish, u);
    p.finish_reason = finish.map(|f| d.finish_words(f));
    p
}

/// Usage over choices: each prompt counts once (as the APIs define `n`),
/// completion and reasoning tokens add up over every choice. `per_prompt` is
/// the number of consecutive choices that share a prompt.
pub fn combined_usage(completions: &[Completion], per_prompt: usize) -> Usage {
    let mut u = Usage::default();
    for group in completions.chunks(per_prompt.max(1)) {
        if let Some(first) = group.first() {
            u.prompt_tokens += first.usage.prompt_tokens;
            u.cached_tokens += first.usage.cached_tokens;
            u.cached_disk_tokens += first.usage.cached_disk_tokens;
            u.cache_write_tokens += first.usage.cache_write_tokens;
            u.cache_write_1h_tokens += first.usage.cache_write_1h_tokens;
            u.image_tokens += first.usage.image_tokens;
            u.images += first.usage.images;
        }
        for c in group {
            u.completion_tokens += c.usage.completion_tokens;
            u.reasoning_tokens += c.usage.reasoning_tokens;
        }
    }
    u
}

/// The error a failed generation reports: a timeout (504) or an engine
/// failure (500); `None` for every other finish.
pub fn failure(f: &FinishReason) -> Option<ApiError> {
    match f {
        FinishReason::Error(m) => Some(ApiError::generation_failed(m)),
        FinishReason::Timeout { limit_secs } => Some(
            ApiError::new(
                crate::error::ErrorKind::Timeout,
                format!(
                    "the request exceeded the server's time limit of {limit_secs} s \
                     (server.request_timeout_secs); the usage counts what was generated"
                ),
            )
            .with_code("request_timeout"),
        ),
        _ => None,
    }
}

/// The error a request whose choice failed reports (the first failed
/// choice's), with the usage of every choice beside it in `d`'s words —
/// a timeout still spent tokens, and the client is told how many. `None`
/// when no choice failed. `per_prompt` as in [`combined_usage`].
pub fn failed(d: Dialect, completions: &[Completion], per_prompt: usize) -> Option<ApiError> {
    let error = completions.iter().find_map(|c| failure(&c.finish))?;
    Some(error.with_usage(usage_json(d, &combined_usage(completions, per_prompt))))
}
