//! Speculative decoding (prompt lookup) on llama.cpp with the default model:
//! every reply equals plain decoding's, token for token, with the same usage
//! and finish, whatever the sampler, grammar or stop sequences; drafts are
//! counted apart from completion tokens. Equal to the bit in batch-invariant
//! mode; with the default kernels a step of several rows may compute a
//! logit in another order than a single row, so there the equality is
//! checked where the model's choice is clear.
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

mod common;
use common::{chat_prompt, gguf_path};
use shoal_engine::{
    collect_blocking, BackendChoice, Completion, DraftOptions, Engine, EngineOptions, FinishReason,
    GenerateRequest, Grammar, LlamaOptions, SamplingParams,
};

fn start(draft: DraftOptions, invariant: bool) -> Engine {
    let opts = EngineOptions {
        backend: BackendChoice::Llama,
        prefix_cache_bytes: 0,
        max_batch: 8,
        draft,
        llama: LlamaOptions::default().batch_invariant(invariant),
        ..EngineOptions::default()
    };
    Engine::start(&gguf_path(), "smollm2", opts).expect("load default model")
}

/// Batch-invariant engines with drafting on (the default) and off, shared
/// by the tests.
fn engines() -> &'static (Engine, Engine) {
    static E: OnceLock<(Engine, Engine)> = OnceLock::new();
    E.get_or_init(|| {
        (
            start(DraftOptions::default(), true),
            start(DraftOptions::off(), true),
        )
    })
}

/// A request whose answer repeats its prompt: what prompt lookup is for.
const COPY: &str = "Repeat the following text exactly, word for word:\n\n\
    The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. \
    A journey of a thousand miles begins with a single step. \
    All that glitters is not gold. The early bird catches the worm.";

fn request(e: &Engine, user: &str, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(chat_prompt(e, user));
    r.max_tokens = Some(max_tokens);
    r.sampling = SamplingParams::greedy();
    r
}

fn run(e: &Engine, r: GenerateRequest) -> (String, Completion) {
    collect_blocking(e.submit(r).expect("submit")).expect("complete")
}

/// The same reply with and without drafts: text, finish and usage.
fn same_reply(what: &str, drafted: &(String, Completion), plain: &(String, Completion)) {
    assert_eq!(drafted.0, plain.0, "{what}: text differs with drafts");
    assert_eq!(drafted.1.finish, plain.1.finish, "{what}: finish differs");
    assert_eq!(drafted.1.usage, plain.1.usage, "{what}: usage differs");
    assert_eq!(
        plain.1.timings.draft_tokens, 0,
        "{what}: plain decoding drafted"
    );
    let t = drafted.1.timings;
    assert!(t.draft_accepted <= t.draft_tokens, "{what}: {t:?}");
    // A kept draft is a completion token; the first token is never a draft.
    assert!(
        t.draft_accepted < drafted.1.usage.completion_tokens.max(1),
        "{what}: {t:?} against {:?}",
        drafted.1.usage
    );
}

#[test]
fn greedy_replies_with_drafts_equal_plain_decoding() {
    let (on, off) = engines();
    let copy = request(on, COPY, 80);
    let drafted = run(on, copy.clone());
    same_reply("copy", &drafted, &run(off, copy));
    assert!(
        drafted.1.timings.draft_accepted >= 10,
        "prompt lookup kept too few drafts on a copying task: {:?}\n{}",
        drafted.1.timings,
        drafted.0
    );
    // Open questions, where little repeats: the same replies too.
    for q in [
        "What is the capital of France? Answer in one sentence.",
        "Write a haiku about autumn leaves.",
    ] {
        let r = request(on, q, 48);
        same_reply(q, &run(on, r.clone()), &run(off, r));
    }
}

#[test]
fn with_default_kernels_clear_answers_are_the_same_and_drafts_are_kept() {
    let on = start(DraftOptions::default(), false);
    let off = start(DraftOptions::off(), false);
    let copy = request(&on, COPY, 80);
    let drafted = run(&on, copy.clone());
    same_reply("copy", &drafted, &run(&off, copy));
    assert!(
        drafted.1.timings.draft_accepted >= 10,
        "{:?}",
        drafted.1.timings
    );
    let r = request(
        &on,
        "What is the capital of France? Answer in one sentence.",
        24,
    );
    same_reply("capital", &run(&on, r.clone()), &run(&off, r));
}

#[test]
fn seeded_sampling_with_drafts_draws_what_plain_decoding_draws() {
    // Sampling t ~ p and keeping a draft iff t equals it is the rejection
    // rule for a draft of probability 1, and draws the same random numbers
    // as plain decoding: each seed gives the same reply either way.
    let (on, off) = engines();
    let mut kept = 0;
    for seed in 1..=6 {
        let mut r = request(on, COPY, 60);
        r.sampling = SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let drafted = run(on, r.clone());
        same_reply(&format!("seed {seed}"), &drafted, &run(off, r));
        kept += drafted.1.timings.draft_accepted;
    }
    assert!(kept > 0, "no draft was kept under sampling");
}

#[test]
fn stop_sequences_grammar_and_limits_see_the_tokens_plain_decoding_sees() {
    let (on, off) = engines();
    // A stop sequence inside the copied text: the reply ends at the same
    // place, with the same counts, though drafts ran past it.
    let mut stopped = request(on, COPY, 80);
    stopped.stop = vec!["thousand".into()];
    let drafted = run(on, stopped.clone());
    same_reply("stop sequence", &drafted, &run(off, stopped));
    assert!(
        matches!(drafted.1.finish, FinishReason::StopSequence(ref s) if s == "thousand"),
        "{:?}: {}",
        drafted.1.finish,
        drafted.0
    );
    // A token limit in the middle of a kept draft.
    for max in [1, 7, 23] {
        let r = request(on, COPY, max);
        let drafted = run(on, r.clone());
        same_reply(&format!("max_tokens {max}"), &drafted, &run(off, r));
        assert_eq!(drafted.1.usage.completion_tokens, max);
        assert_eq!(drafted.1.finish, FinishReason::Length);
    }
    // Grammar-constrained output: drafts the grammar forbids are never kept.
    let mut json = request(
        on,
        "Give a JSON object with the name and the age of a person called Ann who is 31.",
        60,
    );
    json.grammar = Some(Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]
    })));
    let drafted = run(on, json.clone());
    same_reply("json schema", &drafted, &run(off, json));
    serde_json::from_str::<serde_json::Value>(&drafted.0).expect("valid JSON");
}

#[test]
fn several_streams_draft_at_once_each_as_alone() {
    let (on, off) = engines();
    let reqs = [
        request(on, COPY, 70),
        request(
            on,
            "Repeat exactly: red, green, blue, red, green, blue, red, green, blue.",
            40,
        ),
        request(on, "Say hello.", 20),
    ];
    let alone: Vec<_> = reqs.iter().map(|r| run(off, r.clone())).collect();
    let before = on.stats.draft_accepted.load(Ordering::Relaxed);
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| on.submit(r.clone()).expect("submit"))
        .collect();
    let together: Vec<_> = streams
        .into_iter()
        .map(|rx| collect_blocking(rx).expect("complete"))
        .collect();
    assert!(on.stats.peak_batch.load(Ordering::Relaxed) >= 2);
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        same_reply(&format!("stream {i}"), t, a);
    }
    let kept: usize = together.iter().map(|t| t.1.timings.draft_accepted).sum();
    assert!(kept > 0, "no stream kept a draft");
    // The engine's counters add up the replies' own.
    assert!(on.stats.draft_accepted.load(Ordering::Relaxed) - before >= kept as u64);
}
