//! Embeddings end to end on the real all-MiniLM-L6-v2 GGUF beside the real
//! chat model: OpenAI's `/v1/embeddings` (float and base64, token arrays,
//! exact usage), Ollama's `/api/embed` and `/api/embeddings` (truncation,
//! counts, durations, names), every refusal in the dialect's own shape, the
//! model kinds in `/v1/models` and `/api/show`, the ledger and `/metrics`.
//! The vectors themselves are checked against a numpy reference in
//! `shoal-engine/tests/embeddings.rs`.
mod common;

use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use serde_json::{json, Value};
use shoal_api::embeddings::MAX_INPUTS;
use shoal_api::AppState;
use shoal_engine::Engine;

const CHAT: &str = "smollm2";
const EMBED: &str = "minilm";

fn chat_engine() -> Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| Engine::start(&common::gguf(), CHAT, common::options()).expect("load"))
        .clone()
}

/// The chat model loaded, the embedding model named (it loads on first use).
fn state() -> AppState {
    let state = AppState::new(chat_engine());
    state
        .pool
        .add_named(EMBED, common::embed_gguf(), Vec::new());
    state
}

use common::{get, post};

fn vector(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a vector: {v}"))
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (n(a) * n(b))
}

/// An OpenAI error body: the type, the parameter and the message.
fn openai_error(v: &Value) -> (&str, &str, &str) {
    let e = &v["error"];
    (
        e["type"].as_str().unwrap_or_else(|| panic!("no type: {v}")),
        e["param"].as_str().unwrap_or(""),
        e["message"].as_str().unwrap_or(""),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_embeddings_float_base64_tokens_and_exact_usage() {
    let base = common::serve(state()).await;
    let shoal_entry = |models: &str| -> Value {
        let v: Value = serde_json::from_str(models).expect("json");
        v["data"]
            .as_array()
            .and_then(|d| d.iter().find(|m| m["id"] == EMBED))
            .map(|m| m["shoal"].clone())
            .unwrap_or_else(|| panic!("{EMBED} in {v}"))
    };
    let before = shoal_entry(&get(&base, "/v1/models").await.1);
    assert_eq!(before["loaded"], false);
    let estimate = before["estimated_memory_bytes"].as_u64().expect("estimate");
    let (s, v) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": ["hello world", "A man is eating food."]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], EMBED);
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    assert_eq!(
        (&data[0]["object"], &data[1]["index"]),
        (&json!("embedding"), &json!(1))
    );
    // [CLS] hello world [SEP] and [CLS] a man is eating food . [SEP]
    assert_eq!(v["usage"], json!({"prompt_tokens": 12, "total_tokens": 12}));
    let float = vector(&data[0]["embedding"]);
    assert_eq!(float.len(), 384);
    // The estimate before loading and the memory once loaded differ only by
    // the file's header (the estimate counts the whole file as weights).
    let after = shoal_entry(&get(&base, "/v1/models").await.1);
    let held = after["memory_bytes"].as_u64().expect("memory");
    assert!(
        estimate > held && estimate - held < 2 << 20,
        "estimate {estimate}, held {held}"
    );

    // base64: the same float32 values, little-endian, as the same lone input
    // as floats. A vector computed beside another input is compared by angle:
    // llama.cpp's default GEMM kernels tile by the step's rows, so a batched
    // row can differ from its lone run in the last bits (`--batch-invariant`
    // is the mode that keeps them equal).
    let (s, lone) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": "hello world"}),
    )
    .await;
    assert_eq!(s, 200, "{lone}");
    let lone = vector(&lone["data"][0]["embedding"]);
    assert!(cosine(&lone, &float) > 0.9999);
    let float = lone;
    let (s, b) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": "hello world", "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().expect("a base64 string"))
        .expect("base64");
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(decoded, float);
    assert_eq!(b["usage"]["prompt_tokens"], 4);

    // Token ids are embedded as given: the same ids as the text, the same vector.
    let (s, t) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": [[101, 7592, 2088, 102]], "dimensions": 384}),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    assert_eq!(t["usage"]["total_tokens"], 4);
    assert!(cosine(&vector(&t["data"][0]["embedding"]), &float) > 0.9999);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_embedding_requests_get_a_400_in_each_dialect_and_the_server_keeps_serving() {
    let mut st = state();
    let mut access = shoal_api::access::Access::default();
    access.max_body_bytes = 64 * 1024;
    st.access = Arc::new(access);
    let base = common::serve(st).await;
    let many: Vec<String> = (0..2049).map(|i| format!("x{i}")).collect();
    for (body, param, words) in [
        (
            json!({"model": EMBED, "input": ""}),
            "input",
            "input 0 is empty",
        ),
        (json!({"model": EMBED, "input": []}), "input", "is empty"),
        (
            json!({"model": EMBED, "input": ["ok", ""]}),
            "input",
            "input 1 is empty",
        ),
        (
            json!({"model": EMBED, "input": 123}),
            "input",
            "must be a string",
        ),
        (
            json!({"model": EMBED, "input": [[101, 999999, 102]]}),
            "input",
            "outside the vocabulary",
        ),
        (
            json!({"model": EMBED, "input": many}),
            "input",
            "at most 2048",
        ),
        (
            json!({"model": EMBED, "input": "hi", "dimensions": 128}),
            "dimensions",
            "does not support",
        ),
        (
            json!({"model": EMBED, "input": "hi", "encoding_format": "hex"}),
            "encoding_format",
            "float or base64",
        ),
        (
            json!({"model": EMBED, "input": "word ".repeat(600)}),
            "input",
            "window is 512",
        ),
        (
            json!({"model": CHAT, "input": "hi"}),
            "model",
            "not an embedding model",
        ),
    ] {
        let (s, v) = post(&base, "/v1/embeddings", body.clone()).await;
        assert_eq!(s, 400, "{body}: {v}");
        let (kind, p, message) = openai_error(&v);
        assert_eq!((kind, p), ("invalid_request_error", param), "{v}");
        assert!(message.contains(words), "{body}: {message}");
    }
    let (s, v) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": "x".repeat(100 * 1024)}),
    )
    .await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(openai_error(&v).0, "invalid_request_error");
    let (s, v) = post(
        &base,
        "/v1/embeddings",
        json!({"model": "nope", "input": "hi"}),
    )
    .await;
    assert_eq!(s, 404, "{v}");

    // Ollama's shape: a lone `error` string.
    for (path, body, words) in [
        (
            "/api/embed",
            json!({"model": EMBED, "input": ["a", ""]}),
            "input 1 is empty",
        ),
        (
            "/api/embed",
            json!({"model": EMBED, "input": 7}),
            "must be a string",
        ),
        (
            "/api/embed",
            json!({"model": EMBED, "input": "word ".repeat(600), "truncate": false}),
            "window is 512",
        ),
        (
            "/api/embed",
            json!({"model": CHAT, "input": "hi"}),
            "not an embedding model",
        ),
        (
            "/api/embeddings",
            json!({"model": CHAT, "prompt": "hi"}),
            "not an embedding model",
        ),
    ] {
        let (s, v) = post(&base, path, body.clone()).await;
        assert_eq!(s, 400, "{body}: {v}");
        let e = v["error"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(e.contains(words), "{body}: {e}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(1), "only `error`: {v}");
    }

    // The embedding model asked to generate, in every dialect.
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": EMBED, "messages": msgs}),
        ),
        ("/v1/completions", json!({"model": EMBED, "prompt": "hi"})),
        ("/v1/responses", json!({"model": EMBED, "input": "hi"})),
        (
            "/v1/messages",
            json!({"model": EMBED, "max_tokens": 8, "messages": msgs}),
        ),
        (
            "/api/chat",
            json!({"model": EMBED, "messages": msgs, "stream": false}),
        ),
        (
            "/api/generate",
            json!({"model": EMBED, "prompt": "hi", "stream": false}),
        ),
    ] {
        let (s, v) = post(&base, path, body).await;
        assert_eq!(s, 400, "{path}: {v}");
        let text = v.to_string();
        assert!(text.contains("is an embedding model"), "{path}: {text}");
    }

    // Still serving, both kinds of model.
    let (s, v) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": "hi"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(
        &base,
        "/v1/chat/completions",
        json!({"model": CHAT, "messages": msgs, "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_embed_truncates_counts_and_answers_the_old_route() {
    let base = common::serve(state()).await;
    // No input: a load request.
    let (s, v) = post(&base, "/api/embed", json!({"model": EMBED})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["embeddings"], json!([]));
    let (s, v) = post(
        &base,
        "/api/embed",
        json!({"model": format!("{EMBED}:latest"), "input": ["hello world", "A man is eating food."]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["model"], format!("{EMBED}:latest"));
    assert_eq!(v["prompt_eval_count"], 12);
    assert!(v["total_duration"].as_u64().is_some_and(|d| d > 0), "{v}");
    assert!(v["load_duration"].as_u64().is_some(), "{v}");
    let vs = v["embeddings"].as_array().expect("embeddings");
    assert_eq!(vs.len(), 2);
    let hello = vector(&vs[0]);
    let norm: f32 = hello.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "unit length: {norm}");

    // Too long: cut to the window by default (Ollama's `truncate`), keeping [SEP].
    let long = "word ".repeat(600);
    let (s, v) = post(&base, "/api/embed", json!({"model": EMBED, "input": long})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["prompt_eval_count"], 512);

    // The older route: one prompt, one vector, the same one.
    let (s, v) = post(
        &base,
        "/api/embeddings",
        json!({"model": EMBED, "prompt": "hello world"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(cosine(&vector(&v["embedding"]), &hello) > 0.9999);
    let (s, v) = post(&base, "/api/embeddings", json!({"model": EMBED})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["embedding"], json!([]));

    // `/api/show` and `/v1/models` call it an embedding model; the chat model is not one.
    let (s, v) = post(&base, "/api/show", json!({"model": EMBED})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["capabilities"], json!(["embedding"]));
    let (s, v) = post(&base, "/api/show", json!({"model": CHAT})).await;
    assert_eq!(s, 200, "{v}");
    assert!(!v["capabilities"].to_string().contains("embedding"), "{v}");
    let (s, t) = get(&base, "/v1/models").await;
    assert_eq!(s, 200, "{t}");
    let models: Value = serde_json::from_str(&t).expect("json");
    let kind = |id: &str| {
        models["data"]
            .as_array()
            .and_then(|d| d.iter().find(|m| m["id"] == id))
            .map(|m| m["shoal"].clone())
            .unwrap_or_else(|| panic!("{id} in {models}"))
    };
    let e = kind(EMBED);
    assert_eq!(e["kind"], "embedding");
    assert_eq!(
        (&e["embedding"]["dimensions"], &e["embedding"]["pooling"]),
        (&json!(384), &json!("mean"))
    );
    assert_eq!(kind(CHAT)["kind"], "chat");
    assert_eq!(kind(CHAT)["embedding"], Value::Null);

    // `keep_alive: 0` unloads it.
    let (s, _) = post(
        &base,
        "/api/embed",
        json!({"model": EMBED, "keep_alive": 0}),
    )
    .await;
    assert_eq!(s, 200);
    assert!(!is_loaded(&base, EMBED).await, "unloaded by keep_alive 0");
}

async fn is_loaded(base: &str, id: &str) -> bool {
    let (_, t) = get(base, "/v1/models").await;
    let v: Value = serde_json::from_str(&t).expect("json");
    v["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"] == id))
        .map(|m| m["shoal"]["loaded"] == true)
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_and_metrics_count_embedding_requests() {
    let mut st = state();
    // $2 per million input tokens, $8 per million output tokens.
    let price = shoal_client::metadata::Price {
        input_per_mtok: 2.0,
        output_per_mtok: 8.0,
        cached_input_per_mtok: None,
    };
    st.prices = Arc::new([(EMBED.to_string(), price)].into());
    let base = common::serve(st).await;
    let (s, _) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": ["hello world", "hello"]}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = post(
        &base,
        "/api/embed",
        json!({"model": EMBED, "input": "hello world"}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": ""}),
    )
    .await;
    assert_eq!(s, 400);

    let (s, t) = get(&base, "/v1/usage?dialect=embeddings").await;
    assert_eq!(s, 200, "{t}");
    let u: Value = serde_json::from_str(&t).expect("json");
    let rows = u["data"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{u}");
    let ok = rows
        .iter()
        .find(|r| r["status"] == 200)
        .expect("served row");
    assert_eq!(ok["dialect"], "openai.embeddings");
    assert_eq!(ok["endpoint"], "/v1/embeddings");
    assert_eq!(ok["model"], EMBED);
    assert_eq!(ok["usage"], json!({"prompt_tokens": 7, "total_tokens": 7}));
    // Priced as input: 7 tokens at $2 per million, nothing as output.
    assert!(
        (ok["cost"]["input"].as_f64().unwrap_or(0.0) - 7.0 * 2.0 / 1e6).abs() < 1e-12,
        "{ok}"
    );
    assert_eq!(ok["cost"]["output"].as_f64(), Some(0.0), "{ok}");
    let refused = rows
        .iter()
        .find(|r| r["status"] == 400)
        .expect("refusal row");
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("empty")),
        "{refused}"
    );

    let (_, t) = get(&base, "/v1/usage?endpoint=/api/embed").await;
    let u: Value = serde_json::from_str(&t).expect("json");
    let row = u["data"]
        .as_array()
        .and_then(|d| d.iter().find(|r| r["endpoint"] == "/api/embed"))
        .unwrap_or_else(|| panic!("{u}"));
    assert_eq!(u["data"].as_array().map(Vec::len), Some(1), "{u}");
    assert_eq!(row["dialect"], "ollama");
    assert_eq!(row["usage"]["prompt_eval_count"], 4);
    assert_eq!(row["usage"]["eval_count"], 0);

    // Grouped by model, the embedding tokens sit on the embedding model.
    let (_, t) = get(&base, "/v1/usage?group_by=model").await;
    assert!(t.contains(EMBED), "{t}");

    let (_, m) = get(&base, "/metrics").await;
    assert!(
        m.contains("shoal_embedding_inputs_total{dialect=\"openai.embeddings\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("shoal_embedding_inputs_total{dialect=\"ollama\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("shoal_tokens_total{dialect=\"openai.embeddings\",kind=\"prompt\"} 7"),
        "{m}"
    );
}

/// A gauge's value in `/metrics`.
async fn gauge(base: &str, name: &str) -> i64 {
    let (_, t) = get(base, "/metrics").await;
    t.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Asks the server until `check` sees the state it waits for: the server's
/// own events decide the outcome. The two-minute deadline only ends a run
/// that hangs; the pause between asks keeps the polling light.
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let hang_guard = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(std::time::Instant::now() < hang_guard, "never saw {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_request_whose_client_leaves_is_recorded_as_cancelled() {
    let base = common::serve(state()).await;
    let text = "the quick brown fox jumps over the lazy dog";
    let (s, v) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": text}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let cost = v["usage"]["prompt_tokens"].as_u64().expect("tokens");
    let at_least = |name: &'static str| {
        let base = base.clone();
        move || {
            let base = base.clone();
            async move { (gauge(&base, name).await >= 1).then_some(()) }
        }
    };
    // A long request keeps the engine busy while a second one waits. How
    // long "long" is depends on the machine: when the second request is
    // answered before it is seen waiting (or before its client can leave),
    // the busy request doubles and the case runs again.
    let mut inputs = 256;
    loop {
        let long: Vec<String> = (0..inputs)
            .map(|i| format!("{text} {i} ").repeat(8))
            .collect();
        let busy = {
            let base = base.clone();
            tokio::spawn(async move {
                post(
                    &base,
                    "/v1/embeddings",
                    json!({"model": EMBED, "input": long}),
                )
                .await
            })
        };
        until(
            "the long request running",
            at_least("shoal_requests_in_flight"),
        )
        .await;
        let mut leaving = {
            let base = base.clone();
            tokio::spawn(async move {
                post(
                    &base,
                    "/v1/embeddings",
                    json!({"model": EMBED, "input": text}),
                )
                .await
            })
        };
        // Waits for the second request to be queued, or to be answered.
        let queued = until("the second request queued or answered", || {
            let base = base.clone();
            let done = leaving.is_finished();
            async move {
                if done {
                    return Some(false);
                }
                (gauge(&base, "shoal_queue_depth").await >= 1).then_some(true)
            }
        })
        .await;
        // Its client leaves: the connection closes with the request unanswered.
        leaving.abort();
        let left = match (&mut leaving).await {
            Err(e) => e.is_cancelled(),
            Ok(_) => false,
        };
        let (s, _) = busy.await.expect("long request");
        assert_eq!(s, 200);
        if queued && left {
            break;
        }
        assert!(
            inputs < MAX_INPUTS,
            "the second request was answered before it could wait even behind {inputs} inputs"
        );
        inputs = (inputs * 2).min(MAX_INPUTS);
    }
    let row = until("the cancelled request's row", || {
        let base = base.clone();
        async move {
            let (_, t) = get(&base, "/v1/usage?dialect=embeddings&finish=cancelled").await;
            let u: Value = serde_json::from_str(&t).unwrap_or_default();
            u["data"].as_array().and_then(|d| d.first()).cloned()
        }
    })
    .await;
    assert_eq!(row["finish_reasons"], json!(["cancelled"]), "{row}");
    assert_eq!(row["model"], EMBED, "{row}");
    // Exact either way: withdrawn from the queue costs nothing; taken into
    // a round before the client left costs its tokens.
    let spent = row["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(spent == 0 || spent == cost, "{row}");
    // The server keeps serving.
    let (s, v) = post(
        &base,
        "/v1/embeddings",
        json!({"model": EMBED, "input": text}),
    )
    .await;
    assert_eq!((s, v["usage"]["prompt_tokens"].as_u64()), (200, Some(cost)));
}
