//! Ollama's API end to end on the real default model: the model routes,
//! chat and generate streamed and not, exact counts against Chat
//! Completions, options, keep-alive on the pool, errors in Ollama's shape,
//! the ledger, and the second port.
mod common;

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};
use std::sync::Arc;

use shoal_api::dialects::ollama::port::{self, OllamaPort};
use shoal_api::AppState;
use shoal_engine::{Engine, EngineOptions};

const MODEL: &str = "smollm2";

fn engine() -> Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    // No prefix cache: counts are compared across identical requests.
    E.get_or_init(|| {
        let opts = EngineOptions {
            prefix_cache_bytes: 0,
            ..common::options()
        };
        Engine::start(&common::gguf(), MODEL, opts).expect("load")
    })
    .clone()
}

async fn server() -> String {
    common::serve(AppState::new(engine())).await
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, String, String) {
    let mut rb = reqwest::Client::new().request(method, url);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.expect("send");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, ct, r.text().await.expect("body"))
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let (s, _, t) = call(reqwest::Method::POST, format!("{base}{path}"), Some(body)).await;
    (s, serde_json::from_str(&t).unwrap_or(Value::String(t)))
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    let (s, _, t) = call(reqwest::Method::GET, format!("{base}{path}"), None).await;
    (s, serde_json::from_str(&t).unwrap_or(Value::String(t)))
}

/// A streamed answer's lines, each parsed as JSON (NDJSON as the clients read it).
async fn stream(base: &str, path: &str, body: Value) -> (String, Vec<Value>) {
    let (s, ct, t) = call(reqwest::Method::POST, format!("{base}{path}"), Some(body)).await;
    assert_eq!(s, 200, "{t}");
    let lines = t
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?}: {e}")))
        .collect();
    (ct, lines)
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn france() -> Value {
    json!([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_routes_answer_as_ollama_does() {
    let base = server().await;
    let (s, _, text) = call(reqwest::Method::GET, format!("{base}/"), None).await;
    assert_eq!((s, text.as_str()), (200, "Ollama is running"));
    let (s, _, _) = call(reqwest::Method::HEAD, format!("{base}/"), None).await;
    assert_eq!(s, 200);
    let (s, v) = get(&base, "/api/version").await;
    assert_eq!(s, 200);
    let version: Vec<u32> = v["version"]
        .as_str()
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse().expect("a number"))
        .collect();
    assert_eq!(version.len(), 3, "{v}");
    // Codex's `--oss` mode refuses an Ollama older than 0.13.4.
    assert!(version >= vec![0, 13, 4], "{v}");

    // Pulling a model the server has is done at once, no hub involved.
    for name in [MODEL.to_string(), format!("{MODEL}:latest")] {
        let (s, v) = post(&base, "/api/pull", json!({"model": name, "stream": false})).await;
        assert_eq!((s, &v), (200, &json!({"status": "success"})), "{name}");
        let (_, lines) = stream(&base, "/api/pull", json!({"model": name})).await;
        assert_eq!(lines.last(), Some(&json!({"status": "success"})), "{name}");
    }

    let (s, v) = get(&base, "/api/tags").await;
    assert_eq!(s, 200, "{v}");
    let m = &v["models"][0];
    assert_eq!(m["name"], "smollm2:latest", "{v}");
    assert_eq!(m["model"], "smollm2:latest");
    assert!(n(&m["size"]) > 1 << 20);
    assert_eq!(m["digest"].as_str().map(str::len), Some(64), "{m}");
    assert!(m["modified_at"].as_str().is_some_and(|t| t.contains('T')));
    assert_eq!(m["details"]["format"], "gguf");
    assert_eq!(m["details"]["family"], "llama");
    assert_eq!(m["details"]["quantization_level"], "Q4_1");
    assert!(m["details"]["parameter_size"]
        .as_str()
        .is_some_and(|p| p.ends_with('M')));

    // Both names of the model, as Copilot's provider calls it.
    for name in ["smollm2", "smollm2:latest"] {
        let (s, v) = post(&base, "/api/show", json!({ "model": name })).await;
        assert_eq!(s, 200, "{v}");
        let caps: Vec<&str> = v["capabilities"]
            .as_array()
            .expect("capabilities")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            caps.contains(&"completion") && caps.contains(&"tools"),
            "{caps:?}"
        );
        assert!(
            !caps.contains(&"thinking"),
            "SmolLM2 cannot think: {caps:?}"
        );
        assert_eq!(v["model_info"]["general.architecture"], "llama", "{v}");
        assert_eq!(n(&v["model_info"]["llama.context_length"]), 8192);
        // The window served beside the trained one (SmolLM2's whole 8192).
        assert_eq!(n(&v["context_length"]), 8192, "{v}");
        assert_eq!(n(&v["trained_context_length"]), 8192, "{v}");
        assert_eq!(
            n(&v["model_info"]["shoal.trained_context_length"]),
            8192,
            "{v}"
        );
        assert!(
            v["parameters"]
                .as_str()
                .is_some_and(|p| p.ends_with("\nnum_ctx 8192")),
            "{v}"
        );
        assert!(v["template"]
            .as_str()
            .is_some_and(|t| t.contains("im_start")));
        // The model card's defaults, as written.
        assert!(
            v["parameters"]
                .as_str()
                .is_some_and(|p| p.contains("temperature 0.2\n") && p.contains("top_p 0.9\n")),
            "{v}"
        );
    }
    let (s, v) = post(&base, "/api/show", json!({"model": "nope"})).await;
    assert_eq!(
        (s, v),
        (
            404,
            json!({"error": "model \"nope\" not found, try pulling it first"})
        )
    );

    let (s, v) = get(&base, "/api/ps").await;
    assert_eq!(s, 200, "{v}");
    let m = &v["models"][0];
    assert_eq!(m["name"], "smollm2:latest");
    assert!(n(&m["size"]) > 1 << 20);
    assert_eq!(m["size_vram"], 0);
    assert_eq!(n(&m["context_length"]), 8192);
    assert_eq!(n(&m["trained_context_length"]), 8192);
    // Kept until unloaded (no idle limit): far in the future.
    assert!(m["expires_at"].as_str().is_some_and(|t| t > "2200"), "{m}");

    let (s, v) = post(
        &base,
        "/api/embed",
        json!({"model": "smollm2", "input": "hi"}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("not an embedding model")),
        "{v}"
    );
    let (s, v) = get(&base, "/api/nope").await;
    assert_eq!(s, 404);
    assert!(v["error"].is_string(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_counts_match_chat_completions_streamed_or_not() {
    let base = server().await;
    let (s, openai) = post(
        &base,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": france(), "temperature": 0, "max_tokens": 24}),
    )
    .await;
    assert_eq!(s, 200, "{openai}");
    let body = json!({"model": "smollm2:latest", "messages": france(), "stream": false,
                      "options": {"temperature": 0, "num_predict": 24}});
    let (s, v) = post(&base, "/api/chat", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    let text = v["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert!(text.contains("Paris"), "{v}");
    assert_eq!(text, openai["choices"][0]["message"]["content"]);
    assert_eq!(v["message"]["role"], "assistant");
    assert_eq!(v["model"], "smollm2:latest");
    assert_eq!(v["done"], true);
    assert_eq!(
        v["done_reason"],
        match openai["choices"][0]["finish_reason"].as_str() {
            Some("length") => "length",
            _ => "stop",
        }
    );
    assert_eq!(v["prompt_eval_count"], openai["usage"]["prompt_tokens"]);
    assert_eq!(v["eval_count"], openai["usage"]["completion_tokens"]);
    assert_eq!(v["prompt_eval_cached_count"], 0);
    assert_eq!(v["eval_thinking_count"], 0);
    let total = n(&v["total_duration"]);
    assert!(
        n(&v["eval_duration"]) > 0 && n(&v["prompt_eval_duration"]) > 0,
        "{v}"
    );
    assert!(
        total >= n(&v["prompt_eval_duration"]) + n(&v["eval_duration"]),
        "{v}"
    );
    assert!(total >= n(&v["load_duration"]));

    // Streamed by default: NDJSON, the same text and the same counts.
    let mut streamed = body.clone();
    streamed.as_object_mut().expect("object").remove("stream");
    let (ct, lines) = stream(&base, "/api/chat", streamed).await;
    assert!(ct.starts_with("application/x-ndjson"), "{ct}");
    let (last, parts) = lines.split_last().expect("lines");
    assert!(parts
        .iter()
        .all(|l| l["done"] == false && l["created_at"].is_string()));
    let joined: String = parts
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(last["done"], true);
    assert_eq!(last["message"]["content"], "");
    for k in ["prompt_eval_count", "eval_count", "done_reason"] {
        assert_eq!(last[k], v[k], "{k}");
    }

    // The same through /api/generate with the chat template.
    let (s, g) = post(
        &base,
        "/api/generate",
        json!({"model": MODEL, "prompt": "What is the capital of France? Answer in one sentence.", "stream": false,
               "options": {"temperature": 0, "num_predict": 24}}),
    )
    .await;
    assert_eq!(s, 200, "{g}");
    assert_eq!(g["response"], text.as_str());
    assert_eq!(g["prompt_eval_count"], openai["usage"]["prompt_tokens"]);
    let (_, lines) = stream(
        &base,
        "/api/generate",
        json!({"model": MODEL, "prompt": "What is the capital of France? Answer in one sentence.",
               "options": {"temperature": 0, "num_predict": 24}}),
    )
    .await;
    let joined: String = lines
        .iter()
        .filter_map(|l| l["response"].as_str())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(lines.last().expect("last")["eval_count"], g["eval_count"]);

    // Raw: no template, fewer prompt tokens than the templated prompt.
    let (s, r) = post(
        &base,
        "/api/generate",
        json!({"model": MODEL, "prompt": "The capital of France is", "raw": true, "stream": false,
               "options": {"temperature": 0, "num_predict": 4}}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert!(
        n(&r["prompt_eval_count"]) < n(&g["prompt_eval_count"]),
        "{r}"
    );

    // Every request is in the ledger as Ollama, with its own usage words.
    let (s, u) = get(&base, "/v1/usage?dialect=ollama").await;
    assert_eq!(s, 200, "{u}");
    let rows = u["data"].as_array().expect("rows");
    assert_eq!(rows.len(), 5, "{u}");
    assert!(rows.iter().all(|r| r["dialect"] == "ollama"));
    let chat_row = rows
        .iter()
        .find(|r| r["endpoint"] == "/api/chat" && r["stream"] == false)
        .expect("chat row");
    assert_eq!(
        chat_row["usage"]["prompt_eval_count"],
        v["prompt_eval_count"]
    );
    assert_eq!(chat_row["tokens"]["completion"], v["eval_count"]);
}

/// `logprobs` / `top_logprobs` on `/api/chat` and `/api/generate`, as
/// Ollama 0.12.11 on gives them: one entry per generated token, the same
/// streamed or not, with the alternatives asked for; none unless asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_per_token_streamed_or_not() {
    // An engine of its own: a row batched with another test's request may
    // differ from its lone run in a logprob's last bits.
    let alone = Engine::start(
        &common::gguf(),
        MODEL,
        EngineOptions {
            prefix_cache_bytes: 0,
            ..common::options()
        },
    )
    .expect("load");
    let base = common::serve(AppState::new(alone)).await;
    for (path, body) in [
        ("/api/chat", json!({"model": MODEL, "messages": france()})),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "The capital of France is"}),
        ),
    ] {
        let mut asked = body.clone();
        asked["options"] = json!({"temperature": 0, "num_predict": 6});
        asked["logprobs"] = json!(true);
        asked["top_logprobs"] = json!(2);
        asked["stream"] = json!(false);
        let (s, v) = post(&base, path, asked.clone()).await;
        assert_eq!(s, 200, "{path}: {v}");
        let lps = v["logprobs"].as_array().expect("logprobs").clone();
        assert_eq!(lps.len() as u64, n(&v["eval_count"]), "{path}: {v}");
        for l in &lps {
            assert!(l["logprob"].as_f64().is_some_and(|x| x <= 0.0), "{l}");
            assert!(l["token"].is_string(), "{l}");
            let top = l["top_logprobs"].as_array().expect("top");
            assert_eq!(top.len(), 2, "{l}");
            // Greedy: the chosen token is the most likely one.
            assert_eq!(top[0]["token"], l["token"], "{l}");
        }
        asked["stream"] = json!(true);
        let (_, lines) = stream(&base, path, asked.clone()).await;
        let streamed: Vec<Value> = lines
            .iter()
            .filter_map(|l| l["logprobs"].as_array())
            .flatten()
            .cloned()
            .collect();
        assert_eq!(streamed, lps, "{path}");
        // Not asked: none.
        let mut plain = body.clone();
        plain["options"] = json!({"temperature": 0, "num_predict": 6});
        plain["stream"] = json!(false);
        let (_, v) = post(&base, path, plain).await;
        assert!(v.get("logprobs").is_none(), "{path}: {v}");
        let mut bad = asked.clone();
        bad["top_logprobs"] = json!(21);
        let (s, v) = post(&base, path, bad).await;
        assert_eq!(s, 400, "{path}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_format_and_finishes() {
    let base = server().await;
    // num_predict caps the reply: `length`, exactly that many tokens.
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}],
               "stream": false, "options": {"num_predict": 3, "temperature": 0}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["done_reason"].clone(), n(&v["eval_count"])),
        (json!("length"), 3)
    );
    // num_ctx bounds prompt + reply.
    let prompt = n(&v["prompt_eval_count"]);
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}],
               "stream": false, "options": {"num_ctx": prompt + 4, "temperature": 0}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["done_reason"], "length");
    assert_eq!(n(&v["eval_count"]), 4, "{v}");
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}],
               "stream": false, "options": {"num_ctx": prompt}}),
    )
    .await;
    assert_eq!(s, 400, "a prompt that fills num_ctx: {v}");
    // A stop sequence ends the reply before it, as `stop`; the ledger keeps
    // the engine's reason.
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "messages": france(), "stream": false,
               "options": {"stop": ["Paris"], "temperature": 0, "num_predict": 24}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["done_reason"], "stop");
    assert!(
        !v["message"]["content"]
            .as_str()
            .unwrap_or("Paris")
            .contains("Paris"),
        "{v}"
    );
    let (_, u) = get(&base, "/v1/usage?dialect=ollama&limit=1").await;
    assert_eq!(
        u["data"][0]["engine_finish_reasons"][0], "stop_sequence",
        "{u}"
    );
    // format: JSON, parsed by the client as it arrives.
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "stream": false, "format": {"type": "object",
                 "properties": {"city": {"type": "string"}}, "required": ["city"]},
               "messages": [{"role": "user", "content": "Name the capital of France as JSON."}],
               "options": {"temperature": 0, "num_predict": 40}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let parsed: Value = serde_json::from_str(v["message"]["content"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {v}"));
    assert!(parsed["city"].is_string(), "{parsed}");
    // Unknown options are ignored, as Ollama does.
    let (s, v) = post(
        &base,
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "stream": false,
               "options": {"num_predict": 2, "mirostat": 2, "num_gpu": 99}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_ollama_errors_and_are_recorded() {
    let base = server().await;
    let msg = france();
    for (path, body, status, words) in [
        (
            "/api/chat",
            json!({"model": "nope", "messages": msg}),
            404,
            "model \"nope\" not found, try pulling it first",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
            400,
            "vision",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "images": ["aGk="]}),
            400,
            "vision",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": msg, "think": true}),
            400,
            "does not support thinking",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": msg, "options": {"num_ctx": 0}}),
            400,
            "num_ctx",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": msg, "options": {"temperature": "hot"}}),
            400,
            "options",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": msg, "format": "yaml"}),
            400,
            "format",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": msg, "keep_alive": "soon"}),
            400,
            "keep_alive",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "def f(", "suffix": "return 1"}),
            400,
            "insert",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "context": [1, 2]}),
            400,
            "context",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}),
            400,
            "role",
        ),
        ("/api/chat", json!({"messages": msg}), 400, "model"),
    ] {
        let (s, v) = post(&base, path, body.clone()).await;
        assert_eq!(s, status, "{body}: {v}");
        let e = v["error"].as_str().unwrap_or_else(|| panic!("{body}: {v}"));
        assert!(e.contains(words), "{body}: {e}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(1), "only `error`: {v}");
    }
    let (s, _, t) = call(reqwest::Method::POST, format!("{base}/api/chat"), None).await;
    assert_eq!(s, 400, "{t}");
    // Refusals are ledger rows with their status and Ollama's words.
    let (_, u) = get(&base, "/v1/usage?dialect=ollama&limit=100").await;
    let rows = u["data"].as_array().expect("rows");
    let missing = rows
        .iter()
        .find(|r| r["status"] == 404)
        .unwrap_or_else(|| panic!("{u}"));
    assert!(missing["error"]
        .as_str()
        .is_some_and(|e| e.contains("try pulling it first")));
    // The server keeps serving.
    let (s, v) = post(
        &base,
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "stream": false, "options": {"num_predict": 2}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_reply_is_not_a_stop() {
    let engine = Engine::start(
        &common::gguf(),
        MODEL,
        EngineOptions {
            prefix_cache_bytes: 0,
            blocked_phrases: vec!["Paris".into()],
            ..common::options()
        },
    )
    .expect("load");
    let base = common::serve(AppState::new(engine)).await;
    let body = json!({"model": MODEL, "messages": france(), "stream": false,
                      "options": {"temperature": 0, "num_predict": 24}});
    let (s, v) = post(&base, "/api/chat", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["done_reason"], "content_filter", "{v}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (_, lines) = stream(&base, "/api/chat", streamed).await;
    assert_eq!(lines.last().expect("last")["done_reason"], "content_filter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_loads_and_unloads_through_the_pool() {
    // A pool that loads the default model from its path on demand.
    let pool = shoal_api::pool::ModelPool::new(shoal_api::pool::PoolOptions {
        engine: EngineOptions {
            prefix_cache_bytes: 0,
            ..common::options()
        },
        ..Default::default()
    });
    pool.add_named(MODEL, common::gguf(), Vec::new());
    let base = common::serve(AppState::with_pool(pool)).await;
    let loaded = |v: &Value| v["models"].as_array().map_or(0, Vec::len);

    let (_, ps) = get(&base, "/api/ps").await;
    assert_eq!(loaded(&ps), 0, "{ps}");
    // An empty request loads the model.
    let (s, v) = post(&base, "/api/generate", json!({"model": MODEL})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["done"].clone(), v["done_reason"].clone()),
        (json!(true), json!("load"))
    );
    let (_, ps) = get(&base, "/api/ps").await;
    assert_eq!(loaded(&ps), 1, "{ps}");
    // keep_alive 0 with no messages unloads it.
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "messages": [], "keep_alive": 0}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["done_reason"], "unload");
    let (_, ps) = get(&base, "/api/ps").await;
    assert_eq!(loaded(&ps), 0, "{ps}");
    // A reply with keep_alive 0 loads, answers, and unloads after.
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "messages": france(), "stream": false, "keep_alive": 0,
               "options": {"num_predict": 2}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        n(&v["load_duration"]) > 0,
        "the model was loaded for it: {v}"
    );
    let (_, ps) = get(&base, "/api/ps").await;
    assert_eq!(loaded(&ps), 0, "{ps}");
    // A duration keeps it that long after its last use, then the pool lets go.
    let (s, v) = post(
        &base,
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "stream": false, "keep_alive": "2s",
               "options": {"num_predict": 2}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (_, ps) = get(&base, "/api/ps").await;
    assert_eq!(loaded(&ps), 1, "{ps}");
    let expires = ps["models"][0]["expires_at"]
        .as_str()
        .expect("expires")
        .to_string();
    assert!(expires.as_str() < "2200", "{expires}");
    // Wait for the unload itself (bounded, generously: the machine is shared).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, ps) = get(&base, "/api/ps").await;
        if loaded(&ps) == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never unloaded: {ps}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ollama_port_serves_and_a_taken_one_is_reported() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut state = AppState::new(engine());
    state.ollama = Arc::new(OllamaPort::new(Some(port)));
    let base = common::serve(state).await;
    // Listening is set up before the main port accepts.
    let (_, h) = get(&base, "/health").await;
    assert_eq!(h["ollama"]["listening"], true, "{h}");
    let ollama = format!("http://127.0.0.1:{port}");
    let (s, _, text) = call(reqwest::Method::GET, format!("{ollama}/"), None).await;
    assert_eq!((s, text.as_str()), (200, "Ollama is running"));
    let (s, v) = get(&ollama, "/api/tags").await;
    assert_eq!(s, 200);
    assert_eq!(v["models"][0]["name"], "smollm2:latest");
    // A browser on the main port still gets the web UI.
    let r = reqwest::Client::new()
        .get(format!("{base}/"))
        .header("accept", "text/html")
        .send()
        .await
        .expect("page");
    assert!(r.headers()["content-type"]
        .to_str()
        .is_ok_and(|c| c.starts_with("text/html")));

    // A second server asking for the same port keeps serving on its own.
    let mut second = AppState::new(engine());
    second.ollama = Arc::new(OllamaPort::new(Some(port)));
    let other = common::serve(second).await;
    let (s, h) = get(&other, "/health").await;
    assert_eq!(s, 200);
    assert_eq!(h["ollama"]["listening"], false, "{h}");
    assert!(
        h["ollama"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(&port.to_string()) && e.contains("taken")),
        "{h}"
    );
    let (s, _) = get(&other, "/api/tags").await;
    assert_eq!(s, 200);
}

/// A free port on the loopback interface (free when this returns).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

async fn put_switch(base: &str, body: Value) -> (u16, Value) {
    let (s, _, t) = call(
        reqwest::Method::PUT,
        format!("{base}/v1/settings/ollama-port"),
        Some(body),
    )
    .await;
    (s, serde_json::from_str(&t).unwrap_or(Value::String(t)))
}

/// The settings switch opens and closes Ollama's port on a running server,
/// says so when the port is taken, and is remembered in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_switch_opens_and_closes_the_ollama_port() {
    let dir = std::env::temp_dir().join(format!("shoal-ollama-switch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let db = dir.join("shoal.db");
    let state = AppState::new(engine())
        .with_store(&db, Default::default())
        .expect("store");
    let store = state.store.clone().expect("store");
    let base = common::serve(state).await;
    let (s, v) = get(&base, "/v1/settings/ollama-port").await;
    assert_eq!(s, 200);
    assert_eq!(
        (v["enabled"].clone(), v["port"].clone()),
        (json!(false), json!(11434)),
        "{v}"
    );

    let port = free_port();
    let (s, v) = put_switch(&base, json!({"enabled": true, "port": port})).await;
    assert_eq!((s, v["listening"].clone()), (200, json!(true)), "{v}");
    let ollama = format!("http://127.0.0.1:{port}");
    let (s, tags) = get(&ollama, "/api/tags").await;
    assert_eq!(s, 200);
    assert_eq!(tags["models"][0]["name"], "smollm2:latest");
    let (_, h) = get(&base, "/health").await;
    assert_eq!(h["ollama"]["listening"], true, "{h}");
    assert_eq!(
        port::remembered(&store.lock().expect("store")),
        Some(Some(port))
    );

    // Off: the port no longer answers; the main one does.
    let (s, v) = put_switch(&base, json!({"enabled": false})).await;
    assert_eq!(
        (s, v["enabled"].clone(), v["listening"].clone()),
        (200, json!(false), json!(false)),
        "{v}"
    );
    let refused = reqwest::Client::new()
        .get(format!("{ollama}/api/tags"))
        .send()
        .await;
    assert!(refused.is_err(), "the closed port still answered");
    assert_eq!(port::remembered(&store.lock().expect("store")), Some(None));

    // A taken port: the switch is on, nothing listens, and the reason says so.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = taken.local_addr().expect("addr").port();
    let (s, v) = put_switch(&base, json!({"enabled": true, "port": busy})).await;
    assert_eq!(s, 200);
    assert_eq!(
        (v["enabled"].clone(), v["listening"].clone()),
        (json!(true), json!(false)),
        "{v}"
    );
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("taken") && e.contains(&busy.to_string())),
        "{v}"
    );
    let (s, _) = get(&base, "/api/tags").await;
    assert_eq!(s, 200, "the main port serves regardless");

    // Bad bodies are 400s in the OpenAI shape of Shoal's own routes.
    for bad in [
        json!({"enabled": "yes"}),
        json!({"enabled": true, "port": 0}),
        json!({"on": true}),
    ] {
        let (s, v) = put_switch(&base, bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
}
