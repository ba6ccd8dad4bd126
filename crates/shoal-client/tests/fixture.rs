//! Every target against a local fixture provider that replays responses in
//! the shapes the public OpenAI, Azure OpenAI, Anthropic and Ollama
//! references document. Each reply is stored and read back, and its metadata is checked
//! key by key — including that forged reserved keys from the request are gone.
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use shoal_client::target::{Dialect, Message, PieceKind, Request, Target, TargetConfig};
use shoal_client::Metadata;
use shoal_store::Store;

/// (status, content type, body) for a scenario name.
fn scenario(name: &str) -> (u16, &'static str, String) {
    let j = |v: Value| (200, "application/json", v.to_string());
    let sse = |events: &[Value], done: bool| {
        let mut s: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        if done {
            s.push_str("data: [DONE]\n\n");
        }
        (200, "text/event-stream", s)
    };
    let named = |events: &[(&str, Value)]| {
        let s: String = events
            .iter()
            .map(|(n, e)| format!("event: {n}\ndata: {e}\n\n"))
            .collect();
        (200, "text/event-stream", s)
    };
    let chunk = |delta: Value, finish: Value| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    match name {
        "chat_stop" => j(json!({"id": "c", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                      "prompt_tokens_details": {"cached_tokens": 4}, "completion_tokens_details": {"reasoning_tokens": 0}}})),
        "chat_n2" => j(json!({"choices": [
            {"index": 1, "message": {"role": "assistant", "content": "B"}, "finish_reason": "length"},
            {"index": 0, "message": {"role": "assistant", "content": "A"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}})),
        "chat_tools" => j(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}})),
        "chat_filtered" => j(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null},
            "finish_reason": "content_filter", "content_filter_results": {"hate": {"filtered": true, "severity": "high"}}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}})),
        "chat_400_filter" => (400, "application/json", json!({"error": {
            "message": "The response was filtered due to the prompt triggering content management policy.",
            "type": null, "param": "prompt", "code": "content_filter", "status": 400,
            "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {"violence": {"filtered": true, "severity": "medium"}}}}}).to_string()),
        "chat_500" => (500, "text/plain", "upstream exploded".to_string()),
        // A generation over the server's time limit: the error, and beside it
        // what was spent (Shoal's shape).
        "chat_504_usage" => (504, "application/json", json!({"error": {
            "message": "the request exceeded the server's time limit of 1 s", "type": "timeout_error",
            "param": null, "code": "request_timeout"},
            "usage": {"prompt_tokens": 14, "completion_tokens": 40, "total_tokens": 54,
                      "prompt_tokens_details": {"cached_tokens": 6}, "completion_tokens_details": {"reasoning_tokens": 0}}}).to_string()),
        "chat_stream_timeout" => sse(&[
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"content": "1, 2"}), Value::Null),
            json!({"error": {"message": "the request exceeded the server's time limit of 1 s", "type": "timeout_error",
                   "param": null, "code": "request_timeout"},
                   "usage": {"prompt_tokens": 14, "completion_tokens": 3, "total_tokens": 17,
                             "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}}),
        ], true),
        "messages_504_usage" => (504, "application/json", json!({"type": "error",
            "error": {"type": "timeout_error", "message": "the request exceeded the server's time limit of 1 s"},
            "usage": {"input_tokens": 9, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5, "output_tokens": 40}}).to_string()),
        "chat_odd_usage" => j(json!({"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": ""}],
            "usage": {"prompt_tokens": null, "completion_tokens": "7", "total_tokens": 12.0,
                      "prompt_tokens_details": {}, "completion_tokens_details": {"reasoning_tokens": -1}}})),
        "chat_no_usage" => j(json!({"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}]})),
        "chat_stream_usage" => sse(&[
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"content": "Hel"}), Value::Null),
            chunk(json!({"content": "lo"}), Value::Null),
            chunk(json!({}), json!("stop")),
            json!({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11,
                   "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}}),
        ], true),
        "chat_stream_tools" => sse(&[
            chunk(json!({"tool_calls": [{"index": 0, "id": "call_9", "type": "function", "function": {"name": "f", "arguments": ""}}]}), Value::Null),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}), Value::Null),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}), Value::Null),
            chunk(json!({}), json!("tool_calls")),
        ], true),
        "chat_stream_cut" => sse(&[chunk(json!({"content": "partial"}), Value::Null)], false),
        "completions_length" => j(json!({"object": "text_completion", "choices": [{"index": 0, "text": "abc", "finish_reason": "length", "logprobs": null}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})),
        "responses_incomplete" => j(json!({"id": "resp_1", "object": "response", "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "reasoning", "id": "rs_1", "summary": []},
                       {"type": "message", "id": "msg_1", "role": "assistant", "status": "incomplete",
                        "content": [{"type": "output_text", "text": "The capital", "annotations": []}]}],
            "usage": {"input_tokens": 37, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
                      "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 40}})),
        "responses_filtered" => j(json!({"id": "resp_2", "object": "response", "status": "incomplete",
            "incomplete_details": {"reason": "content_filter"}, "output": [],
            "usage": {"input_tokens": 12, "output_tokens": 4, "total_tokens": 16}})),
        "responses_stream" => named(&[
            ("response.created", json!({"type": "response.created", "response": {"status": "in_progress", "output": []}})),
            ("response.output_text.delta", json!({"type": "response.output_text.delta", "delta": "Hi"})),
            ("response.output_item.added", json!({"type": "response.output_item.added",
                "item": {"type": "function_call", "call_id": "call_3", "name": "f", "arguments": ""}})),
            ("response.completed", json!({"type": "response.completed", "response": {"status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
                           {"type": "function_call", "call_id": "call_3", "name": "f", "arguments": "{}"}],
                "usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 5, "total_tokens": 14}}})),
        ]),
        "messages_stop_sequence" => j(json!({"id": "msg_1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "The capital of France is "}],
            "stop_reason": "stop_sequence", "stop_sequence": "Paris",
            "usage": {"input_tokens": 17, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 20, "output_tokens": 6}})),
        "messages_refusal" => j(json!({"id": "msg_2", "type": "message", "role": "assistant", "content": [],
            "stop_reason": "refusal", "stop_sequence": null, "usage": {"input_tokens": 11, "output_tokens": 2}})),
        "messages_tool_use" => j(json!({"id": "msg_3", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            "stop_reason": "tool_use", "stop_sequence": null, "usage": {"input_tokens": 50, "output_tokens": 20}})),
        "messages_stream" => named(&[
            ("message_start", json!({"type": "message_start", "message": {"id": "msg_4", "content": [], "stop_reason": null,
                "usage": {"input_tokens": 25, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 0, "output_tokens": 1}}})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ("ping", json!({"type": "ping"})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}})),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": null}, "usage": {"output_tokens": 7}})),
            ("message_stop", json!({"type": "message_stop"})),
        ]),
        "messages_stream_timeout" => named(&[
            ("message_start", json!({"type": "message_start", "message": {"id": "msg_5", "content": [], "stop_reason": null,
                "usage": {"input_tokens": 9, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5, "output_tokens": 1}}})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "1, 2"}})),
            ("error", json!({"type": "error", "error": {"type": "timeout_error", "message": "the request exceeded the server's time limit of 1 s"},
                "usage": {"input_tokens": 9, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5, "output_tokens": 3}})),
        ]),
        "ollama_stop" => j(json!({"model": "m", "created_at": "2023-08-04T19:22:45.499127Z",
            "message": {"role": "assistant", "content": "Hi"}, "done": true, "done_reason": "stop",
            "total_duration": 4883583458u64, "load_duration": 1334875, "prompt_eval_count": 26,
            "prompt_eval_duration": 342546000, "eval_count": 2, "eval_duration": 4535599000u64})),
        "ollama_stream" => {
            let lines = [
                json!({"model": "m", "message": {"role": "assistant", "content": "Hel"}, "done": false}),
                json!({"model": "m", "message": {"role": "assistant", "content": "lo"}, "done": false}),
                json!({"model": "m", "message": {"role": "assistant", "content": ""}, "done": true,
                       "done_reason": "length", "prompt_eval_count": 8, "prompt_eval_cached_count": 3,
                       "eval_count": 2, "eval_thinking_count": 0}),
            ];
            let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
            (200, "application/x-ndjson", body)
        }
        "ollama_tools" => j(json!({"model": "m", "message": {"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            "done": true, "done_reason": "stop", "prompt_eval_count": 30, "eval_count": 12})),
        "ollama_404" => (404, "application/json", json!({"error": "model 'm' not found"}).to_string()),
        // Shoal's Ollama error for a generation over its time limit: the
        // counts spent, under `usage`, beside the error.
        "ollama_504_usage" => (504, "application/json", json!({
            "error": "the request exceeded the server's time limit of 1 s",
            "usage": {"prompt_eval_count": 14, "prompt_eval_cached_count": 6, "eval_count": 40,
                      "eval_thinking_count": 0}}).to_string()),
        other => (404, "text/plain", format!("no scenario {other}")),
    }
}

async fn provider(headers: HeaderMap) -> Response {
    let name = headers
        .get("x-scenario")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (status, ct, body) = scenario(name);
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", ct)
        .body(Body::from(body))
        .unwrap_or_default()
}

async fn fixture() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = Router::new()
        .route("/v1/{*path}", post(provider))
        .route("/api/{*path}", post(provider));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// Caller metadata that tries to forge every kind of reserved key.
fn forged() -> Metadata {
    let mut m = Metadata::new();
    for k in shoal_client::RESERVED_KEYS {
        m.insert(k.to_string(), json!("forged"));
    }
    m.insert("token_usage_prompt_tokens".into(), json!(999));
    m.insert("token_usage_made_up".into(), json!(1));
    m.insert("run".into(), json!("r1"));
    m
}

fn expected(status: u16, pairs: Value) -> Metadata {
    let mut m = Metadata::new();
    m.insert("run".into(), json!("r1"));
    m.insert("http_status".into(), json!(status));
    if let Value::Object(o) = pairs {
        m.extend(o);
    }
    m
}

struct Case {
    dialect: Dialect,
    stream: bool,
    scenario: &'static str,
    /// Per piece: (kind, text, metadata besides run/http_status).
    pieces: Vec<(PieceKind, &'static str, Value)>,
    status: u16,
}

async fn check(base: &str, store: &mut Store, conv: i64, c: Case) {
    let target = Target::new(TargetConfig {
        dialect: c.dialect,
        base_url: format!("{base}/v1"),
        model: "m".into(),
        api_key: Some("sk-test".into()),
        headers: vec![("x-scenario".into(), c.scenario.into())],
        stream: c.stream,
        price: None,
    })
    .expect("target");
    let req = Request {
        messages: vec![Message {
            role: "user".into(),
            content: "hi".into(),
            images: Vec::new(),
        }],
        max_tokens: Some(8),
        metadata: forged(),
        ..Request::default()
    };
    let reply = target.send(&req).await;
    assert_eq!(reply.http_status, c.status, "{}", c.scenario);
    let id = store
        .add_message(
            conv,
            "assistant",
            Some(c.dialect.name()),
            Some("m"),
            &reply.pieces,
        )
        .expect("store");
    let stored = store.message(id).expect("read").expect("present");
    assert_eq!(
        stored.pieces.len(),
        c.pieces.len(),
        "{}: {:?}",
        c.scenario,
        stored.pieces
    );
    for (i, (p, (kind, text, meta))) in stored.pieces.iter().zip(c.pieces).enumerate() {
        assert_eq!(p.kind, kind, "{} piece {i}", c.scenario);
        assert_eq!(p.text, text, "{} piece {i}", c.scenario);
        let mut want = expected(c.status, meta);
        if kind == PieceKind::Error {
            let err = p.metadata.get("error").cloned().unwrap_or(Value::Null);
            assert!(
                err.as_str().is_some_and(|e| !e.is_empty()),
                "{}: error text",
                c.scenario
            );
            want.insert("error".into(), err);
        }
        // Key by key, so a failure names the key.
        for (k, v) in &want {
            assert_eq!(
                p.metadata.get(k),
                Some(v),
                "{} piece {i} key {k}",
                c.scenario
            );
        }
        for k in p.metadata.keys() {
            assert!(
                want.contains_key(k),
                "{} piece {i}: unexpected key {k} = {}",
                c.scenario,
                p.metadata[k]
            );
        }
    }
}

#[tokio::test]
async fn every_path_records_the_providers_reason_and_usage_only() {
    let base = fixture().await;
    let dir = std::env::temp_dir().join(format!("shoal-fixture-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut store = Store::open(&dir.join("s.sqlite")).expect("store");
    let conv = store.create_conversation("fixture").expect("conv");
    use Dialect::*;
    use PieceKind::*;
    let cases = vec![
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_stop",
            status: 200,
            pieces: vec![(
                Text,
                "Hi",
                json!({
            "finish_reason": "stop", "token_usage_prompt_tokens": 10, "token_usage_completion_tokens": 2,
            "token_usage_total_tokens": 12, "token_usage_cached_tokens": 4, "token_usage_reasoning_tokens": 0}),
            )],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_n2",
            status: 200,
            pieces: vec![
                (
                    Text,
                    "A",
                    json!({"finish_reason": "stop", "token_usage_prompt_tokens": 5, "token_usage_completion_tokens": 9, "token_usage_total_tokens": 14}),
                ),
                (
                    Text,
                    "B",
                    json!({"finish_reason": "length", "token_usage_prompt_tokens": 5, "token_usage_completion_tokens": 9, "token_usage_total_tokens": 14}),
                ),
            ],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_tools",
            status: 200,
            pieces: vec![(
                Text,
                "",
                json!({
            "finish_reason": "tool_calls", "token_usage_prompt_tokens": 30, "token_usage_completion_tokens": 12, "token_usage_total_tokens": 42}),
            )],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_filtered",
            status: 200,
            pieces: vec![(
                Text,
                "",
                json!({
            "finish_reason": "content_filter", "token_usage_prompt_tokens": 20, "token_usage_completion_tokens": 3, "token_usage_total_tokens": 23}),
            )],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_400_filter",
            status: 400,
            pieces: vec![(Error, "", json!({"finish_reason": "content_filter"}))],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_500",
            status: 500,
            pieces: vec![(Error, "", json!({}))],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_504_usage",
            status: 504,
            pieces: vec![(
                Error,
                "",
                json!({"token_usage_prompt_tokens": 14, "token_usage_completion_tokens": 40, "token_usage_total_tokens": 54,
                       "token_usage_cached_tokens": 6, "token_usage_reasoning_tokens": 0}),
            )],
        },
        Case {
            dialect: Chat,
            stream: true,
            scenario: "chat_stream_timeout",
            status: 200,
            pieces: vec![(
                Error,
                "1, 2",
                json!({"token_usage_prompt_tokens": 14, "token_usage_completion_tokens": 3, "token_usage_total_tokens": 17,
                       "token_usage_cached_tokens": 0, "token_usage_reasoning_tokens": 0}),
            )],
        },
        Case {
            dialect: Messages,
            stream: false,
            scenario: "messages_504_usage",
            status: 504,
            pieces: vec![(
                Error,
                "",
                json!({"token_usage_input_tokens": 9, "token_usage_cached_tokens": 5, "token_usage_cache_creation_tokens": 0,
                       "token_usage_prompt_tokens": 14, "token_usage_completion_tokens": 40, "token_usage_total_tokens": 54}),
            )],
        },
        Case {
            dialect: Messages,
            stream: true,
            scenario: "messages_stream_timeout",
            status: 200,
            pieces: vec![(
                Error,
                "1, 2",
                json!({"token_usage_input_tokens": 9, "token_usage_cached_tokens": 5, "token_usage_cache_creation_tokens": 0,
                       "token_usage_prompt_tokens": 14, "token_usage_completion_tokens": 3, "token_usage_total_tokens": 17}),
            )],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_odd_usage",
            status: 200,
            pieces: vec![(Text, "x", json!({"token_usage_total_tokens": 12}))],
        },
        Case {
            dialect: Chat,
            stream: false,
            scenario: "chat_no_usage",
            status: 200,
            pieces: vec![(Text, "x", json!({"finish_reason": "stop"}))],
        },
        Case {
            dialect: Chat,
            stream: true,
            scenario: "chat_stream_usage",
            status: 200,
            pieces: vec![(
                Text,
                "Hello",
                json!({
            "finish_reason": "stop", "token_usage_prompt_tokens": 8, "token_usage_completion_tokens": 3, "token_usage_total_tokens": 11,
            "token_usage_cached_tokens": 0, "token_usage_reasoning_tokens": 0}),
            )],
        },
        Case {
            dialect: Chat,
            stream: true,
            scenario: "chat_stream_tools",
            status: 200,
            pieces: vec![(Text, "", json!({"finish_reason": "tool_calls"}))],
        },
        Case {
            dialect: Chat,
            stream: true,
            scenario: "chat_stream_cut",
            status: 200,
            pieces: vec![(Text, "partial", json!({}))],
        },
        Case {
            dialect: Completions,
            stream: false,
            scenario: "completions_length",
            status: 200,
            pieces: vec![(
                Text,
                "abc",
                json!({
            "finish_reason": "length", "token_usage_prompt_tokens": 3, "token_usage_completion_tokens": 3, "token_usage_total_tokens": 6}),
            )],
        },
        Case {
            dialect: Responses,
            stream: false,
            scenario: "responses_incomplete",
            status: 200,
            pieces: vec![(
                Text,
                "The capital",
                json!({
            "status": "incomplete", "incomplete_reason": "max_output_tokens", "token_usage_prompt_tokens": 37, "token_usage_cached_tokens": 0,
            "token_usage_completion_tokens": 3, "token_usage_reasoning_tokens": 1, "token_usage_total_tokens": 40}),
            )],
        },
        Case {
            dialect: Responses,
            stream: false,
            scenario: "responses_filtered",
            status: 200,
            pieces: vec![(
                Text,
                "",
                json!({
            "status": "incomplete", "incomplete_reason": "content_filter", "token_usage_prompt_tokens": 12,
            "token_usage_completion_tokens": 4, "token_usage_total_tokens": 16}),
            )],
        },
        Case {
            dialect: Responses,
            stream: true,
            scenario: "responses_stream",
            status: 200,
            pieces: vec![(
                Text,
                "Hi",
                json!({
            "status": "completed", "token_usage_prompt_tokens": 9, "token_usage_cached_tokens": 2,
            "token_usage_completion_tokens": 5, "token_usage_total_tokens": 14}),
            )],
        },
        Case {
            dialect: Messages,
            stream: false,
            scenario: "messages_stop_sequence",
            status: 200,
            pieces: vec![(
                Text,
                "The capital of France is ",
                json!({
            "stop_reason": "stop_sequence", "stop_sequence": "Paris", "token_usage_input_tokens": 17, "token_usage_cached_tokens": 20,
            "token_usage_cache_creation_tokens": 0, "token_usage_prompt_tokens": 37, "token_usage_completion_tokens": 6, "token_usage_total_tokens": 43}),
            )],
        },
        Case {
            dialect: Messages,
            stream: false,
            scenario: "messages_refusal",
            status: 200,
            pieces: vec![(
                Text,
                "",
                json!({
            "stop_reason": "refusal", "token_usage_input_tokens": 11, "token_usage_prompt_tokens": 11,
            "token_usage_completion_tokens": 2, "token_usage_total_tokens": 13}),
            )],
        },
        Case {
            dialect: Messages,
            stream: false,
            scenario: "messages_tool_use",
            status: 200,
            pieces: vec![(
                Text,
                "Checking.",
                json!({
            "stop_reason": "tool_use", "token_usage_input_tokens": 50, "token_usage_prompt_tokens": 50,
            "token_usage_completion_tokens": 20, "token_usage_total_tokens": 70}),
            )],
        },
        Case {
            dialect: Messages,
            stream: true,
            scenario: "messages_stream",
            status: 200,
            pieces: vec![(
                Text,
                "Hello",
                json!({
            "stop_reason": "max_tokens", "token_usage_input_tokens": 25, "token_usage_cached_tokens": 0, "token_usage_cache_creation_tokens": 5,
            "token_usage_prompt_tokens": 30, "token_usage_completion_tokens": 7, "token_usage_total_tokens": 37}),
            )],
        },
        Case {
            dialect: Ollama,
            stream: false,
            scenario: "ollama_stop",
            status: 200,
            pieces: vec![(
                Text,
                "Hi",
                json!({"finish_reason": "stop", "token_usage_prompt_tokens": 26,
                       "token_usage_completion_tokens": 2, "token_usage_total_tokens": 28}),
            )],
        },
        Case {
            dialect: Ollama,
            stream: true,
            scenario: "ollama_stream",
            status: 200,
            pieces: vec![(
                Text,
                "Hello",
                json!({"finish_reason": "length", "token_usage_prompt_tokens": 8,
                       "token_usage_cached_tokens": 3, "token_usage_completion_tokens": 2,
                       "token_usage_total_tokens": 10, "token_usage_reasoning_tokens": 0}),
            )],
        },
        Case {
            dialect: Ollama,
            stream: false,
            scenario: "ollama_404",
            status: 404,
            pieces: vec![(Error, "", json!({}))],
        },
        Case {
            dialect: Ollama,
            stream: false,
            scenario: "ollama_504_usage",
            status: 504,
            pieces: vec![(
                Error,
                "",
                json!({"token_usage_prompt_tokens": 14, "token_usage_cached_tokens": 6,
                       "token_usage_completion_tokens": 40, "token_usage_total_tokens": 54,
                       "token_usage_reasoning_tokens": 0}),
            )],
        },
    ];
    for c in cases {
        check(&base, &mut store, conv, c).await;
    }
    assert_eq!(store.integrity_check().expect("check"), "ok");
}

#[tokio::test]
async fn tool_calls_are_kept_per_dialect() {
    let base = fixture().await;
    for (dialect, stream, scenario, want) in [
        (
            Dialect::Chat,
            false,
            "chat_tools",
            json!([{"id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}]),
        ),
        (
            Dialect::Chat,
            true,
            "chat_stream_tools",
            json!([{"id": "call_9", "name": "f", "arguments": "{\"a\":1}"}]),
        ),
        (
            Dialect::Responses,
            true,
            "responses_stream",
            json!([{"id": "call_3", "name": "f", "arguments": "{}"}]),
        ),
        (
            Dialect::Messages,
            false,
            "messages_tool_use",
            json!([{"id": "toolu_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}]),
        ),
        (
            Dialect::Ollama,
            false,
            "ollama_tools",
            json!([{"id": "", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}]),
        ),
    ] {
        let t = Target::new(TargetConfig {
            dialect,
            base_url: base.clone(),
            model: "m".into(),
            api_key: None,
            headers: vec![("x-scenario".into(), scenario.into())],
            stream,
            price: None,
        })
        .expect("target");
        let reply = t.send(&Request::default()).await;
        assert_eq!(json!(reply.pieces[0].tool_calls), want, "{scenario}");
    }
}

#[tokio::test]
async fn an_unreachable_provider_is_an_error_piece_with_clean_metadata() {
    let t = Target::new(TargetConfig {
        dialect: Dialect::Chat,
        base_url: "http://127.0.0.1:9".into(),
        model: "m".into(),
        api_key: Some("sk-secret".into()),
        headers: vec![],
        stream: false,
        price: None,
    })
    .expect("target");
    let req = Request {
        metadata: forged(),
        ..Request::default()
    };
    let reply = t.send(&req).await;
    assert_eq!(reply.http_status, 0);
    let p = &reply.pieces[0];
    assert_eq!(p.kind, PieceKind::Error);
    let keys: Vec<&String> = p.metadata.keys().collect();
    assert_eq!(keys, vec!["run", "error"]);
    assert!(!p.metadata["error"].to_string().contains("sk-secret"));
}
