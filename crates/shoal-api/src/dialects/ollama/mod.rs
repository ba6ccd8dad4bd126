//! Ollama's API (`/api/*`), for the tools that speak only it: chat and
//! generate as NDJSON streams, the model routes (tags, show, ps, pull,
//! delete, version) and keep-alive on the model pool. Models are named
//! `id` or `id:latest`; usage is Ollama's `prompt_eval_count` /
//! `eval_count` plus two fields of Shoal's that Ollama's clients ignore:
//! `prompt_eval_cached_count` (the part of the prompt read from the prefix
//! cache) and `eval_thinking_count` (the part of `eval_count` that was
//! thinking).
use axum::routing::{delete, get, post};
use axum::Router;

use crate::dialects::registration::Registered;
use crate::state::AppState;
pub use shared::{DIALECT, OLLAMA_VERSION, ROOT_TEXT};

pub(crate) mod chat;
mod embed;
pub(crate) mod generate;
mod models;
pub mod port;
mod settings;
pub(crate) mod shared;

pub const REGISTERED: Registered = Registered::new(DIALECT, routes);

fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/settings/ollama-port",
            get(settings::get_setting).put(settings::put_setting),
        )
        .route("/api/version", get(models::version).head(models::version))
        .route("/api/tags", get(models::tags).head(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/ps", get(models::ps))
        .route("/api/pull", post(models::pull))
        .route("/api/delete", delete(models::remove))
        .route("/api/chat", post(chat::handle))
        .route("/api/generate", post(generate::handle))
        .route("/api/embed", post(embed::embed_route))
        .route("/api/embeddings", post(embed::legacy_route))
}
