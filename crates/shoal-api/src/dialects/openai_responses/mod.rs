//! `POST /v1/responses` and `GET /v1/responses/{id}` (OpenAI Responses):
//! the request (`request.rs`), the stored responses (`store.rs`), the
//! response object and its stream (`render.rs`), and the adapter here.
use serde_json::{json, Value};
use shoal_engine::{Completion, Event};

use crate::error::{ApiError, ErrorShape};
use crate::run;
use crate::state::Served;

mod render;
mod request;
mod store;
pub mod words;

pub use render::{OutCall, ResponsesRenderer, Shape};
use request::prepare;
#[cfg(test)]
pub(crate) use request::{text_format, tool_request};
pub use request::{Input, InputItem, Namespaced, ResponsesRequest};

/// The response header naming the tool types a request sent that this
/// server cannot run and left out of the offer (`web_search`, …).
pub const OMITTED_TOOLS_HEADER: &str = "x-shoal-omitted-tools";
pub use store::{get_response, ResponseStore};

/// Responses as an [`run::Adapter`]: the response's shape, and the
/// conversation to store with it.
pub struct Responses {
    shape: Shape,
    msgs: store::Stored,
    /// Tool types left out of the offer (said in a response header).
    omitted: Vec<String>,
}

impl run::Adapter for Responses {
    type Request = ResponsesRequest;
    type Stream = ResponsesStream;
    const DIALECT: crate::dialect::Dialect = DIALECT;

    fn prepare(served: &Served, mut req: ResponsesRequest, id: String) -> run::Prepared<Self> {
        let request::Prepared {
            job,
            msgs,
            names,
            omitted,
        } = prepare(served, &mut req)?;
        let shape = Shape {
            id,
            msg_id: run::new_id("msg_"),
            reasoning_id: run::new_id("rs_"),
            created: run::now_secs(),
            model: req.model.clone(),
            instructions: req.instructions.clone(),
            max_output_tokens: req.max_output_tokens,
            previous_response_id: req.previous_response_id.clone(),
            temperature: job.sampling.temperature,
            top_p: job.sampling.top_p,
            store: req.store.unwrap_or(true),
            metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
            tools: json!(req.tools.clone().unwrap_or_default()),
            tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            text_format: req
                .text
                .as_ref()
                .and_then(|t| t.get("format"))
                .cloned()
                .unwrap_or_else(|| json!({"type": "text"})),
            names,
        };
        Ok((
            job,
            Responses {
                shape,
                msgs,
                omitted,
            },
        ))
    }

    fn respond(self, served: &Served, collected: Vec<run::Collected>) -> Result<Value, ApiError> {
        let c = collected
            .first()
            .ok_or_else(|| ApiError::internal("no output"))?;
        let calls: Vec<OutCall> = c
            .tool_calls
            .iter()
            .map(|t| OutCall::new(&t.name, &t.arguments, &self.shape.names))
            .collect();
        let body =
            self.shape
                .response_full(Some(&c.reasoning), &c.text, &calls, Some(c.completion()));
        if self.shape.store {
            remember(served, &self.shape, self.msgs, &c.text, &calls, &body);
        }
        Ok(body)
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        if self.omitted.is_empty() {
            return Vec::new();
        }
        vec![(OMITTED_TOOLS_HEADER, self.omitted.join(", "))]
    }

    fn stream(self, served: Served) -> ResponsesStream {
        let keep = self
            .shape
            .store
            .then(|| (served, self.shape.clone(), self.msgs));
        ResponsesStream {
            renderer: ResponsesRenderer::new(self.shape),
            text: String::new(),
            reasoning: String::new(),
            done: None,
            keep,
        }
    }
}

/// The live Responses stream: the renderer, and what storing the finished
/// response (`store: true`) needs.
pub struct ResponsesStream {
    renderer: ResponsesRenderer,
    text: String,
    reasoning: String,
    done: Option<Completion>,
    keep: Option<(Served, Shape, store::Stored)>,
}

impl run::StreamRender for ResponsesStream {
    fn frames(&mut self, _choice: usize, ev: &Event) -> run::Step {
        match ev {
            Event::Delta { text, .. } => self.text.push_str(text),
            Event::Reasoning { text } => self.reasoning.push_str(text),
            Event::Done(c) => self.done = Some(c.clone()),
            _ => {}
        }
        run::Step {
            frames: run::named(self.renderer.step(ev)),
            last: matches!(ev, Event::Done(_)),
        }
    }

    fn heartbeat(&mut self) -> Vec<(Option<String>, String)> {
        run::named(self.renderer.heartbeat())
    }

    fn finished(&mut self) {
        if let (Some((state, shape, msgs)), Some(c)) = (self.keep.take(), &self.done) {
            let calls = self.renderer.calls();
            let body = shape.response_full(Some(&self.reasoning), &self.text, &calls, Some(c));
            remember(&state, &shape, msgs, &self.text, &calls, &body);
        }
    }
}

/// OpenAI Responses's words for the engine's records.
pub const DIALECT: crate::dialect::Dialect = crate::dialect::Dialect(&crate::dialect::Described {
    ledger_name: "openai.responses",
    short_name: "responses",
    path_prefixes: &["/v1/responses"],
    generation_paths: &["/v1/responses"],
    model_paths: &["/v1/responses"],
    error_shape: ErrorShape::OPENAI,
    id_prefix: "resp_",
    transport: crate::dialect::Transport::PLAIN,
    // A finish is its `status`, or `status:reason` when incomplete.
    finish_words: |f| {
        let (word, reason) = words::outcome(f);
        crate::dialect::FinishWords { word, reason }
    },
    usage_json: words::usage_json,
    provider_meta,
});

/// What a recorder stores under its reserved keys for a reply.
fn provider_meta(
    p: &mut shoal_client::ProviderMeta,
    finish: Option<&shoal_engine::FinishReason>,
    _: &shoal_engine::Usage,
) {
    match finish {
        Some(shoal_engine::FinishReason::Cancelled) => {
            p.status = Some(crate::dialect::CANCELLED.into())
        }
        Some(f) => {
            let (status, reason) = words::outcome(f);
            p.status = Some(status.into());
            p.incomplete_reason = reason.map(str::to_string);
        }
        None => {}
    }
}

/// The dialect as the server registers it: its words and its routes.
pub const REGISTERED: crate::dialects::registration::Registered =
    crate::dialects::registration::Registered::new(DIALECT, routes).keeping(store::keep);

fn routes() -> axum::Router<crate::state::AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/responses", post(run::serve::<Responses>))
        .route("/v1/responses/{id}", get(get_response))
}

/// Keeps a finished response for `previous_response_id` and `GET /v1/responses/{id}`.
fn remember(
    state: &Served,
    shape: &Shape,
    (mut msgs, images): store::Stored,
    text: &str,
    calls: &[OutCall],
    body: &Value,
) {
    let calls: Vec<(String, Value)> = calls
        .iter()
        .map(|c| {
            (
                c.offered.clone(),
                crate::tools::arguments_value(&c.arguments),
            )
        })
        .collect();
    msgs.push(state.assistant_with_calls(text, &calls));
    store::of(state).put(shape.id.clone(), (msgs, images), body.clone());
}
