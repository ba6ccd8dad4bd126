//! `POST /api/generate`: a prompt through the chat template, or `raw`, or
//! fill-in-the-middle with `suffix` where the model has the tokens for it.

use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::loader::Vocabulary;
use shoal_engine::{ChatMessage, Event};

use super::shared::{
    can_think, format_grammar, model_id, now, take_images, wanted_thinking, KeepAlive, Options,
    Reply, DIALECT,
};
use crate::body::Body;
use crate::error::{ApiError, DialectError};
use crate::images::{user_text, Images};
use crate::run::{self, Collected, Step};
use crate::state::{AppState, Served};

#[derive(Debug, Deserialize)]
pub struct GenerateRequest {
    pub model: String,
    #[serde(default)]
    pub prompt: String,
    pub suffix: Option<String>,
    pub system: Option<String>,
    pub template: Option<String>,
    pub context: Option<Vec<i64>>,
    pub stream: Option<bool>,
    #[serde(default)]
    pub raw: bool,
    pub format: Option<Value>,
    pub keep_alive: Option<Value>,
    pub images: Option<Vec<Value>>,
    pub options: Option<Options>,
    pub think: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
}

impl run::WireRequest for GenerateRequest {
    fn model(&self) -> &str {
        model_id(&self.model)
    }
    fn stream(&self) -> bool {
        self.stream.unwrap_or(true)
    }
}

/// `POST /api/generate`: a load (or unload) request when it has no prompt;
/// else a generation.
pub async fn handle(
    State(state): State<AppState>,
    tracked: Option<axum::Extension<crate::ledger::Tracked>>,
    body: Body,
) -> Result<Response, DialectError> {
    let req: GenerateRequest = crate::body::parse(&body).map_err(|e| e.in_dialect(DIALECT))?;
    let keep = KeepAlive::parse(req.keep_alive.as_ref().unwrap_or(&Value::Null))
        .map_err(|e| e.in_dialect(DIALECT))?;
    let name = req.model.clone();
    if req.prompt.is_empty() && req.suffix.as_deref().unwrap_or("").is_empty() {
        return super::shared::load_request(&state, &name, keep, |reason| {
            json!({"model": name, "created_at": now(), "response": "",
                   "done": true, "done_reason": reason})
        })
        .await;
    }
    super::shared::generation::<OllamaGenerate>(&state, tracked, req, &name, keep).await
}

/// Fill-in-the-middle markers, as the model's vocabulary spells them
/// (Qwen-Coder's and StarCoder's); each must be one token.
const FIM_MARKERS: &[[&str; 3]] = &[
    ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
    ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
];

/// The model's fill-in-the-middle markers, if it has them.
pub fn fim_markers(vocab: &Vocabulary) -> Option<[&'static str; 3]> {
    FIM_MARKERS.iter().copied().find(|m| {
        m.iter()
            .all(|t| vocab.encode_plain(t).is_ok_and(|ids| ids.len() == 1))
    })
}

/// The prompt's tokens and the reasoning / tool settings a chat prompt brings.
fn prompt(
    served: &Served,
    req: &GenerateRequest,
    want: Option<Option<usize>>,
) -> Result<shoal_engine::prompt::ChatPrompt, ApiError> {
    let vocab = &served.engine.model.vocab;
    let mut images = Images::default();
    let markers = take_images(req.images.as_ref(), "images", &mut images)?;
    let user = user_text(&req.prompt);
    let plain = |text: &str| -> Result<shoal_engine::prompt::ChatPrompt, ApiError> {
        let prepared = served.prepare_images(&images)?;
        let (tokens, spans) =
            shoal_engine::prompt::encode(vocab, &format!("{markers}{text}"), &prepared)?;
        Ok(shoal_engine::prompt::ChatPrompt {
            tokens,
            reasoning: None,
            tools: None,
            grammar: None,
            images: spans,
        })
    };
    if let Some(suffix) = req.suffix.as_deref().filter(|s| !s.is_empty()) {
        if !images.is_empty() {
            return Err(ApiError::param(
                "suffix",
                "'suffix' (insert) cannot be combined with 'images'",
            ));
        }
        if req.raw {
            return Err(ApiError::param(
                "suffix",
                "'suffix' cannot be combined with 'raw'",
            ));
        }
        let Some([pre, suf, mid]) = fim_markers(vocab) else {
            return Err(ApiError::param(
                "suffix",
                format!("\"{}\" does not support insert ('suffix')", req.model),
            ));
        };
        return plain(&format!("{pre}{user}{suf}{}{mid}", user_text(suffix)));
    }
    if req.raw || !vocab.capabilities().chat {
        return plain(&user);
    }
    let mut messages = Vec::new();
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", format!("{markers}{user}")));
    served.chat_prompt(&messages, want, None, &images)
}

/// `/api/generate` as an [`run::Adapter`].
pub struct OllamaGenerate(Reply);

impl run::Adapter for OllamaGenerate {
    type Request = GenerateRequest;
    type Stream = GenerateStream;
    const DIALECT: crate::dialect::Dialect = DIALECT;

    fn prepare(served: &Served, mut req: GenerateRequest, _id: String) -> run::Prepared<Self> {
        if req.template.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::param(
                "template",
                "a custom 'template' is not supported: the model's own template is used \
                 (send 'raw': true with a prompt you formatted yourself)",
            ));
        }
        if req.context.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(ApiError::param(
                "context",
                "'context' (deprecated by Ollama) is not supported: send the conversation \
                 to /api/chat as messages",
            ));
        }
        let options = req.options.take().unwrap_or_default();
        let format = format_grammar(req.format.as_ref())?;
        let want = wanted_thinking(req.think.as_ref(), can_think(served), &req.model)?;
        let p = prompt(served, &req, want)?;
        let mut job = super::shared::job(served, p, &options, format)?;
        job.sampling.top_logprobs = super::shared::wanted_logprobs(req.logprobs, req.top_logprobs)?;
        Ok((
            job,
            OllamaGenerate(Reply::new(served, req.model, req.logprobs)),
        ))
    }

    fn respond(self, _: &Served, collected: Vec<Collected>) -> Result<Value, ApiError> {
        let c = super::shared::only(&collected)?;
        let mut body = json!({"response": c.text});
        if !c.reasoning.is_empty() {
            body["thinking"] = json!(c.reasoning);
        }
        Ok(self.0.close(body, c))
    }

    fn stream(self, _: Served) -> GenerateStream {
        GenerateStream(self.0)
    }
}

/// The live `/api/generate` stream.
pub struct GenerateStream(Reply);

impl GenerateStream {
    /// A line of the stream: an empty response, not done, with `extra`'s fields.
    fn line(&self, extra: Value) -> (Option<String>, String) {
        let mut v =
            json!({"model": self.0.model, "created_at": now(), "response": "", "done": false});
        if let (Value::Object(o), Value::Object(e)) = (&mut v, extra) {
            o.extend(e);
        }
        (None, v.to_string())
    }
}

impl run::StreamRender for GenerateStream {
    fn frames(&mut self, _: usize, ev: &Event) -> Step {
        let mut step = Step::default();
        let line = |extra: Value| self.line(extra);
        match ev {
            Event::Delta { text, logprobs } if self.0.logprobs && !logprobs.is_empty() => {
                let lps = super::shared::logprobs_json(logprobs);
                step.frames
                    .push(line(json!({"response": text, "logprobs": lps})));
            }
            Event::Delta { text, .. } if !text.is_empty() => {
                step.frames.push(line(json!({"response": text})));
            }
            Event::Reasoning { text } => step.frames.push(line(json!({"thinking": text}))),
            Event::Done(c) => {
                let head = json!({"model": self.0.model, "created_at": now(), "response": ""});
                let last = super::shared::closing(head, c, self.0.ready_after);
                step.frames.push((None, last.to_string()));
                step.last = true;
            }
            _ => {}
        }
        step
    }

    /// A line with an empty response: clients append it as nothing.
    fn heartbeat(&mut self) -> Vec<(Option<String>, String)> {
        vec![self.line(json!({}))]
    }
}
