//! `/v1/settings/ollama-port`: the server-wide switch for Ollama's own port
//! ([`super::port::OllamaPort`]), read and set on a running server and
//! remembered in the store for the next start.
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::port::{DEFAULT_PORT, SETTING};
use crate::error::{ApiError, ErrorShape};
use crate::state::AppState;

/// `GET /v1/settings/ollama-port`.
pub(crate) async fn get_setting(State(s): State<AppState>) -> Json<Value> {
    Json(s.ollama.status())
}

/// The body of `PUT /v1/settings/ollama-port`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Setting {
    enabled: bool,
    /// Default: Ollama's 11434.
    #[serde(default)]
    port: Option<u16>,
}

/// `PUT /v1/settings/ollama-port`: turns the second port on or off now and
/// remembers it for the next start (when the config says nothing). Answers
/// with the switch's state: a taken port is a 200 whose `listening` is
/// false and whose `error` says why.
pub(crate) async fn put_setting(
    State(s): State<AppState>,
    body: Result<Json<Setting>, axum::extract::rejection::JsonRejection>,
) -> axum::response::Response {
    let Json(setting) = match body {
        Ok(b) => b,
        Err(e) => {
            return ApiError::invalid(format!(
                "expected {{\"enabled\": true|false, \"port\": 1-65535}}: {}",
                e.body_text()
            ))
            .in_dialect(ErrorShape::OPENAI)
            .into_response()
        }
    };
    let port = setting.port.unwrap_or(DEFAULT_PORT);
    if port == 0 {
        return ApiError::param("port", "port must be 1-65535")
            .in_dialect(ErrorShape::OPENAI)
            .into_response();
    }
    let wanted = setting.enabled.then_some(port);
    s.ollama.set(wanted).await;
    if let Some(store) = &s.store {
        let value = wanted.map_or("off".to_string(), |p| p.to_string());
        let saved = store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_setting(SETTING, &value);
        if let Err(e) = saved {
            tracing::warn!(error = %e, "could not remember the Ollama port setting");
        }
    }
    Json(s.ollama.status()).into_response()
}
