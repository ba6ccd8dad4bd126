//! Continuous batching and constrained decoding on the real default model.
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

mod common;
use common::{chat_prompt, gguf};
use shoal_engine::{
    collect_blocking, BackendKind, Completion, Engine, EngineError, EngineOptions, FinishReason,
    GenerateRequest, Grammar, SamplingParams,
};

fn start_engine() -> Engine {
    let opts = EngineOptions {
        prefix_cache_bytes: 0,
        max_batch: 8,
        ..common::options()
    };
    Engine::start(&gguf(), "smollm2", opts).expect("load default model")
}

/// On llama.cpp, in batch-invariant mode (MLX always is).
fn start_invariant_engine() -> Engine {
    let mut opts = EngineOptions {
        prefix_cache_bytes: 0,
        max_batch: 8,
        ..common::options()
    };
    opts.llama = opts.llama.batch_invariant(true);
    Engine::start(&gguf(), "smollm2", opts).expect("load default model")
}

/// The engine the tests share.
fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(start_engine)
}

fn request(e: &Engine, user: &str, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(chat_prompt(e, user));
    r.max_tokens = Some(max_tokens);
    r.sampling = SamplingParams::greedy();
    r
}

fn run(e: &Engine, r: GenerateRequest) -> (String, Completion) {
    collect_blocking(e.submit(r).expect("submit")).expect("complete")
}

#[test]
fn concurrent_requests_match_sequential_ones_token_for_token() {
    // MLX computes each row of a step the same way whatever else is in the
    // step; llama.cpp does in batch-invariant mode.
    batched_like_sequential(&start_invariant_engine(), true);
}

#[test]
fn batched_replies_keep_exact_accounting_with_default_kernels() {
    // llama.cpp's default kernels change with a step's rows (weight
    // repacking and llamafile's GEMM from two rows, attention by the tokens
    // in a step), so a batched greedy reply may part from the sequential one
    // after a near tie; the accounting of every reply holds all the same.
    let e = start_engine();
    let invariant = e.model.info.backend == BackendKind::Mlx;
    batched_like_sequential(&e, invariant);
}

/// Requests run one by one, then all at once (an engine of its own, so its
/// peak batch counts these only): equal replies where `invariant`, exact
/// accounting always.
fn batched_like_sequential(e: &Engine, invariant: bool) {
    let mut reqs = vec![
        request(
            e,
            "What is the capital of France? Answer in one sentence.",
            40,
        ),
        request(e, "Write a haiku about autumn leaves.", 48),
        request(e, "List three colours.", 12),
        request(
            e,
            "Explain in detail how a bicycle works, step by step.",
            56,
        ),
        request(e, "Say hello.", 30),
    ];
    // Per-sequence settings survive batching: a stop sequence and seeded sampling.
    let mut stopped = request(e, "Count from one to ten in words.", 40);
    stopped.stop = vec!["4".into()];
    reqs.push(stopped);
    let mut sampled = request(e, "Write a short poem about the sea.", 32);
    sampled.sampling = SamplingParams {
        temperature: 0.9,
        top_p: 0.9,
        seed: Some(7),
        ..SamplingParams::default()
    };
    reqs.push(sampled);

    let sequential: Vec<_> = reqs.iter().map(|r| run(e, r.clone())).collect();
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| e.submit(r.clone()).expect("submit"))
        .collect();
    let concurrent: Vec<_> = streams
        .into_iter()
        .map(|rx| collect_blocking(rx).expect("complete"))
        .collect();

    assert!(
        e.stats.peak_batch.load(Ordering::Relaxed) >= 4,
        "requests were not decoded together (peak batch {})",
        e.stats.peak_batch.load(Ordering::Relaxed)
    );
    for (i, ((st, sc), (ct, cc))) in sequential.iter().zip(&concurrent).enumerate() {
        let max = reqs[i].max_tokens.expect("every request sets max_tokens");
        for c in [sc, cc] {
            assert!(c.usage.completion_tokens <= max, "request {i}: {c:?}");
            if c.finish == FinishReason::Length {
                assert_eq!(c.usage.completion_tokens, max, "request {i}");
            }
        }
        assert_eq!(
            sc.usage.prompt_tokens, cc.usage.prompt_tokens,
            "request {i}: prompt tokens differ when batched"
        );
        assert_eq!(sc.usage.cached_tokens + cc.usage.cached_tokens, 0);
        if invariant {
            assert_eq!(st, ct, "request {i}: text differs when batched");
            assert_eq!(sc.finish, cc.finish, "request {i}: finish differs");
            assert_eq!(sc.usage, cc.usage, "request {i}: usage differs");
        }
    }
    assert!(
        matches!(
            sequential[5].1.finish,
            FinishReason::StopSequence(ref s) if s == "4"
        ),
        "{:?}: {}",
        sequential[5].1.finish,
        sequential[5].0
    );
    assert_eq!(sequential[2].1.finish, FinishReason::Length);
    assert_eq!(sequential[2].1.usage.completion_tokens, 12);
}

#[test]
fn json_schema_output_parses_and_validates() {
    let e = engine();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer"},
            "coastal": {"type": "boolean"}
        },
        "required": ["city", "population", "coastal"],
        "additionalProperties": false
    });
    let mut r = request(
        e,
        "Describe Paris as JSON with city, population and coastal.",
        80,
    );
    r.grammar = Some(Grammar::JsonSchema(schema));
    let (text, c) = run(e, r);
    assert_eq!(
        c.finish,
        FinishReason::Stop,
        "grammar must end the reply: {text}"
    );
    let v: serde_json::Value = serde_json::from_str(&text).expect("output is JSON");
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 3, "{text}");
    assert!(obj["city"].is_string(), "{text}");
    assert!(
        obj["population"].is_i64() || obj["population"].is_u64(),
        "{text}"
    );
    assert!(obj["coastal"].is_boolean(), "{text}");
    assert!(c.usage.completion_tokens > 5);
}

#[test]
fn json_object_mode_gives_an_object() {
    let e = engine();
    let mut r = request(e, "Give me a JSON object describing a cat.", 60);
    r.grammar = Some(Grammar::JsonObject);
    let (text, c) = run(e, r);
    if c.finish == FinishReason::Stop {
        let v: serde_json::Value = serde_json::from_str(&text).expect("output is JSON");
        assert!(v.is_object(), "{text}");
    } else {
        // Cut by max_tokens: still a valid prefix of an object.
        assert_eq!(c.finish, FinishReason::Length);
        assert!(text.trim_start().starts_with('{'), "{text}");
    }
}

#[test]
fn an_invalid_schema_is_refused_at_submit() {
    let e = engine();
    let mut r = request(e, "Hi", 8);
    r.grammar = Some(Grammar::JsonSchema(
        serde_json::json!({"type": "no-such-type"}),
    ));
    match e.submit(r) {
        Err(EngineError::InvalidRequest(m)) => assert!(m.contains("grammar"), "{m}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}
