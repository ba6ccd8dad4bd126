//! `POST /v1/completions` (legacy text completions, no chat template).
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{Completion, Event, TokenLogprob};

use super::common::StreamOptions;
use crate::body::OneOrMany;
use crate::dialects::openai_words::{finish_reason, usage_json};
use crate::dialects::registration::Registered;
use crate::error::{ApiError, ErrorShape};
use crate::params::{check_max_tokens, check_range, check_stop, OpenAiSampling};
use crate::run::{self, Generation};
use crate::state::Served;

#[derive(Debug, Deserialize)]
// Some fields are accepted (and type-checked) for SDK compatibility without
// changing anything here.
#[allow(dead_code)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Option<Prompt>,
    pub max_tokens: Option<i64>,
    #[serde(flatten)]
    pub sampling: OpenAiSampling,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<OneOrMany<String>>,
    #[serde(default)]
    pub echo: bool,
    pub logprobs: Option<i64>,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
    pub user: Option<String>,
}

run::wire_request!(CompletionRequest);

/// A prompt: text, texts, token ids, or lists of token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// OpenAI's default for this endpoint.
const DEFAULT_MAX_TOKENS: i64 = 16;

/// Legacy logprobs object for the tokens of one choice.
fn logprobs_json(lps: &[TokenLogprob], offset: usize) -> Value {
    let mut pos = offset;
    let mut offsets = Vec::with_capacity(lps.len());
    for l in lps {
        offsets.push(pos);
        pos += l.text.len();
    }
    json!({
        "tokens": lps.iter().map(|l| l.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| {
            let m: serde_json::Map<String, Value> = l.top.iter().map(|(_, t, lp)| (t.clone(), json!(lp))).collect();
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

struct Prepared {
    job: Generation,
    texts: Vec<String>,
}

fn prepare(state: &Served, req: &mut CompletionRequest) -> Result<Prepared, ApiError> {
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param(
            "suffix",
            "'suffix' (insertion) is not supported by this model",
        ));
    }
    let sampling = req.sampling.params(
        &state.engine.model.defaults.params(),
        req.logprobs.map(|n| n as usize),
    )?;
    if let Some(b) = req.best_of {
        if b != req.sampling.n() as i64 {
            return Err(ApiError::param(
                "best_of",
                "'best_of' other than 'n' is not supported",
            ));
        }
    }
    check_range("logprobs", req.logprobs, 0, 5)?;
    if req.echo && req.logprobs.is_some() {
        return Err(ApiError::param(
            "echo",
            "'echo' together with 'logprobs' is not supported",
        ));
    }
    let max_tokens = check_max_tokens(
        "max_tokens",
        Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    )?;
    let vocab = &state.engine.model.vocab;
    let (prompts, texts): (Vec<Vec<u32>>, Vec<String>) = match req.prompt.take() {
        None => return Err(ApiError::param("prompt", "'prompt' is required")),
        Some(Prompt::Text(t)) => (vec![vocab.encode(&t)?], vec![t]),
        Some(Prompt::Texts(ts)) => {
            let ids = ts
                .iter()
                .map(|t| vocab.encode(t))
                .collect::<Result<Vec<_>, _>>()?;
            (ids, ts)
        }
        Some(Prompt::Tokens(ids)) => {
            let t = vocab.decode(&ids, false)?;
            (vec![ids], vec![t])
        }
        Some(Prompt::TokenLists(lists)) => {
            let ts = lists
                .iter()
                .map(|ids| vocab.decode(ids, false))
                .collect::<Result<Vec<_>, _>>()?;
            (lists, ts)
        }
    };
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::param("prompt", "'prompt' must not be empty"));
    }
    let vocab_size = state.engine.model.info.vocab_size;
    if prompts.iter().flatten().any(|&t| t as usize >= vocab_size) {
        return Err(ApiError::param(
            "prompt",
            format!("token ids must be below {vocab_size}"),
        ));
    }
    Ok(Prepared {
        job: Generation {
            prompts,
            max_tokens,
            sampling,
            stop: check_stop(req.stop.take())?,
            n: req.sampling.n(),
            cache_breakpoints: Vec::new(),
            images: Vec::new(),
            reasoning: None,
            grammar: None,
            tools: None,
        },
        texts,
    })
}

/// Legacy Completions as an [`run::Adapter`]: what rendering a request needs.
pub struct Completions {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    include_usage: bool,
    /// Choices per prompt (`n`), and choices in all.
    per: usize,
    total: usize,
    /// The prompts' texts when `echo` is on.
    echo: Option<Vec<String>>,
}

impl run::Adapter for Completions {
    type Request = CompletionRequest;
    type Stream = CompletionRenderer;
    const DIALECT: crate::dialect::Dialect = DIALECT;

    fn prepare(served: &Served, mut req: CompletionRequest, id: String) -> run::Prepared<Self> {
        let Prepared { job, texts } = prepare(served, &mut req)?;
        let per = job.n.max(1);
        let adapter = Completions {
            id,
            created: run::now_secs(),
            model: req.model,
            logprobs: req.logprobs.is_some(),
            include_usage: req.stream_options.is_some_and(|o| o.include_usage),
            per,
            total: per * job.prompts.len(),
            echo: req.echo.then_some(texts),
        };
        Ok((job, adapter))
    }

    fn respond(self, _: &Served, collected: Vec<run::Collected>) -> Result<Value, ApiError> {
        let completions: Vec<Completion> =
            collected.iter().map(|c| c.completion().clone()).collect();
        run::check_failed(DIALECT, &completions, self.per)?;
        let out: Vec<Value> = collected
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let prefix = self
                    .echo
                    .as_ref()
                    .and_then(|t| t.get(i / self.per))
                    .map_or("", String::as_str);
                json!({
                    "index": i, "text": format!("{prefix}{}", c.text),
                    "logprobs": if self.logprobs { logprobs_json(&c.logprobs, prefix.len()) } else { Value::Null },
                    "finish_reason": finish_reason(&c.completion().finish),
                })
            })
            .collect();
        Ok(json!({
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "system_fingerprint": null, "choices": out,
            "usage": usage_json(&crate::wire::combined_usage(&completions, self.per)),
        }))
    }

    fn stream(self, _: Served) -> CompletionRenderer {
        CompletionRenderer {
            id: self.id,
            created: self.created,
            model: self.model,
            include_usage: self.include_usage,
            logprobs: self.logprobs,
            per: self.per,
            echo: self.echo,
            progress: run::ChoiceProgress::new(self.total, self.per),
            offsets: vec![None; self.total],
        }
    }
}

/// Renders the chunks of a streamed completion. Pure: events in, `data:`
/// payloads out, `[DONE]` after the last choice ends.
pub struct CompletionRenderer {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    pub logprobs: bool,
    /// Choices per prompt (`n`).
    pub per: usize,
    /// The prompts' texts, sent first in each choice when `echo` is on.
    pub echo: Option<Vec<String>>,
    /// How far each choice got.
    pub progress: run::ChoiceProgress,
    /// Each choice's text offset so far (`None` until its first chunk).
    pub offsets: Vec<Option<usize>>,
}

impl CompletionRenderer {
    fn chunk(&self, choices: Value) -> Value {
        let mut c = json!({"id": self.id, "object": "text_completion", "created": self.created,
                           "model": self.model, "system_fingerprint": null, "choices": choices});
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// The payloads for one event of choice `i`.
    pub fn step(&mut self, i: usize, ev: &Event) -> Vec<String> {
        let mut out = Vec::new();
        let Some(offset) = self.offsets.get(i) else {
            return out;
        };
        if self.progress.ended(i) {
            return out;
        }
        self.progress.begin(i);
        if offset.is_none() {
            let echoed = self
                .echo
                .as_ref()
                .and_then(|t| t.get(i / self.per.max(1)))
                .cloned();
            self.offsets[i] = Some(echoed.as_ref().map_or(0, String::len));
            if let Some(text) = echoed {
                out.push(self.chunk(json!([{"index": i, "text": text, "logprobs": null, "finish_reason": null}])).to_string());
            }
        }
        match ev {
            Event::Started { .. }
            | Event::Reasoning { .. }
            | Event::ToolCallStart { .. }
            | Event::ToolCallArgs { .. } => {}
            Event::Delta { text, logprobs } => {
                let at = self.offsets[i].unwrap_or(0);
                let lp = if self.logprobs {
                    logprobs_json(logprobs, at)
                } else {
                    Value::Null
                };
                self.offsets[i] = Some(at + text.len());
                out.push(
                    self.chunk(
                        json!([{"index": i, "text": text, "logprobs": lp, "finish_reason": null}]),
                    )
                    .to_string(),
                );
            }
            Event::Done(c) => {
                // A failed choice's error waits for the last choice, so it
                // can carry the whole request's usage.
                if !c.finish.is_failure() {
                    out.push(
                        self.chunk(json!([{"index": i, "text": "", "logprobs": null,
                        "finish_reason": finish_reason(&c.finish)}]))
                            .to_string(),
                    );
                }
                let usage = self.include_usage.then_some(|u: &shoal_engine::Usage| {
                    json!({"id": self.id, "object": "text_completion", "created": self.created,
                        "model": self.model, "system_fingerprint": null, "choices": [],
                        "usage": usage_json(u)})
                });
                out.extend(self.progress.end(i, c, DIALECT, usage));
            }
        }
        out
    }
}

impl run::StreamRender for CompletionRenderer {
    fn frames(&mut self, choice: usize, ev: &Event) -> run::Step {
        let frames = self.step(choice, ev);
        run::Step {
            frames: frames.into_iter().map(|d| (None, d)).collect(),
            last: self.progress.all_ended(),
        }
    }

    /// A chunk of empty text for the first choice still running (clients
    /// append it as nothing). A choice echoing its prompt has not begun, so
    /// its echo still comes first, with its first event.
    fn heartbeat(&mut self) -> Vec<(Option<String>, String)> {
        let Some(i) = self.progress.running() else {
            return Vec::new();
        };
        let c =
            self.chunk(json!([{"index": i, "text": "", "logprobs": null, "finish_reason": null}]));
        vec![(None, c.to_string())]
    }
}

/// OpenAI legacy Completions's words for the engine's records.
pub const DIALECT: crate::dialect::Dialect = crate::dialect::Dialect(&crate::dialect::Described {
    ledger_name: "openai.completions",
    short_name: "completions",
    path_prefixes: &["/v1/completions"],
    generation_paths: &["/v1/completions"],
    model_paths: &["/v1/completions"],
    error_shape: ErrorShape::OPENAI,
    id_prefix: "cmpl-",
    transport: crate::dialect::Transport::PLAIN,
    finish_words: |f| {
        crate::dialect::FinishWords::one(crate::dialects::openai_words::finish_reason(f))
    },
    usage_json: crate::dialects::openai_words::usage_json,
    provider_meta: |p, f, _| p.finish_reason = f.map(|f| DIALECT.finish_words(f)),
});

/// The dialect as the server registers it: its words and its routes.
pub const REGISTERED: Registered = Registered::new(DIALECT, routes);

fn routes() -> axum::Router<crate::state::AppState> {
    use axum::routing::post;
    axum::Router::new().route("/v1/completions", post(run::serve::<Completions>))
}
