//! Earlier responses kept for `previous_response_id` and
//! `GET /v1/responses/{id}`.
use std::collections::VecDeque;
use std::sync::Mutex;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use shoal_engine::ChatMessage;

use crate::error::{ApiError, DialectError, ErrorShape};
use crate::state::AppState;

/// How many earlier responses the store keeps.
const KEPT: usize = 256;

/// Adds the dialect's store to a new server's state (its registration's `keeps`).
pub(super) fn keep(state: &mut axum::http::Extensions) {
    state.insert(std::sync::Arc::new(ResponseStore::new(KEPT)));
}

/// The server's store of earlier responses.
pub(super) fn of(state: &AppState) -> &ResponseStore {
    state
        .dialect_state::<std::sync::Arc<ResponseStore>>()
        .expect("the Responses dialect's registration adds its store to every server")
}

/// A stored conversation: its messages and the images their markers stand
/// for, as the client sent them (a later turn may run on another model).
pub type Stored = (Vec<ChatMessage>, Vec<crate::images::ImageSource>);

/// Conversations of earlier responses, for `previous_response_id`; bounded.
pub struct ResponseStore {
    cap: usize,
    items: Mutex<VecDeque<(String, Stored, Value)>>,
}

impl ResponseStore {
    pub fn new(cap: usize) -> Self {
        ResponseStore {
            cap: cap.max(1),
            items: Mutex::new(VecDeque::new()),
        }
    }
    pub(crate) fn put(&self, id: String, conversation: Stored, response: Value) {
        let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == self.cap {
            q.pop_front();
        }
        q.push_back((id, conversation, response));
    }
    pub(crate) fn conversation(&self, id: &str) -> Option<Stored> {
        let q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .find(|(i, _, _)| i == id)
            .map(|(_, c, _)| c.clone())
    }
    pub(crate) fn response(&self, id: &str) -> Option<Value> {
        let q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .find(|(i, _, _)| i == id)
            .map(|(_, _, r)| r.clone())
    }
}

pub async fn get_response(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, DialectError> {
    of(&state)
        .response(&id)
        .map(|r| Json(r).into_response())
        .ok_or_else(|| {
            ApiError::not_found(format!("no stored response with id '{id}'"))
                .in_dialect(ErrorShape::OPENAI)
        })
}
