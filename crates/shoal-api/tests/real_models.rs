//! Every dialect, streaming and not, on the real GGUFs run by llama.cpp:
//! SmolLM2 (the default), Qwen2.5-Coder-0.5B-Instruct and Gemma-3-270m.
//! Usage is checked against what the other paths report for the same
//! request (stream vs not, count_tokens, the ledger), finish reasons against
//! the limits that caused them.
use std::path::PathBuf;

use serde_json::{json, Value};
use shoal_api::AppState;
use shoal_engine::{BackendChoice, Engine, EngineOptions};

mod common;

struct Model {
    id: &'static str,
    path: PathBuf,
    chat: bool,
}

fn models() -> Vec<Model> {
    let real = shoal_engine::loader::real_models_dir();
    let all = vec![
        Model {
            id: "smollm2",
            path: common::gguf(),
            chat: true,
        },
        Model {
            id: "qwen2.5-coder",
            path: real.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
            chat: true,
        },
        // A base model whose GGUF carries no chat template.
        Model {
            id: "gemma3",
            path: real.join("gemma-3-270m-q4_k_m.gguf"),
            chat: false,
        },
    ];
    for m in &all {
        assert!(
            m.path.is_file(),
            "{} missing at {} — run `make models`",
            m.id,
            m.path.display()
        );
    }
    all
}

async fn serve(m: &Model, prefix_cache_bytes: usize) -> String {
    serve_on(m, BackendChoice::Llama, prefix_cache_bytes).await
}

async fn serve_on(m: &Model, backend: BackendChoice, prefix_cache_bytes: usize) -> String {
    let engine = Engine::start(
        &m.path,
        m.id,
        EngineOptions {
            backend,
            prefix_cache_bytes,
            ..EngineOptions::default()
        },
    )
    .expect("load on llama.cpp");
    common::serve(AppState::new(engine)).await
}

async fn post(base: &str, path: &str, body: &Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request");
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// The data of each SSE event (`[DONE]` left out).
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .flat_map(|b| b.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("event json"))
        .collect()
}

/// (prompt, completion, cached) tokens and the dialect's stop words, from a
/// whole response or from the final events of a stream.
#[derive(Debug, PartialEq)]
struct Outcome {
    prompt: u64,
    completion: u64,
    cached: u64,
    finish: String,
    text: String,
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn outcome(dialect: &str, body: &str, stream: bool) -> Outcome {
    match (dialect, stream) {
        ("chat", false) | ("completions", false) => {
            let v: Value = serde_json::from_str(body).expect("json");
            let c = &v["choices"][0];
            Outcome {
                prompt: n(&v["usage"]["prompt_tokens"]),
                completion: n(&v["usage"]["completion_tokens"]),
                cached: n(&v["usage"]["prompt_tokens_details"]["cached_tokens"]),
                finish: c["finish_reason"].as_str().unwrap_or("").into(),
                text: c["message"]["content"]
                    .as_str()
                    .or(c["text"].as_str())
                    .unwrap_or("")
                    .into(),
            }
        }
        ("chat", true) | ("completions", true) => {
            let ev = events(body);
            let usage = ev
                .iter()
                .rev()
                .find(|e| e["usage"].is_object())
                .expect("usage chunk");
            let finish = ev
                .iter()
                .filter_map(|e| e["choices"][0]["finish_reason"].as_str())
                .next_back()
                .unwrap_or("");
            let text: String = ev
                .iter()
                .filter_map(|e| {
                    e["choices"][0]["delta"]["content"]
                        .as_str()
                        .or(e["choices"][0]["text"].as_str())
                })
                .collect();
            Outcome {
                prompt: n(&usage["usage"]["prompt_tokens"]),
                completion: n(&usage["usage"]["completion_tokens"]),
                cached: n(&usage["usage"]["prompt_tokens_details"]["cached_tokens"]),
                finish: finish.into(),
                text,
            }
        }
        ("messages", false) => {
            let v: Value = serde_json::from_str(body).expect("json");
            Outcome {
                prompt: n(&v["usage"]["input_tokens"]) + n(&v["usage"]["cache_read_input_tokens"]),
                completion: n(&v["usage"]["output_tokens"]),
                cached: n(&v["usage"]["cache_read_input_tokens"]),
                finish: v["stop_reason"].as_str().unwrap_or("").into(),
                text: v["content"][0]["text"].as_str().unwrap_or("").into(),
            }
        }
        ("messages", true) => {
            let ev = events(body);
            let start = &ev[0]["message"]["usage"];
            let delta = ev
                .iter()
                .find(|e| e["type"] == "message_delta")
                .expect("message_delta");
            let text: String = ev
                .iter()
                .filter_map(|e| e["delta"]["text"].as_str())
                .collect();
            Outcome {
                prompt: n(&start["input_tokens"]) + n(&start["cache_read_input_tokens"]),
                completion: n(&delta["usage"]["output_tokens"]),
                cached: n(&start["cache_read_input_tokens"]),
                finish: delta["delta"]["stop_reason"].as_str().unwrap_or("").into(),
                text,
            }
        }
        ("responses", s) => {
            let v: Value = if s {
                events(body).pop().expect("final event")["response"].clone()
            } else {
                serde_json::from_str(body).expect("json")
            };
            let text = v["output"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|o| o["content"].as_array().into_iter().flatten())
                .filter_map(|c| c["text"].as_str())
                .collect();
            Outcome {
                prompt: n(&v["usage"]["input_tokens"]),
                completion: n(&v["usage"]["output_tokens"]),
                cached: n(&v["usage"]["input_tokens_details"]["cached_tokens"]),
                finish: match v["incomplete_details"]["reason"].as_str() {
                    Some(r) => format!("incomplete:{r}"),
                    None => v["status"].as_str().unwrap_or("").into(),
                },
                text,
            }
        }
        other => panic!("no dialect {other:?}"),
    }
}

/// The request body of each dialect for one user turn.
fn body(dialect: &str, model: &str, user: &str, max: u32, extra: Value) -> (String, Value) {
    let mut b = match dialect {
        "chat" => json!({"model": model, "messages": [{"role": "user", "content": user}],
                         "max_tokens": max, "temperature": 0}),
        // Raw text: a story to continue, so the reply runs past a few tokens.
        "completions" => json!({"model": model, "max_tokens": max, "temperature": 0,
            "prompt": format!("{user}\n\nOnce upon a time, in a small village by the sea, there lived")}),
        "messages" => json!({"model": model, "messages": [{"role": "user", "content": user}],
                             "max_tokens": max, "temperature": 0}),
        "responses" => json!({"model": model, "input": user, "max_output_tokens": max,
                              "temperature": 0}),
        other => panic!("no dialect {other}"),
    };
    if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let path = match dialect {
        "chat" => "/v1/chat/completions",
        "completions" => "/v1/completions",
        "messages" => "/v1/messages",
        _ => "/v1/responses",
    };
    (path.into(), b)
}

async fn both(
    base: &str,
    dialect: &str,
    model: &str,
    user: &str,
    max: u32,
    extra: Value,
) -> Outcome {
    let (path, b) = body(dialect, model, user, max, extra.clone());
    let (s, t) = post(base, &path, &b).await;
    assert_eq!(s, 200, "{model} {dialect}: {t}");
    let plain = outcome(dialect, &t, false);
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    if dialect == "chat" || dialect == "completions" {
        sb["stream_options"] = json!({"include_usage": true});
    }
    let (s, t) = post(base, &path, &sb).await;
    assert_eq!(s, 200, "{model} {dialect} stream: {t}");
    let streamed = outcome(dialect, &t, true);
    assert_eq!(
        plain, streamed,
        "{model} {dialect}: streaming reported otherwise"
    );
    plain
}

const LENGTH: [(&str, &str); 4] = [
    ("chat", "length"),
    ("completions", "length"),
    ("messages", "max_tokens"),
    ("responses", "incomplete:max_output_tokens"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_finish_reasons_in_every_dialect_on_real_models() {
    for m in models() {
        let base = serve(&m, 0).await;
        let user = "Write a short poem about the sea.";
        for (dialect, words) in LENGTH {
            if !m.chat && dialect != "completions" {
                continue;
            }
            // Cut by the token limit: exactly that many completion tokens.
            let o = both(&base, dialect, m.id, user, 7, json!({})).await;
            assert_eq!(o.finish, words, "{} {dialect}", m.id);
            assert_eq!(o.completion, 7, "{} {dialect}", m.id);
            assert!(o.prompt > 0 && o.cached == 0);
            // A stop sequence taken from the reply itself ends it there (the
            // Responses API has no stop sequences).
            if dialect == "responses" {
                continue;
            }
            let long = both(&base, dialect, m.id, user, 24, json!({})).await;
            let word = long
                .text
                .split_whitespace()
                .nth(3)
                .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
                .filter(|w| !w.is_empty())
                .unwrap_or_else(|| panic!("{} {dialect}: reply too short: {:?}", m.id, long.text));
            let stop = if dialect == "messages" {
                json!({"stop_sequences": [word]})
            } else {
                json!({"stop": [word]})
            };
            let o = both(&base, dialect, m.id, user, 24, stop).await;
            let cut = long.text.find(word).expect("word in reply");
            assert_eq!(
                o.text,
                long.text[..cut],
                "{} {dialect}: text up to the stop",
                m.id
            );
            assert!(o.completion < long.completion, "{} {dialect}", m.id);
            let stop_words = match dialect {
                "messages" => "stop_sequence",
                "responses" => "completed",
                _ => "stop",
            };
            assert_eq!(o.finish, stop_words, "{} {dialect}", m.id);
        }
        if m.chat {
            // The same conversation costs the same prompt tokens in every chat
            // dialect, and count_tokens agrees. One request at a time: `both`
            // compares a plain reply with a streamed one, and on llama.cpp a
            // batch shared with other requests may part a near tie.
            let mut prompts = Vec::new();
            for d in ["chat", "messages", "responses"] {
                prompts.push(both(&base, d, m.id, "Hi", 2, json!({})).await.prompt);
            }
            let (s, t) = post(
                &base,
                "/v1/messages/count_tokens",
                &json!({"model": m.id, "messages": [{"role": "user", "content": "Hi"}]}),
            )
            .await;
            assert_eq!(s, 200, "{t}");
            let counted = n(&serde_json::from_str::<Value>(&t).expect("json")["input_tokens"]);
            assert!(
                prompts.iter().all(|&p| p == counted),
                "{}: {prompts:?} vs {counted}",
                m.id
            );
        } else {
            // No template: the chat dialects refuse in their own shape, naming it.
            for dialect in ["chat", "messages", "responses"] {
                let (path, b) = body(dialect, m.id, "Hi", 4, json!({}));
                let (s, t) = post(&base, &path, &b).await;
                assert_eq!(s, 400, "{dialect}: {t}");
                assert!(t.contains("chat template"), "{dialect}: {t}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_tools_and_prefix_cache_on_real_models() {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"},
        "population": {"type": "integer"}}, "required": ["city", "population"],
        "additionalProperties": false});
    let weather = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    for m in models() {
        let base = serve(&m, 256 << 20).await;
        // The same prompt twice: the second reuses all but its last token.
        let dialect = if m.chat { "chat" } else { "completions" };
        let user = "Explain in one sentence why the sky is blue.";
        let (path, b) = body(dialect, m.id, user, 8, json!({}));
        let (_, t1) = post(&base, &path, &b).await;
        let (_, t2) = post(&base, &path, &b).await;
        let (o1, o2) = (outcome(dialect, &t1, false), outcome(dialect, &t2, false));
        assert_eq!(o1.cached, 0, "{}", m.id);
        assert_eq!(o2.prompt, o1.prompt);
        assert_eq!(o2.cached, o1.prompt - 1, "{}: cached tokens reported", m.id);
        // Not asserted: the same words. On llama.cpp a prompt's last position run
        // alone (after a hit) and run inside the whole prompt's batch can differ in
        // the last bits, enough to flip a greedy choice on some prompts.
        assert_eq!(o2.completion, o1.completion, "{}", m.id);
        if m.chat {
            let (s, t) = post(
                &base,
                "/v1/chat/completions",
                &json!({"model": m.id,
                "messages": [{"role": "user", "content": "Name a big city and its population."}],
                "max_tokens": 64, "temperature": 0,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "city", "schema": schema, "strict": true}}}),
            )
            .await;
            assert_eq!(s, 200, "{t}");
            let v: Value = serde_json::from_str(&t).expect("json");
            let content = v["choices"][0]["message"]["content"]
                .as_str()
                .expect("content");
            let parsed: Value = serde_json::from_str(content)
                .unwrap_or_else(|e| panic!("{}: {content:?} does not parse: {e}", m.id));
            assert!(
                parsed["city"].is_string() && parsed["population"].is_i64(),
                "{parsed}"
            );
            assert_eq!(v["choices"][0]["finish_reason"], "stop");

            // A forced call ends with tool_calls / tool_use and its usage.
            let (s, t) = post(
                &base,
                "/v1/chat/completions",
                &json!({"model": m.id,
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": weather, "tool_choice": "required", "max_tokens": 64,
                "temperature": 0}),
            )
            .await;
            assert_eq!(s, 200, "{t}");
            let v: Value = serde_json::from_str(&t).expect("json");
            assert_eq!(
                v["choices"][0]["finish_reason"], "tool_calls",
                "{}: {t}",
                m.id
            );
            let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
            assert_eq!(call["name"], "get_weather");
            let args: Value =
                serde_json::from_str(call["arguments"].as_str().expect("args")).expect("args json");
            assert!(args["city"].is_string(), "{args}");
            assert!(n(&v["usage"]["completion_tokens"]) > 0);
            let (s, t) = post(
                &base,
                "/v1/messages",
                &json!({"model": m.id,
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": [{"name": "get_weather", "description": "Current weather for a city",
                    "input_schema": weather[0]["function"]["parameters"]}],
                "tool_choice": {"type": "any"}, "max_tokens": 64, "temperature": 0}),
            )
            .await;
            assert_eq!(s, 200, "{t}");
            let v: Value = serde_json::from_str(&t).expect("json");
            assert_eq!(v["stop_reason"], "tool_use", "{}: {t}", m.id);
            assert!(n(&v["usage"]["output_tokens"]) > 0);
        }
    }
}

/// A corpus of conversations, written as OpenAI Chat messages plus tools.
fn corpus() -> Vec<(&'static str, Value, Value)> {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    let long: String = (0..100)
        .map(|i| format!("Sentence {i} of a long document about tides, ships and harbours. "))
        .collect();
    vec![
        (
            "system",
            json!([{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello there"}]),
            json!(null),
        ),
        (
            "developer",
            json!([{"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "What is two plus two?"}]),
            json!(null),
        ),
        (
            "multi-turn",
            json!([{"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
            {"role": "assistant", "content": "Green."},
            {"role": "user", "content": "And a third."}]),
            json!(null),
        ),
        (
            "tools",
            json!([{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]),
            tools,
        ),
        (
            "unicode",
            json!([{"role": "user",
            "content": "Übersetze: 東京は晴れ 🌞 — naïve café, ΔT≈3°C, Ж, नमस्ते, 👩‍👩‍👧"}]),
            json!(null),
        ),
        (
            "code",
            json!([{"role": "user", "content":
            "Fix this:\n```rust\nfn main() {\n\tlet v = vec![1, 2];\n    println!(\"{:?}\", v)\n}\n```"}]),
            json!(null),
        ),
        (
            "long",
            json!([{"role": "user", "content": long}]),
            json!(null),
        ),
    ]
}

/// The same conversation in Anthropic's shape: system apart, tool calls and
/// results as content blocks.
fn to_anthropic(messages: &Value, tools: &Value) -> Value {
    let mut system = Vec::new();
    let mut out = Vec::new();
    for m in messages.as_array().into_iter().flatten() {
        let content = m["content"].clone();
        match m["role"].as_str().unwrap_or("") {
            "system" | "developer" => system.push(content.as_str().unwrap_or("").to_string()),
            "tool" => out.push(json!({"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": m["tool_call_id"], "content": content}]})),
            "assistant" if m["tool_calls"].is_array() => {
                let blocks: Vec<Value> = m["tool_calls"].as_array().into_iter().flatten()
                    .map(|c| json!({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                        "input": serde_json::from_str::<Value>(c["function"]["arguments"].as_str().unwrap_or("{}"))
                            .unwrap_or(json!({}))}))
                    .collect();
                out.push(json!({"role": "assistant", "content": blocks}));
            }
            role => out.push(json!({"role": role, "content": content})),
        }
    }
    let mut body = json!({"messages": out});
    if !system.is_empty() {
        body["system"] = json!(system.join("\n"));
    }
    if let Some(t) = tools.as_array() {
        body["tools"] = t
            .iter()
            .map(|t| {
                json!({"name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"]})
            })
            .collect();
    }
    body
}

/// The same conversation as Responses input items.
fn to_responses(messages: &Value, tools: &Value) -> Value {
    let mut input = Vec::new();
    for m in messages.as_array().into_iter().flatten() {
        match m["role"].as_str().unwrap_or("") {
            "tool" => input.push(json!({"type": "function_call_output",
                "call_id": m["tool_call_id"], "output": m["content"]})),
            "assistant" if m["tool_calls"].is_array() => {
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    input.push(json!({"type": "function_call", "call_id": c["id"],
                        "name": c["function"]["name"], "arguments": c["function"]["arguments"]}));
                }
            }
            role => input.push(json!({"role": role, "content": m["content"]})),
        }
    }
    let mut body = json!({"input": input});
    if let Some(t) = tools.as_array() {
        body["tools"] = t
            .iter()
            .map(|t| {
                json!({"type": "function", "name": t["function"]["name"],
            "description": t["function"]["description"],
            "parameters": t["function"]["parameters"]})
            })
            .collect();
    }
    body
}

/// The same conversation in Ollama's shape: tool calls with arguments as
/// objects, tool results naming their tool, `developer` as `system`.
fn to_ollama(messages: &Value, tools: &Value) -> Value {
    let out: Vec<Value> = messages
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m["role"].as_str().unwrap_or("") {
            "developer" => json!({"role": "system", "content": m["content"]}),
            "tool" => json!({"role": "tool", "content": m["content"], "tool_name": "get_weather"}),
            "assistant" if m["tool_calls"].is_array() => {
                let calls: Vec<Value> = m["tool_calls"].as_array().into_iter().flatten()
                    .map(|c| json!({"function": {"name": c["function"]["name"],
                        "arguments": serde_json::from_str::<Value>(c["function"]["arguments"].as_str().unwrap_or("{}"))
                            .unwrap_or(json!({}))}}))
                    .collect();
                json!({"role": "assistant", "content": "", "tool_calls": calls})
            }
            role => json!({"role": role, "content": m["content"]}),
        })
        .collect();
    let mut body = json!({"messages": out});
    if !tools.is_null() {
        body["tools"] = tools.clone();
    }
    body
}

/// Prompt tokens one server reports for `conversation` in every dialect and
/// in count_tokens, by name.
async fn prompt_tokens(base: &str, messages: &Value, tools: &Value) -> Vec<(String, u64)> {
    let mut chat =
        json!({"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0});
    if !tools.is_null() {
        chat["tools"] = tools.clone();
    }
    let mut anthropic = to_anthropic(messages, tools);
    anthropic["model"] = json!("smollm2");
    let mut count = anthropic.clone();
    anthropic["max_tokens"] = json!(1);
    let mut responses = to_responses(messages, tools);
    responses["model"] = json!("smollm2");
    responses["max_output_tokens"] = json!(1);
    let mut ollama = to_ollama(messages, tools);
    ollama["model"] = json!("smollm2:latest");
    ollama["stream"] = json!(false);
    ollama["options"] = json!({"num_predict": 1, "temperature": 0});
    let mut out = Vec::new();
    for (name, path, body, field) in [
        ("chat", "/v1/chat/completions", chat, "/usage/prompt_tokens"),
        ("messages", "/v1/messages", anthropic, "/usage/input_tokens"),
        (
            "count_tokens",
            "/v1/messages/count_tokens",
            count.take(),
            "/input_tokens",
        ),
        (
            "responses",
            "/v1/responses",
            responses,
            "/usage/input_tokens",
        ),
        ("ollama", "/api/chat", ollama, "/prompt_eval_count"),
    ] {
        let (s, t) = post(base, path, &body).await;
        assert_eq!(s, 200, "{name}: {t}");
        let v: Value = serde_json::from_str(&t).expect("json");
        out.push((
            name.to_string(),
            v.pointer(field).and_then(Value::as_u64).expect(field),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_tokens_do_not_depend_on_the_backend() {
    // The same file on both engines: MLX tokenizes with Shoal's tokenizer built from the
    // GGUF's vocabulary, llama.cpp with its own. Every dialect must report the same.
    let m = models().remove(0);
    let (mlx, llama) = (
        serve_on(&m, BackendChoice::Mlx, 0).await,
        serve_on(&m, BackendChoice::Llama, 0).await,
    );
    let mut checked = 0;
    for (name, messages, tools) in corpus() {
        let a = prompt_tokens(&mlx, &messages, &tools).await;
        let b = prompt_tokens(&llama, &messages, &tools).await;
        assert_eq!(a, b, "{name}: MLX vs llama.cpp");
        // Ollama's /api/chat counts the prompt as Chat Completions does.
        let of = |d: &str| a.iter().find(|(n, _)| n == d).map(|(_, c)| *c);
        assert_eq!(
            of("ollama"),
            of("chat"),
            "{name}: /api/chat vs /v1/chat/completions"
        );
        checked += a.len();
    }
    for text in [
        "Once upon a time",
        "  leading spaces and trailing  ",
        "<|im_start|>user\nspecial tokens written out<|im_end|>",
        "数字 1234567 and emoji 🧪 in raw text",
    ] {
        let body = json!({"model": "smollm2", "prompt": text, "max_tokens": 1, "temperature": 0});
        let count =
            |t: &str| n(&serde_json::from_str::<Value>(t).expect("json")["usage"]["prompt_tokens"]);
        let (_, ta) = post(&mlx, "/v1/completions", &body).await;
        let (_, tb) = post(&llama, "/v1/completions", &body).await;
        assert_eq!(count(&ta), count(&tb), "completions {text:?}: {ta} vs {tb}");
        assert!(count(&ta) > 0);
        checked += 1;
    }
    assert_eq!(checked, corpus().len() * 5 + 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_list_says_which_backend_and_counts_the_kv_pool() {
    let m = models().remove(1);
    for (backend, name) in [(BackendChoice::Llama, "llama"), (BackendChoice::Mlx, "mlx")] {
        if backend == BackendChoice::Mlx {
            // Qwen's Q4_K tensors are not for MLX: the list says so before a load.
            let base = serve_on(&models().remove(0), BackendChoice::Mlx, 0).await;
            let (_, t) = get(&base, "/v1/models").await;
            let v: Value = serde_json::from_str(&t).expect("json");
            assert_eq!(v["data"][0]["shoal"]["backend"], "mlx", "{t}");
            assert_eq!(v["data"][0]["shoal"]["kv_cache_bytes"], 0, "{t}");
            continue;
        }
        let base = serve_on(&m, backend, 0).await;
        let (_, t) = get(&base, "/v1/models").await;
        let v: Value = serde_json::from_str(&t).expect("json");
        let s = &v["data"][0]["shoal"];
        assert_eq!(s["backend"], name, "{t}");
        let (kv, mem, est) = (
            n(&s["kv_cache_bytes"]),
            n(&s["memory_bytes"]),
            n(&s["estimated_memory_bytes"]),
        );
        // Qwen2.5-0.5B: 24 layers x 2 KV heads x (64 + 64) x 2 bytes per
        // position; the `auto` pool holds its whole trained window of 32768
        // (384 MiB, within a quarter of any budget this runs on), and the
        // list says so.
        assert_eq!(s["context_length"], 32768, "{t}");
        assert_eq!(s["trained_context_length"], 32768, "{t}");
        assert_eq!(kv, 24 * 2 * 128 * 2 * 32768, "{t}");
        // Beside weights and KV, a logits row of Qwen's 151,936 tokens for
        // each of the 16 sequences the context tracks (the default max_batch),
        // and llama.cpp's tables of those tokens and the file's 151,387 merges.
        let buffers = 16 * 151_936 * 4 + 151_936 * 168 + 151_387 * 176;
        assert!(
            mem > kv + buffers && mem - kv - buffers <= n(&s["size_bytes"]),
            "{t}"
        );
        // The estimate made before loading is the file plus the same reservations.
        assert_eq!(est, n(&s["size_bytes"]) + kv + buffers, "{t}");
    }
}

async fn get(base: &str, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("{base}{path}"))
        .await
        .expect("request");
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// Ollama's /api/chat tools, fill-in-the-middle through /api/generate's
/// `suffix`, and the prefix cache's count, on Qwen2.5-Coder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_tools_insert_and_cache_on_qwen() {
    let m = models().remove(1);
    let base = serve(&m, 256 << 20).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    // Qwen2.5-Coder-0.5B writes its call as a bare JSON object (no
    // <tool_call> markers) when told to answer with one.
    let ask = json!([{"role": "system", "content": "Always answer with a <tool_call> block."},
        {"role": "user", "content": "What is the weather in Paris?"}]);
    let (s, t) = post(
        &base,
        "/api/chat",
        &json!({"model": format!("{}:latest", m.id), "messages": ask, "tools": tools,
                "stream": false, "options": {"temperature": 0, "num_predict": 64}}),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    let call = &v["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{t}");
    assert!(
        call["arguments"]["city"].is_string(),
        "arguments as an object: {t}"
    );
    // Ollama ends a call with `stop`; the ledger keeps the engine's reason.
    assert_eq!(v["done_reason"], "stop");
    let (_, u) = get(&base, "/v1/usage?dialect=ollama&limit=1").await;
    assert!(u.contains("\"tool_calls\""), "{u}");
    // Streamed: the call arrives whole before the final line.
    let (s, t) = post(
        &base,
        "/api/chat",
        &json!({"model": m.id, "messages": ask, "tools": tools,
                "options": {"temperature": 0, "num_predict": 64}}),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let lines: Vec<Value> = t
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    let streamed = lines
        .iter()
        .find_map(|l| l["message"]["tool_calls"][0]["function"].as_object())
        .expect("a tool_calls line");
    assert_eq!(Value::Object(streamed.clone()), *call);
    let last = lines.last().expect("last");
    assert_eq!(
        (last["done"].clone(), last["eval_count"].clone()),
        (json!(true), v["eval_count"].clone())
    );
    // The result goes back as a tool message; the model answers with it.
    let turn = json!([ask[1], {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
        {"role": "tool", "tool_name": "get_weather", "content": "18 C and sunny"}]);
    let (s, t) = post(
        &base,
        "/api/chat",
        &json!({"model": m.id, "messages": turn, "tools": tools, "stream": false,
                "options": {"temperature": 0, "num_predict": 48}}),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert!(
        v["message"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{t}"
    );

    // Qwen-Coder has fill-in-the-middle tokens: `insert`, and `suffix` works.
    let (s, t) = post(&base, "/api/show", &json!({"model": m.id})).await;
    assert_eq!(s, 200, "{t}");
    assert!(t.contains("\"insert\""), "{t}");
    let fim = json!({"model": m.id, "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n",
        "stream": false, "options": {"temperature": 0, "num_predict": 16}});
    let (s, t) = post(&base, "/api/generate", &fim).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert!(
        v["response"].as_str().is_some_and(|r| r.contains("return")),
        "{t}"
    );

    // The same chat twice: the second reads all but its last token from the cache.
    let chat = json!({"model": m.id, "stream": false, "options": {"temperature": 0, "num_predict": 4},
        "messages": [{"role": "user", "content": "Explain in one sentence why the sky is blue."}]});
    let (_, t1) = post(&base, "/api/chat", &chat).await;
    let (_, t2) = post(&base, "/api/chat", &chat).await;
    let (a, b): (Value, Value) = (
        serde_json::from_str(&t1).expect("1"),
        serde_json::from_str(&t2).expect("2"),
    );
    // (The first may already share the template's opening with earlier requests.)
    assert!(
        n(&a["prompt_eval_cached_count"]) < n(&a["prompt_eval_count"]) - 1,
        "{t1}"
    );
    assert_eq!(b["prompt_eval_count"], a["prompt_eval_count"]);
    assert_eq!(
        n(&b["prompt_eval_cached_count"]),
        n(&a["prompt_eval_count"]) - 1,
        "{t2}"
    );
}

/// Speculative decoding through the API: a reply that copies its prompt
/// keeps drafts, yet its usage and finish equal plain decoding's in the
/// response, the stream and the ledger; drafts are counted apart, in
/// `/v1/usage` and `/metrics`, never as completion tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_are_counted_apart_from_completion_tokens() {
    let m = models().remove(0);
    let start = |draft: shoal_engine::DraftOptions| {
        Engine::start(
            &m.path,
            m.id,
            EngineOptions {
                backend: BackendChoice::Llama,
                prefix_cache_bytes: 0,
                draft,
                ..EngineOptions::default()
            },
        )
        .expect("load on llama.cpp")
    };
    let on = common::serve(AppState::new(start(shoal_engine::DraftOptions::default()))).await;
    let off = common::serve(AppState::new(start(shoal_engine::DraftOptions::off()))).await;
    let user = "Repeat the following text exactly, word for word:\n\n\
        The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. \
        A journey of a thousand miles begins with a single step. \
        All that glitters is not gold. The early bird catches the worm.";
    let chat = |stream: bool| {
        json!({"model": m.id, "messages": [{"role": "user", "content": user}],
               "max_tokens": 80, "temperature": 0, "stream": stream,
               "stream_options": {"include_usage": true}})
    };
    let reply = |body: &str, stream: bool| -> (String, Value, Value) {
        if stream {
            let ev = events(body);
            let text: String = ev
                .iter()
                .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
                .collect();
            let finish = ev
                .iter()
                .find_map(|e| e["choices"][0]["finish_reason"].as_str().map(|s| json!(s)))
                .unwrap_or(Value::Null);
            let usage = ev.last().map(|e| e["usage"].clone()).unwrap_or_default();
            (text, finish, usage)
        } else {
            let v: Value = serde_json::from_str(body).expect("json");
            (
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                v["choices"][0]["finish_reason"].clone(),
                v["usage"].clone(),
            )
        }
    };
    let mut kept_total = 0;
    let mut checked_total = 0;
    for stream in [false, true] {
        let (s, drafted) = post(&on, "/v1/chat/completions", &chat(stream)).await;
        assert_eq!(s, 200, "{drafted}");
        let (s, plain) = post(&off, "/v1/chat/completions", &chat(stream)).await;
        assert_eq!(s, 200, "{plain}");
        let (d, p) = (reply(&drafted, stream), reply(&plain, stream));
        assert_eq!(d, p, "stream {stream}: drafted and plain replies differ");
        let completion = n(&d.2["completion_tokens"]);
        assert!(completion > 20, "{d:?}");

        // The ledger: the same usage, and the drafts beside it.
        for (base, drafting) in [(&on, true), (&off, false)] {
            let (_, t) = get(base, "/v1/usage?limit=1").await;
            let v: Value = serde_json::from_str(&t).expect("json");
            let e = &v["data"][0];
            assert_eq!(e["tokens"]["completion"], completion, "{t}");
            assert_eq!(e["stream"], stream, "{t}");
            let (checked, kept) = (n(&e["draft_tokens"]), n(&e["draft_accepted"]));
            if drafting {
                assert!(kept >= 10 && kept <= checked, "{t}");
                // The first token is never a draft.
                assert!(kept < completion, "{t}");
                checked_total += checked;
                kept_total += kept;
            } else {
                assert_eq!((checked, kept), (0, 0), "{t}");
            }
        }
    }
    // /metrics: kept and rejected drafts, summed over both requests.
    let metric = |text: &str, outcome: &str| -> u64 {
        text.lines()
            .find(|l| {
                l.starts_with("shoal_draft_tokens_total{")
                    && l.contains(&format!("outcome=\"{outcome}\""))
                    && l.contains("dialect=\"openai.chat\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {outcome} drafts in\n{text}"))
    };
    let (_, text) = get(&on, "/metrics").await;
    assert_eq!(metric(&text, "accepted"), kept_total, "{text}");
    assert_eq!(
        metric(&text, "rejected"),
        checked_total - kept_total,
        "{text}"
    );
    let (_, text) = get(&off, "/metrics").await;
    assert!(!text.contains("shoal_draft_tokens_total{"), "{text}");
}

/// A draft model through the server: the pool's estimate and `/v1/models`
/// count it with the model it drafts for, `/health` its KV pool, and the
/// ledger its drafts, while the reply's usage is plain decoding's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_model_is_counted_in_memory_and_its_drafts_in_the_ledger() {
    let q8 = common::q8_gguf();
    let draft = common::gguf();
    let pool_with = |draft_model: Option<PathBuf>| {
        let pool = shoal_api::pool::ModelPool::new(shoal_api::pool::PoolOptions {
            engine: EngineOptions {
                backend: BackendChoice::Llama,
                draft_model,
                ..EngineOptions::default()
            },
            ..shoal_api::pool::PoolOptions::default()
        });
        pool.add_named("smollm2-q8", q8.clone(), Vec::new());
        pool
    };
    let plain = common::serve(AppState::with_pool(pool_with(None))).await;
    let base = common::serve(AppState::with_pool(pool_with(Some(draft.clone())))).await;
    let entry = |t: &str| -> Value {
        let v: Value = serde_json::from_str(t).expect("json");
        v["data"][0]["shoal"].clone()
    };
    // Before loading: the estimate adds the draft model's file and reservations.
    let (_, t) = get(&plain, "/v1/models").await;
    let alone = n(&entry(&t)["estimated_memory_bytes"]);
    let (_, t) = get(&base, "/v1/models").await;
    let with = n(&entry(&t)["estimated_memory_bytes"]);
    let draft_file = std::fs::metadata(&draft).expect("draft file").len();
    assert!(with > alone + draft_file, "{alone} then {with}: {t}");

    let body = json!({"model": "smollm2-q8", "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content":
            "Repeat exactly: the quick brown fox jumps over the lazy dog, twice."}]});
    let (s, drafted) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{drafted}");
    let (s, undrafted) = post(&plain, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{undrafted}");
    let usage = |t: &str| serde_json::from_str::<Value>(t).expect("json")["usage"].clone();
    assert_eq!(usage(&drafted), usage(&undrafted));

    // Loaded: memory and KV with the draft model's, which has the same
    // shape as its Q8_0 copy and so the same KV pool.
    let (_, t) = get(&base, "/v1/models").await;
    let e = entry(&t);
    let d = &e["draft_model"];
    assert_eq!(d["path"], json!(draft), "{t}");
    // Timed at load, which decides whether the model is ever tried.
    for k in ["plain_ms_per_token", "best_drafted_ms_per_token"] {
        let ms = d["timed_at_load"][k].as_f64().unwrap_or(0.0);
        assert!(ms > 0.0 && ms.is_finite(), "{k}: {t}");
    }
    assert_eq!(n(&e["kv_cache_bytes"]), 2 * n(&d["kv_cache_bytes"]), "{t}");
    assert!(
        n(&e["memory_bytes"]) > n(&d["memory_bytes"]) + n(&e["size_bytes"]),
        "{t}"
    );
    let (_, t) = get(&plain, "/v1/models").await;
    assert!(entry(&t)["draft_model"].is_null(), "{t}");
    let (_, h) = get(&base, "/health").await;
    let h: Value = serde_json::from_str(&h).expect("json");
    assert_eq!(h["engine"]["kv_cache_bytes"], e["kv_cache_bytes"], "{h}");

    let (_, t) = get(&base, "/v1/usage?limit=1").await;
    let row = &serde_json::from_str::<Value>(&t).expect("json")["data"][0];
    let kept = n(&row["draft_accepted"]);
    assert!(kept > 0 && kept <= n(&row["draft_tokens"]), "{t}");
    assert!(kept < n(&row["tokens"]["completion"]), "{t}");
}

/// Qwen2.5-Coder-0.5B writes a tool call as a bare JSON object in a
/// ```` ```json ```` fence rather than inside `<tool_call>` markers (the raw
/// completion of its rendered prompt shows it). Such a reply is a call, in
/// the body and in the stream, with nothing of the fence left as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_written_in_a_json_fence_is_a_tool_call_on_qwen() {
    let Some(m) = models().into_iter().find(|m| m.id == "qwen2.5-coder") else {
        panic!("no qwen model")
    };
    let options = EngineOptions {
        backend: BackendChoice::Llama,
        ..EngineOptions::default()
    };
    let engine = Engine::start(&m.path, m.id, options).expect("load");
    let weather = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    let user = "What's the weather in Paris?";
    let mut extra = serde_json::Map::new();
    extra.insert("tools".into(), weather.clone());
    let prompt = engine
        .model
        .vocab
        .render_chat(
            &[shoal_engine::ChatMessage::new("user", user)],
            true,
            &extra,
        )
        .expect("render");
    let base = common::serve(AppState::new(engine)).await;
    let (s, t) = post(
        &base,
        "/v1/completions",
        &json!({"model": m.id, "prompt": prompt, "max_tokens": 60, "temperature": 0}),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    let raw = v["choices"][0]["text"].as_str().unwrap_or_default();
    assert!(
        raw.starts_with("```json\n{"),
        "the model's own words: {raw:?}"
    );

    let chat = json!({"model": m.id, "messages": [{"role": "user", "content": user}],
        "tools": weather, "max_tokens": 60, "temperature": 0});
    let (s, t) = post(&base, "/v1/chat/completions", &chat).await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{t}");
    assert!(
        choice["message"]["content"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "{t}"
    );
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{t}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap_or("")).expect("args");
    assert_eq!(args["city"], "Paris", "{t}");

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (s, t) = post(&base, "/v1/chat/completions", &streamed).await;
    assert_eq!(s, 200, "{t}");
    let (mut text, mut name, mut arguments, mut finish) =
        (String::new(), String::new(), String::new(), Value::Null);
    for ev in events(&t) {
        let c = &ev["choices"][0];
        text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        if let Some(tc) = c["delta"]["tool_calls"].get(0) {
            name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
            arguments.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
        if !c["finish_reason"].is_null() {
            finish = c["finish_reason"].clone();
        }
    }
    assert_eq!((text.as_str(), name.as_str()), ("", "get_weather"), "{t}");
    let args: Value = serde_json::from_str(&arguments).expect("streamed args");
    assert_eq!(
        (args["city"].as_str(), finish),
        (Some("Paris"), json!("tool_calls"))
    );
}

/// A tool loop as the chat window runs it, on a model that calls tools of
/// its own accord: Qwen2.5-Coder is offered the reference filesystem
/// server's `read_text_file` (MCP, over `/v1/mcp`) and calls it for the file
/// the user names (no `tool_choice` forcing it), with arguments the tool
/// takes; its next turn reads the call and the file's words. Each model turn
/// is a ledger row of the same chat turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen_calls_an_mcp_tool_of_its_own_accord_and_reads_its_result() {
    let Some(m) = models().into_iter().find(|m| m.id == "qwen2.5-coder") else {
        panic!("no qwen model")
    };
    let dir = std::env::temp_dir().join(format!("shoal-qwen-mcp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "The launch code is 4417.\n").expect("write");
    let index = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    let engine = Engine::start(
        &m.path,
        m.id,
        EngineOptions {
            backend: BackendChoice::Llama,
            ..EngineOptions::default()
        },
    )
    .expect("load");
    let mut state = AppState::new(engine);
    let hub = shoal_mcp::McpHub::open(None, shoal_mcp::Limits::default());
    hub.set_config(
        shoal_mcp::McpFile::parse(
            &json!({"mcpServers": {"files": {"command": "node", "args": [index, &dir],
                "enabledTools": ["read_text_file"]}}})
            .to_string(),
            "test",
        )
        .expect("valid"),
    )
    .await
    .expect("set");
    state.mcp = std::sync::Arc::new(hub);
    let base = common::serve(state).await;
    let (_, t) = get(&base, "/v1/mcp/tools").await;
    let listed: Value = serde_json::from_str(&t).expect("json");
    let tools: Vec<Value> = listed["data"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["tool"].clone())
        .collect();
    assert_eq!(tools.len(), 1, "{listed}");

    let turn = "chat-qwen/m1/v0";
    let client = reqwest::Client::new();
    let step = |messages: Value| {
        let client = client.clone();
        let (base, tools) = (base.clone(), tools.clone());
        async move {
            let body = json!({"model": m.id, "messages": messages, "tools": tools,
                "max_tokens": 80, "temperature": 0});
            let r = client
                .post(format!("{base}/v1/chat/completions"))
                .header("x-shoal-turn", turn)
                .json(&body)
                .send()
                .await
                .expect("send");
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.expect("json")
        }
    };
    // The file is named by a path relative to the server's folder, so the
    // prompt (and the greedy reply) does not depend on where the test runs.
    let ask = json!({"role": "user", "content":
        "Read the file notes.txt and tell me the launch code it holds."});
    let first = step(json!([ask])).await;
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    let call = first["choices"][0]["message"]["tool_calls"][0].clone();
    assert_eq!(call["function"]["name"], "files__read_text_file", "{first}");
    // The model's own arguments, run as the chat runs them.
    let (s, t) = post(
        &base,
        "/v1/mcp/call",
        &json!({"function": call["function"]["name"], "arguments": call["function"]["arguments"]}),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let out: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(
        out["is_error"], false,
        "the model named the file: {call} → {out}"
    );
    assert!(
        out["content"].as_str().is_some_and(|c| c.contains("4417")),
        "{out}"
    );

    // The next turn reads the call and its result. (What it does with them
    // is the small model's own: Qwen2.5-Coder-0.5B tends to call again, which
    // the chat's step limit ends; it is not asserted here.)
    let second = step(json!([ask,
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": out["content"]}]))
    .await;
    let prompt = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(
        prompt(&second) > prompt(&first) + 8,
        "the call and the file's words are in the second prompt: {first} / {second}"
    );
    assert!(
        ["stop", "tool_calls", "length"]
            .contains(&second["choices"][0]["finish_reason"].as_str().unwrap_or("")),
        "{second}"
    );
    // Both model turns are rows of the one chat turn.
    let mut url = reqwest::Url::parse(&format!("{base}/v1/usage")).expect("url");
    url.query_pairs_mut().append_pair("turn", turn);
    let rows: Value = reqwest::get(url)
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let mut ids: Vec<&str> = rows["data"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    ids.sort_unstable();
    let mut want = [
        first["id"].as_str().unwrap_or_default(),
        second["id"].as_str().unwrap_or_default(),
    ];
    want.sort_unstable();
    assert_eq!(ids, want, "{rows}");
    let _ = std::fs::remove_dir_all(&dir);
}
