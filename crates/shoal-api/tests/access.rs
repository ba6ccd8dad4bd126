//! Access rules on the real default model: API keys (both headers, constant
//! answers in each dialect's shape), origins and CORS, request limits.
mod common;

use std::sync::Arc;

use common::gguf;
use serde_json::{json, Value};
use shoal_api::access::Access;
use shoal_api::AppState;
use shoal_engine::Engine;

const MODEL: &str = "smollm2";
const KEY: &str = "sk-local-7f3a9c";

/// One engine for every test, alive until the process exits.
fn engine() -> Engine {
    static E: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    E.get_or_init(|| Engine::start(&gguf(), MODEL, common::options()).expect("load"))
        .clone()
}

async fn server(access: Access) -> String {
    let mut state = AppState::new(engine());
    state.access = Arc::new(access);
    common::serve(state).await
}

async fn call(
    method: reqwest::Method,
    url: String,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut r = reqwest::Client::new().request(method, url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    (status, h, resp.text().await.unwrap())
}

fn chat() -> Value {
    json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
}

fn messages() -> Value {
    json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
}

#[tokio::test]
async fn keys_are_required_in_both_headers_and_refusals_use_each_dialects_shape() {
    let access = Access::default()
        .with_keys(&[KEY.into(), "second-key".into()])
        .expect("keys");
    let base = server(access).await;
    let post = reqwest::Method::POST;
    let (status, _, body) = call(
        post.clone(),
        format!("{base}/v1/chat/completions"),
        &[],
        Some(chat()),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("API key is required"));

    let (status, _, body) = call(
        post.clone(),
        format!("{base}/v1/messages"),
        &[("x-api-key", "nope")],
        Some(messages()),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    assert_eq!(v["error"]["message"], "invalid API key");

    let bearer = format!("Bearer {KEY}");
    let (status, _, body) = call(
        post.clone(),
        format!("{base}/v1/chat/completions"),
        &[("authorization", &bearer)],
        Some(chat()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(
        post.clone(),
        format!("{base}/v1/messages"),
        &[("x-api-key", "second-key")],
        Some(messages()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A key of the right length but wrong bytes, and a prefix of a key.
    for wrong in ["sk-local-7f3a9d", "sk-local"] {
        let h = format!("Bearer {wrong}");
        let (status, _, _) = call(
            post.clone(),
            format!("{base}/v1/chat/completions"),
            &[("authorization", &h)],
            Some(chat()),
        )
        .await;
        assert_eq!(status, 401, "{wrong}");
    }

    let get = reqwest::Method::GET;
    for (path, open) in [
        ("/health", true),
        ("/", true),
        ("/metrics", false),
        ("/v1/models", false),
        ("/v1/usage", false),
        ("/v1/cluster/nodes", false),
    ] {
        let (status, _, _) = call(get.clone(), format!("{base}{path}"), &[], None).await;
        assert_eq!(status == 401, !open, "{path}: {status}");
    }
    let (status, _, usage) = call(
        get.clone(),
        format!("{base}/v1/usage"),
        &[("x-api-key", KEY)],
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        !usage.contains(KEY) && !usage.contains("second-key"),
        "a key leaked into the ledger"
    );
    assert!(usage.contains("openai.chat") && usage.contains("anthropic.messages"));
}

/// Named keys: the ledger records each request under its key's name (never
/// the key), with the user agent and origin; a key past its requests per
/// minute or its tokens per day gets a 429 in the dialect's shape with
/// `retry-after`, generates nothing, and the refusal is in the ledger too.
#[tokio::test]
async fn named_keys_are_recorded_and_held_to_their_limits() {
    let access = Access::default()
        .with_keys(&[
            "opencode=sk-oc-1;requests_per_minute=2".into(),
            "ci=sk-ci-2;tokens_per_day=20".into(),
        ])
        .expect("keys");
    let base = server(access).await;
    let post = reqwest::Method::POST;
    let oc = [
        ("authorization", "Bearer sk-oc-1"),
        ("user-agent", "opencode/0.9"),
    ];
    for _ in 0..2 {
        let (status, _, body) = call(
            post.clone(),
            format!("{base}/v1/chat/completions"),
            &oc,
            Some(chat()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, h, body) = call(
        post.clone(),
        format!("{base}/v1/chat/completions"),
        &oc,
        Some(chat()),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    let wait: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "retry-after {wait}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("2 requests per minute"));
    // Anthropic's shape for the same refusal.
    let (status, h, body) = call(
        post.clone(),
        format!("{base}/v1/messages"),
        &[("x-api-key", "sk-oc-1")],
        Some(messages()),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert!(h.contains_key("retry-after"));
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("rate_limit_error"))
    );

    // The first request of `ci` takes it past 20 tokens (its prompt alone
    // is longer); the next is refused until the UTC day ends.
    let ci = [("x-api-key", "sk-ci-2")];
    let (status, _, body) = call(
        post.clone(),
        format!("{base}/v1/messages"),
        &ci,
        Some(messages()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let sent: Value = serde_json::from_str(&body).unwrap();
    // Anthropic's input_tokens leave out what the prefix cache served.
    let used: u64 = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens",
    ]
    .iter()
    .map(|k| sent["usage"][*k].as_u64().unwrap())
    .sum();
    assert!(used >= 20, "{sent}");
    let (status, h, body) = call(
        post.clone(),
        format!("{base}/v1/messages"),
        &ci,
        Some(messages()),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    let wait: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&wait), "retry-after {wait}");
    assert!(
        body.contains(&format!("used {used} of its 20 tokens")),
        "{body}"
    );

    let get = reqwest::Method::GET;
    let (status, _, listed) = call(
        get.clone(),
        format!("{base}/v1/usage?client=opencode"),
        &[("x-api-key", "sk-ci-2")],
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    assert!(
        !listed.contains("sk-oc-1") && !listed.contains("sk-ci-2"),
        "a key leaked"
    );
    let data = serde_json::from_str::<Value>(&listed).unwrap()["data"].clone();
    let statuses: Vec<u64> = data
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [429, 429, 200, 200], "{data}");
    for e in data.as_array().unwrap() {
        assert_eq!(e["client"], "opencode", "{e}");
    }
    assert_eq!(data[2]["user_agent"], "opencode/0.9");
    assert_eq!(
        data[0]["engine_finish_reasons"],
        json!([]),
        "a refusal generated nothing"
    );
    assert_eq!(data[0]["usage"]["input_tokens"], 0, "{}", data[0]);
    assert_eq!(data[1]["usage"]["prompt_tokens"], 0, "{}", data[1]);
    let (_, _, keys) = call(
        get.clone(),
        format!("{base}/v1/usage/keys"),
        &[("x-api-key", "sk-ci-2")],
        None,
    )
    .await;
    let keys: Value = serde_json::from_str(&keys).unwrap();
    assert_eq!(keys["data"][0]["name"], "opencode");
    assert_eq!(keys["data"][0]["requests_last_minute"], 2, "{keys}");
    assert_eq!(keys["data"][1]["tokens_today"], used, "{keys}");
    assert_eq!(keys["data"][1]["tokens_per_day"], 20);
    // Sums per client match what each was sent.
    let (_, _, grouped) = call(
        get,
        format!("{base}/v1/usage?group_by=client"),
        &[("x-api-key", "sk-ci-2")],
        None,
    )
    .await;
    let grouped: Value = serde_json::from_str(&grouped).unwrap();
    let ci_row = grouped["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"] == "ci")
        .cloned()
        .unwrap();
    assert_eq!(ci_row["requests"], 2, "{grouped}");
    assert_eq!(ci_row["total_tokens"], used, "{grouped}");
}

#[tokio::test]
async fn foreign_origins_are_refused_and_only_allowed_ones_get_cors() {
    let mut access = Access::default();
    access.origins.push("http://localhost:5173".into());
    let base = server(access).await;
    let host = base.trim_start_matches("http://").to_string();
    let post = reqwest::Method::POST;
    let url = format!("{base}/v1/chat/completions");
    let (status, _, body) = call(
        post.clone(),
        url.clone(),
        &[("origin", "http://evil.example")],
        Some(chat()),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "origin_not_allowed");
    // A text/plain "simple" request (no preflight in a browser) is refused too.
    let resp = reqwest::Client::new()
        .post(&url)
        .header("origin", "http://evil.example")
        .header("content-type", "text/plain")
        .body(chat().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);

    let own = format!("http://{host}");
    let (status, _, body) =
        call(post.clone(), url.clone(), &[("origin", &own)], Some(chat())).await;
    assert_eq!(status, 200, "the server's own pages: {body}");
    for allowed in ["tauri://localhost", "http://localhost:5173"] {
        let (status, h, body) = call(
            post.clone(),
            url.clone(),
            &[("origin", allowed)],
            Some(chat()),
        )
        .await;
        assert_eq!(status, 200, "{allowed}: {body}");
        assert_eq!(h["access-control-allow-origin"], allowed);
    }
    let preflight = |origin: &'static str| {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, url.clone())
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type,authorization",
            )
            .send()
    };
    let ok = preflight("http://localhost:5173").await.unwrap();
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );
    // Every dialect's own request headers are allowed (Anthropic's SDK sends
    // `anthropic-version` and `x-api-key` from a browser too).
    let allowed = ok.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    let own = shoal_api::dialects::registry().request_headers();
    assert!(own.contains(&"anthropic-version"), "{own:?}");
    for h in own.iter().chain(&["content-type", "authorization"]) {
        assert!(
            allowed.split(',').any(|a| a.trim() == *h),
            "{h} not allowed: {allowed}"
        );
    }
    let evil = preflight("http://evil.example").await.unwrap();
    assert!(evil.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn message_and_tool_counts_are_bounded() {
    let mut access = Access::default();
    access.max_messages = 3;
    access.max_tools = 1;
    let base = server(access).await;
    let post = reqwest::Method::POST;
    let many: Vec<Value> = (0..4)
        .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": "x"}))
        .collect();
    let (status, _, body) = call(
        post.clone(),
        format!("{base}/v1/chat/completions"),
        &[],
        Some(json!({"model": MODEL, "messages": many})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["param"],
        "messages"
    );
    let tool = |n: &str| json!({"name": n, "input_schema": {"type": "object"}});
    let (status, _, body) = call(
        post.clone(),
        format!("{base}/v1/messages"),
        &[],
        Some(
            json!({"model": MODEL, "max_tokens": 4, "tools": [tool("a"), tool("b")],
                    "messages": [{"role": "user", "content": "x"}]}),
        ),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("2 tools"),
        "{v}"
    );
    // Within the limits all is well.
    let (status, _, body) = call(
        post,
        format!("{base}/v1/chat/completions"),
        &[],
        Some(chat()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// The body limit is a setting: a body over it, sized or chunked, gets a
/// 413 in the dialect's shape naming the setting; a body within it is served.
#[tokio::test]
async fn the_body_limit_is_configurable_and_holds_for_chunked_bodies() {
    let mut access = Access::default();
    access.max_body_bytes = 1024;
    let base = server(access).await;
    let padded = |mut v: Value, n: usize| {
        v["metadata"] = json!({"pad": "x".repeat(n)});
        v
    };
    let post = reqwest::Method::POST;
    // (route, body, the error's top-level type, the field naming the error)
    for (path, body, top, field) in [
        (
            "/v1/chat/completions",
            padded(chat(), 2000),
            Value::Null,
            "code",
        ),
        (
            "/v1/messages",
            padded(messages(), 2000),
            json!("error"),
            "type",
        ),
    ] {
        let (status, _, body) = call(post.clone(), format!("{base}{path}"), &[], Some(body)).await;
        assert_eq!(status, 413, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["type"], top, "{v}");
        assert_eq!(v["error"][field], "request_too_large", "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("--max-body-mb"), "{v}");
    }
    // No Content-Length: the body is streamed in chunks past the limit.
    let chunks: Vec<Result<String, std::io::Error>> = vec![
        Ok(r#"{"model": "smollm2", "max_tokens": 2, "metadata": {"pad": ""#.to_string()),
        Ok("y".repeat(1500)),
        Ok(r#""}, "messages": [{"role": "user", "content": "Hi"}]}"#.to_string()),
    ];
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    // Within the limit the request is served.
    let (status, _, body) = call(
        post,
        format!("{base}/v1/chat/completions"),
        &[],
        Some(padded(chat(), 500)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// A request over the time limit stops: a 504 when not streaming, the
/// dialect's error event when streaming, and the ledger keeps its usage.
#[tokio::test]
async fn requests_over_the_time_limit_end_with_a_timeout_and_keep_their_usage() {
    let mut access = Access::default();
    // The limit is the feature under test, not a wait: the 4000-token reply
    // it must cut takes minutes here, and a host slow enough to reach it
    // before the first token still passes (only the prompt is counted).
    access.request_timeout = Some(std::time::Duration::from_millis(1500));
    let base = server(access).await;
    let post = reqwest::Method::POST;
    // A reply far longer than the limit allows, in every dialect.
    let count = "Write the numbers from 1 to 500 separated by commas.";
    let body = |path: &str, stream: bool| match path {
        "/v1/completions" => json!({"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6,",
            "max_tokens": 4000, "temperature": 0, "stream": stream}),
        "/v1/responses" => json!({"model": MODEL, "max_output_tokens": 4000, "temperature": 0,
            "stream": stream, "input": count}),
        _ => json!({"model": MODEL, "max_tokens": 4000, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": count}]}),
    };
    let paths = [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
    ];
    // Per request: its ledger id and the usage the client was sent.
    let mut sent: Vec<(String, Value)> = Vec::new();
    let id_of = |h: &reqwest::header::HeaderMap| {
        h.get(shoal_api::ledger::REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .expect("the response names its ledger id")
    };
    for path in paths {
        let (status, h, text) = call(
            post.clone(),
            format!("{base}{path}"),
            &[],
            Some(body(path, false)),
        )
        .await;
        let v: Value = serde_json::from_str(&text).unwrap();
        if path == "/v1/responses" {
            // Responses reports a failed response object, usage included.
            assert_eq!(status, 200, "{text}");
            assert_eq!(v["status"], "failed", "{v}");
            assert_eq!(v["error"]["code"], "request_timeout", "{v}");
            sent.push((id_of(&h), v["usage"].clone()));
            continue;
        }
        assert_eq!(status, 504, "{path}: {text}");
        let code = if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{v}");
            &v["error"]["type"]
        } else {
            &v["error"]["code"]
        };
        assert!(
            *code == "request_timeout" || *code == "timeout_error",
            "{path}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("time limit of 1 s"),
            "{v}"
        );
        // The usage the generation spent, beside the error.
        assert!(v["usage"].is_object(), "{path}: {v}");
        sent.push((id_of(&h), v["usage"].clone()));
    }

    // Each streamed dialect ends with its own error event, usage beside it.
    for path in paths {
        let (status, h, text) = call(
            post.clone(),
            format!("{base}{path}"),
            &[],
            Some(body(path, true)),
        )
        .await;
        assert_eq!(status, 200, "{path}");
        let last = text
            .split("\n\n")
            .filter_map(|block| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .and_then(|d| serde_json::from_str::<Value>(d).ok())
            })
            .last()
            .unwrap_or_else(|| panic!("{path}: no events in {text}"));
        let usage = match path {
            "/v1/responses" => {
                assert_eq!(last["type"], "response.failed", "{last}");
                assert_eq!(last["response"]["error"]["code"], "request_timeout");
                last["response"]["usage"].clone()
            }
            "/v1/messages" => {
                assert_eq!(
                    (&last["type"], &last["error"]["type"]),
                    (&json!("error"), &json!("timeout_error")),
                    "{last}"
                );
                last["usage"].clone()
            }
            _ => {
                assert_eq!(last["error"]["code"], "request_timeout", "{path}: {last}");
                assert!(text.trim_end().ends_with("data: [DONE]"), "{path}: {text}");
                last["usage"].clone()
            }
        };
        sent.push((id_of(&h), usage));
    }

    let (_, _, ledger) = call(reqwest::Method::GET, format!("{base}/v1/usage"), &[], None).await;
    let ledger: Value = serde_json::from_str(&ledger).unwrap();
    let entries = ledger["data"].as_array().unwrap();
    assert_eq!(sent.len(), 8);
    for (id, usage) in &sent {
        let e = entries
            .iter()
            .find(|e| e["id"] == id.as_str())
            .unwrap_or_else(|| panic!("no ledger entry {id}: {ledger}"));
        assert_eq!(e["engine_finish_reasons"], json!(["timeout"]), "{e}");
        // What the client was told is the ledger's own record.
        assert_eq!(&e["usage"], usage, "{id}");
        // A busy host may reach the limit before the first token, so what
        // must hold is the prompt counted and the reply cut short of its cap.
        let prompt = usage["prompt_tokens"]
            .as_u64()
            .or(usage["input_tokens"].as_u64())
            .unwrap_or(0);
        let out = usage["completion_tokens"]
            .as_u64()
            .or(usage["output_tokens"].as_u64());
        assert!(prompt > 0, "usage kept: {e}");
        assert!(out.is_some_and(|n| n < 4000), "usage kept: {e}");
    }
}
