//! The API dialects, peers in one folder: each module is one wire format
//! (its requests, its renderers, its routes and its words for the engine's
//! records) and is listed in [`REGISTRY`]. Nothing outside this folder
//! names a dialect: the serving path, the ledger, the metrics and the
//! conversation store reach a dialect's words through
//! [`crate::dialect::Dialect`], and the set of them through the
//! [`registry`] value the server hands down. A new dialect is one module
//! here plus one line in [`REGISTRY`].
use std::sync::OnceLock;

use axum::Router;
use serde_json::Value;

pub use crate::dialect::{Described, Dialect, FinishWords, Registry, Words, CANCELLED};
use crate::state::AppState;

pub mod anthropic;
mod registration;
pub use registration::Registered;
pub mod common;
#[cfg(test)]
mod echo_tests;
pub mod ollama;
pub mod openai_chat;
pub mod openai_completions;
pub mod openai_embeddings;
pub mod openai_responses;
pub mod openai_words;

/// Every dialect the server speaks, in the order the UI lists them.
pub const REGISTRY: &[Registered] = &[
    openai_chat::REGISTERED,
    openai_completions::REGISTERED,
    openai_responses::REGISTERED,
    anthropic::REGISTERED,
    ollama::REGISTERED,
    openai_embeddings::REGISTERED,
    #[cfg(test)]
    echo_tests::REGISTERED,
];

/// Every registered dialect's words, as the layers below look them up.
pub fn registry() -> Registry {
    static ALL: OnceLock<Vec<Dialect>> = OnceLock::new();
    Registry(ALL.get_or_init(|| REGISTRY.iter().map(|r| r.dialect).collect()))
}

/// The state every dialect keeps for itself, for a new server.
pub fn kept_state() -> axum::http::Extensions {
    let mut ext = axum::http::Extensions::new();
    REGISTRY
        .iter()
        .filter_map(|r| r.keeps)
        .for_each(|keep| keep(&mut ext));
    ext
}

/// Every dialect's routes.
pub fn routes() -> Router<AppState> {
    REGISTRY
        .iter()
        .fold(Router::new(), |r, reg| r.merge((reg.routes)()))
}

/// `GET /v1/dialects`: the registered dialects, so the UI lists them
/// without naming any.
pub async fn list() -> axum::Json<Value> {
    axum::Json(serde_json::json!({
        "data": registry().all().map(|d| serde_json::json!({
            "name": d.ledger_name(),
            "short_name": d.0.short_name(),
            "generation_paths": d.0.generation_paths(),
        })).collect::<Vec<_>>()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_find_their_dialect() {
        for (path, want) in [
            ("/v1/chat/completions", Some("openai.chat")),
            ("/v1/completions", Some("openai.completions")),
            ("/v1/responses/resp_1", Some("openai.responses")),
            ("/v1/messages/count_tokens", Some("anthropic.messages")),
            ("/api/chat", Some("ollama")),
            ("/api/tags", Some("ollama")),
            ("/v1/models", None),
            ("/v1/usage", None),
            ("/apix", None),
        ] {
            assert_eq!(
                registry().for_path(path).map(Dialect::ledger_name),
                want,
                "{path}"
            );
        }
        assert_eq!(
            registry()
                .for_generation_path("/api/generate")
                .map(Dialect::ledger_name),
            Some("ollama")
        );
        assert!(registry().for_generation_path("/api/tags").is_none());
    }

    #[test]
    fn names_are_unique_and_parse_back() {
        let names: Vec<_> = registry().all().map(Dialect::ledger_name).collect();
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(names.len(), dedup.len());
        for d in registry().all() {
            assert_eq!(registry().parse(d.ledger_name()), Some(d));
            assert_eq!(registry().parse(d.0.short_name()), Some(d));
        }
    }
}
