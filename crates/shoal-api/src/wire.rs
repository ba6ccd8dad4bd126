//! Each dialect's words for the engine's own records: finish reasons, usage
//! objects and the reserved metadata a recorder stores. The ledger, the
//! metrics and the conversation store keep records typed and word them here
//! when they are read, so usage is computed once (in the engine) and the
//! dialects only rename it.
use serde_json::Value;
use shoal_client::{Dialect, ProviderMeta};
use shoal_engine::{FinishReason, Usage};

use crate::{anthropic, openai_chat, openai_responses};

/// The word for a choice whose client left before it ended: no dialect has one.
pub const CANCELLED: &str = "cancelled";

/// One choice's finish in the dialect's words, as the ledger lists it. A
/// Responses finish is its `status`, or `status:reason` when incomplete.
pub fn finish_words(d: Dialect, f: &FinishReason) -> String {
    if *f == FinishReason::Cancelled {
        return CANCELLED.into();
    }
    match d {
        Dialect::Chat | Dialect::Completions => openai_chat::finish_reason(f).to_string(),
        Dialect::Messages => anthropic::stop_reason(f).to_string(),
        Dialect::Responses => match responses_status(f) {
            (status, Some(reason)) => format!("{status}:{reason}"),
            (status, None) => status.to_string(),
        },
    }
}

/// A Responses finish: `status` and `incomplete_details.reason`.
fn responses_status(f: &FinishReason) -> (&'static str, Option<String>) {
    let (status, incomplete, _) = openai_responses::status(f);
    let reason = incomplete
        .get("reason")
        .and_then(Value::as_str)
        .map(str::to_string);
    (status, reason)
}

/// The usage object exactly as the dialect sends it.
pub fn usage_json(d: Dialect, u: &Usage) -> Value {
    match d {
        Dialect::Chat | Dialect::Completions => openai_chat::usage_json(u),
        Dialect::Responses => openai_responses::usage_json(u),
        Dialect::Messages => anthropic::usage_json(u),
    }
}

/// What a recorder client of `d` stores under its reserved keys for a reply
/// that ended with `finish` and used `u`: the dialect's own finish words and
/// the usage fields the dialect reports (Anthropic reports no reasoning
/// tokens, and its `input_tokens` leave out cache reads).
pub fn provider_meta(d: Dialect, finish: Option<&FinishReason>, u: &Usage) -> ProviderMeta {
    let mut p = ProviderMeta::default();
    let n = |v: usize| Some(v as u64);
    match d {
        Dialect::Chat | Dialect::Completions => {
            p.finish_reason = finish.map(|f| finish_words(d, f));
        }
        Dialect::Messages => p.stop_reason = finish.map(|f| finish_words(d, f)),
        Dialect::Responses => match finish {
            Some(FinishReason::Cancelled) => p.status = Some(CANCELLED.into()),
            Some(f) => {
                let (status, reason) = responses_status(f);
                p.status = Some(status.into());
                p.incomplete_reason = reason;
            }
            None => {}
        },
    }
    p.token_usage_prompt_tokens = n(u.prompt_tokens);
    p.token_usage_completion_tokens = n(u.completion_tokens);
    p.token_usage_total_tokens = n(u.total_tokens());
    p.token_usage_cached_tokens = n(u.cached_tokens);
    if d == Dialect::Messages {
        p.token_usage_input_tokens = n(u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens));
        p.token_usage_cache_creation_tokens = n(0);
    } else {
        p.token_usage_reasoning_tokens = n(u.reasoning_tokens);
    }
    if let Some(FinishReason::StopSequence(s)) = finish {
        p.stop_sequence = Some(s.clone());
    }
    p
}
