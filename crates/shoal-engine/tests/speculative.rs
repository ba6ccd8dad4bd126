//! Speculative decoding on llama.cpp, by prompt lookup with the default
//! model, and by a draft model (the default model drafting for its Q8_0
//! copy): every reply equals plain decoding's, token for token, with the
//! same usage and finish, whatever the sampler, grammar or stop sequences;
//! drafts are counted apart from completion tokens. Equal to the bit in batch-invariant
//! mode; with the default kernels a step of several rows may compute a
//! logit in another order than a single row, so there the equality is
//! checked where the model's choice is clear.
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

mod common;
use common::{chat, chat_prompt, gguf, q8_gguf, think_gguf};
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
    Engine::start(&gguf(), "smollm2", opts).expect("load default model")
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

/// Seeded sampling on `prompt`, each seed's reply with drafts as without.
/// Returns how many drafts were kept.
fn seeded_replies_are_plain(on: &Engine, off: &Engine, prompt: &str, seeds: u64) -> usize {
    let mut kept = 0;
    for seed in 1..=seeds {
        let mut r = request(on, prompt, 60);
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
    kept
}

/// A stop sequence inside the copied text (drafts run past it), token
/// limits in the middle of a kept draft, and a JSON schema whose forbidden
/// drafts are never kept: each reply ends where plain decoding's does, with
/// the same counts.
fn constrained_replies_are_plain(on: &Engine, off: &Engine, limits: &[usize]) {
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
    for &max in limits {
        let r = request(on, COPY, max);
        let drafted = run(on, r.clone());
        same_reply(&format!("max_tokens {max}"), &drafted, &run(off, r));
        assert_eq!(drafted.1.usage.completion_tokens, max);
        assert_eq!(drafted.1.finish, FinishReason::Length);
    }
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

/// `reqs` submitted at once to `on`, each reply as its lone run on `off`.
fn streams_as_alone(
    on: &Engine,
    off: &Engine,
    reqs: &[GenerateRequest],
) -> Vec<(String, Completion)> {
    let alone: Vec<_> = reqs.iter().map(|r| run(off, r.clone())).collect();
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| on.submit(r.clone()).expect("submit"))
        .collect();
    let together: Vec<_> = streams
        .into_iter()
        .map(|rx| collect_blocking(rx).expect("complete"))
        .collect();
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        same_reply(&format!("stream {i}"), t, a);
    }
    together
}

#[test]
fn seeded_sampling_with_drafts_draws_what_plain_decoding_draws() {
    // Sampling t ~ p and keeping a draft iff t equals it is the rejection
    // rule for a draft of probability 1, and draws the same random numbers
    // as plain decoding: each seed gives the same reply either way.
    let (on, off) = engines();
    let kept = seeded_replies_are_plain(on, off, COPY, 6);
    assert!(kept > 0, "no draft was kept under sampling");
}

#[test]
fn stop_sequences_grammar_and_limits_see_the_tokens_plain_decoding_sees() {
    let (on, off) = engines();
    constrained_replies_are_plain(on, off, &[1, 7, 23]);
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
    let before = on.stats.draft_accepted.load(Ordering::Relaxed);
    let together = streams_as_alone(on, off, &reqs);
    assert!(on.stats.peak_batch.load(Ordering::Relaxed) >= 2);
    let kept: usize = together.iter().map(|t| t.1.timings.draft_accepted).sum();
    assert!(kept > 0, "no stream kept a draft");
    // The engine's counters add up the replies' own.
    assert!(on.stats.draft_accepted.load(Ordering::Relaxed) - before >= kept as u64);
}

/// Drafting that uses the draft model whenever prompt lookup has nothing,
/// whether or not it pays here (so the tests exercise it).
fn always_model() -> DraftOptions {
    DraftOptions {
        measured: false,
        ..DraftOptions::default()
    }
}

fn start_target(
    draft: DraftOptions,
    draft_model: Option<std::path::PathBuf>,
    prefix_cache_bytes: usize,
) -> Engine {
    let opts = EngineOptions {
        backend: BackendChoice::Llama,
        prefix_cache_bytes,
        max_batch: 8,
        draft,
        draft_model,
        draft_model_required: true,
        llama: LlamaOptions::default().batch_invariant(true),
        ..EngineOptions::default()
    };
    Engine::start(&q8_gguf(), "smollm2-q8", opts).expect("load the Q8_0 model")
}

/// The Q8_0 model drafted for by the Q4_1 one, and alone; batch-invariant,
/// no prefix cache (a prompt computed in two parts is not computed as one).
fn model_engines() -> &'static (Engine, Engine) {
    static E: OnceLock<(Engine, Engine)> = OnceLock::new();
    E.get_or_init(|| {
        (
            start_target(always_model(), Some(gguf()), 0),
            start_target(DraftOptions::off(), None, 0),
        )
    })
}

#[test]
fn a_draft_model_drafts_and_greedy_replies_equal_plain_decoding() {
    let (on, off) = model_engines();
    // Loaded beside the target and counted in its memory.
    let d = on.model.draft.as_ref().expect("the draft model is loaded");
    assert_eq!(d.path, gguf());
    assert!(d.info.weight_bytes > 0 && d.info.kv_capacity_bytes > 0);
    assert_eq!(
        on.model.resident_bytes(),
        on.model.info.resident_bytes() + d.info.resident_bytes()
    );
    assert!(off.model.draft.is_none());
    let mut accepted = 0;
    for q in [
        COPY,
        "What is the capital of France? Answer in one sentence.",
        "Write a haiku about autumn leaves.",
        "Explain in three sentences why the sky is blue.",
    ] {
        let r = request(on, q, 64);
        let drafted = run(on, r.clone());
        same_reply(q, &drafted, &run(off, r));
        accepted += drafted.1.timings.draft_accepted;
    }
    // The Q4_1 model mostly agrees with its own Q8_0 copy.
    assert!(
        accepted >= 40,
        "the draft model's drafts were seldom kept: {accepted}"
    );
}

#[test]
fn a_draft_model_keeps_seeded_sampling_stop_sequences_and_grammar_exact() {
    let (on, off) = model_engines();
    seeded_replies_are_plain(on, off, "Tell me a short story about a cat.", 4);
    constrained_replies_are_plain(on, off, &[1, 9]);
}

#[test]
fn several_streams_draft_from_the_draft_model_at_once_each_as_alone() {
    let (on, off) = model_engines();
    let reqs = [
        request(on, COPY, 50),
        // A clear answer: on some CPUs' kernels the model's greedy reply to
        // "the capital of Italy" parts from its draft copy's at once.
        request(
            on,
            "What is the capital of France? Answer in one sentence.",
            30,
        ),
        request(on, "List three colours.", 30),
    ];
    for (i, t) in streams_as_alone(on, off, &reqs).iter().enumerate() {
        assert!(t.1.timings.draft_accepted > 0, "stream {i} kept no draft");
    }
}

#[test]
fn the_draft_model_keeps_its_cache_for_the_next_turn() {
    // Prefix caches on: both engines see the same requests in the same
    // order, so each splits the follow-up's prompt at the same place.
    let on = start_target(always_model(), Some(gguf()), 1 << 30);
    let off = start_target(DraftOptions::off(), None, 1 << 30);
    // Little to look up: the draft model drafts. The instructions make the
    // prompt longer than a micro-batch: batch-invariant mode reuses whole
    // ones of a prompt only (a reply's positions are computed otherwise).
    const SYSTEM: &str = "You are a patient science teacher. Answer in plain words, with \
        short sentences, for a curious student of twelve who likes examples from daily life. \
        Prefer the kitchen, the garden and the bicycle to the laboratory, name no formulas, \
        and end with one question the student could try at home.";
    let mut first = request(&on, "Explain in three sentences why the sky is blue.", 40);
    first.prompt = chat(
        &on,
        &[
            ("system", SYSTEM),
            ("user", "Explain in three sentences why the sky is blue."),
        ],
    );
    assert!(first.prompt.len() > 64, "{} tokens", first.prompt.len());
    let turn = run(&on, first.clone());
    same_reply("first turn", &turn, &run(&off, first.clone()));
    // The draft model's cache of the reply is kept beside the model's.
    let kept = |e: &Engine| e.stats.prefix_cache_bytes.load(Ordering::Relaxed);
    assert!(kept(&on) > kept(&off) && kept(&off) > 0);
    let r = GenerateRequest {
        prompt: chat(
            &on,
            &[
                ("system", SYSTEM),
                ("user", "Explain in three sentences why the sky is blue."),
                ("assistant", &turn.0),
                ("user", "Now explain why sunsets are red."),
            ],
        ),
        ..first
    };
    let drafted = run(&on, r.clone());
    same_reply("follow-up", &drafted, &run(&off, r));
    assert!(drafted.1.usage.cached_tokens > 0);
    assert!(
        drafted.1.timings.draft_accepted > 0,
        "{:?} {:?}",
        drafted.0,
        drafted.1.timings
    );
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused_or_left_out() {
    // The default model with one token renamed: same size, one text differs.
    let other = think_gguf();
    let opts = |required| EngineOptions {
        backend: BackendChoice::Llama,
        draft_model: Some(other.clone()),
        draft_model_required: required,
        ..EngineOptions::default()
    };
    let err = Engine::start(&gguf(), "smollm2", opts(true))
        .err()
        .expect("a draft model of another vocabulary is refused")
        .to_string();
    assert!(
        err.contains("vocabulary") && err.contains("token 4"),
        "{err}"
    );
    // Named for the pool, it is left out: the model drafts by prompt lookup.
    let e = Engine::start(&gguf(), "smollm2", opts(false)).expect("loads");
    assert!(e.model.draft.is_none());
    let r = request(&e, COPY, 40);
    assert!(run(&e, r).1.timings.draft_tokens > 0);
}
