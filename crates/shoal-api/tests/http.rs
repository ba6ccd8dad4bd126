//! HTTP tests against an in-process server on the real default model: raw
//! SSE framing and order, and a table of malformed requests per dialect.
mod common;

use std::sync::OnceLock;

use serde_json::{json, Value};
use shoal_api::AppState;
use shoal_engine::{Engine, EngineOptions};

const MODEL: &str = "smollm2";

fn engine() -> Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    // No prefix cache: these tests compare usage across identical requests.
    E.get_or_init(|| {
        let opts = EngineOptions {
            prefix_cache_bytes: 0,
            ..common::options()
        };
        Engine::start(&gguf(), MODEL, opts).expect("load")
    })
    .clone()
}

/// An engine of its own whose content filter blocks "Paris" (the greedy
/// answer to `france()`).
fn filtering_engine() -> Engine {
    Engine::start(
        &gguf(),
        MODEL,
        EngineOptions {
            prefix_cache_bytes: 0,
            blocked_phrases: vec!["Paris".into()],
            ..common::options()
        },
    )
    .expect("load")
}

/// Starts a server on a free port and returns its base URL.
/// An engine of its own on `path`, no prefix cache: the replies a test
/// compares each run alone (on llama.cpp a row batched with another test's
/// request may take the other side of a near tie).
fn alone(path: &std::path::Path) -> Engine {
    let opts = EngineOptions {
        prefix_cache_bytes: 0,
        ..common::options()
    };
    Engine::start(path, MODEL, opts).expect("load")
}

async fn server(engine: Engine) -> String {
    serve_state(AppState::new(engine)).await
}

/// A request's ledger entry through `/v1/usage/{id}`, which waits for a
/// request still winding down (a client that hung up is recorded once the
/// engine has stopped it) on the write itself, not on a clock.
async fn recorded(base: &str, id: &str) -> Value {
    let (status, text) = get_text(base, &format!("/v1/usage/{id}")).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).expect("json")
}

use common::{gguf, serve as serve_state};

/// Splits an SSE body into (event name, data) pairs.
fn sse(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push(d);
                }
            }
            (name, data)
        })
        // Comment-only blocks (keep-alives) carry no event.
        .filter(|(_, data)| !data.is_empty())
        .map(|(name, data)| (name, data.join("\n")))
        .collect()
}

async fn post(base: &str, path: &str, body: &str) -> (u16, String, reqwest::header::HeaderMap) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.text().await.expect("body"), headers)
}

fn france() -> Value {
    json!([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_sse_order_and_usage_only_when_asked() {
    let base = server(engine()).await;
    for include in [false, true] {
        let body = json!({"model": MODEL, "messages": france(), "temperature": 0, "max_tokens": 5,
                          "stream": true, "stream_options": {"include_usage": include}});
        let (status, text, headers) = post(&base, "/v1/chat/completions", &body.to_string()).await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-type"], "text/event-stream");
        let events = sse(&text);
        assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|(_, d)| serde_json::from_str(d).expect("json chunk"))
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let with_finish: Vec<&Value> = chunks
            .iter()
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .collect();
        assert_eq!(with_finish.len(), 1);
        assert_eq!(with_finish[0]["choices"][0]["finish_reason"], "length");
        if include {
            let last = chunks.last().expect("usage chunk");
            assert_eq!(last["choices"], json!([]));
            assert_eq!(last["usage"]["completion_tokens"], 5);
            assert_eq!(last["usage"]["prompt_tokens"], 42);
            for c in &chunks[..chunks.len() - 1] {
                assert!(
                    c["usage"].is_null(),
                    "usage must be null before the last chunk"
                );
                assert!(c.get("usage").is_some());
            }
        } else {
            for c in &chunks {
                assert!(c.get("usage").is_none(), "usage leaked: {c}");
            }
        }
    }
}

/// `ID:latest`, the name Ollama's `/api/tags` lists, names the model on the
/// other dialects' routes too (tools reuse it); an unknown name stays a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ollama_tag_names_the_model_on_every_route() {
    let base = server(engine()).await;
    let tagged = format!("{MODEL}:latest");
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": tagged, "messages": france(), "max_tokens": 2}),
        ),
        (
            "/v1/messages",
            json!({"model": tagged, "messages": france(), "max_tokens": 2}),
        ),
        (
            "/v1/responses",
            json!({"model": tagged, "input": "Hi", "max_output_tokens": 2}),
        ),
        (
            "/v1/completions",
            json!({"model": tagged, "prompt": "Hi", "max_tokens": 2}),
        ),
    ] {
        let (status, text, _) = post(&base, path, &body.to_string()).await;
        assert_eq!(status, 200, "{path}: {text}");
        let mut unknown = body.clone();
        unknown["model"] = json!("nosuchmodel:latest");
        let (status, text, _) = post(&base, path, &unknown.to_string()).await;
        assert_eq!(status, 404, "{path}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_and_responses_sse_order() {
    let base = server(engine()).await;
    let body = json!({"model": MODEL, "max_tokens": 20, "messages": france(), "temperature": 0,
                      "stream": true, "stop_sequences": ["Paris"]});
    let (status, text, _) = post(&base, "/v1/messages", &body.to_string()).await;
    assert_eq!(status, 200);
    let ev = sse(&text);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap_or("")).collect();
    assert_eq!(names[..3], ["message_start", "content_block_start", "ping"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(names[3..names.len() - 3]
        .iter()
        .all(|n| *n == "content_block_delta"));
    for (n, d) in &ev {
        let v: Value = serde_json::from_str(d).expect("json");
        assert_eq!(
            v["type"],
            n.as_deref().unwrap_or(""),
            "data type matches event name"
        );
    }
    let start: Value = serde_json::from_str(&ev[0].1).expect("json");
    assert_eq!(start["message"]["usage"]["input_tokens"], 42);
    let delta: Value = serde_json::from_str(&ev[ev.len() - 2].1).expect("json");
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], "Paris");
    assert_eq!(delta["usage"]["output_tokens"], 6);

    let body = json!({"model": MODEL, "input": "What is the capital of France? Answer in one sentence.", "max_output_tokens": 3,
                      "temperature": 0, "stream": true});
    let (status, text, _) = post(&base, "/v1/responses", &body.to_string()).await;
    assert_eq!(status, 200);
    let ev = sse(&text);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap_or("")).collect();
    assert_eq!(names[0], "response.created");
    assert_eq!(names[1], "response.in_progress");
    assert_eq!(*names.last().unwrap_or(&""), "response.incomplete");
    let last: Value = serde_json::from_str(&ev[ev.len() - 1].1).expect("json");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(last["response"]["usage"]["output_tokens"], 3);
    assert_eq!(last["response"]["usage"]["input_tokens"], 42);
    for (i, (_, d)) in ev.iter().enumerate() {
        let v: Value = serde_json::from_str(d).expect("json");
        assert_eq!(v["sequence_number"], i as u64);
    }
}

/// (path, body, expected status): bodies are raw text so malformed JSON can be sent.
fn openai_bad() -> Vec<(&'static str, String, u16)> {
    let m = MODEL;
    let chat = "/v1/chat/completions";
    let cmpl = "/v1/completions";
    let resp = "/v1/responses";
    vec![
        (chat, "{not json".into(), 400),
        (chat, "".into(), 400),
        (chat, "[1,2]".into(), 400),
        (chat, json!({"messages": france()}).to_string(), 400),
        (chat, json!({"model": m}).to_string(), 400),
        (chat, json!({"model": m, "messages": []}).to_string(), 400),
        (chat, json!({"model": "nope", "messages": france()}).to_string(), 404),
        (chat, json!({"model": m, "messages": "hi"}).to_string(), 400),
        (chat, json!({"model": m, "messages": [{"role": "wizard", "content": "x"}]}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "max_tokens": -3}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "max_completion_tokens": 0}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "max_tokens": "ten"}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "temperature": 5}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "top_p": 0}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "n": 0}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "top_k": -1}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "min_p": 5}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "repetition_penalty": -3}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": "x", "repetition_penalty": 0}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "stop": ["a", "b", "c", "d", "e"]}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "response_format": {"type": "json_schema", "json_schema": {}}}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "top_logprobs": 3}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "logit_bias": {"a": 1}}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "logit_bias": {"5": 150}}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "logit_bias": {"999999": -100}}).to_string(), 400),
        (chat, json!({"model": m, "messages": france(), "logit_bias": [1]}).to_string(), 400),
        (chat, json!({"model": m, "messages": [{"role": "user", "content": "x".repeat(40_000)}]}).to_string(), 400),
        (chat, json!({"model": m, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).to_string(), 400),
        (cmpl, json!({"model": m}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": ""}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": [999_999]}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": "x", "logprobs": 9}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": "x", "logit_bias": {"-3": 1}}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": "x", "top_p": 0}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": "x", "temperature": "hot"}).to_string(), 400),
        (cmpl, json!({"model": m, "prompt": "x", "max_tokens": 0}).to_string(), 400),
        (resp, json!({"model": m}).to_string(), 400),
        (resp, json!({"model": m, "input": []}).to_string(), 400),
        (resp, json!({"model": m, "input": "x", "previous_response_id": "resp_missing"}).to_string(), 400),
        (resp, json!({"model": m, "input": "x", "max_output_tokens": 0}).to_string(), 400),
        (resp, json!({"model": m, "input": "x", "max_output_tokens": -7}).to_string(), 400),
        ("/v1/nope", "{}".into(), 404),
    ]
}

fn anthropic_bad() -> Vec<(&'static str, String, u16)> {
    let m = MODEL;
    let msgs = "/v1/messages";
    vec![
        (msgs, "{oops".into(), 400),
        (msgs, "".into(), 400),
        (msgs, "42".into(), 400),
        (msgs, json!({"max_tokens": 5, "messages": france()}).to_string(), 400),
        (msgs, json!({"model": m, "messages": france()}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": []}).to_string(), 400),
        (msgs, json!({"model": "claude-nope", "max_tokens": 5, "messages": france()}).to_string(), 404),
        (msgs, json!({"model": m, "max_tokens": 0, "messages": france()}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": -1, "messages": france()}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": france(), "temperature": 1.5}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": [{"role": "user"}]}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": france(), "stop_sequences": "x"}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": france(), "stop_sequences": [""]}).to_string(), 400),
        (msgs, json!({"model": m, "max_tokens": 5, "messages": [{"role": "user", "content": "x".repeat(40_000)}]}).to_string(), 400),
        ("/v1/messages/count_tokens", json!({"model": m}).to_string(), 400),
        ("/v1/messages/count_tokens", json!({"model": "nope", "messages": france()}).to_string(), 404),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_table_openai_then_still_serving() {
    let base = server(engine()).await;
    let cases = openai_bad();
    assert!(cases.len() >= 15);
    for (path, body, want) in &cases {
        let (status, text, _) = post(&base, path, body).await;
        assert_eq!(status, *want, "{path} {body:.80} -> {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(!msg.is_empty(), "error without message: {text}");
        assert!(v["error"]["type"].is_string(), "OpenAI error shape: {text}");
        assert!(
            v["error"].get("param").is_some() && v["error"].get("code").is_some(),
            "{text}"
        );
        // Only a generation that ran reports usage beside its error.
        assert!(v.get("usage").is_none(), "{text}");
    }
    let body = json!({"model": MODEL, "messages": france(), "temperature": 0});
    let (status, text, _) = post(&base, "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_table_anthropic_then_still_serving() {
    let base = server(engine()).await;
    let cases = anthropic_bad();
    assert!(cases.len() >= 15);
    for (path, body, want) in &cases {
        let (status, text, _) = post(&base, path, body).await;
        assert_eq!(status, *want, "{path} {body:.80} -> {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        assert_eq!(v["type"], "error", "{text}");
        let kind = if *want == 404 {
            "not_found_error"
        } else {
            "invalid_request_error"
        };
        assert_eq!(v["error"]["type"], kind, "{text}");
        assert!(!v["error"]["message"].as_str().unwrap_or("").is_empty());
        assert!(v.get("usage").is_none(), "{text}");
    }
    let body = json!({"model": MODEL, "max_tokens": 3, "temperature": 0, "messages": france()});
    let (status, text, _) = post(&base, "/v1/messages", &body.to_string()).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_overflow_is_429_and_529_with_retry_after() {
    let small = Engine::start(
        &gguf(),
        MODEL,
        EngineOptions {
            queue_capacity: 1,
            // One running at a time: the second request stays queued until
            // the first ends, whatever the timing.
            max_batch: 1,
            prefix_cache_bytes: 0,
            ..common::options()
        },
    )
    .expect("load");
    // Occupy the engine deterministically: one long generation running, one waiting.
    let long = |n: u32| {
        let mut r = shoal_engine::GenerateRequest::new((1..=n).collect());
        r.max_tokens = Some(2000);
        r.ignore_eos = true;
        r
    };
    let mut running = small.submit(long(20)).expect("first");
    while !matches!(
        running.recv().await,
        Some(shoal_engine::Event::Started { .. })
    ) {}
    let waiting = small.submit(long(21)).expect("second waits in the queue");
    let base = server(small.clone()).await;
    let chat = json!({"model": MODEL, "messages": france(), "max_tokens": 5});
    let (s1, t1, h1) = post(&base, "/v1/chat/completions", &chat.to_string()).await;
    let anth = json!({"model": MODEL, "max_tokens": 5, "messages": france()});
    let (s2, t2, h2) = post(&base, "/v1/messages", &anth.to_string()).await;
    assert_eq!(s1, 429, "{t1}");
    assert_eq!(h1["retry-after"], "1");
    let v: Value = serde_json::from_str(&t1).expect("json");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(s2, 529, "{t2}");
    assert_eq!(h2["retry-after"], "1");
    let v: Value = serde_json::from_str(&t2).expect("json");
    assert_eq!(v["error"]["type"], "overloaded_error");
    // Once the engine frees up, the same request is served.
    drop(running);
    drop(waiting);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (s, t, _) = post(&base, "/v1/chat/completions", &chat.to_string()).await;
        if s == 200 {
            break;
        }
        assert_eq!(s, 429, "{t}");
        assert!(
            std::time::Instant::now() < deadline,
            "engine never freed up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `logit_bias` banning the model's end-of-turn tokens, so a reply runs to its
/// token limit whatever the batch it decodes in (batched and single-row
/// logits differ in the last bits, and a greedy path can turn on them).
use common::no_eos;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_bans_tokens_and_the_finish_says_so() {
    let engine = engine();
    let base = server(engine.clone()).await;
    // Unbiased, the greedy answer ends its turn; with the end-of-turn tokens
    // banned it runs to the limit, and the finish and count say so.
    for (bias, finish, tokens) in [
        (json!({}), "stop", None),
        (no_eos(&engine), "length", Some(40)),
    ] {
        let body = json!({"model": MODEL, "messages": france(), "temperature": 0, "max_tokens": 40,
                          "logit_bias": bias});
        let (status, text, _) = post(&base, "/v1/chat/completions", &body.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["choices"][0]["finish_reason"], finish, "{text}");
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .expect("text");
        assert!(
            content.starts_with("The capital of France is Paris."),
            "{text}"
        );
        if let Some(n) = tokens {
            assert_eq!(v["usage"]["completion_tokens"], n, "{text}");
        }
    }
    // A banned word never appears: ban the first token of the greedy reply
    // on the legacy endpoint, and the reply starts differently.
    let prompt = "The capital of France is";
    let greedy = |bias: Value| {
        json!({"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 1,
                                      "logit_bias": bias})
    };
    let (status, text, _) = post(&base, "/v1/completions", &greedy(json!({})).to_string()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    let first = v["choices"][0]["text"].as_str().expect("text").to_string();
    let ids = engine.model.vocab.encode_plain(&first).expect("encode");
    assert_eq!(ids.len(), 1, "{first:?} is one token");
    let ban = json!({ids[0].to_string(): -100});
    let (status, text, _) = post(&base, "/v1/completions", &greedy(ban).to_string()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_ne!(v["choices"][0]["text"], first.as_str(), "{text}");
    assert_eq!(v["usage"]["completion_tokens"], 1, "{text}");
}

/// Starts a long streamed chat, reads its first chunk and hangs up; returns
/// the request's ledger id.
async fn leave_after_first_chunk(base: &str) -> String {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Count to one hundred in words."}],
                      "max_tokens": 300, "temperature": 0, "stream": true,
                      "logit_bias": no_eos(&engine())});
    common::leave_after_first_chunk(base, &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_stream_is_cancelled_in_ledger() {
    let base = server(engine()).await;
    let id = leave_after_first_chunk(&base).await;
    let e = recorded(&base, &id).await;
    assert_eq!(e["id"], id.as_str());
    assert_eq!(e["finish_reasons"], json!(["cancelled"]), "{e}");
    // An id the ledger neither holds nor expects is a 404 at once.
    let (status, text) = get_text(&base, "/v1/usage/chatcmpl-never-sent").await;
    assert_eq!(status, 404, "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("chatcmpl-never-sent")),
        "{v}"
    );
    let done = e["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!(
        done < 300,
        "generation was not stopped early ({done} tokens)"
    );
}

/// A client that hangs up while its long prompt is still being read (its
/// request admitted, no token out) stops the prefill at the end of the chunk
/// in progress: nothing is generated, and what was read is kept, so the same
/// prompt sent again starts from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_during_prefill_stops_it_and_keeps_what_was_read() {
    // Its own engine, with the prefix cache.
    let engine = Engine::start(&gguf(), MODEL, common::options()).expect("load");
    let base = server(engine).await;
    // Over two prefill chunks (2,048 tokens each).
    let rows: Vec<String> = (0..480)
        .map(|i| format!("item{i} weighs {} kg.", i * 7 % 13))
        .collect();
    let ask = format!("{}\nWhich item weighs the most?", rows.join(" "));
    let body = |stream: bool| {
        json!({"model": MODEL, "messages": [{"role": "user", "content": ask}],
               "max_tokens": 1, "temperature": 0, "stream": stream})
    };
    let (id, resp) = common::open_stream(&base, &body(true)).await;
    // Hang up once the engine runs the request: it is reading its prompt
    // (the deadline only guards against a hang).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (_, t) = get_text(&base, "/health").await;
        let h: Value = serde_json::from_str(&t).expect("json");
        if h["engine"]["running"] == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never admitted: {h}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(resp);
    let e = recorded(&base, &id).await;
    assert_eq!(e["finish_reasons"], json!(["cancelled"]), "{e}");
    assert_eq!(
        e["usage"]["completion_tokens"], 0,
        "the prefill ran on to a token: {e}"
    );
    let prompt = e["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    assert!(prompt > 2 * 2048, "{e}");
    // The same prompt again reads the kept chunks from the cache.
    let (s, t, _) = post(&base, "/v1/chat/completions", &body(false).to_string()).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["usage"]["prompt_tokens"], prompt, "{v}");
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached >= 2048 && cached < prompt,
        "cached {cached} of {prompt}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_413_in_each_dialect() {
    let base = server(engine()).await;
    let huge = format!(
        "{{\"model\": \"{MODEL}\", \"pad\": \"{}\"}}",
        "x".repeat(shoal_api::access::Access::default().max_body_bytes + 10)
    );
    let (s, t, _) = post(&base, "/v1/chat/completions", &huge).await;
    assert_eq!(s, 413, "{t:.200}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["error"]["code"], "request_too_large");
    let (s, t, _) = post(&base, "/v1/messages", &huge).await;
    assert_eq!(s, 413);
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["error"]["type"], "request_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_filter_in_every_dialect_with_usage() {
    let filtered = filtering_engine();
    let base = server(filtered).await;
    let chat = json!({"model": MODEL, "messages": france(), "temperature": 0, "max_tokens": 20});
    let (s, t, _) = post(&base, "/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is "
    );
    assert_eq!(
        v["usage"]["completion_tokens"], 6,
        "tokens spent before the filter fired still count"
    );
    assert_eq!(v["usage"]["prompt_tokens"], 42);

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (_, t, _) = post(&base, "/v1/chat/completions", &streamed.to_string()).await;
    let ev = sse(&t);
    let fin: Vec<Value> = ev
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str::<Value>(d).expect("json"))
        .collect();
    assert!(fin
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "content_filter"));
    assert_eq!(fin.last().expect("usage")["usage"]["completion_tokens"], 6);

    let anth = json!({"model": MODEL, "max_tokens": 20, "messages": france(), "temperature": 0});
    let (_, t, _) = post(&base, "/v1/messages", &anth.to_string()).await;
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["stop_reason"], "refusal");
    assert_eq!(v["usage"]["output_tokens"], 6);

    let resp = json!({"model": MODEL, "input": "What is the capital of France? Answer in one sentence.", "temperature": 0});
    let (_, t, _) = post(&base, "/v1/responses", &resp.to_string()).await;
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "content_filter");
    assert_eq!(v["usage"]["output_tokens"], 6);

    let cmpl = json!({"model": MODEL, "prompt": "The capital of France is", "temperature": 0, "max_tokens": 5});
    let (_, t, _) = post(&base, "/v1/completions", &cmpl.to_string()).await;
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(v["choices"][0]["text"], " ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_filter_regex_on_the_real_model() {
    let filtered = Engine::start(
        &gguf(),
        MODEL,
        EngineOptions {
            prefix_cache_bytes: 0,
            blocked_patterns: vec![r"\bP[a-z]+s\b".into()],
            ..common::options()
        },
    )
    .expect("load");
    let base = server(filtered).await;
    let chat = json!({"model": MODEL, "messages": france(), "temperature": 0, "max_tokens": 20});
    let (s, t, _) = post(&base, "/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is "
    );
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let bad = Engine::start(
        &gguf(),
        MODEL,
        EngineOptions {
            blocked_patterns: vec!["(oops".into()],
            ..common::options()
        },
    );
    assert!(bad.is_err_and(|e| e.to_string().contains("(oops")));
}

/// The server opens the thinking section for a model with `</think>` but no
/// switch of its own, so a budget of N gives exactly N reasoning tokens
/// (the real 135M weights, given that token: `common::think_gguf`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_budget_is_exact_in_every_dialect() {
    let alone = alone(&common::think_gguf());
    let base = server(alone).await;
    let budget = 5;
    let chat = json!({"model": MODEL, "messages": france(), "temperature": 0, "max_tokens": 30,
                      "reasoning": {"max_tokens": budget}});
    let (s, t, _) = post(&base, "/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], budget);
    assert!(
        u["completion_tokens"].as_u64() > Some(budget),
        "the answer follows the closed section"
    );
    let reasoning = v["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .expect("reasoning_content");
    assert!(
        !reasoning.is_empty() && !reasoning.contains("<think>") && !reasoning.contains("</think>")
    );
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(!content.contains("</think>"));

    // Streaming: reasoning deltas first, then content; usage identical to non-streamed.
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (_, t, _) = post(&base, "/v1/chat/completions", &streamed.to_string()).await;
    let chunks: Vec<Value> = sse(&t)
        .into_iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(&d).expect("json"))
        .collect();
    let r: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    let c: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(r, reasoning);
    assert_eq!(c, content);
    assert_eq!(&chunks.last().expect("usage")["usage"], u);

    // Anthropic: a thinking block before the text block; output_tokens covers both.
    let anth = json!({"model": MODEL, "max_tokens": 30, "messages": france(), "temperature": 0,
                      "thinking": {"type": "enabled", "budget_tokens": budget}});
    let (_, t, _) = post(&base, "/v1/messages", &anth.to_string()).await;
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["content"][0]["type"], "thinking");
    assert_eq!(v["content"][0]["thinking"], reasoning);
    assert_eq!(v["content"][1]["type"], "text");
    let mut anth_stream = anth.clone();
    anth_stream["stream"] = json!(true);
    let (_, t, _) = post(&base, "/v1/messages", &anth_stream.to_string()).await;
    let ev = sse(&t);
    let starts: Vec<Value> = ev
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
        .map(|(_, d)| serde_json::from_str::<Value>(d).expect("json"))
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["content_block"]["type"], "thinking");
    assert_eq!(starts[1]["content_block"]["type"], "text");
    assert_eq!(starts[1]["index"], 1);
    let delta: Value = serde_json::from_str(&ev[ev.len() - 2].1).expect("json");
    assert_eq!(delta["usage"]["output_tokens"], v["usage"]["output_tokens"]);
    let bad = json!({"model": MODEL, "max_tokens": 5, "messages": france(),
                     "thinking": {"type": "enabled", "budget_tokens": 5}});
    let (s, _, _) = post(&base, "/v1/messages", &bad.to_string()).await;
    assert_eq!(s, 400, "budget must be below max_tokens");

    // Responses: a reasoning item before the message, reasoning_tokens in usage.
    let resp = json!({"model": MODEL, "input": "What is the capital of France? Answer in one sentence.", "temperature": 0,
                      "max_output_tokens": 30, "reasoning": {"effort": "low"}});
    let (_, t, _) = post(&base, "/v1/responses", &resp.to_string()).await;
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["output"][0]["type"], "reasoning");
    let rt = v["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(rt > 0 && rt <= v["usage"]["output_tokens"].as_u64().unwrap_or(0));
}

/// A model that cannot reason (no thinking switch, no `</think>` token)
/// asked for reasoning answers exactly as it does unasked, in every dialect,
/// streamed or not: no section is opened, nothing counts as reasoning.
/// Ollama's `think` is refused instead, as Ollama refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_reason_answers_normally_when_asked_to() {
    let alone = alone(&gguf());
    let base = server(alone).await;
    let (_, t) = get_text(&base, "/v1/models").await;
    let models: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(
        models["data"][0]["shoal"]["capabilities"]["reasoning"], false,
        "{models}"
    );
    let plain = json!({"model": MODEL, "messages": france(), "temperature": 0, "max_tokens": 30});
    let (s, t, _) = post(&base, "/v1/chat/completions", &plain.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    let answer = v["choices"][0]["message"]["content"].clone();
    let completion = v["usage"]["completion_tokens"].clone();
    assert!(answer.as_str().is_some_and(|a| a.contains("Paris")), "{v}");

    for ask in [
        json!({"reasoning_effort": "medium"}),
        json!({"reasoning": {"max_tokens": 5}}),
        json!({"reasoning": {"effort": "high"}}),
    ] {
        for stream in [false, true] {
            let mut body = plain.clone();
            for (k, val) in ask.as_object().expect("object") {
                body[k] = val.clone();
            }
            if stream {
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
            }
            let (s, t, _) = post(&base, "/v1/chat/completions", &body.to_string()).await;
            assert_eq!(s, 200, "{ask}: {t}");
            let (content, reasoning, usage) = if stream {
                let chunks: Vec<Value> = sse(&t)
                    .into_iter()
                    .filter(|(_, d)| d != "[DONE]")
                    .map(|(_, d)| serde_json::from_str(&d).expect("json"))
                    .collect();
                let pick = |k: &str| -> String {
                    chunks
                        .iter()
                        .filter_map(|c| c["choices"][0]["delta"][k].as_str())
                        .collect()
                };
                (
                    json!(pick("content")),
                    pick("reasoning_content"),
                    chunks.last().expect("usage")["usage"].clone(),
                )
            } else {
                let v: Value = serde_json::from_str(&t).expect("json");
                let m = &v["choices"][0]["message"];
                (
                    m["content"].clone(),
                    m["reasoning_content"].as_str().unwrap_or("").to_string(),
                    v["usage"].clone(),
                )
            };
            assert_eq!(content, answer, "{ask} stream={stream}");
            assert_eq!(reasoning, "", "{ask} stream={stream}");
            assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 0);
            assert_eq!(
                usage["completion_tokens"], completion,
                "{ask} stream={stream}"
            );
        }
    }

    // Anthropic: `thinking` enabled gives no thinking block, only the answer.
    let anth = json!({"model": MODEL, "max_tokens": 30, "messages": france(), "temperature": 0,
                      "thinking": {"type": "enabled", "budget_tokens": 5}});
    let (s, t, _) = post(&base, "/v1/messages", &anth.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    let blocks = v["content"].as_array().expect("content");
    assert_eq!(blocks.len(), 1, "{v}");
    assert_eq!(
        (&blocks[0]["type"], &blocks[0]["text"]),
        (&json!("text"), &answer)
    );
    assert_eq!(v["usage"]["output_tokens"], completion);
    let mut anth_stream = anth.clone();
    anth_stream["stream"] = json!(true);
    let (_, t, _) = post(&base, "/v1/messages", &anth_stream.to_string()).await;
    let kinds: Vec<Value> = sse(&t)
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).expect("json")["content_block"]["type"].clone()
        })
        .collect();
    assert_eq!(kinds, [json!("text")], "{t}");
    // The whole block is ignored, Anthropic's budget rule included: Qwen
    // Code sends a budget of 32000 with a max_tokens of 4000.
    let qwen_code = json!({"model": MODEL, "max_tokens": 30, "messages": france(), "temperature": 0,
                           "thinking": {"type": "enabled", "budget_tokens": 32000}});
    let (s, t, _) = post(&base, "/v1/messages", &qwen_code.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v["content"][0]["text"], answer);

    // Responses: no reasoning item, reasoning_tokens 0.
    for stream in [false, true] {
        let resp = json!({"model": MODEL, "input": "What is the capital of France? Answer in one sentence.",
                          "temperature": 0, "max_output_tokens": 30, "reasoning": {"effort": "low"},
                          "stream": stream});
        let (s, t, _) = post(&base, "/v1/responses", &resp.to_string()).await;
        assert_eq!(s, 200, "{t}");
        let v: Value = if stream {
            let done = sse(&t)
                .into_iter()
                .find(|(n, _)| n.as_deref() == Some("response.completed"))
                .expect("response.completed");
            serde_json::from_str::<Value>(&done.1).expect("json")["response"].clone()
        } else {
            serde_json::from_str(&t).expect("json")
        };
        let types: Vec<&Value> = v["output"]
            .as_array()
            .expect("output")
            .iter()
            .map(|o| &o["type"])
            .collect();
        assert_eq!(types, [&json!("message")], "stream={stream}: {v}");
        assert_eq!(v["output"][0]["content"][0]["text"], answer);
        assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    }

    // Ollama's contract: `think` on a model that cannot think is a 400.
    let (s, t, _) = post(
        &base,
        "/api/chat",
        &json!({"model": MODEL, "messages": france(), "think": true, "stream": false}).to_string(),
    )
    .await;
    assert_eq!(s, 400, "{t}");
    assert!(t.contains("does not support thinking"), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_lists_this_node_with_live_figures_and_the_ui_is_served() {
    let base = server(engine()).await;
    let c = reqwest::Client::new();
    let v: Value = c
        .get(format!("{base}/v1/cluster/nodes"))
        .send()
        .await
        .expect("nodes")
        .json()
        .await
        .expect("json");
    let nodes = v["nodes"].as_array().expect("nodes array");
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n["self"], true);
    assert_eq!(n["status"], "online");
    assert_eq!(n["address"], base.trim_start_matches("http://"));
    assert!(n["memory"]["total_bytes"].as_u64().is_some_and(|t| t > 0));
    assert!(n["memory"]["used_bytes"].as_u64().is_some_and(|u| u > 0));
    assert!(n["cpu"]["cores"].as_u64().is_some_and(|c| c > 0));
    assert!(n["models"][0]["memory_bytes"]
        .as_u64()
        .is_some_and(|b| b > 1 << 20));
    // Live figures: other tests share this engine, so only their presence
    // is certain here.
    assert!(n["requests"]["queued"].is_u64(), "{n}");

    // `/` and UI routes are the web page (to a browser); unknown API paths
    // stay JSON 404s.
    for path in ["/", "/chat/some-conversation"] {
        let r = c
            .get(format!("{base}{path}"))
            .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
            .send()
            .await
            .expect("page");
        assert_eq!(r.status(), 200, "{path}");
        let ct = r.headers()["content-type"]
            .to_str()
            .unwrap_or_default()
            .to_string();
        assert!(ct.starts_with("text/html"), "{path}: {ct}");
    }
    let r = c.get(format!("{base}/v1/nope")).send().await.expect("404");
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.expect("json error");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("/v1/nope")));
    let r = c
        .get(format!("{base}/missing.js"))
        .send()
        .await
        .expect("404");
    assert_eq!(r.status(), 404);
}

/// Shutting the server down cancels a streaming generation: the stream ends
/// with its final chunk and `[DONE]`, and the server returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_with_their_final_event() {
    use futures::StreamExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(shoal_api::serve_until(
        listener,
        AppState::new(engine()),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let body = json!({"model": engine().model.id, "stream": true, "max_tokens": 2000, "temperature": 0,
                      "messages": [{"role": "user", "content": "Write a long story about a dragon."}]});
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("request");
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    // Wait for the first content, then shut down.
    while !text.contains("\"content\"") {
        let chunk = stream.next().await.expect("chunk").expect("bytes");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let _ = stop_tx.send(());
    let rest = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(Ok(chunk)) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(rest.is_ok(), "the stream did not end after shutdown");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        text.contains("\"finish_reason\":\"stop\""),
        "a final chunk: {text}"
    );
    let done = tokio::time::timeout(std::time::Duration::from_secs(20), server).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "server did not return");
}

/// Starts a server with a fresh conversation store; returns its base URL.
async fn server_with_store(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("shoal-http-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let state = AppState::new(engine())
        .with_store(&dir.join("store.sqlite"), Default::default())
        .expect("store");
    serve_state(state).await
}

async fn send(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut r = reqwest::Client::new().request(method, url);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_store_replies_with_the_ledger_metadata_not_the_clients() {
    use reqwest::Method;
    let base = server_with_store("conv").await;
    let (st, conv) = send(
        Method::POST,
        format!("{base}/v1/conversations"),
        Some(json!({"settings": {"model": MODEL, "stop": ["."]}})),
    )
    .await;
    assert_eq!(st, 200, "{conv}");
    let cid = conv["id"].as_i64().expect("id");
    let (st, user) = send(
        Method::POST,
        format!("{base}/v1/conversations/{cid}/messages"),
        Some(json!({"role": "user", "content": "What is the capital of France? Answer in one sentence."})),
    )
    .await;
    assert_eq!((st, user["role"].as_str()), (200, Some("user")), "{user}");

    // A streamed reply cut by a stop sequence, then stored with forged keys.
    let (_, body, _) = post(
        &base,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                "max_tokens": 40, "temperature": 0, "stop": ["."], "stream": true,
                "stream_options": {"include_usage": true}})
        .to_string(),
    )
    .await;
    let events = sse(&body);
    let chunks: Vec<Value> = events
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(d).expect("json"))
        .collect();
    let rid = chunks[0]["id"].as_str().expect("id").to_string();
    let usage = chunks.last().expect("usage chunk")["usage"].clone();
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .expect("finish")
        .to_string();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let (st, reply) = send(
        Method::POST,
        format!("{base}/v1/conversations/{cid}/messages"),
        Some(
            json!({"role": "assistant", "content": text, "response_id": rid,
                    "metadata": {"finish_reason": "forged", "token_usage_prompt_tokens": 1,
                                 "token_usage_made_up": 7, "ttft_ms": 0.5, "run": "r1"}}),
        ),
    )
    .await;
    assert_eq!(st, 200, "{reply}");
    let meta = &reply["pieces"][0]["metadata"];
    assert_eq!(meta["finish_reason"], json!(finish), "{meta}");
    assert_eq!(meta["finish_reason"], "stop");
    assert_eq!(meta["engine_finish_reason"], "stop_sequence");
    assert_eq!(meta["stop_sequence"], ".");
    assert_eq!(meta["token_usage_prompt_tokens"], usage["prompt_tokens"]);
    assert_eq!(
        meta["token_usage_completion_tokens"],
        usage["completion_tokens"]
    );
    assert_eq!(meta["token_usage_total_tokens"], usage["total_tokens"]);
    assert_eq!(
        meta["token_usage_cached_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"]
    );
    assert!(meta.get("token_usage_made_up").is_none(), "{meta}");
    assert_ne!(meta["ttft_ms"], 0.5, "server keys are the server's");
    assert_eq!(meta["run"], "r1", "the client's own keys are kept");
    assert_eq!(meta["response_id"], json!(rid));
    assert_eq!(reply["target"], "openai.chat");
    assert_eq!(reply["model"], MODEL);

    // An unknown response id stores no provider keys at all (absent, not 0).
    let (st, orphan) = send(
        Method::POST,
        format!("{base}/v1/conversations/{cid}/messages"),
        Some(
            json!({"role": "assistant", "content": "", "response_id": "chatcmpl-none",
                    "error": "network down", "metadata": {"finish_reason": "stop"}}),
        ),
    )
    .await;
    assert_eq!(st, 200, "{orphan}");
    assert_eq!(orphan["pieces"][0]["kind"], "error");
    let om = orphan["pieces"][0]["metadata"].as_object().expect("meta");
    assert_eq!(om.keys().collect::<Vec<_>>(), vec!["error"], "{om:?}");

    // Listed, retried (truncated) and deleted.
    let (_, list) = send(Method::GET, format!("{base}/v1/conversations"), None).await;
    let listed = &list["data"][0];
    assert_eq!(listed["id"], cid);
    assert_eq!(listed["settings"]["stop"], json!(["."]));
    assert_eq!(listed["messages"].as_array().map(Vec::len), Some(3));
    let orphan_id = orphan["id"].as_i64().expect("id");
    let (st, gone) = send(
        Method::DELETE,
        format!("{base}/v1/conversations/{cid}/messages/{orphan_id}"),
        None,
    )
    .await;
    assert_eq!((st, gone["deleted"].as_u64()), (200, Some(1)));
    let (st, renamed) = send(
        Method::PATCH,
        format!("{base}/v1/conversations/{cid}"),
        Some(json!({"title": "France"})),
    )
    .await;
    assert_eq!((st, renamed["title"].as_str()), (200, Some("France")));
    assert_eq!(renamed["messages"].as_array().map(Vec::len), Some(2));

    // Bad input: the OpenAI error shape, never a 500.
    for (method, path, body, want) in [
        (
            Method::POST,
            format!("/v1/conversations/{cid}/messages"),
            Some(json!({"role": "bot", "content": ""})),
            400,
        ),
        (
            Method::POST,
            format!("/v1/conversations/{cid}/messages"),
            Some(json!({"content": "no role"})),
            400,
        ),
        (
            Method::POST,
            format!("/v1/conversations/{cid}/messages"),
            Some(json!({"role": "user", "content": "x", "response_id": "r"})),
            400,
        ),
        (
            Method::POST,
            "/v1/conversations/999/messages".to_string(),
            Some(json!({"role": "user", "content": "x"})),
            404,
        ),
        (
            Method::PATCH,
            format!("/v1/conversations/{cid}"),
            Some(json!({"settings": "not an object"})),
            400,
        ),
        (
            Method::PATCH,
            "/v1/conversations/999".to_string(),
            Some(json!({"title": "x"})),
            404,
        ),
        (
            Method::DELETE,
            format!("/v1/conversations/{cid}/messages/999"),
            None,
            404,
        ),
        (Method::GET, "/v1/conversations/abc".to_string(), None, 400),
    ] {
        let (st, err) = send(method.clone(), format!("{base}{path}"), body).await;
        assert_eq!(st, want, "{method} {path}: {err}");
        assert!(
            err["error"]["message"].is_string(),
            "{method} {path}: {err}"
        );
    }
    let (st, _) = send(
        Method::DELETE,
        format!("{base}/v1/conversations/{cid}"),
        None,
    )
    .await;
    assert_eq!(st, 200);
    let (_, list) = send(Method::GET, format!("{base}/v1/conversations"), None).await;
    assert_eq!(list["data"], json!([]));
}

/// One chat completion, not streamed: its id, text and usage.
async fn complete(base: &str, messages: Value, max_tokens: u32) -> (String, String, Value) {
    let (st, body, _) = post(
        base,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
            .to_string(),
    )
    .await;
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    let id = v["id"].as_str().expect("id").to_string();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (id, text, v["usage"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_keeps_its_continued_steps_and_regenerated_versions_each_with_its_usage() {
    use reqwest::Method;
    let base = server_with_store("versions").await;
    let (_, conv) = send(Method::POST, format!("{base}/v1/conversations"), None).await;
    let cid = conv["id"].as_i64().expect("id");
    let question = "What is the capital of France?";
    let (_, user) = send(
        Method::POST,
        format!("{base}/v1/conversations/{cid}/messages"),
        Some(json!({"role": "user", "content": question})),
    )
    .await;
    let uid = user["id"].as_i64().expect("id");

    // Step 0: cut by its token limit; step 1 carries it on from the text so far.
    let (r0, t0, u0) = complete(&base, json!([{"role": "user", "content": question}]), 3).await;
    let (_, reply) = send(
        Method::POST,
        format!("{base}/v1/conversations/{cid}/messages"),
        Some(json!({"role": "assistant", "content": t0, "response_id": r0})),
    )
    .await;
    let rid = reply["id"].as_i64().expect("id");
    let (r1, t1, u1) = complete(
        &base,
        json!([{"role": "user", "content": question}, {"role": "assistant", "content": t0}]),
        4,
    )
    .await;
    let pieces = format!("{base}/v1/conversations/{cid}/messages/{rid}/pieces");
    let (st, stepped) = send(
        Method::POST,
        pieces.clone(),
        Some(
            json!({"content": t1, "response_id": r1, "version": 0, "step": 1,
                    "metadata": {"token_usage_completion_tokens": 999}}),
        ),
    )
    .await;
    assert_eq!(st, 200, "{stepped}");
    // A regenerated version with usage of its own.
    let (r2, t2, u2) = complete(&base, json!([{"role": "user", "content": question}]), 5).await;
    let (st, _) = send(
        Method::POST,
        pieces.clone(),
        Some(json!({"content": t2, "response_id": r2, "version": 1, "step": 0})),
    )
    .await;
    assert_eq!(st, 200);

    // The question edited: the versions so far keep the words they answered.
    let (st, edited) = send(
        Method::PATCH,
        format!("{base}/v1/conversations/{cid}/messages/{uid}"),
        Some(json!({"content": "What is the capital of Italy?"})),
    )
    .await;
    assert_eq!(st, 200, "{edited}");
    assert_eq!(edited["pieces"][0]["text"], "What is the capital of Italy?");

    let (_, c) = send(Method::GET, format!("{base}/v1/conversations/{cid}"), None).await;
    let got = &c["messages"][1]["pieces"];
    let want = [
        (&t0, &r0, &u0, 0, 0),
        (&t1, &r1, &u1, 0, 1),
        (&t2, &r2, &u2, 1, 0),
    ];
    assert_eq!(got.as_array().map(Vec::len), Some(3), "{got}");
    for (i, (text, rid, usage, version, step)) in want.into_iter().enumerate() {
        let p = &got[i];
        let m = &p["metadata"];
        assert_eq!(p["text"], json!(text), "{p}");
        assert_eq!(p["version"].as_u64().unwrap_or(0), version, "{p}");
        assert_eq!(p["step"].as_u64().unwrap_or(0), step, "{p}");
        assert_eq!(m["response_id"], json!(rid), "{p}");
        // Each step's and version's usage is its own request's, as the ledger has it.
        assert_eq!(
            m["token_usage_completion_tokens"], usage["completion_tokens"],
            "{p}"
        );
        assert_eq!(
            m["token_usage_prompt_tokens"], usage["prompt_tokens"],
            "{p}"
        );
        assert_eq!(m["answered"], question, "{p}");
    }
    assert_eq!(got[0]["metadata"]["finish_reason"], "length");

    // Bad input: a clear 400 or 404 in the OpenAI shape, nothing written.
    let other = format!("{base}/v1/conversations/{cid}/messages");
    for (method, url, body, want) in [
        (
            Method::POST,
            pieces.clone(),
            json!({"content": "x", "version": 0}),
            400,
        ),
        (
            Method::POST,
            pieces.clone(),
            json!({"content": "x", "version": -1, "step": 0}),
            400,
        ),
        (
            Method::POST,
            pieces.clone(),
            json!({"content": "x", "version": 0, "step": 0, "role": "user"}),
            400,
        ),
        (
            Method::POST,
            other.clone(),
            json!({"role": "assistant", "content": "x", "version": 1, "step": 0}),
            400,
        ),
        (
            Method::POST,
            format!("{other}/{uid}/pieces"),
            json!({"content": "x", "version": 0, "step": 1}),
            404,
        ),
        (
            Method::POST,
            format!("{other}/999/pieces"),
            json!({"content": "x", "version": 0, "step": 1}),
            404,
        ),
        (
            Method::PATCH,
            format!("{other}/{rid}"),
            json!({"content": "x"}),
            404,
        ),
        (
            Method::PATCH,
            format!("{other}/{uid}"),
            json!({"text": "x"}),
            400,
        ),
    ] {
        let (st, err) = send(method.clone(), url.clone(), Some(body)).await;
        assert_eq!(st, want, "{method} {url}: {err}");
        assert!(err["error"]["message"].is_string(), "{method} {url}: {err}");
    }
    let (_, after) = send(Method::GET, format!("{base}/v1/conversations/{cid}"), None).await;
    assert_eq!(after["messages"][1]["pieces"], *got);
    assert_eq!(after["messages"].as_array().map(Vec::len), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_reply_is_stored_as_cancelled_from_the_ledger() {
    use futures::StreamExt;
    use reqwest::Method;
    let base = server_with_store("cancel").await;
    let (_, conv) = send(Method::POST, format!("{base}/v1/conversations"), None).await;
    let cid = conv["id"].as_i64().expect("id");
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "Count to one hundred in words."}],
                      "max_tokens": 300, "temperature": 0, "stream": true}))
        .send()
        .await
        .expect("send");
    let mut stream = resp.bytes_stream();
    // Read until the first complete event (the id comes with it).
    let mut seen = String::new();
    let chunk: Value = loop {
        let bytes = stream.next().await.expect("a chunk").expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&bytes));
        if let Some((_, d)) = seen
            .contains("\n\n")
            .then(|| sse(&seen))
            .and_then(|e| e.into_iter().next())
        {
            break serde_json::from_str(&d).expect("json");
        }
    };
    let rid = chunk["id"].as_str().expect("id").to_string();
    drop(stream);
    // Posted at once: the server waits for the generation to wind down.
    let (st, reply) = send(
        Method::POST,
        format!("{base}/v1/conversations/{cid}/messages"),
        Some(json!({"role": "assistant", "content": "One", "response_id": rid})),
    )
    .await;
    assert_eq!(st, 200, "{reply}");
    let meta = &reply["pieces"][0]["metadata"];
    assert_eq!(meta["finish_reason"], "cancelled", "{meta}");
    assert_eq!(meta["engine_finish_reason"], "cancelled");
    let done = meta["token_usage_completion_tokens"]
        .as_u64()
        .expect("counted");
    assert!(done < 300, "{meta}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_conversations_are_503() {
    let base = server(engine()).await;
    let (st, err) = send(
        reqwest::Method::GET,
        format!("{base}/v1/conversations"),
        None,
    )
    .await;
    assert_eq!(st, 503, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("store")));
}

/// `/metrics` as text and as parsed by a Prometheus text parser.
async fn scrape_metrics(base: &str) -> (String, prometheus_parse::Scrape) {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
    (text, scrape)
}

/// The sum of a counter's or gauge's samples carrying all of `labels`.
fn sample_sum(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .sum()
}

/// Observations in a histogram, over all its label sets.
fn histogram_count(scrape: &prometheus_parse::Scrape, name: &str) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .map(|s| match &s.value {
            prometheus_parse::Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
            _ => 0.0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_counters_match_the_usage_of_the_requests_made() {
    let base = server(engine()).await;
    let (st, chat, _) = post(
        &base,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 5, "temperature": 0, "n": 2})
        .to_string(),
    )
    .await;
    assert_eq!(st, 200, "{chat}");
    let chat: Value = serde_json::from_str(&chat).expect("json");
    let (st, msg, _) = post(
        &base,
        "/v1/messages",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}],
                "max_tokens": 7, "temperature": 0, "stream": true})
        .to_string(),
    )
    .await;
    assert_eq!(st, 200);
    let events = sse(&msg);
    let start: Value = serde_json::from_str(&events[0].1).expect("json");
    let delta: Value = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("message_delta"))
        .map(|(_, d)| serde_json::from_str(d).expect("json"))
        .next_back()
        .expect("message_delta");
    let (text, scrape) = scrape_metrics(&base).await;
    let value = |name: &str, labels: &[(&str, &str)]| sample_sum(&scrape, name, labels);
    let chat_finish = chat["choices"][0]["finish_reason"]
        .as_str()
        .expect("finish");
    let same_finish = chat["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .filter(|c| c["finish_reason"] == chat_finish)
        .count();
    assert_eq!(
        value(
            "shoal_requests_total",
            &[("dialect", "openai.chat"), ("finish_reason", chat_finish)]
        ),
        same_finish as f64,
        "{text}"
    );
    let u = &chat["usage"];
    // n = 2: OpenAI counts the prompt once; the engine ran it per choice.
    let n = |v: &Value| v.as_f64().expect("number");
    assert_eq!(
        value(
            "shoal_tokens_total",
            &[("dialect", "openai.chat"), ("kind", "completion")]
        ),
        n(&u["completion_tokens"])
    );
    assert_eq!(
        value(
            "shoal_tokens_total",
            &[("dialect", "openai.chat"), ("kind", "prompt")]
        ),
        2.0 * n(&u["prompt_tokens"])
    );
    let stop = delta["delta"]["stop_reason"].as_str().expect("stop_reason");
    assert_eq!(
        value(
            "shoal_requests_total",
            &[("dialect", "anthropic.messages"), ("finish_reason", stop)]
        ),
        1.0
    );
    assert_eq!(
        value(
            "shoal_tokens_total",
            &[("dialect", "anthropic.messages"), ("kind", "completion")]
        ),
        n(&delta["usage"]["output_tokens"])
    );
    assert_eq!(
        value(
            "shoal_tokens_total",
            &[("dialect", "anthropic.messages"), ("kind", "prompt")]
        ),
        n(&start["message"]["usage"]["input_tokens"])
            + n(&start["message"]["usage"]["cache_read_input_tokens"])
    );
    assert_eq!(
        histogram_count(&scrape, "shoal_time_to_first_token_seconds"),
        3.0,
        "one TTFT per generated choice: {text}"
    );
    assert_eq!(value("shoal_model_loaded", &[("model", MODEL)]), 1.0);
    assert!(value("shoal_model_memory_bytes", &[("model", MODEL)]) > 1e6);
    // The engine is shared with the other tests here: its gauges exist, their
    // values depend on what else is running.
    for gauge in [
        "shoal_requests_in_flight",
        "shoal_queue_depth",
        "shoal_prefix_cache_hit_ratio",
    ] {
        assert!(
            scrape.samples.iter().any(|s| s.metric == gauge),
            "{gauge}: {text}"
        );
    }
}

/// The cached and reasoning token counters and the decode-rate histogram
/// follow what the replies reported, on a server with a prefix cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_cached_and_reasoning_tokens_as_reported() {
    let opts = EngineOptions {
        prefix_cache_bytes: 64 << 20,
        ..common::options()
    };
    // The default weights with `</think>`: a model the server opens a section for.
    let base = server(Engine::start(&common::think_gguf(), MODEL, opts).expect("load")).await;
    let body = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
                      "reasoning": {"max_tokens": 4},
                      "messages": [{"role": "user", "content": "Think about the sea, then name a fish."}]})
    .to_string();
    let (mut cached, mut reasoning) = (0.0, 0.0);
    for _ in 0..2 {
        let (st, text, _) = post(&base, "/v1/chat/completions", &body).await;
        assert_eq!(st, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        let u = &v["usage"];
        cached += u["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .expect("cached");
        reasoning += u["completion_tokens_details"]["reasoning_tokens"]
            .as_f64()
            .expect("reasoning");
    }
    // The second request reuses the first one's prompt.
    assert!(cached > 0.0, "no prefix-cache hit");
    assert_eq!(reasoning, 8.0, "a budget of 4 per request");
    let (text, scrape) = scrape_metrics(&base).await;
    let chat = |kind| {
        sample_sum(
            &scrape,
            "shoal_tokens_total",
            &[("dialect", "openai.chat"), ("kind", kind)],
        )
    };
    assert_eq!(chat("cached"), cached, "{text}");
    assert_eq!(chat("reasoning"), reasoning, "{text}");
    assert_eq!(
        histogram_count(&scrape, "shoal_decode_tokens_per_second"),
        2.0,
        "one decode rate per reply: {text}"
    );
    assert!(
        sample_sum(&scrape, "shoal_prefix_cache_bytes", &[]) > 0.0,
        "{text}"
    );
    let ratio = sample_sum(&scrape, "shoal_prefix_cache_hit_ratio", &[]);
    assert!(ratio > 0.0 && ratio <= 1.0, "{text}");
}

async fn get_text(base: &str, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("{base}{path}"))
        .await
        .expect("request");
    let status = r.status().as_u16();
    (status, r.text().await.expect("body"))
}

/// `/v1/usage` filters, groups and exports what the ledger recorded, and the
/// sums equal what the clients were sent; bad parameters get a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_filters_groups_and_exports_the_ledger() {
    let base = server(engine()).await;
    let chat = |max: u32| {
        json!({"model": MODEL, "messages": france(), "max_tokens": max, "temperature": 0})
            .to_string()
    };
    let mut sent_chat = (0u64, 0u64);
    let mut chat_ids = Vec::new();
    for max in [3, 40] {
        let (status, body, _) = post(&base, "/v1/chat/completions", &chat(max)).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("json");
        sent_chat.0 += v["usage"]["prompt_tokens"].as_u64().expect("prompt");
        sent_chat.1 += v["usage"]["completion_tokens"]
            .as_u64()
            .expect("completion");
        chat_ids.push(v["id"].as_str().expect("id").to_string());
    }
    // This one says which chat turn it served: a long id is kept cut at
    // 128 bytes, on a character boundary.
    let turn = format!("chat-1/m2/v0/{}", "é".repeat(100));
    let msg = json!({"model": MODEL, "messages": france(), "max_tokens": 3, "temperature": 0});
    let m: Value = reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .header("x-shoal-turn", &turn)
        .json(&msg)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    // 13 bytes of ASCII and 57 two-byte letters: the 58th would pass 128.
    let kept_turn = format!("chat-1/m2/v0/{}", "é".repeat(57));
    let kept_turn = kept_turn.as_str();
    let sent_msg = (
        m["usage"]["input_tokens"].as_u64().expect("input")
            + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0),
        m["usage"]["output_tokens"].as_u64().expect("output"),
    );

    let list = |path: &'static str| {
        let base = base.clone();
        async move {
            let (status, body) = get_text(&base, path).await;
            assert_eq!(status, 200, "{path}: {body}");
            serde_json::from_str::<Value>(&body).expect("json")
        }
    };
    let only_chat = list("/v1/usage?dialect=openai.chat").await;
    let ids: Vec<&str> = only_chat["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        [chat_ids[1].as_str(), chat_ids[0].as_str()],
        "newest first"
    );
    let cut = list("/v1/usage?dialect=chat&finish=length").await;
    assert_eq!(cut["data"].as_array().map(Vec::len), Some(1), "{cut}");
    assert_eq!(cut["data"][0]["id"], chat_ids[0].as_str());
    // A chat turn's requests are found by it.
    let mut url = reqwest::Url::parse(&format!("{base}/v1/usage")).expect("url");
    url.query_pairs_mut().append_pair("turn", kept_turn);
    let (status, by_turn) = send(reqwest::Method::GET, url.to_string(), None).await;
    assert_eq!(status, 200, "{by_turn}");
    assert_eq!(
        by_turn["data"].as_array().map(Vec::len),
        Some(1),
        "{by_turn}"
    );
    assert_eq!(by_turn["data"][0]["id"], m["id"], "{by_turn}");
    assert_eq!(by_turn["data"][0]["turn"], kept_turn, "{by_turn}");
    let none = list("/v1/usage?model=nope").await;
    assert_eq!(none["data"], json!([]));
    let future = list("/v1/usage?since=99999999999").await;
    assert_eq!(future["data"], json!([]));

    // Sums per dialect are what the clients were sent.
    let groups = list("/v1/usage?group_by=dialect").await;
    let group = |name: &str| {
        groups["data"]
            .as_array()
            .and_then(|g| g.iter().find(|x| x["key"] == name).cloned())
            .unwrap_or_else(|| panic!("no group {name}: {groups}"))
    };
    let c = group("openai.chat");
    assert_eq!(c["requests"], 2);
    // Without prices nothing speaks of cost.
    assert!(
        c.get("cost").is_none() && groups.get("cost").is_none(),
        "{groups}"
    );
    assert_eq!(
        (c["prompt_tokens"].as_u64(), c["completion_tokens"].as_u64()),
        (Some(sent_chat.0), Some(sent_chat.1))
    );
    let a = group("anthropic.messages");
    assert_eq!(
        (a["prompt_tokens"].as_u64(), a["completion_tokens"].as_u64()),
        (Some(sent_msg.0), Some(sent_msg.1))
    );
    // The same sums as CSV.
    let (status, text) = get_text(&base, "/v1/usage?group_by=dialect&format=csv").await;
    assert_eq!(status, 200, "{text}");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("key,requests,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,total_tokens")
    );
    let chat_line = lines
        .find(|l| l.starts_with("openai.chat,"))
        .unwrap_or_else(|| panic!("{text}"));
    let fields: Vec<&str> = chat_line.split(',').collect();
    assert_eq!(
        (fields[1], fields[2], fields[4]),
        (
            "2",
            sent_chat.0.to_string().as_str(),
            sent_chat.1.to_string().as_str()
        ),
        "{text}"
    );
    let days = list("/v1/usage?group_by=day").await;
    assert_eq!(days["data"].as_array().map(Vec::len), Some(1), "{days}");
    assert_eq!(days["data"][0]["requests"], 3);

    // CSV: a header and one row per request.
    let (status, text) = get_text(&base, "/v1/usage?format=csv&dialect=anthropic.messages").await;
    assert_eq!(status, 200);
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        rows[0].starts_with("id,created,dialect,endpoint,model,backend"),
        "{text}"
    );
    assert!(
        rows[1].contains(",anthropic.messages,") && rows[1].contains(m["id"].as_str().expect("id"))
    );
    // Its total and timings are the JSON row's, as the UI's log shows them.
    let row: std::collections::HashMap<&str, &str> =
        rows[0].split(',').zip(rows[1].split(',')).collect();
    let listed = list("/v1/usage?dialect=anthropic.messages").await;
    let e = &listed["data"][0];
    assert_eq!(row["turn"], kept_turn, "{text}");
    assert_eq!(
        row["total_tokens"],
        e["tokens"]["total"].to_string(),
        "{text}"
    );
    for k in [
        "ttft_ms",
        "decode_tokens_per_s",
        "queue_ms",
        "prefill_tokens_per_s",
    ] {
        let csv: f64 = row[k].parse().expect("a number");
        assert_eq!(Some(csv), e[k].as_f64(), "{k}: {text}");
    }
    assert!(row["ttft_ms"].parse::<f64>().unwrap_or(0.0) > 0.0, "{text}");

    // Pages of one follow the cursor through every entry, newest first.
    let mut paged = Vec::new();
    let mut path = "/v1/usage?limit=1".to_string();
    loop {
        let (status, body) = get_text(&base, &path).await;
        assert_eq!(status, 200, "{body}");
        let page: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(page["data"].as_array().map(Vec::len), Some(1), "{page}");
        paged.push(page["data"][0]["id"].as_str().expect("id").to_string());
        if page["has_more"] == false {
            assert!(page["next_cursor"].is_null(), "{page}");
            break;
        }
        let cursor = page["next_cursor"].as_i64().expect("cursor");
        path = format!("/v1/usage?limit=1&cursor={cursor}");
    }
    let m_id = m["id"].as_str().expect("id").to_string();
    assert_eq!(paged, [m_id, chat_ids[1].clone(), chat_ids[0].clone()]);

    // Bad parameters: the OpenAI error shape, naming the parameter.
    for (path, param) in [
        ("/v1/usage?cursor=-1", "cursor"),
        ("/v1/usage?group_by=month", "group_by"),
        ("/v1/usage?limit=many", "limit"),
        ("/v1/usage?dialect=gemini", "dialect"),
        ("/v1/usage?colour=blue", "colour"),
    ] {
        let (status, body) = get_text(&base, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["error"]["param"], param, "{path}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}

/// With prices set, `/v1/usage` says what the traffic would have cost:
/// each entry, each group and the groups' total, from what the clients were
/// sent; a model without a price adds nothing and is named; the group CSV
/// has the cost column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_prices_the_traffic_of_models_with_a_price() {
    use shoal_client::metadata::Price;
    // The same engine under a second name that has no price.
    let pool = shoal_api::pool::ModelPool::new(shoal_api::pool::PoolOptions::default());
    pool.insert(engine(), vec!["unpriced-alias".into()]);
    let mut state = AppState::with_pool(pool);
    let price = Price {
        input_per_mtok: 2.0,
        output_per_mtok: 10.0,
        cached_input_per_mtok: Some(0.5),
    };
    state.prices = std::sync::Arc::new([(MODEL.to_string(), price.clone())].into());
    let base = serve_state(state).await;

    // What each request would cost, from the usage its client was sent.
    let mut want = std::collections::BTreeMap::new();
    for (path, model, max) in [
        ("/v1/chat/completions", MODEL, 5),
        ("/v1/messages", MODEL, 3),
        ("/v1/chat/completions", "unpriced-alias", 4),
    ] {
        let body =
            json!({"model": model, "messages": france(), "max_tokens": max, "temperature": 0});
        let (status, text, _) = post(&base, path, &body.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        let u = &v["usage"];
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        let (prompt, cached, completion) = if path == "/v1/messages" {
            let cached = n("cache_read_input_tokens");
            (n("input_tokens") + cached, cached, n("output_tokens"))
        } else {
            (
                n("prompt_tokens"),
                u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0),
                n("completion_tokens"),
            )
        };
        assert!(prompt > 0 && completion > 0, "{v}");
        let cost = (model == MODEL).then(|| {
            ((prompt - cached) as f64 * 2.0 + cached as f64 * 0.5 + completion as f64 * 10.0) / 1e6
        });
        want.insert(v["id"].as_str().expect("id").to_string(), (model, cost));
    }
    let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-12);
    let priced_total: f64 = want.values().filter_map(|(_, c)| *c).sum();

    // Each entry, priced or `null`.
    let (_, text) = get_text(&base, "/v1/usage").await;
    let list: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(list["unpriced_models"], json!(["unpriced-alias"]), "{list}");
    for e in list["data"].as_array().expect("data") {
        let (_, cost) = want[e["id"].as_str().expect("id")];
        match cost {
            Some(c) => assert!(close(e["cost"]["total"].as_f64(), c), "{e} vs {c}"),
            None => assert!(e["cost"].is_null(), "{e}"),
        }
    }

    // Each group, and the total of the sums.
    let (_, text) = get_text(&base, "/v1/usage?group_by=model").await;
    let groups: Value = serde_json::from_str(&text).expect("json");
    let group = |key: &str| {
        groups["data"]
            .as_array()
            .and_then(|g| g.iter().find(|x| x["key"] == key).cloned())
            .unwrap_or_else(|| panic!("no group {key}: {groups}"))
    };
    let g = group(MODEL);
    assert_eq!(g["requests"], 2);
    assert!(close(g["cost"]["total"].as_f64(), priced_total), "{g}");
    let parts = ["input", "cached_input", "output"].map(|k| g["cost"][k].as_f64().unwrap_or(-1.0));
    assert!(close(Some(parts.iter().sum()), priced_total), "{g}");
    assert_eq!(group("unpriced-alias")["cost"]["total"], 0.0, "{groups}");
    assert!(
        close(groups["cost"]["total"].as_f64(), priced_total),
        "{groups}"
    );
    assert_eq!(
        groups["unpriced_models"],
        json!(["unpriced-alias"]),
        "{groups}"
    );

    // The group CSV ends with the cost.
    let (status, csv) = get_text(&base, "/v1/usage?group_by=model&format=csv").await;
    assert_eq!(status, 200, "{csv}");
    assert_eq!(
        csv.lines().next(),
        Some("key,requests,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,total_tokens,cost")
    );
    let row = csv
        .lines()
        .find(|l| l.starts_with(&format!("{MODEL},")))
        .unwrap_or_else(|| panic!("{csv}"));
    let cost = row.rsplit(',').next().and_then(|c| c.parse::<f64>().ok());
    assert!(close(cost, priced_total), "{csv}");
}

/// The recorder client for `dialect` against the test server.
fn recorder(base: &str, dialect: shoal_client::Dialect, stream: bool) -> shoal_client::Target {
    shoal_client::Target::new(shoal_client::TargetConfig {
        dialect,
        base_url: base.to_string(),
        model: MODEL.into(),
        api_key: None,
        headers: Vec::new(),
        stream,
        price: None,
    })
    .expect("target")
}

/// Per ledger dialect: requests, then prompt, cached, completion and
/// reasoning tokens.
type Sums<'a> = std::collections::BTreeMap<&'a str, [u64; 5]>;

/// `/v1/usage?group_by=dialect` equals `sent` for every dialect in it;
/// returns the groups.
async fn assert_ledger_sums(base: &str, sent: &Sums<'_>) -> Value {
    let (_, text) = get_text(base, "/v1/usage?group_by=dialect").await;
    let groups: Value = serde_json::from_str(&text).expect("json");
    for (dialect, s) in sent {
        let g = groups["data"]
            .as_array()
            .and_then(|g| g.iter().find(|x| x["key"] == *dialect).cloned())
            .unwrap_or_else(|| panic!("no {dialect}: {groups}"));
        let ledger = [
            "requests",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "reasoning_tokens",
        ]
        .map(|k| g[k].as_u64().unwrap_or(u64::MAX));
        assert_eq!(&ledger, s, "{dialect}: ledger {g} vs sent {s:?}");
    }
    groups
}

/// The ledger's sums equal what the clients were sent, as the recorder
/// client reads it off the wire: every dialect, streamed and not, two
/// choices where the dialect has `n`, content-filter finishes, and a
/// cancelled stream (whose client saw no usage: the ledger's record of it is
/// the one figure that says what it cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_totals_equal_what_the_clients_were_sent() {
    use shoal_client::{Message, Request};
    let base = server(filtering_engine()).await;
    // Per ledger dialect: requests, then prompt, cached, completion and
    // reasoning tokens as the clients were told.
    let mut sent: Sums = Default::default();
    let mut filtered_replies = 0;
    for dialect in common::recorder_dialects() {
        for stream in [false, true] {
            let target = recorder(&base, dialect, stream);
            let has_n = dialect.has_choices();
            for (question, n) in [
                ("Name a colour.", if has_n { Some(2) } else { None }),
                (
                    "What is the capital of France? Answer in one sentence.",
                    None,
                ),
            ] {
                let req = Request {
                    messages: vec![Message {
                        role: "user".into(),
                        content: question.into(),
                        images: Vec::new(),
                    }],
                    max_tokens: Some(12),
                    temperature: Some(0.0),
                    n,
                    ..Request::default()
                };
                let reply = target.send(&req).await;
                assert_eq!(reply.http_status, 200, "{dialect:?} {stream}: {reply:?}");
                assert_eq!(reply.pieces.len(), n.unwrap_or(1) as usize, "{reply:?}");
                let m = &reply.pieces[0].metadata;
                let get = |k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0);
                let s = sent.entry(dialect.ledger_name()).or_default();
                s[0] += 1;
                s[1] += get("token_usage_prompt_tokens");
                s[2] += get("token_usage_cached_tokens");
                s[3] += get("token_usage_completion_tokens");
                s[4] += get("token_usage_reasoning_tokens");
                for p in &reply.pieces {
                    let word = |k: &str| p.metadata.get(k).and_then(Value::as_str);
                    if word("finish_reason") == Some("content_filter")
                        || word("stop_reason") == Some("refusal")
                        || word("incomplete_reason") == Some("content_filter")
                    {
                        filtered_replies += 1;
                    }
                }
            }
        }
    }
    assert!(
        filtered_replies >= 6,
        "the filter fired in too few replies: {filtered_replies}"
    );

    // A stream the client leaves after its first chunk.
    let id = leave_after_first_chunk(&base).await;
    let cancelled = recorded(&base, &id).await;
    assert_eq!(
        cancelled["engine_finish_reasons"],
        json!(["cancelled"]),
        "{cancelled}"
    );
    let u = &cancelled["usage"];
    let s = sent.entry("openai.chat").or_default();
    s[0] += 1;
    s[1] += u["prompt_tokens"].as_u64().expect("prompt");
    s[3] += u["completion_tokens"].as_u64().expect("completion");

    assert_ledger_sums(&base, &sent).await;
    let (_, text) = get_text(&base, "/v1/usage?group_by=finish").await;
    let finishes: Value = serde_json::from_str(&text).expect("json");
    let count = |key: &str| {
        finishes["data"]
            .as_array()
            .and_then(|g| g.iter().find(|x| x["key"] == key))
            .map_or(0, |g| g["requests"].as_u64().unwrap_or(0))
    };
    assert_eq!(count("cancelled"), 1, "{finishes}");
    // (A request with two choices is counted by its first; every filtered
    // reply here is a single choice.)
    assert_eq!(count("content_filter"), filtered_replies, "{finishes}");
}

/// Requests stopped by the server's time limit, as the recorder client
/// reads them off the wire (the timeout error and the usage beside it, or
/// Responses' failed response), sum to the ledger's figures: every dialect,
/// streamed and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_totals_of_timed_out_requests_equal_what_the_clients_were_sent() {
    use shoal_client::{Dialect, Message, PieceKind, Request};
    let mut state = AppState::new(engine());
    let mut access = shoal_api::access::Access::default();
    // The limit is the feature under test, not a wait: the 4000-token reply
    // it must cut takes minutes here, and a host slow enough to reach it
    // before the first token still passes (only the prompt is counted).
    access.request_timeout = Some(std::time::Duration::from_millis(1500));
    state.access = std::sync::Arc::new(access);
    let base = serve_state(state).await;
    // Per ledger dialect: requests, then prompt, cached, completion and
    // reasoning tokens as the clients were told.
    let mut sent: Sums = Default::default();
    let dialects = common::recorder_dialects();
    for &dialect in &dialects {
        for stream in [false, true] {
            let target = recorder(&base, dialect, stream);
            // A reply far longer than the time limit allows (a bare prompt
            // for legacy Completions, which applies no chat template).
            let content = match dialect {
                Dialect::Completions => "1, 2, 3, 4, 5, 6,",
                _ => "Write the numbers from 1 to 500 separated by commas.",
            };
            let req = Request {
                messages: vec![Message {
                    role: "user".into(),
                    content: content.into(),
                    images: Vec::new(),
                }],
                max_tokens: Some(4000),
                temperature: Some(0.0),
                ..Request::default()
            };
            let reply = target.send(&req).await;
            let want_status = if stream || dialect == Dialect::Responses {
                200
            } else {
                504
            };
            assert_eq!(
                reply.http_status, want_status,
                "{dialect:?} {stream}: {reply:?}"
            );
            assert_eq!(reply.pieces.len(), 1, "{reply:?}");
            let p = &reply.pieces[0];
            assert_eq!(p.kind, PieceKind::Error, "{dialect:?} {stream}: {p:?}");
            let get = |k: &str| {
                p.metadata
                    .get(k)
                    .and_then(Value::as_u64)
                    .unwrap_or_else(|| panic!("{dialect:?} {stream}: no {k} in {p:?}"))
            };
            let s = sent.entry(dialect.ledger_name()).or_default();
            s[0] += 1;
            s[1] += get("token_usage_prompt_tokens");
            s[2] += get("token_usage_cached_tokens");
            s[3] += get("token_usage_completion_tokens");
            if dialect != Dialect::Messages {
                s[4] += get("token_usage_reasoning_tokens");
            }
        }
    }
    let groups = assert_ledger_sums(&base, &sent).await;
    assert_eq!(
        groups["data"].as_array().map(Vec::len),
        Some(dialects.len()),
        "{groups}"
    );
    let (_, text) = get_text(&base, "/v1/usage?group_by=finish").await;
    let finishes: Value = serde_json::from_str(&text).expect("json");
    let only = finishes["data"].as_array().map(|g| {
        g.iter()
            .map(|x| (x["key"].clone(), x["requests"].clone()))
            .collect::<Vec<_>>()
    });
    assert_eq!(
        only,
        Some(vec![(json!("timeout"), json!(2 * dialects.len()))]),
        "every request here timed out: {finishes}"
    );
}

/// A reply cut by its token limit and sent back as a trailing assistant
/// message is carried on, in each dialect: the two steps read as the one
/// reply of both limits together, the second step's prompt counts the first
/// step's tokens, and each step's completion is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trailing_assistant_message_is_continued_with_exact_usage() {
    let base = server(alone(&gguf())).await;
    let ask = "Count from 1 to 40, separated by commas.";
    // A reply's text, prompt and completion tokens, and finish.
    type Reply = (String, u64, u64, String);
    let body = |path: &str, prefix: Option<&str>, max: u32| {
        let mut msgs = vec![json!({"role": "user", "content": ask})];
        msgs.extend(prefix.map(|p| json!({"role": "assistant", "content": p})));
        match path {
            "/api/chat" => json!({"model": MODEL, "messages": msgs, "stream": false,
                                  "options": {"temperature": 0, "num_predict": max}}),
            _ => json!({"model": MODEL, "messages": msgs, "temperature": 0, "max_tokens": max}),
        }
    };
    let read = |path: &str, v: &Value| -> Reply {
        match path {
            "/v1/chat/completions" => (
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                v["usage"]["prompt_tokens"].as_u64().unwrap_or_default(),
                v["usage"]["completion_tokens"].as_u64().unwrap_or_default(),
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
            ),
            "/v1/messages" => (
                v["content"][0]["text"].as_str().unwrap_or_default().into(),
                v["usage"]["input_tokens"].as_u64().unwrap_or_default(),
                v["usage"]["output_tokens"].as_u64().unwrap_or_default(),
                v["stop_reason"].as_str().unwrap_or_default().into(),
            ),
            _ => (
                v["message"]["content"].as_str().unwrap_or_default().into(),
                v["prompt_eval_count"].as_u64().unwrap_or_default(),
                v["eval_count"].as_u64().unwrap_or_default(),
                v["done_reason"].as_str().unwrap_or_default().into(),
            ),
        }
    };
    let cases = [
        ("/v1/chat/completions", "length"),
        ("/v1/messages", "max_tokens"),
        ("/api/chat", "length"),
    ];
    for (path, cut) in cases {
        let call = |b: Value| {
            let base = base.clone();
            async move {
                let (s, t, _) = post(&base, path, &b.to_string()).await;
                assert_eq!(s, 200, "{path}: {t}");
                let v: Value = serde_json::from_str(&t).expect("json");
                read(path, &v)
            }
        };
        let whole = call(body(path, None, 16)).await;
        let first = call(body(path, None, 8)).await;
        assert_eq!(first.3, cut, "{path}: {first:?}");
        assert!(whole.0.starts_with(&first.0), "{path}: {whole:?} {first:?}");
        let rest = call(body(path, Some(&first.0), 8)).await;
        assert_eq!(
            format!("{}{}", first.0, rest.0),
            whole.0,
            "{path}: the continued reply differs from the one reply"
        );
        assert_eq!(
            rest.1,
            first.1 + first.2,
            "{path}: the prompt counts the first step"
        );
        assert_eq!((first.2, rest.2), (8, 8), "{path}");
        assert_eq!(rest.3, cut, "{path}: {rest:?}");
    }
}

/// The five dialects' requests for `text` with a reply limit far above any
/// window, and how each says what it counted and why it ended.
const DIALECTS: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/api/chat",
];

fn limited(path: &str, text: &str, max: u64) -> Value {
    let user = json!([{"role": "user", "content": text}]);
    match path {
        "/v1/chat/completions" => {
            json!({"model": MODEL, "messages": user, "max_tokens": max, "temperature": 0})
        }
        "/v1/completions" => {
            json!({"model": MODEL, "prompt": text, "max_tokens": max, "temperature": 0})
        }
        "/v1/responses" => {
            json!({"model": MODEL, "input": text, "max_output_tokens": max, "temperature": 0})
        }
        "/v1/messages" => {
            json!({"model": MODEL, "messages": user, "max_tokens": max, "temperature": 0})
        }
        // Ollama has no reply limit to exceed but num_predict, and a
        // num_ctx above the window (LlamaIndex sends its own) is the window.
        _ => json!({"model": MODEL, "messages": user, "stream": false,
                    "options": {"num_ctx": 100_000, "num_predict": max, "temperature": 0}}),
    }
}

/// (prompt tokens, reply tokens, finish words) of a dialect's reply.
fn counted(path: &str, v: &Value) -> (u64, u64, String) {
    let n = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("{p}: {v}"))
    };
    match path {
        "/v1/chat/completions" | "/v1/completions" => (
            n("/usage/prompt_tokens"),
            n("/usage/completion_tokens"),
            v["choices"][0]["finish_reason"].to_string(),
        ),
        "/v1/responses" => (
            n("/usage/input_tokens"),
            n("/usage/output_tokens"),
            format!("{} {}", v["status"], v["incomplete_details"]["reason"]),
        ),
        "/v1/messages" => (
            n("/usage/input_tokens"),
            n("/usage/output_tokens"),
            v["stop_reason"].to_string(),
        ),
        _ => (
            n("/prompt_eval_count"),
            n("/eval_count"),
            v["done_reason"].to_string(),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_limit_past_the_window_is_a_cap_in_every_dialect() {
    // Claude Code sends max_tokens 32000, whatever the window.
    let base = server(engine()).await;
    let window = engine().model.info.context_length as u64;
    for path in DIALECTS {
        for max in [window + 1, 100_000, i64::MAX as u64] {
            let mut body = limited(
                path,
                "What is the capital of France? Answer in one sentence.",
                max,
            );
            if path == "/v1/completions" {
                // A raw continuation has no end of turn: its sentence ends it.
                body["stop"] = json!(["."]);
            }
            let (s, t, _) = post(&base, path, &body.to_string()).await;
            assert_eq!(s, 200, "{path} with {max}: {t}");
            let v: Value = serde_json::from_str(&t).expect("json");
            let (_, reply, finish) = counted(path, &v);
            // The answer ends on its own, long before the window is full.
            assert!(reply > 0 && reply < 40, "{path}: {t}");
            assert!(
                ["\"stop\"", "\"end_turn\"", "\"completed\" null"].contains(&finish.as_str()),
                "{path}: {finish}: {t}"
            );
        }
    }
}

/// The default model with its header's `llama.context_length` rewritten
/// to `window` (a copy, changed in place): a model trained on a small
/// window, on whichever backend runs it.
fn trained_on(window: u32) -> std::path::PathBuf {
    let mut bytes = std::fs::read(gguf()).expect("read the default model");
    let key = b"llama.context_length";
    let mut at = None;
    for i in 8..bytes.len().min(1 << 20) - key.len() {
        if &bytes[i..i + key.len()] == key && bytes[i - 8..i] == (key.len() as u64).to_le_bytes() {
            at = Some(i + key.len());
            break;
        }
    }
    let at = at.expect("llama.context_length in the header");
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "a u32 value");
    bytes[at + 4..at + 8].copy_from_slice(&window.to_le_bytes());
    let dir = std::env::temp_dir().join(format!("shoal-http-window-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join(format!("SmolLM2-trained-on-{window}.gguf"));
    std::fs::write(&path, bytes).expect("write");
    path
}

/// A prompt of `filler` list items (the same tokens each), then a request
/// for a long reply.
fn filled(filler: usize) -> String {
    format!(
        "Here is a list: {}.\n\nNow count from one to one hundred in words: one, two, three,",
        vec!["apple"; filler].join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_runs_until_the_window_is_full_and_says_so() {
    // A small window two ways: on llama.cpp a KV pool of 300 positions asked
    // of the default model (trained on 8192; llama.cpp rounds the pool to
    // 512), and on the backend under test the default model told it was
    // trained on 512 (an `auto` pool then holds just that).
    let small_pool = Engine::start(
        &gguf(),
        MODEL,
        EngineOptions {
            prefix_cache_bytes: 0,
            backend: shoal_engine::BackendChoice::Llama,
            llama: shoal_engine::LlamaOptions::new(0, 300),
            ..EngineOptions::default()
        },
    )
    .expect("load");
    let small_file = trained_on(512);
    let trained_small = Engine::start(
        &small_file,
        MODEL,
        EngineOptions {
            prefix_cache_bytes: 0,
            ..common::options()
        },
    )
    .expect("load");
    for (engine, trained) in [(small_pool, 8192), (trained_small, 512)] {
        let window = engine.model.info.context_length as u64;
        assert_eq!(window, 512, "{:?}", engine.model.info.backend);
        // Where the dialect allows, the end of turn is banned outright: a
        // raw continuation might otherwise end at once.
        let ban = no_eos(&engine);
        let base = server(engine).await;
        // Every listing says the window served, beside the trained one.
        let (_, t) = get_text(&base, "/v1/models").await;
        let v: Value = serde_json::from_str(&t).expect("json");
        assert_eq!(v["data"][0]["shoal"]["context_length"], window, "{t}");
        assert_eq!(
            v["data"][0]["shoal"]["trained_context_length"], trained,
            "{t}"
        );
        let (_, t, _) = post(&base, "/api/show", &json!({"model": MODEL}).to_string()).await;
        let v: Value = serde_json::from_str(&t).expect("json");
        assert_eq!(v["context_length"], window, "{t}");
        assert_eq!(v["trained_context_length"], trained, "{t}");
        assert_eq!(v["model_info"]["llama.context_length"], window, "{t}");
        assert!(
            v["parameters"]
                .as_str()
                .is_some_and(|p| p.ends_with(&format!("num_ctx {window}"))),
            "{t}"
        );
        let (_, t) = get_text(&base, "/api/ps").await;
        let v: Value = serde_json::from_str(&t).expect("json");
        assert_eq!(v["models"][0]["context_length"], window, "{t}");
        assert_eq!(v["models"][0]["trained_context_length"], trained, "{t}");

        for path in DIALECTS {
            let ask = |filler: usize, max: u64| {
                let base = base.clone();
                let ban = ban.clone();
                async move {
                    let mut body = limited(path, &filled(filler), max);
                    if path.ends_with("completions") {
                        body["logit_bias"] = ban;
                    }
                    let (s, t, _) = post(&base, path, &body.to_string()).await;
                    assert_eq!(s, 200, "{path}: {t}");
                    let v: Value = serde_json::from_str(&t).expect("json");
                    (counted(path, &v), t)
                }
            };
            // A prompt that leaves about 16 tokens of the window, measured
            // in this dialect (its template adds its own tokens).
            let ((p0, ..), _) = ask(0, 1).await;
            let ((p50, ..), _) = ask(50, 1).await;
            let per_item = (p50 - p0) as f64 / 50.0;
            let filler = ((window - 16 - p0) as f64 / per_item) as usize;
            let ((prompt, reply, finish), t) = ask(filler, 100_000).await;
            assert!(
                prompt < window && window - prompt <= 64,
                "{path}: {prompt} of {window}: {t}"
            );
            assert_eq!(
                reply,
                window - prompt,
                "{path}: the reply fills the window: {t}"
            );
            let word = match path {
                "/v1/responses" => "\"incomplete\" \"max_output_tokens\"",
                "/v1/messages" => "\"model_context_window_exceeded\"",
                _ => "\"length\"",
            };
            assert_eq!(finish, word, "{path}: {t}");
            // A prompt that alone fills the window is still refused.
            let body = limited(path, &filled(filler * 2), 100_000);
            let (s, t, _) = post(&base, path, &body.to_string()).await;
            assert_eq!(s, 400, "{path}: {t}");
        }
    }
    if let Some(dir) = small_file.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The reference MCP server from npm (installed in `tests/mcp` by `make setup`).
fn mcp_everything() -> String {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(p.exists(), "{} is missing: run `make setup`", p.display());
    p.display().to_string()
}

async fn put_json(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .put(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("send");
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_reach_the_model_and_a_call_feeds_the_next_turn() {
    let base = server(engine()).await;
    let file =
        json!({"mcpServers": {"every": {"command": "node", "args": [mcp_everything(), "stdio"]}}});
    let (s, v) = put_json(&base, "/v1/mcp/config", &file).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["mcpServers"]["every"]["command"], "node");

    let (s, t) = get_text(&base, "/v1/mcp/servers").await;
    assert_eq!(s, 200, "{t}");
    let servers: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(servers["data"][0]["name"], "every", "{servers}");
    assert_eq!(servers["data"][0]["state"], "ready", "{servers}");

    let (_, t) = get_text(&base, "/v1/mcp/tools").await;
    let tools: Value = serde_json::from_str(&t).expect("json");
    let echo = tools["data"]
        .as_array()
        .and_then(|d| d.iter().find(|t| t["name"] == "echo"))
        .cloned()
        .unwrap_or_else(|| panic!("{tools}"));
    assert_eq!(echo["read_only"], true);
    assert_eq!(echo["tool"]["function"]["name"], "every__echo");

    // The model, made to call the tool, writes arguments the tool accepts.
    let ask = json!({"role": "user", "content": "Echo the word hello."});
    let turn = |messages: Value| {
        json!({"model": MODEL, "messages": messages, "tools": [echo["tool"]],
               "tool_choice": {"type": "function", "function": {"name": "every__echo"}},
               "temperature": 0, "max_tokens": 48})
    };
    let (s, t, _) = post(
        &base,
        "/v1/chat/completions",
        &turn(json!([ask])).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let first: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    let call = first["choices"][0]["message"]["tool_calls"][0].clone();
    assert_eq!(call["function"]["name"], "every__echo");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("text")).expect("json");
    let message = args["message"]
        .as_str()
        .expect("a message argument")
        .to_string();

    // The call, as a chat runs it: by the function name, with the model's text.
    let body = json!({"function": "every__echo", "arguments": call["function"]["arguments"]});
    let (s, t, _) = post(&base, "/v1/mcp/call", &body.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let out: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(out["content"], format!("Echo: {message}"), "{out}");
    assert_eq!(
        (out["is_error"].as_bool(), out["truncated"].as_bool()),
        (Some(false), Some(false))
    );

    // The result goes back as the tool's message; the next turn reads it.
    let messages = json!([ask,
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": out["content"]}]);
    let mut next = turn(messages);
    next["tool_choice"] = json!("none");
    let (s, t, _) = post(&base, "/v1/chat/completions", &next.to_string()).await;
    assert_eq!(s, 200, "{t}");
    let second: Value = serde_json::from_str(&t).expect("json");
    // Against the same request with the question alone (tool_choice none
    // leaves the tool list out of both), the call and its result add tokens.
    let mut alone = turn(json!([ask]));
    alone["tool_choice"] = json!("none");
    let (_, t, _) = post(&base, "/v1/chat/completions", &alone.to_string()).await;
    let base_prompt: Value = serde_json::from_str(&t).expect("json");
    let p1 = base_prompt["usage"]["prompt_tokens"].as_u64().expect("p1");
    let p2 = second["usage"]["prompt_tokens"].as_u64().expect("p2");
    let added = format!("{}{}", call["function"]["arguments"], out["content"]);
    assert!(
        p2 > p1 + added.len() as u64 / 8,
        "the call and its result are in the second prompt: {p1} vs {p2}"
    );
    assert_ne!(
        second["choices"][0]["finish_reason"], "tool_calls",
        "{second}"
    );

    // Bad input: OpenAI-shaped errors, and the configuration unchanged.
    let (s, v) = put_json(&base, "/v1/mcp/config", &json!({"mcpServers": {"x": {}}})).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("'x'")),
        "{v}"
    );
    let (_, t) = get_text(&base, "/v1/mcp/config").await;
    assert!(t.contains("\"every\""), "{t}");
    for (body, status) in [
        (json!({"server": "nobody", "tool": "echo"}), 404),
        (json!({"server": "every", "tool": "nope"}), 404),
        (
            json!({"function": "every__echo", "arguments": "{not json"}),
            400,
        ),
        (json!({"function": "echo"}), 400),
        (json!({"server": "every"}), 400),
        (json!({"server": "every", "tool": "echo", "extra": 1}), 400),
    ] {
        let (s, t, _) = post(&base, "/v1/mcp/call", &body.to_string()).await;
        assert_eq!(s, status, "{body}: {t}");
        let v: Value = serde_json::from_str(&t).expect("json");
        assert!(v["error"]["message"].is_string(), "{t}");
    }
    // "Always allow" is kept by the server, in the file, for every window.
    let (s, v) = put_json(
        &base,
        "/v1/mcp/always_allow",
        &json!({"function": "every__echo", "allow": true}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (_, t) = get_text(&base, "/v1/mcp/tools").await;
    let tools: Value = serde_json::from_str(&t).expect("json");
    let allowed: Vec<&str> = tools["data"]
        .as_array()
        .expect("tools")
        .iter()
        .filter(|t| t["always_allow"] == true)
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(allowed, ["echo"], "{tools}");
    let (_, t) = get_text(&base, "/v1/mcp/config").await;
    let config: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(
        config["mcpServers"]["every"]["alwaysAllow"],
        json!(["echo"])
    );
    for (body, status) in [
        (
            json!({"server": "nobody", "tool": "echo", "allow": true}),
            404,
        ),
        (json!({"function": "every__echo"}), 400),
        (json!({"function": "echo", "allow": true}), 400),
    ] {
        let (s, v) = put_json(&base, "/v1/mcp/always_allow", &body).await;
        assert_eq!(s, status, "{body}: {v}");
    }
    let (_, forgotten) = send(
        reqwest::Method::DELETE,
        format!("{base}/v1/mcp/always_allow"),
        None,
    )
    .await;
    assert_eq!(forgotten["forgotten"], 1, "{forgotten}");
    // Still serving, and the server still answers.
    let body = json!({"server": "every", "tool": "echo", "arguments": {"message": "still"}});
    let (s, t, _) = post(&base, "/v1/mcp/call", &body.to_string()).await;
    assert_eq!((s, t.contains("Echo: still")), (200, true), "{t}");
}
