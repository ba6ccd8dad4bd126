//! A sixth dialect that exists only in tests, to hold the promise the
//! folder makes: a dialect is one module plus one line in `REGISTRY`. This
//! file is that module (its words, its request, its renderers, its routes)
//! and `REGISTRY` its one line; nothing else in the server names it. The
//! test below serves it on the real default model and finds it everywhere a
//! dialect shows: the ledger and its filters, `/v1/dialects`, `/metrics`,
//! its own error shape, its stream framing and the request's dialect layer.
//!
//! Its wire is made up: `POST /v1/echo` with `{"model", "say", "max_tokens",
//! "stream"}` answers `{"said", "why", "spent": {"in", "out"}}`; a stream is
//! NDJSON lines `{"said": …}` closed by one with `why` and `spent`.
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{ChatMessage, Event, FinishReason, SamplingParams, Usage};

use crate::dialect::{Described, Dialect, FinishWords};
use crate::dialects::registration::Registered;
use crate::error::{ApiError, ErrorShape};
use crate::run::{self, Collected, Generation, Step};
use crate::state::{AppState, Served};

/// The echo dialect's words for the engine's records.
pub const DIALECT: Dialect = Dialect(&Described {
    ledger_name: "test.echo",
    short_name: "echo",
    path_prefixes: &["/v1/echo"],
    generation_paths: &["/v1/echo"],
    model_paths: &["/v1/echo"],
    error_shape: ErrorShape::PLAIN,
    id_prefix: "echo-",
    transport: crate::dialect::Transport {
        framing: run::Framing::Ndjson,
        ..crate::dialect::Transport::PLAIN
    },
    finish_words: |f| FinishWords::one(why(f)),
    usage_json: spent,
    provider_meta: |_, _, _| {},
});

pub const REGISTERED: Registered = Registered::new(DIALECT, routes);

fn routes() -> Router<AppState> {
    Router::new().route("/v1/echo", post(run::serve::<Echo>))
}

/// A finish in the echo dialect's words.
fn why(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::StopSequence(_) => "done",
        FinishReason::Length | FinishReason::ContextWindow => "cut",
        _ => "other",
    }
}

/// Usage in the echo dialect's words.
fn spent(u: &Usage) -> Value {
    json!({"in": u.prompt_tokens, "out": u.completion_tokens})
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoRequest {
    model: String,
    say: String,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    stream: bool,
}
run::wire_request!(EchoRequest);

pub struct Echo;

impl run::Adapter for Echo {
    type Request = EchoRequest;
    type Stream = EchoStream;
    const DIALECT: Dialect = DIALECT;

    fn prepare(served: &Served, req: EchoRequest, _id: String) -> run::Prepared<Self> {
        let prompt = served.chat_prompt(
            &[ChatMessage::new("user", req.say)],
            None,
            None,
            &Default::default(),
        )?;
        let job = Generation {
            prompts: vec![prompt.tokens],
            max_tokens: req.max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop: Vec::new(),
            n: 1,
            reasoning: None,
            grammar: None,
            tools: None,
            cache_breakpoints: Vec::new(),
            images: Vec::new(),
        };
        Ok((job, Echo))
    }

    fn respond(self, _: &Served, collected: Vec<Collected>) -> Result<Value, ApiError> {
        let c = collected
            .first()
            .ok_or_else(|| ApiError::internal("no choice collected"))?;
        let done = c.completion();
        Ok(json!({"said": c.text, "why": why(&done.finish), "spent": spent(&done.usage)}))
    }

    fn stream(self, _: Served) -> EchoStream {
        EchoStream
    }
}

pub struct EchoStream;

impl run::StreamRender for EchoStream {
    fn frames(&mut self, _choice: usize, ev: &Event) -> Step {
        let (line, last) = match ev {
            Event::Delta { text, .. } => (Some(json!({"said": text})), false),
            Event::Done(c) => (
                Some(json!({"why": why(&c.finish), "spent": spent(&c.usage)})),
                true,
            ),
            _ => (None, false),
        };
        Step {
            frames: line.map(|l| (None, l.to_string())).into_iter().collect(),
            last,
        }
    }
}

// The test itself.

/// The default model, started on the backend `make test` names.
fn engine() -> shoal_engine::Engine {
    let path = std::env::var("SHOAL_TEST_GGUF")
        .expect("SHOAL_TEST_GGUF names the default model (make test sets it)");
    let backend = match std::env::var("SHOAL_TEST_BACKEND") {
        Ok(v) if !v.is_empty() => v.parse().expect("SHOAL_TEST_BACKEND"),
        _ => shoal_engine::BackendChoice::Mlx,
    };
    let opts = shoal_engine::EngineOptions {
        backend,
        ..shoal_engine::EngineOptions::default()
    };
    shoal_engine::Engine::start(std::path::Path::new(&path), "m", opts).expect("load")
}

async fn serve(state: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(crate::server::serve_until(
        listener,
        state,
        std::future::pending(),
    ));
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dialect_declared_in_one_module_is_served_recorded_and_listed_everywhere() {
    let base = serve(AppState::new(engine())).await;
    let http = reqwest::Client::new();
    let post = |body: Value| http.post(format!("{base}/v1/echo")).json(&body).send();

    // Its own request and answer, with usage in its own words.
    let said: Value =
        post(json!({"model": "m", "say": "What is the capital of France?", "max_tokens": 3}))
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
    assert_eq!(said["why"], "cut", "{said}");
    assert_eq!(said["spent"]["out"], 3, "{said}");
    let prompt_tokens = said["spent"]["in"].as_u64().expect("spent.in");
    assert!(prompt_tokens > 0, "{said}");

    // Its stream: NDJSON (its framing), the usage on the last line.
    let text = post(json!({"model": "m", "say": "What is the capital of France?", "max_tokens": 3, "stream": true}))
        .await
        .expect("send")
        .text()
        .await
        .expect("text");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
        .collect();
    let last = lines.last().expect("a closing line");
    assert_eq!(last["why"], "cut", "{text}");
    assert_eq!(last["spent"], said["spent"], "{text}");
    let streamed: String = lines.iter().filter_map(|l| l["said"].as_str()).collect();
    assert_eq!(streamed, said["said"].as_str().unwrap_or_default());

    // Bad input: a 400 in its error shape (Plain: `{"error": "…"}`),
    // found by the layer that attaches a request's dialect.
    let bad = post(json!({"model": "m"})).await.expect("send");
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().await.expect("json");
    assert!(
        err["error"].is_string(),
        "not the echo dialect's error shape: {err}"
    );

    // Listed for the UI.
    let get = |path: &str| {
        let req = http.get(format!("{base}{path}")).send();
        async move { req.await.expect("send").text().await.expect("text") }
    };
    let listed: Value = serde_json::from_str(&get("/v1/dialects").await).expect("json");
    let names: Vec<&str> = listed["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert!(names.contains(&"test.echo"), "{listed}");

    // Recorded in the ledger under its name, found by its short name and
    // its finish word, with the usage the client was sent.
    let usage: Value =
        serde_json::from_str(&get("/v1/usage?dialect=echo&finish=cut").await).expect("json");
    let rows = usage["data"].as_array().expect("data");
    assert_eq!(rows.len(), 2, "{usage}");
    for row in rows {
        assert_eq!(row["dialect"], "test.echo", "{row}");
        assert_eq!(row["finish_reasons"], json!(["cut"]), "{row}");
        // Its usage in its own words, as the client was sent it.
        assert_eq!(row["usage"], said["spent"], "{row}");
        assert_eq!(
            row["tokens"]["prompt"].as_u64(),
            Some(prompt_tokens),
            "{row}"
        );
    }

    // Counted by /metrics under its name.
    let metrics = get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("shoal_requests_total") && l.contains("dialect=\"test.echo\"")),
        "no echo requests in /metrics"
    );
}
