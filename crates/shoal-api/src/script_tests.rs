//! Adapter tests over scripted event streams: every finish reason, including
//! the paths the small default model cannot reach on demand (tool calls,
//! content filter, reasoning, an error mid-stream), must carry exact usage.
use serde_json::Value;
use shoal_engine::{Completion, Event, FinishReason, Timings, Usage};

use crate::dialects::{anthropic, openai_chat, openai_completions, openai_responses};

fn usage() -> Usage {
    Usage {
        prompt_tokens: 40,
        cached_tokens: 10,
        completion_tokens: 7,
        reasoning_tokens: 3,
        ..Usage::default()
    }
}

fn script(finish: FinishReason) -> Vec<Event> {
    vec![
        Event::Started {
            prompt_tokens: 40,
            cached_tokens: 10,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
        },
        Event::Delta {
            text: "Hel".into(),
            logprobs: vec![],
        },
        Event::Delta {
            text: "lo".into(),
            logprobs: vec![],
        },
        Event::Done(Completion {
            finish,
            usage: usage(),
            timings: Timings::default(),
        }),
    ]
}

fn chat_renderer(include_usage: bool) -> openai_chat::ChunkRenderer {
    openai_chat::ChunkRenderer {
        id: "chatcmpl-x".into(),
        created: 1,
        model: "m".into(),
        include_usage,
        logprobs: false,
    }
}

fn chat(include_usage: bool, finish: FinishReason) -> Vec<String> {
    let r = chat_renderer(include_usage);
    let evs: Vec<(usize, Event)> = script(finish).into_iter().map(|e| (0, e)).collect();
    r.render_all(1, &evs)
}

fn parse(s: &str) -> Value {
    serde_json::from_str(s).expect("chunk is JSON")
}

#[test]
fn chat_every_finish_reason_has_exact_usage() {
    for (finish, word) in [
        (FinishReason::Stop, "stop"),
        (FinishReason::StopSequence("x".into()), "stop"),
        (FinishReason::Length, "length"),
        (FinishReason::ContextWindow, "length"),
        (FinishReason::ToolCalls, "tool_calls"),
        (FinishReason::ContentFilter, "content_filter"),
    ] {
        let out = chat(true, finish);
        assert_eq!(out.last().map(String::as_str), Some("[DONE]"));
        let fin = parse(&out[out.len() - 3]);
        assert_eq!(fin["choices"][0]["finish_reason"], word);
        assert!(
            fin["usage"].is_null(),
            "usage must be null on content chunks"
        );
        let u = parse(&out[out.len() - 2]);
        assert_eq!(u["choices"].as_array().map(Vec::len), Some(0));
        assert_eq!(u["usage"]["prompt_tokens"], 40);
        assert_eq!(u["usage"]["completion_tokens"], 7);
        assert_eq!(u["usage"]["total_tokens"], 47);
        assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
        assert_eq!(
            u["usage"]["completion_tokens_details"]["reasoning_tokens"],
            3
        );
    }
}

#[test]
fn chat_without_include_usage_leaks_no_usage_key() {
    let out = chat(false, FinishReason::ToolCalls);
    for data in &out[..out.len() - 1] {
        assert!(
            parse(data).get("usage").is_none(),
            "unexpected usage in {data}"
        );
    }
}

#[test]
fn chat_error_mid_stream_sends_error_then_done() {
    let out = chat(true, FinishReason::Error("MLX blew up".into()));
    assert_eq!(out.last().map(String::as_str), Some("[DONE]"));
    let err = parse(&out[out.len() - 2]);
    assert_eq!(err["error"]["type"], "server_error");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("MLX blew up"));
    // Text that did stream stays; no usage chunk claims success, but the
    // error says what the request spent.
    assert!(out
        .iter()
        .all(|d| d == "[DONE]" || parse(d)["choices"] != serde_json::json!([])));
    assert_eq!(
        err["usage"],
        crate::dialects::openai_words::usage_json(&usage())
    );
}

/// A failed choice's error waits for the other choices and carries the
/// request's usage (the prompt once, every choice's completion), once.
#[test]
fn chat_n2_failure_is_one_error_with_the_requests_usage() {
    let r = openai_chat::ChunkRenderer {
        id: "c".into(),
        created: 1,
        model: "m".into(),
        include_usage: false,
        logprobs: false,
    };
    let mut evs = Vec::new();
    for (i, f) in [
        (0, FinishReason::Timeout { limit_secs: 3 }),
        (1, FinishReason::Length),
    ] {
        for e in script(f) {
            evs.push((i, e));
        }
    }
    let out = r.render_all(2, &evs);
    let errors: Vec<Value> = out
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| parse(d))
        .filter(|v| v.get("error").is_some())
        .collect();
    assert_eq!(errors.len(), 1, "{out:?}");
    assert_eq!(
        out[out.len() - 2],
        errors[0].to_string(),
        "the error is last"
    );
    let u = &errors[0]["usage"];
    assert_eq!(
        (
            &u["prompt_tokens"],
            &u["completion_tokens"],
            &u["total_tokens"]
        ),
        (
            &serde_json::json!(40),
            &serde_json::json!(14),
            &serde_json::json!(54)
        )
    );
    let finishes: Vec<Value> = out
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| parse(d)["choices"][0]["finish_reason"].clone())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [serde_json::json!("length")], "{out:?}");
}

/// A timeout is its own finish: each dialect's timeout error, never a
/// finish that claims the reply ended.
#[test]
fn a_timeout_mid_stream_is_the_dialects_timeout_error() {
    let t = || FinishReason::Timeout { limit_secs: 3 };
    let out = chat(true, t());
    let err = parse(&out[out.len() - 2]);
    assert_eq!(err["error"]["code"], "request_timeout", "{err}");
    assert_eq!(err["error"]["type"], "timeout_error");
    assert!(err["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("time limit of 3 s")));
    // Each error carries the dialect's own usage object beside it.
    assert_eq!(
        err["usage"],
        crate::dialects::openai_words::usage_json(&usage())
    );
    let out = completions(1, None, t());
    let err = parse(&out[out.len() - 2]);
    assert_eq!(err["error"]["code"], "request_timeout", "{err}");
    assert_eq!(
        err["usage"],
        crate::dialects::openai_words::usage_json(&usage())
    );
    let f = anthropic_frames(t());
    let (name, data) = f.last().expect("frames");
    assert_eq!(
        (name.as_str(), &data["error"]["type"]),
        ("error", &serde_json::json!("timeout_error"))
    );
    assert_eq!(data["type"], "error");
    assert_eq!(
        data["usage"],
        crate::dialects::anthropic::usage_json(&usage())
    );
    assert_eq!(data["usage"]["input_tokens"], 30, "input excludes cached");
    let f = responses_frames(t());
    let (name, data) = f.last().expect("frames");
    assert_eq!(name, "response.failed");
    assert_eq!(data["response"]["error"]["code"], "request_timeout");
    assert_eq!(data["response"]["usage"]["output_tokens"], 7);
}

#[test]
fn chat_n2_each_choice_finishes_and_usage_sums_completions() {
    let r = openai_chat::ChunkRenderer {
        id: "c".into(),
        created: 1,
        model: "m".into(),
        include_usage: true,
        logprobs: false,
    };
    let mut evs = Vec::new();
    for (i, f) in [(0, FinishReason::Stop), (1, FinishReason::Length)] {
        for e in script(f) {
            evs.push((i, e));
        }
    }
    let out = r.render_all(2, &evs);
    let finishes: Vec<(u64, String)> = out
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| parse(d))
        .filter_map(|v| {
            let c = v["choices"].get(0)?.clone();
            let f = c["finish_reason"].as_str()?.to_string();
            Some((c["index"].as_u64()?, f))
        })
        .collect();
    assert_eq!(finishes, vec![(0, "stop".into()), (1, "length".into())]);
    let u = parse(&out[out.len() - 2]);
    assert_eq!(u["usage"]["prompt_tokens"], 40);
    assert_eq!(u["usage"]["completion_tokens"], 14);
    assert_eq!(u["usage"]["total_tokens"], 54);
}

fn anthropic_frames(finish: FinishReason) -> Vec<(String, Value)> {
    let mut r = anthropic::MessagesRenderer::new("msg_x".into(), "m".into());
    script(finish).iter().flat_map(|e| r.step(e)).collect()
}

#[test]
fn anthropic_stream_order_and_usage_on_every_path() {
    for (finish, word, seq) in [
        (FinishReason::Stop, "end_turn", Value::Null),
        (
            FinishReason::StopSequence("END".into()),
            "stop_sequence",
            Value::String("END".into()),
        ),
        (FinishReason::Length, "max_tokens", Value::Null),
        // A reply that filled the context window says so, not max_tokens.
        (
            FinishReason::ContextWindow,
            "model_context_window_exceeded",
            Value::Null,
        ),
        (FinishReason::ToolCalls, "tool_use", Value::Null),
        (FinishReason::ContentFilter, "refusal", Value::Null),
    ] {
        let f = anthropic_frames(finish);
        let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let start = &f[0].1["message"]["usage"];
        assert_eq!(start["input_tokens"], 30, "input excludes cached tokens");
        assert_eq!(start["cache_read_input_tokens"], 10);
        let delta = &f[6].1;
        assert_eq!(delta["delta"]["stop_reason"], word);
        assert_eq!(delta["delta"]["stop_sequence"], seq);
        assert_eq!(delta["usage"]["output_tokens"], 7);
        assert_eq!(delta["usage"]["input_tokens"], 30);
        assert_eq!(delta["usage"]["cache_read_input_tokens"], 10);
    }
}

#[test]
fn anthropic_error_mid_stream_is_an_error_event() {
    let f = anthropic_frames(FinishReason::Error("boom".into()));
    let (name, data) = f.last().expect("frames");
    assert_eq!(name, "error");
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["type"], "api_error");
    assert_eq!(data["usage"]["output_tokens"], 7);
    assert!(f.iter().all(|(n, _)| n != "message_stop"));
}

fn shape() -> openai_responses::Shape {
    openai_responses::Shape {
        id: "resp_x".into(),
        msg_id: "msg_x".into(),
        reasoning_id: "rs_x".into(),
        created: 1,
        model: "m".into(),
        instructions: None,
        max_output_tokens: None,
        previous_response_id: None,
        temperature: 1.0,
        top_p: 1.0,
        store: true,
        metadata: serde_json::json!({}),
        tools: serde_json::json!([]),
        tool_choice: serde_json::json!("auto"),
        text_format: serde_json::json!({"type": "text"}),
        names: Default::default(),
    }
}

fn responses_frames(finish: FinishReason) -> Vec<(String, Value)> {
    let mut shape = shape();
    shape.max_output_tokens = Some(7);
    let mut r = openai_responses::ResponsesRenderer::new(shape);
    script(finish).iter().flat_map(|e| r.step(e)).collect()
}

#[test]
fn responses_event_order_status_and_usage() {
    for (finish, last, status, reason) in [
        (
            FinishReason::Stop,
            "response.completed",
            "completed",
            Value::Null,
        ),
        (
            FinishReason::ToolCalls,
            "response.completed",
            "completed",
            Value::Null,
        ),
        (
            FinishReason::Length,
            "response.incomplete",
            "incomplete",
            Value::String("max_output_tokens".into()),
        ),
        (
            FinishReason::ContextWindow,
            "response.incomplete",
            "incomplete",
            Value::String("max_output_tokens".into()),
        ),
        (
            FinishReason::ContentFilter,
            "response.incomplete",
            "incomplete",
            Value::String("content_filter".into()),
        ),
    ] {
        let f = responses_frames(finish);
        let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                last
            ]
        );
        for (i, (name, data)) in f.iter().enumerate() {
            assert_eq!(data["sequence_number"], i as u64);
            assert_eq!(data["type"], name.as_str());
        }
        let resp = &f[f.len() - 1].1["response"];
        assert_eq!(resp["status"], status);
        assert_eq!(resp["incomplete_details"]["reason"], reason);
        assert_eq!(resp["usage"]["input_tokens"], 40);
        assert_eq!(resp["usage"]["input_tokens_details"]["cached_tokens"], 10);
        assert_eq!(resp["usage"]["output_tokens"], 7);
        assert_eq!(
            resp["usage"]["output_tokens_details"]["reasoning_tokens"],
            3
        );
        assert_eq!(resp["usage"]["total_tokens"], 47);
        assert_eq!(f[6].1["text"], "Hello");
    }
}

#[test]
fn responses_error_mid_stream_fails_with_usage() {
    let f = responses_frames(FinishReason::Error("oom".into()));
    let (name, data) = f.last().expect("frames");
    assert_eq!(name, "response.failed");
    assert_eq!(data["response"]["status"], "failed");
    assert_eq!(data["response"]["error"]["code"], "server_error");
    assert_eq!(data["response"]["usage"]["output_tokens"], 7);
}

#[test]
fn responses_reasoning_item_streams_before_the_message() {
    let shape = shape();
    let mut r = openai_responses::ResponsesRenderer::new(shape);
    let mut evs = vec![Event::Reasoning { text: "hmm".into() }];
    evs.extend(script(FinishReason::Stop));
    let f: Vec<(String, Value)> = evs.iter().flat_map(|e| r.step(e)).collect();
    let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(f[2].1["item"]["type"], "reasoning");
    assert_eq!(f[6].1["output_index"], 1);
    let resp = &f[f.len() - 1].1["response"];
    assert_eq!(resp["output"][0]["content"][0]["text"], "hmm");
    assert_eq!(resp["output"][1]["content"][0]["text"], "Hello");
    assert_eq!(
        resp["usage"]["output_tokens_details"]["reasoning_tokens"],
        3
    );
}

#[test]
fn anthropic_thinking_block_precedes_text_block() {
    let mut r = anthropic::MessagesRenderer::new("msg_x".into(), "m".into());
    let mut evs = vec![
        Event::Started {
            prompt_tokens: 40,
            cached_tokens: 10,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
        },
        Event::Reasoning { text: "hmm".into() },
    ];
    evs.extend(script(FinishReason::Stop).into_iter().skip(1));
    let f: Vec<(String, Value)> = evs.iter().flat_map(|e| r.step(e)).collect();
    let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(f[3].1["delta"]["type"], "thinking_delta");
    assert_eq!(f[5].1["index"], 1);
    assert_eq!(f[6].1["delta"]["type"], "text_delta");
}

/// Text, then one tool call whose arguments arrive in two pieces.
fn tool_script() -> Vec<Event> {
    vec![
        Event::Started {
            prompt_tokens: 40,
            cached_tokens: 10,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
        },
        Event::Delta {
            text: "Checking.".into(),
            logprobs: vec![],
        },
        Event::ToolCallStart {
            index: 0,
            name: "get_weather".into(),
        },
        Event::ToolCallArgs {
            index: 0,
            delta: "{\"city\": ".into(),
        },
        Event::ToolCallArgs {
            index: 0,
            delta: "\"Paris\"}".into(),
        },
        Event::Done(Completion {
            finish: FinishReason::ToolCalls,
            usage: usage(),
            timings: Timings::default(),
        }),
    ]
}

#[test]
fn chat_streams_tool_call_deltas_and_finishes_tool_calls() {
    let r = chat_renderer(true);
    let evs: Vec<(usize, Event)> = tool_script().into_iter().map(|e| (0, e)).collect();
    let out = r.render_all(1, &evs);
    let chunks: Vec<Value> = out
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| parse(d))
        .collect();
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert_eq!(calls[0][0]["type"], "function");
    assert!(calls[0][0]["id"]
        .as_str()
        .is_some_and(|s| s.starts_with("call_")));
    let args: String = calls
        .iter()
        .filter_map(|c| c[0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, "{\"city\": \"Paris\"}");
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec!["tool_calls"]);
    let last = chunks.last().expect("usage chunk");
    assert_eq!(last["usage"]["completion_tokens"], 7);
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
}

#[test]
fn anthropic_streams_a_tool_use_block_with_input_json_deltas() {
    let mut r = anthropic::MessagesRenderer::new("msg_x".into(), "m".into());
    let f: Vec<(String, Value)> = tool_script().iter().flat_map(|e| r.step(e)).collect();
    let starts: Vec<&Value> = f
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["content_block"]["type"], "text");
    assert_eq!(starts[1]["content_block"]["type"], "tool_use");
    assert_eq!(starts[1]["content_block"]["name"], "get_weather");
    assert_eq!(starts[1]["index"], 1);
    let json: String = f
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| {
            assert_eq!(d["index"], 1);
            d["delta"]["partial_json"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(json, "{\"city\": \"Paris\"}");
    let stops = f.iter().filter(|(n, _)| n == "content_block_stop").count();
    assert_eq!(stops, 2);
    let delta = f
        .iter()
        .find(|(n, _)| n == "message_delta")
        .expect("message_delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta.1["usage"]["output_tokens"], 7);
    assert_eq!(delta.1["usage"]["cache_read_input_tokens"], 10);
}

#[test]
fn responses_stream_a_function_call_item() {
    let mut r = openai_responses::ResponsesRenderer::new(shape());
    let f: Vec<(String, Value)> = tool_script().iter().flat_map(|e| r.step(e)).collect();
    let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
    let added: Vec<&Value> = f
        .iter()
        .filter(|(n, _)| n == "response.output_item.added")
        .map(|(_, d)| &d["item"])
        .collect();
    assert_eq!(added.len(), 2);
    assert_eq!(added[0]["type"], "message");
    assert_eq!(added[1]["type"], "function_call");
    assert_eq!(added[1]["name"], "get_weather");
    let deltas: String = f
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(deltas, "{\"city\": \"Paris\"}");
    let done = f
        .iter()
        .find(|(n, _)| n == "response.function_call_arguments.done")
        .expect("arguments done");
    assert_eq!(done.1["arguments"], "{\"city\": \"Paris\"}");
    // The message closes before the call opens; the response completes last.
    let msg_done = names
        .iter()
        .position(|n| *n == "response.output_text.done")
        .expect("text done");
    let call_added = names
        .iter()
        .rposition(|n| *n == "response.output_item.added")
        .expect("call added");
    assert!(msg_done < call_added);
    let (last, data) = f.last().expect("frames");
    assert_eq!(last, "response.completed");
    let output = data["response"]["output"].as_array().expect("output");
    assert_eq!(output.len(), 2);
    assert_eq!(output[1]["type"], "function_call");
    assert_eq!(output[1]["arguments"], "{\"city\": \"Paris\"}");
    assert_eq!(data["response"]["usage"]["output_tokens"], 7);
    // Sequence numbers count up without gaps.
    for (i, (_, d)) in f.iter().enumerate() {
        assert_eq!(d["sequence_number"], i as u64);
    }
}

fn completion_renderer(n: usize, echo: Option<&str>) -> openai_completions::CompletionRenderer {
    openai_completions::CompletionRenderer {
        id: "cmpl-x".into(),
        created: 1,
        model: "m".into(),
        include_usage: true,
        logprobs: false,
        per: n,
        echo: echo.map(|t| vec![t.to_string()]),
        progress: crate::run::ChoiceProgress::new(n, n),
        offsets: vec![None; n],
    }
}

fn completions(n: usize, echo: Option<&str>, finish: FinishReason) -> Vec<String> {
    let mut r = completion_renderer(n, echo);
    // Choices interleave as the engine sends them.
    let mut out = Vec::new();
    let evs = script(finish);
    for ev in &evs {
        for i in 0..n {
            out.extend(r.step(i, ev));
        }
    }
    out
}

#[test]
fn completions_every_finish_reason_has_exact_usage_once_all_choices_end() {
    for (finish, word) in [
        (FinishReason::Stop, "stop"),
        (FinishReason::StopSequence("x".into()), "stop"),
        (FinishReason::Length, "length"),
        (FinishReason::ContentFilter, "content_filter"),
    ] {
        let out = completions(2, None, finish);
        assert_eq!(out.last().map(String::as_str), Some("[DONE]"));
        let usage = parse(&out[out.len() - 2]);
        assert_eq!(usage["choices"], serde_json::json!([]));
        // The prompt counts once for both choices; completions add up.
        assert_eq!(usage["usage"]["prompt_tokens"], 40);
        assert_eq!(usage["usage"]["completion_tokens"], 14);
        assert_eq!(usage["usage"]["total_tokens"], 54);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
        let finishes: Vec<Value> = out[..out.len() - 2]
            .iter()
            .map(|d| parse(d)["choices"][0]["finish_reason"].clone())
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finishes, vec![serde_json::json!(word); 2]);
        // Every chunk before the usage chunk carries `usage: null`.
        assert!(out[..out.len() - 2]
            .iter()
            .all(|d| parse(d)["usage"].is_null()));
    }
}

#[test]
fn completions_echo_comes_first_in_each_choice() {
    let out = completions(1, Some("Say: "), FinishReason::Stop);
    let texts: Vec<String> = out
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| parse(d)["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(texts.concat(), "Say: Hello");
    assert_eq!(texts.first().map(String::as_str), Some("Say: "));
}

#[test]
fn completions_error_mid_stream_sends_its_usage_in_the_error_then_done() {
    let out = completions(1, None, FinishReason::Error("boom".into()));
    assert_eq!(out.last().map(String::as_str), Some("[DONE]"));
    let err = parse(&out[out.len() - 2]);
    assert_eq!(err["error"]["type"], "server_error");
    assert_eq!(err["usage"]["completion_tokens"], 7);
    assert!(out.iter().all(|d| d == "[DONE]"
        || parse(d).get("error").is_some()
        || parse(d)["choices"] != serde_json::json!([])));
}

/// Two heartbeats of a quiet stream, then the whole script: the stream a
/// client gets from a request that waited or prefilled past the interval.
#[test]
fn chat_heartbeats_open_with_the_role_once_then_empty_deltas() {
    let r = chat_renderer(true);
    let mut st = crate::run::ChoiceProgress::new(1, 1);
    let mut out: Vec<Value> = (0..2).filter_map(|_| r.heartbeat(&mut st)).collect();
    for ev in script(FinishReason::Stop) {
        out.extend(
            r.step(&mut st, 0, &ev)
                .iter()
                .filter(|d| *d != "[DONE]")
                .map(|d| parse(d)),
        );
    }
    assert_eq!(
        out[0]["choices"][0]["delta"],
        serde_json::json!({"role": "assistant", "content": ""})
    );
    assert_eq!(out[1]["choices"][0]["delta"], serde_json::json!({}));
    assert!(out[1]["choices"][0]["finish_reason"].is_null());
    assert!(out[1]["usage"].is_null(), "a heartbeat carries no usage");
    let roles = out
        .iter()
        .filter(|c| c["choices"][0]["delta"].get("role").is_some())
        .count();
    assert_eq!(roles, 1, "the role is said once, heartbeat or not");
    assert_eq!(out[2]["choices"][0]["delta"]["content"], "Hel");
    // Once every choice has ended there is nothing left to beat for.
    assert!(r.heartbeat(&mut st).is_none());
}

#[test]
fn completions_heartbeats_are_empty_text_and_echo_still_comes_first() {
    use crate::run::StreamRender;
    let mut r = completion_renderer(1, Some("Say: "));
    let beat = r.heartbeat();
    assert_eq!(beat.len(), 1);
    let c = parse(&beat[0].1);
    assert_eq!(c["choices"][0]["text"], "");
    assert!(c["choices"][0]["finish_reason"].is_null());
    let first = r.step(0, &script(FinishReason::Stop)[0]);
    assert_eq!(parse(&first[0])["choices"][0]["text"], "Say: ");
    for ev in &script(FinishReason::Stop)[1..] {
        r.step(0, ev);
    }
    assert!(r.heartbeat().is_empty());
}

#[test]
fn responses_heartbeats_create_once_then_repeat_in_progress_with_contiguous_numbers() {
    let mut r = openai_responses::ResponsesRenderer::new(shape());
    let mut out = r.heartbeat();
    out.extend(r.heartbeat());
    for ev in script(FinishReason::Stop) {
        out.extend(r.step(&ev));
    }
    let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.in_progress",
            "response.output_item.added"
        ]
    );
    assert_eq!(
        names.iter().filter(|n| **n == "response.created").count(),
        1
    );
    assert_eq!(out[2].1["response"]["status"], "in_progress");
    assert_eq!(out[2].1["response"]["id"], "resp_x");
    let seqs: Vec<u64> = out
        .iter()
        .filter_map(|(_, d)| d["sequence_number"].as_u64())
        .collect();
    assert_eq!(seqs, (0..out.len() as u64).collect::<Vec<_>>());
    assert_eq!(names.last(), Some(&"response.completed"));
}

#[test]
fn anthropic_heartbeats_are_pings_before_message_start() {
    use crate::run::StreamRender;
    let mut r = anthropic::MessagesRenderer::new("msg_x".into(), "m".into());
    let beat = r.heartbeat();
    assert_eq!(
        beat,
        vec![(Some("ping".to_string()), r#"{"type":"ping"}"#.to_string())]
    );
    let frames: Vec<(String, Value)> = script(FinishReason::Stop)
        .iter()
        .flat_map(|e| r.step(e))
        .collect();
    assert_eq!(
        frames[0].0, "message_start",
        "a ping changes nothing after it"
    );
    assert_eq!(frames[0].1["message"]["usage"]["input_tokens"], 30);
}
