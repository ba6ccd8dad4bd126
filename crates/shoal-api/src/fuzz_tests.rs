//! Structured fuzzing of the request parsers: arbitrary bytes and JSON
//! built from each dialect's own field names go through body parsing and the
//! validation that needs no model. Every outcome must be a value or an
//! `ApiError` with a 4xx status — never a panic. `PROPTEST_CASES` sets the
//! count (`make fuzz` runs many).
use proptest::prelude::*;
use serde_json::Value;

use crate::body::{parse, Body};
use crate::error::{ApiError, ErrorShape};

const KEYS: &[&str] = &[
    "model",
    // Ollama's.
    "options",
    "num_predict",
    "num_ctx",
    "keep_alive",
    "think",
    "format",
    "prompt",
    "suffix",
    "raw",
    "images",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stream",
    "stream_options",
    "include_usage",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stop",
    "stop_sequences",
    "seed",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "function",
    "name",
    "parameters",
    "input_schema",
    "arguments",
    "response_format",
    "json_schema",
    "schema",
    "strict",
    "reasoning_effort",
    "reasoning",
    "effort",
    "thinking",
    "budget_tokens",
    "system",
    "input",
    "instructions",
    "previous_response_id",
    "prompt",
    "format",
    "tool_calls",
    "tool_call_id",
    "image_url",
    "source",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
];

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-2.0f64..3.0).prop_map(Value::from),
        prop::sample::select(vec![
            "user",
            "assistant",
            "system",
            "tool",
            "developer",
            "auto",
            "none",
            "required",
            "json_object",
            "json_schema",
            "text",
            "function",
            "high",
            "low",
            "enabled",
            "object",
            "string",
            "smollm2",
            "",
            "😀",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

/// A request-shaped object: mostly the right top-level keys, random values.
fn request() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(KEYS), json()), 0..10)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

fn client_error(e: &ApiError) -> bool {
    e.status(ErrorShape::OPENAI).is_client_error()
        && e.status(crate::dialects::anthropic::ERRORS)
            .is_client_error()
        && e.status(ErrorShape::PLAIN).is_client_error()
}

fn body(bytes: Vec<u8>) -> Body {
    Ok(bytes.into())
}

/// Parses and validates as every dialect; returns the first server-side error.
fn check_all(bytes: Vec<u8>) -> Result<(), String> {
    let b = body(bytes);
    let bad = |what: &str, e: ApiError| Err(format!("{what}: {:?} {}", e.kind, e.message));
    match parse::<crate::dialects::openai_chat::ChatRequest>(&b) {
        Ok(req) => {
            for r in [
                crate::dialects::openai_chat::tool_request(&req).map(|_| ()),
                crate::dialects::openai_chat::format_grammar(req.response_format.as_ref())
                    .map(|_| ()),
                crate::dialects::openai_chat::wanted_reasoning(&req).map(|_| ()),
                req.sampling
                    .params(&Default::default(), Some(3))
                    .map(|_| ()),
            ] {
                if let Err(e) = r.as_ref() {
                    if !client_error(e) {
                        return bad("chat", e.clone());
                    }
                }
            }
        }
        Err(e) if !client_error(&e) => return bad("chat parse", e),
        Err(_) => {}
    }
    match parse::<crate::dialects::openai_responses::ResponsesRequest>(&b) {
        Ok(req) => {
            for r in [
                crate::dialects::openai_responses::tool_request(&req).map(|_| ()),
                crate::dialects::openai_responses::text_format(req.text.as_ref()).map(|_| ()),
            ] {
                if let Err(e) = r.as_ref() {
                    if !client_error(e) {
                        return bad("responses", e.clone());
                    }
                }
            }
        }
        Err(e) if !client_error(&e) => return bad("responses parse", e),
        Err(_) => {}
    }
    match parse::<crate::dialects::anthropic::MessagesRequest>(&b) {
        Ok(req) => {
            if let Err(e) = crate::dialects::anthropic::tool_request(
                req.tools.as_ref(),
                req.tool_choice.as_ref(),
            ) {
                if !client_error(&e) {
                    return bad("messages", e);
                }
            }
        }
        Err(e) if !client_error(&e) => return bad("messages parse", e),
        Err(_) => {}
    }
    match parse::<crate::dialects::ollama::chat::ChatRequest>(&b) {
        Ok(req) => {
            use crate::dialects::ollama::shared as o;
            let options = req.options.as_ref();
            for r in [
                options.map_or(Ok(()), |o| o.sampling(&Default::default()).map(|_| ())),
                options.map_or(Ok(()), |o| o.stops().map(|_| ())),
                options.map_or(Ok(()), |o| o.max_tokens(10, 100).map(|_| ())),
                o::format_grammar(req.format.as_ref()).map(|_| ()),
                o::wanted_thinking(req.think.as_ref(), false, "m").map(|_| ()),
                o::KeepAlive::parse(req.keep_alive.as_ref().unwrap_or(&Value::Null)).map(|_| ()),
            ] {
                if let Err(e) = r.as_ref() {
                    if !client_error(e) {
                        return bad("ollama chat", e.clone());
                    }
                }
            }
        }
        Err(e) if !client_error(&e) => return bad("ollama chat parse", e),
        Err(_) => {}
    }
    if let Err(e) = parse::<crate::dialects::ollama::generate::GenerateRequest>(&b) {
        if !client_error(&e) {
            return bad("ollama generate parse", e);
        }
    }
    match parse::<crate::dialects::openai_completions::CompletionRequest>(&b) {
        Err(e) if !client_error(&e) => bad("completions parse", e),
        _ => Ok(()),
    }
}

proptest! {
    #[test]
    fn request_shaped_json_gets_a_value_or_a_client_error(req in request()) {
        let bytes = serde_json::to_vec(&req).expect("serialize");
        if let Err(e) = check_all(bytes) {
            prop_assert!(false, "{e} for {req}");
        }
    }

    #[test]
    fn arbitrary_bytes_get_a_client_error(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = check_all(bytes.clone()) {
            prop_assert!(false, "{e} for {:?}", String::from_utf8_lossy(&bytes));
        }
    }
}
