//! Earlier responses kept for `previous_response_id` and
//! `GET /v1/responses/{id}`.
use std::collections::VecDeque;
use std::sync::Mutex;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use shoal_engine::ChatMessage;

use super::{OutCall, Shape};
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::tools;
use crate::{AppState, Served};

/// Conversations of earlier responses, for `previous_response_id`; bounded.
pub struct ResponseStore {
    cap: usize,
    items: Mutex<VecDeque<(String, Vec<ChatMessage>, Value)>>,
}

impl ResponseStore {
    pub fn new(cap: usize) -> Self {
        ResponseStore {
            cap: cap.max(1),
            items: Mutex::new(VecDeque::new()),
        }
    }
    pub(crate) fn put(&self, id: String, conversation: Vec<ChatMessage>, response: Value) {
        let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == self.cap {
            q.pop_front();
        }
        q.push_back((id, conversation, response));
    }
    pub(crate) fn conversation(&self, id: &str) -> Option<Vec<ChatMessage>> {
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

pub(super) fn remember(
    state: &Served,
    shape: &Shape,
    mut msgs: Vec<ChatMessage>,
    text: &str,
    calls: &[OutCall],
    body: &Value,
) {
    let calls: Vec<(String, Value)> = calls
        .iter()
        .map(|c| (c.offered.clone(), tools::arguments_value(&c.arguments)))
        .collect();
    msgs.push(state.assistant_with_calls(text, &calls));
    state.responses.put(shape.id.clone(), msgs, body.clone());
}

pub async fn get_response(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, DialectError> {
    state
        .responses
        .response(&id)
        .map(|r| Json(r).into_response())
        .ok_or_else(|| {
            ApiError::not_found(format!("no stored response with id '{id}'"))
                .in_dialect(ErrorShape::OpenAi)
        })
}
