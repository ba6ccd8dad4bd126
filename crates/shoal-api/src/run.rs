//! Shared plumbing between HTTP handlers and the engine: submits one engine
//! request per choice, merges their events, cancels them when the client
//! leaves, and writes the ledger entry on every path.
use futures::StreamExt;
use shoal_engine::{CancelFlag, Completion, Event, FinishReason, GenerateRequest, SamplingParams};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::Instrument;

use crate::dialect::Dialect;
use crate::error::ApiError;
pub use crate::ids::{new_id, now_secs};
use crate::ledger::{LedgerEntry, Tracked};
pub use crate::sse::Framing;
use crate::state::Served;
use crate::wire;

/// What to generate, after a dialect has parsed and validated its request.
#[derive(Clone, Debug)]
pub struct Generation {
    /// One or more prompts; each gets `n` choices, indexed `prompt * n + choice`.
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub n: usize,
    pub reasoning: Option<shoal_engine::reasoning::ReasoningSpec>,
    /// Output grammar (structured output or a forced tool call).
    pub grammar: Option<shoal_engine::Grammar>,
    /// Parse tool calls in this syntax out of the reply.
    pub tools: Option<shoal_engine::tools::ToolSyntax>,
    /// Prefixes the client marked for caching (Anthropic's `cache_control`).
    pub cache_breakpoints: Vec<shoal_engine::CacheBreakpoint>,
    /// Where the (one) prompt's images sit in it.
    pub images: Vec<shoal_engine::vision::ImageSpan>,
}

/// The facts of a request its ledger entry keeps beside the engine's records.
pub struct LedgerFormat {
    pub id: String,
    pub dialect: Dialect,
    pub model: String,
    pub stream: bool,
    /// The request's facts and where to say it was recorded (absent when
    /// the handler runs outside the router, as in unit tests).
    pub tracked: Option<crate::ledger::Tracked>,
}

/// Merged events of all choices, tagged with the choice index.
pub struct Choices {
    pub rx: mpsc::UnboundedReceiver<(usize, Event)>,
    pub n: usize,
}

/// How often an idle stream writes an SSE comment. Writing is the only way to
/// notice that a client left while its request waits in the queue or prefills.
pub const KEEPALIVE: std::time::Duration = std::time::Duration::from_millis(500);

/// What a streamed request's channel gives next.
#[derive(Debug)]
pub enum Next {
    /// An event of choice `.0`.
    Event(usize, Event),
    /// Nothing for [`KEEPALIVE`]: the stream is quiet (queued, prefilling).
    Quiet,
}

impl Choices {
    /// Next event for a streaming response, writing SSE comments to `tx`
    /// while idle. `None` when the events end or the client is gone
    /// (dropping `self` then cancels the generation).
    pub async fn next_streamed(
        &mut self,
        tx: &mpsc::UnboundedSender<String>,
        framing: Framing,
    ) -> Option<Next> {
        tokio::select! {
            ev = self.rx.recv() => ev.map(|(i, ev)| Next::Event(i, ev)),
            // Without a keep-alive to write, the response body being
            // dropped (the connection closed) is the sign.
            _ = tx.closed() => None,
            _ = tokio::time::sleep(KEEPALIVE) => {
                match framing.keepalive() {
                    Some(k) if tx.send(k.to_string()).is_err() => None,
                    _ => Some(Next::Quiet),
                }
            }
        }
    }

    /// Waits for every choice to finish (non-streaming responses).
    pub async fn collect(mut self) -> Result<Vec<Collected>, ApiError> {
        let mut out: Vec<Collected> = (0..self.n).map(|_| Collected::default()).collect();
        let mut remaining = self.n;
        while let Some((i, ev)) = self.rx.recv().await {
            let Some(slot) = out.get_mut(i) else { continue };
            match ev {
                Event::Delta { text, logprobs } => {
                    slot.text.push_str(&text);
                    slot.logprobs.extend(logprobs);
                }
                Event::Reasoning { text } => slot.reasoning.push_str(&text),
                Event::ToolCallStart { name, .. } => slot.tool_calls.push(CollectedCall {
                    name,
                    arguments: String::new(),
                }),
                Event::ToolCallArgs { index, delta } => {
                    if let Some(call) = slot.tool_calls.get_mut(index) {
                        call.arguments.push_str(&delta);
                    }
                }
                Event::Done(c) => {
                    slot.completion = Some(c);
                    remaining -= 1;
                    if remaining == 0 {
                        break;
                    }
                }
                Event::Started { .. } => {}
            }
        }
        if out.iter().any(|c| c.completion.is_none()) {
            return Err(ApiError::internal(
                "the engine stopped before finishing the request",
            ));
        }
        Ok(out)
    }
}

/// What a dialect's stream renderer makes of one event: SSE frames (an
/// optional event name and the data) and whether the stream is over.
#[derive(Debug, Default)]
pub struct Step {
    pub frames: Vec<(Option<String>, String)>,
    pub last: bool,
}

/// How far each choice of a streamed request got, and how an OpenAI-style
/// stream closes once all have ended: the part of n-choice streaming that
/// Chat Completions and Completions share.
#[derive(Debug)]
pub struct ChoiceProgress {
    started: Vec<bool>,
    done: Vec<Option<Completion>>,
    /// Consecutive choices that share a prompt (the request's `n`).
    per_prompt: usize,
}

impl ChoiceProgress {
    pub fn new(choices: usize, per_prompt: usize) -> Self {
        ChoiceProgress {
            started: vec![false; choices],
            done: vec![None; choices],
            per_prompt,
        }
    }

    /// Whether this is choice `i`'s first event (it is marked begun).
    pub fn begin(&mut self, i: usize) -> bool {
        match self.started.get_mut(i) {
            Some(s) if !*s => {
                *s = true;
                true
            }
            _ => false,
        }
    }

    /// Whether choice `i` has ended (or does not exist).
    pub fn ended(&self, i: usize) -> bool {
        self.done.get(i).is_none_or(Option::is_some)
    }

    /// The first choice that has not ended, if any.
    pub fn running(&self) -> Option<usize> {
        self.done.iter().position(Option::is_none)
    }

    pub fn all_ended(&self) -> bool {
        self.done.iter().all(Option::is_some)
    }

    /// Records choice `i`'s end. When it was the last, the stream's closing
    /// data in dialect `d`: the first failed choice's error with the whole
    /// request's usage, else the usage chunk `usage` makes (when the client
    /// asked for one), then `[DONE]`.
    pub fn end(
        &mut self,
        i: usize,
        c: &Completion,
        d: Dialect,
        usage: Option<impl FnOnce(&shoal_engine::Usage) -> serde_json::Value>,
    ) -> Vec<String> {
        let Some(slot) = self.done.get_mut(i) else {
            return Vec::new();
        };
        *slot = Some(c.clone());
        if !self.all_ended() {
            return Vec::new();
        }
        let all: Vec<Completion> = self.done.iter().flatten().cloned().collect();
        let mut out = Vec::new();
        match (wire::failed(d, &all, self.per_prompt), usage) {
            (Some(err), _) => out.push(err.body(d.error_shape()).to_string()),
            (None, Some(make)) => {
                out.push(make(&wire::combined_usage(&all, self.per_prompt)).to_string())
            }
            (None, None) => {}
        }
        out.push("[DONE]".into());
        out
    }
}

/// A dialect's streaming half: pure, events in and frames out, so scripted
/// events can test it without an engine.
pub trait StreamRender: Send + 'static {
    /// The frames for event `ev` of choice `choice`.
    fn frames(&mut self, choice: usize, ev: &Event) -> Step;

    /// Called once the last frame went out (Responses stores the response).
    fn finished(&mut self) {}

    /// Frames that tell a client the request is alive when nothing else
    /// has gone out for a while: a dialect's own data event, which its SDK
    /// hands to the caller. An SSE comment is not enough: the SDKs drop
    /// comments before their iterators, and agents' stream-idle guards
    /// (Qwen Code's 240 s, Codex's 300 s) watch those iterators, so a long
    /// prefill would end the request. Empty: the dialect has no such event.
    fn heartbeat(&mut self) -> Vec<(Option<String>, String)> {
        Vec::new()
    }
}

/// Streams a request's events through `render` as an SSE response. Writes
/// keep-alive comments while idle, and the dialect's heartbeat when no data
/// went out for `heartbeat` (`None`: never); a client that leaves ends the
/// loop, and dropping `choices` then cancels the generation.
pub fn stream(
    mut choices: Choices,
    mut render: impl StreamRender,
    framing: Framing,
    heartbeat: Option<std::time::Duration>,
) -> axum::response::Response {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let send = |frames: &[(Option<String>, String)]| {
            frames
                .iter()
                .all(|(name, data)| tx.send(framing.frame(name.as_deref(), data)).is_ok())
        };
        let mut last_data = tokio::time::Instant::now();
        while let Some(next) = choices.next_streamed(&tx, framing).await {
            let mut step = match next {
                Next::Event(i, ev) => render.frames(i, &ev),
                Next::Quiet => Step::default(),
            };
            // Events that make no frames (a dialect without words for them,
            // such as reasoning in legacy Completions) leave a stream as
            // quiet as no events do.
            let due = heartbeat.is_some_and(|every| last_data.elapsed() >= every);
            if step.frames.is_empty() && !step.last && due {
                step.frames = render.heartbeat();
            }
            if !step.frames.is_empty() {
                last_data = tokio::time::Instant::now();
            }
            if !send(&step.frames) {
                return;
            }
            if step.last {
                render.finished();
                return;
            }
        }
    });
    crate::sse::framed_response(rx, framing)
}

/// What every dialect's request carries: the model it names and whether it
/// asks for a stream.
pub trait WireRequest: serde::de::DeserializeOwned + Send {
    fn model(&self) -> &str;
    fn stream(&self) -> bool;
}

/// Implements [`WireRequest`] for a request type with `model` and `stream` fields.
macro_rules! wire_request {
    ($t:ty) => {
        impl $crate::run::WireRequest for $t {
            fn model(&self) -> &str {
                &self.model
            }
            fn stream(&self) -> bool {
                self.stream
            }
        }
    };
}
pub(crate) use wire_request;

/// What [`Adapter::prepare`] makes of a request: the engine job and the
/// adapter that renders its reply (one name for the type every adapter returns).
pub type Prepared<A> = Result<(Generation, A), ApiError>;

/// A dialect's part in serving a generation request, as pure steps. The one
/// path in [`serve`] owns the rest: body parsing, the model lookup, the
/// engine start with its ledger entry, streaming or collecting, and the
/// error mapping into the dialect's shape. A new dialect is one impl.
pub trait Adapter: Sized + Send + 'static {
    /// The request as the wire carries it.
    type Request: WireRequest;
    /// The live stream's renderer.
    type Stream: StreamRender;
    /// Its dialect, which also gives its replies' id prefix and its
    /// streams' framing (every route of a dialect shares them).
    const DIALECT: Dialect;

    /// Wire request to engine job, validation included, plus what the
    /// rendering needs; `id` is the response's id.
    fn prepare(served: &Served, req: Self::Request, id: String) -> Prepared<Self>;
    /// The whole response body from every collected choice.
    fn respond(
        self,
        served: &Served,
        collected: Vec<Collected>,
    ) -> Result<serde_json::Value, ApiError>;
    /// Headers the response carries beside the dialect's own (what the
    /// server did with the request that the body has no word for).
    fn headers(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The renderer for the streamed response.
    fn stream(self, served: Served) -> Self::Stream;
}

/// Serves one generation request in dialect `A`.
pub async fn serve<A: Adapter>(
    axum::extract::State(state): axum::extract::State<crate::state::AppState>,
    tracked: Option<axum::Extension<crate::ledger::Tracked>>,
    body: crate::body::Body,
) -> Result<axum::response::Response, crate::error::DialectError> {
    let req: A::Request = crate::body::parse(&body).map_err(|e| e.in_dialect(A::DIALECT))?;
    serve_request::<A>(&state, tracked.map(|t| t.0), req).await
}

/// Serves a parsed generation request in dialect `A` (for a dialect whose
/// handler looks at the request first, as Ollama's does for load requests).
pub async fn serve_request<A: Adapter>(
    state: &crate::state::AppState,
    tracked: Option<crate::ledger::Tracked>,
    req: A::Request,
) -> Result<axum::response::Response, crate::error::DialectError> {
    use axum::response::IntoResponse;
    let answer = async {
        let streaming = req.stream();
        let model = req.model().to_string();
        let served = state.serve(&model).await?;
        if served.engine.model.embedding().is_some() {
            return Err(ApiError::param(
                "model",
                format!(
                    "model '{model}' is an embedding model; it cannot generate text. Send it \
                     to /v1/embeddings (or Ollama's /api/embed)"
                ),
            )
            .with_code("model_not_supported"));
        }
        let id = A::DIALECT.new_id();
        let (job, adapter) = A::prepare(&served, req, id.clone())?;
        let fmt = LedgerFormat {
            id,
            dialect: A::DIALECT,
            model,
            stream: streaming,
            tracked,
        };
        let headers = adapter.headers();
        let choices = start(&served, job, fmt)?;
        let mut response = if streaming {
            let heartbeat = state.access.stream_heartbeat;
            let render = adapter.stream(served);
            stream(choices, render, A::DIALECT.framing(), heartbeat)
        } else {
            let collected = choices.collect().await?;
            let body = adapter.respond(&served, collected)?;
            axum::Json(body).into_response()
        };
        for (name, value) in headers {
            if let Ok(v) = axum::http::HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, v);
            }
        }
        Ok::<_, ApiError>(response)
    };
    answer.await.map_err(|e| e.in_dialect(A::DIALECT))
}

/// Named frames (`event:` name and JSON data), as the Anthropic and
/// Responses renderers make them.
pub fn named(frames: Vec<(String, serde_json::Value)>) -> Vec<(Option<String>, String)> {
    frames
        .into_iter()
        .map(|(name, data)| (Some(name), data.to_string()))
        .collect()
}

/// One choice, fully generated.
#[derive(Default, Debug)]
pub struct Collected {
    pub text: String,
    pub reasoning: String,
    pub logprobs: Vec<shoal_engine::TokenLogprob>,
    pub tool_calls: Vec<CollectedCall>,
    pub completion: Option<Completion>,
}

/// A tool call as the model made it: name and arguments JSON text.
#[derive(Debug, Clone)]
pub struct CollectedCall {
    pub name: String,
    pub arguments: String,
}

impl Collected {
    pub fn completion(&self) -> &Completion {
        // `collect` guarantees every slot is filled.
        self.completion
            .as_ref()
            .expect("collected choice has a completion")
    }
}

/// Submits the job and starts the forwarding task.
pub fn start(state: &Served, job: Generation, fmt: LedgerFormat) -> Result<Choices, ApiError> {
    let per = job.n.max(1);
    let n = per * job.prompts.len();
    let (streams, flags) = submit(state, &job, &fmt)?;
    let span = request_span(state, &job, &fmt);
    // From here the request is the ledger's: it is recorded under this id
    // before its final event (the response carries the id in a header).
    if let Some(t) = &fmt.tracked {
        let _ = t.recorded.set(fmt.id.clone());
    }
    let forward = Forward {
        recorder: Recorder {
            ledger: state.ledger.clone(),
            metrics: state.metrics.clone(),
            backend: state.engine.model.info.backend.to_string(),
            created: now_secs(),
            per,
            fmt,
        },
        limit: state.access.request_timeout,
        // Registered so a server shutdown can end it with a proper final event.
        running: state.running.register(flags.clone()),
        flags,
    };
    // Readers of the id (a stored reply's usage) wait for its row until then.
    let pending = state.ledger.expect(&forward.recorder.fmt.id);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        async move {
            forward
                .run(futures::stream::select_all(streams), n, tx)
                .await;
            drop(pending);
        }
        .instrument(span),
    );
    Ok(Choices { rx, n })
}

type ChoiceStream = futures::stream::BoxStream<'static, (usize, Event)>;

/// One engine request per choice (seeds stepped so choices differ but
/// repeat), with their cancel flags; if one is refused, those already
/// submitted are cancelled.
fn submit(
    state: &Served,
    job: &Generation,
    fmt: &LedgerFormat,
) -> Result<(Vec<ChoiceStream>, Vec<CancelFlag>), ApiError> {
    let per = job.n.max(1);
    let n = per * job.prompts.len();
    let client = fmt.tracked.as_ref().and_then(|t| t.client.get().cloned());
    let cache_salt = state.access.cache_salt(client.as_deref());
    let mut streams = Vec::with_capacity(n);
    let mut flags = Vec::with_capacity(n);
    for i in 0..n {
        let mut sampling = job.sampling.clone();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add((i % per) as u64));
        let req = GenerateRequest {
            prompt: job.prompts[i / per].clone(),
            max_tokens: job.max_tokens,
            sampling,
            stop: job.stop.clone(),
            ignore_eos: false,
            cancel: CancelFlag::default(),
            reasoning: job.reasoning.clone(),
            grammar: job.grammar.clone(),
            tools: job.tools,
            cache_salt,
            cache_breakpoints: job.cache_breakpoints.clone(),
            images: job.images.clone(),
        };
        let flag = req.cancel.clone();
        match state.engine.submit(req) {
            Ok(rx) => {
                streams.push(
                    UnboundedReceiverStream::new(rx)
                        .map(move |ev| (i, ev))
                        .boxed(),
                );
                flags.push(flag);
            }
            Err(e) => {
                flags.iter().for_each(CancelFlag::cancel);
                return Err(e.into());
            }
        }
    }
    Ok((streams, flags))
}

/// One span per request; its outcome is recorded on it when it ends. The
/// prompts are logged in it when the server logs prompts.
fn request_span(state: &Served, job: &Generation, fmt: &LedgerFormat) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        id = %fmt.id,
        dialect = fmt.dialect.ledger_name(),
        model = %fmt.model,
        stream = fmt.stream,
        finish_reason = tracing::field::Empty,
        usage = tracing::field::Empty,
    );
    if state.log_prompts {
        for p in &job.prompts {
            let text = state
                .engine
                .model
                .vocab
                .decode(p, false)
                .unwrap_or_default();
            span.in_scope(|| tracing::info!(prompt = %text, "prompt"));
        }
    }
    span
}

/// Writes a request's ledger row, metrics and log line.
struct Recorder {
    ledger: std::sync::Arc<crate::ledger::Ledger>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    backend: String,
    created: u64,
    per: usize,
    fmt: LedgerFormat,
}

impl Recorder {
    fn record(&self, done: &[Option<Completion>]) {
        let fmt = &self.fmt;
        let entry = LedgerEntry {
            id: fmt.id.clone(),
            dialect: fmt.dialect,
            model: fmt.model.clone(),
            created: self.created,
            stream: fmt.stream,
            per_prompt: self.per,
            completions: done.iter().flatten().cloned().collect(),
            facts: fmt.tracked.as_ref().map(Tracked::facts).unwrap_or_default(),
            backend: self.backend.clone(),
            status: 200,
            error: None,
        };
        let finish_reasons = entry.finish_reasons();
        self.metrics.observe(&entry);
        let usage = wire::usage_json(fmt.dialect, &entry.usage());
        let first = entry.timings();
        let span = tracing::Span::current();
        span.record("finish_reason", tracing::field::debug(&finish_reasons));
        span.record("usage", tracing::field::display(&usage));
        tracing::info!(
            ttft_ms = first.ttft_ms,
            decode_tokens_per_s = first.decode_tokens_per_s,
            "request finished"
        );
        self.ledger.record(&entry);
    }
}

/// The forwarding task: merges the choices' events to the handler, cancels
/// them when the client leaves or the time limit passes, and records the
/// request before the last choice's final event goes out, so a client
/// that has seen the end finds its row.
struct Forward {
    recorder: Recorder,
    limit: Option<std::time::Duration>,
    running: crate::state::RunningGuard,
    flags: Vec<CancelFlag>,
}

impl Forward {
    async fn run(
        self,
        mut merged: futures::stream::SelectAll<ChoiceStream>,
        n: usize,
        tx: mpsc::UnboundedSender<(usize, Event)>,
    ) {
        let cancel = || self.flags.iter().for_each(CancelFlag::cancel);
        let mut done: Vec<Option<Completion>> = vec![None; n];
        let mut client_gone = false;
        let mut recorded = false;
        let deadline = self.limit.map(|l| tokio::time::Instant::now() + l);
        let mut timed_out = false;
        loop {
            let far = tokio::time::Instant::now() + std::time::Duration::from_secs(86_400);
            let next = tokio::select! {
                ev = merged.next() => ev,
                // A client that leaves while nothing is sent to it (its
                // request queued or reading its prompt) is noticed here, not
                // at the first token: the prefill stops at its next chunk and
                // what it read is kept for the prompt's next request.
                () = tx.closed(), if !client_gone => {
                    client_gone = true;
                    tracing::info!("client disconnected; cancelling generation");
                    cancel();
                    continue;
                }
                // Over the time limit: stop generating; the final events
                // below say why.
                () = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() && !timed_out => {
                    timed_out = true;
                    tracing::warn!("request over its time limit; stopping it");
                    cancel();
                    continue;
                }
            };
            let Some((i, mut ev)) = next else { break };
            if let (true, Event::Done(c)) = (timed_out, &mut ev) {
                if c.finish == FinishReason::Cancelled {
                    c.finish = FinishReason::Timeout {
                        limit_secs: self.limit.map_or(0, |l| l.as_secs()),
                    };
                }
            }
            if let Event::Done(c) = &ev {
                if let Some(slot) = done.get_mut(i) {
                    *slot = Some(c.clone());
                }
                if !recorded && done.iter().all(Option::is_some) {
                    self.recorder.record(&done);
                    recorded = true;
                }
            }
            if !client_gone && tx.send((i, ev)).is_err() {
                client_gone = true;
                tracing::info!("client disconnected; cancelling generation");
                cancel();
            }
        }
        drop(self.running);
        if !recorded {
            self.recorder.record(&done);
        }
    }
}

/// The first failed choice of a non-streamed response, as the error to
/// send, with the request's usage in `d`'s words beside it.
pub fn check_failed(
    d: Dialect,
    completions: &[Completion],
    per_prompt: usize,
) -> Result<(), ApiError> {
    match wire::failed(d, completions, per_prompt) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
