//! Usage and finish reasons in every dialect, streamed and not, for each
//! MLX architecture (the tiny mlx-lm-made models of tools/py/tiny_models.py),
//! as the recorder client reads them off the wire: the prompt tokens the
//! model's own template and tokenizer give, and the completion, reasoning
//! and finish of a direct engine run of the same prompt. gpt-oss's
//! analysis channel streams as reasoning in each dialect and keeps a budget.
mod common;

use std::path::PathBuf;

use serde_json::{json, Value};
use shoal_api::AppState;
use shoal_client::{Dialect, Message, Request, Target, TargetConfig};
use shoal_engine::prompt::chat_prompt;
use shoal_engine::{
    BackendChoice, ChatMessage, Completion, Engine, EngineOptions, Event, FinishReason,
    GenerateRequest, SamplingParams,
};

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";
const MAX_TOKENS: usize = 8;

fn tiny(name: &str) -> PathBuf {
    let root = std::env::var("SHOAL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache")));
    let p = root.join("models/tiny-v1").join(name);
    assert!(
        p.join("config.json").is_file(),
        "tiny model missing at {} — run `make models`",
        p.display()
    );
    p
}

fn engine(name: &str) -> Engine {
    Engine::start(
        &tiny(name),
        name,
        EngineOptions {
            backend: BackendChoice::Mlx,
            prefix_cache_bytes: 0,
            ..EngineOptions::default()
        },
    )
    .expect("engine")
}

/// The engine's own greedy run of `prompt`: what every dialect must report.
async fn direct(
    e: &Engine,
    prompt: Vec<u32>,
    spec: Option<shoal_engine::reasoning::ReasoningSpec>,
) -> Completion {
    let mut g = GenerateRequest::new(prompt);
    g.reasoning = spec;
    g.sampling = SamplingParams::greedy();
    g.max_tokens = Some(MAX_TOKENS);
    let mut rx = e.submit(g).expect("submit");
    while let Some(ev) = rx.recv().await {
        if let Event::Done(c) = ev {
            return c;
        }
    }
    panic!("the engine ended the stream without a final event")
}

/// The dialect's word for `finish`, and the metadata key it is under.
fn finish_word(d: Dialect, finish: &FinishReason) -> (&'static str, &'static str) {
    let length = *finish == FinishReason::Length;
    match d {
        Dialect::Chat | Dialect::Completions | Dialect::Ollama => {
            ("finish_reason", if length { "length" } else { "stop" })
        }
        Dialect::Responses => {
            if length {
                ("incomplete_reason", "max_output_tokens")
            } else {
                ("status", "completed")
            }
        }
        Dialect::Messages => (
            "stop_reason",
            if length { "max_tokens" } else { "end_turn" },
        ),
    }
}

async fn check(name: &str) {
    let e = engine(name);
    let vocab = e.model.vocab.clone();
    let msgs = [ChatMessage::new("user", QUESTION)];
    let chat = chat_prompt(&vocab, &msgs, None, None).expect("prompt");
    let chat_run = direct(&e, chat.tokens.clone(), chat.reasoning.clone()).await;
    let raw = vocab.encode(QUESTION).expect("encode");
    let raw_run = direct(&e, raw.clone(), None).await;
    let base = common::serve(AppState::new(e)).await;
    for dialect in common::recorder_dialects() {
        let (prompt, want) = match dialect {
            Dialect::Completions => (raw.len(), &raw_run),
            _ => (chat.tokens.len(), &chat_run),
        };
        for stream in [false, true] {
            let target = Target::new(TargetConfig {
                dialect,
                base_url: base.clone(),
                model: name.into(),
                api_key: None,
                headers: Vec::new(),
                stream,
                price: None,
            })
            .expect("target");
            let req = Request {
                messages: vec![Message {
                    role: "user".into(),
                    content: QUESTION.into(),
                    images: Vec::new(),
                }],
                max_tokens: Some(MAX_TOKENS as u64),
                temperature: Some(0.0),
                ..Request::default()
            };
            let reply = target.send(&req).await;
            let at = format!("{name} {dialect:?} stream={stream}");
            assert_eq!(reply.http_status, 200, "{at}: {reply:?}");
            let m = &reply.pieces[0].metadata;
            let n = |k: &str| m.get(k).and_then(Value::as_u64);
            assert_eq!(
                n("token_usage_prompt_tokens"),
                Some(prompt as u64),
                "{at}: {m:?}"
            );
            assert_eq!(
                n("token_usage_completion_tokens"),
                Some(want.usage.completion_tokens as u64),
                "{at}: {m:?}"
            );
            if let Some(r) = n("token_usage_reasoning_tokens") {
                assert_eq!(r, want.usage.reasoning_tokens as u64, "{at}: {m:?}");
            }
            let (key, word) = finish_word(dialect, &want.finish);
            assert_eq!(m.get(key), Some(&json!(word)), "{at}: {m:?}");
        }
    }
}

macro_rules! archs {
    ($($test:ident => $dir:literal,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            check($dir).await;
        }
    )*};
}

archs! {
    mistral_usage_and_finish_in_every_dialect => "mistral-f32",
    gemma3_usage_and_finish_in_every_dialect => "gemma3_text-f32",
    phi3_usage_and_finish_in_every_dialect => "phi3-f32",
    qwen3_moe_usage_and_finish_in_every_dialect => "qwen3_moe-q4",
    gpt_oss_usage_and_finish_in_every_dialect => "gpt_oss-f32",
}

async fn post(base: &str, path: &str, body: &Value) -> String {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    r.text().await.expect("body")
}

/// `data:` payloads of an SSE body, as JSON (the `[DONE]` line left out).
fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("json"))
        .collect()
}

/// gpt-oss asked to reason with a budget: the analysis channel is cut at
/// the budget, reported as reasoning tokens and streamed as reasoning in
/// Chat Completions, Anthropic Messages and Responses alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpt_oss_reasoning_streams_as_reasoning_and_keeps_its_budget() {
    let name = "gpt_oss-f32";
    let base = common::serve(AppState::new(engine(name))).await;
    let budget = 3;
    let msgs = json!([{"role": "user", "content": QUESTION}]);
    let chat = json!({"model": name, "messages": msgs, "temperature": 0, "max_tokens": 12,
                      "reasoning": {"max_tokens": budget}});
    let v: Value =
        serde_json::from_str(&post(&base, "/v1/chat/completions", &chat).await).expect("json");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], budget,
        "{v}"
    );
    let reasoning = v["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .expect("reasoning_content")
        .to_string();
    assert!(!reasoning.is_empty() && !reasoning.contains("<|"), "{v}");
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = events(&post(&base, "/v1/chat/completions", &streamed).await);
    let r: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(r, reasoning);
    assert_eq!(chunks.last().map(|c| &c["usage"]), Some(&v["usage"]));

    let anth = json!({"model": name, "max_tokens": 12, "messages": msgs, "temperature": 0,
                      "stream": true, "thinking": {"type": "enabled", "budget_tokens": budget}});
    let ev = events(&post(&base, "/v1/messages", &anth).await);
    let thinking: String = ev
        .iter()
        .filter_map(|e| e["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(thinking, reasoning);
    assert_eq!(
        ev.iter()
            .find(|e| e["type"] == "content_block_start")
            .map(|e| &e["content_block"]["type"]),
        Some(&json!("thinking"))
    );

    let resp = json!({"model": name, "input": QUESTION, "temperature": 0, "max_output_tokens": 12,
                      "stream": true, "reasoning": {"effort": "low"}});
    let ev = events(&post(&base, "/v1/responses", &resp).await);
    let done = ev
        .iter()
        .find(|e| e["type"] == "response.completed" || e["type"] == "response.incomplete")
        .expect("a final event");
    let rt = done["response"]["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(rt > 0, "{done}");
    assert!(
        ev.iter()
            .any(|e| e["type"] == "response.reasoning_text.delta"
                || e["type"] == "response.reasoning_summary_text.delta"),
        "no reasoning deltas"
    );
}
