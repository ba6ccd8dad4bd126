//! End-to-end tests on the real default model (SmolLM2-135M-Instruct GGUF).
//! `make test` fetches it; the path comes from `SHOAL_TEST_GGUF`.
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::{chat_prompt, gguf};
use shoal_engine::{
    collect_blocking, ChatMessage, Completion, Engine, EngineError, EngineOptions, Event,
    FinishReason, GenerateRequest, SamplingParams,
};

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    // No prefix cache here: these tests assert usage of repeated prompts.
    E.get_or_init(|| {
        let opts = EngineOptions {
            prefix_cache_bytes: 0,
            ..common::options()
        };
        Engine::start(&gguf(), "smollm2", opts).expect("load default model")
    })
}

/// An engine of a test's own, for replies that must not share decode steps
/// with other tests' requests (on llama.cpp they would change a sampled reply).
fn own_engine() -> Engine {
    Engine::start(&gguf(), "smollm2", common::options()).expect("load")
}

fn greedy(prompt: Vec<u32>, max_tokens: Option<usize>, stop: Vec<String>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop,
        ignore_eos: false,
        cancel: Default::default(),
        reasoning: None,
        grammar: None,
        tools: None,
        cache_salt: 0,
        cache_breakpoints: Vec::new(),
        images: Vec::new(),
    }
}

fn run(req: GenerateRequest) -> (String, Completion) {
    collect_blocking(engine().submit(req).expect("submit")).expect("complete")
}

#[test]
fn france_greedy_answer_and_exact_usage() {
    let e = engine();
    let prompt = chat_prompt(e, "What is the capital of France? Answer in one sentence.");
    let n_prompt = prompt.len();
    let (text, c) = run(greedy(prompt, Some(64), vec![]));
    assert_eq!(text, "The capital of France is Paris.");
    assert_eq!(c.finish, FinishReason::Stop);
    assert_eq!(c.usage.prompt_tokens, n_prompt);
    assert_eq!(c.usage.cached_tokens, 0);
    // Every sampled token counts, the closing <|im_end|> included.
    let text_tokens = e.model.vocab.encode(&text).unwrap().len();
    assert_eq!(c.usage.completion_tokens, text_tokens + 1);
    assert_eq!(c.usage.total_tokens(), n_prompt + c.usage.completion_tokens);
    assert!(c.timings.ttft_ms > 0.0 && c.timings.decode_tokens_per_s > 0.0);
}

#[test]
fn max_tokens_gives_length_with_exact_count() {
    let e = engine();
    let (text, c) = run(greedy(
        chat_prompt(e, "Tell me a long story about a dragon."),
        Some(3),
        vec![],
    ));
    assert_eq!(c.finish, FinishReason::Length);
    assert_eq!(c.usage.completion_tokens, 3);
    assert!(!text.is_empty());
}

#[test]
fn stop_sequence_is_reported_and_excluded() {
    let e = engine();
    let (text, c) = run(greedy(
        chat_prompt(e, "What is the capital of France? Answer in one sentence."),
        Some(64),
        vec!["Paris".into()],
    ));
    assert_eq!(c.finish, FinishReason::StopSequence("Paris".into()));
    assert_eq!(text, "The capital of France is ");
    // The tokens that spelled the stop sequence were sampled, so they count.
    let upto = e
        .model
        .vocab
        .encode("The capital of France is Paris")
        .unwrap()
        .len();
    assert_eq!(c.usage.completion_tokens, upto);
}

#[test]
fn stop_sequence_across_tokens() {
    let e = engine();
    // "of Fr" spans the tokens " of" and " France".
    let (text, c) = run(greedy(
        chat_prompt(e, "What is the capital of France? Answer in one sentence."),
        Some(64),
        vec!["of Fr".into()],
    ));
    assert_eq!(c.finish, FinishReason::StopSequence("of Fr".into()));
    assert_eq!(text, "The capital ");
}

#[test]
fn seeded_sampling_is_reproducible() {
    // Its own engine, like `utf8_never_broken_in_deltas`: two runs of a seed
    // must not share decode steps with other tests' requests.
    let e = &own_engine();
    let run = |r| collect_blocking(e.submit(r).expect("submit")).expect("complete");
    let mk = |seed| GenerateRequest {
        prompt: chat_prompt(e, "Write a short poem about the sea."),
        max_tokens: Some(24),
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 0.95,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        stop: vec![],
        ignore_eos: false,
        cancel: Default::default(),
        reasoning: None,
        grammar: None,
        tools: None,
        cache_salt: 0,
        cache_breakpoints: Vec::new(),
        images: Vec::new(),
    };
    let (a, _) = run(mk(7));
    let (b, _) = run(mk(7));
    let (c, _) = run(mk(8));
    let (d, _) = run(mk(9));
    assert_eq!(a, b, "same seed, same prompt must give the same text");
    assert!(a != c || a != d, "different seeds should not all agree");
}

#[test]
fn prompt_longer_than_context_is_rejected_before_work() {
    let e = engine();
    let ctx = e.model.info.context_length;
    let before = e.stats.completed.load(Ordering::Relaxed);
    let err = e
        .submit(greedy(vec![1; ctx + 5], Some(4), vec![]))
        .expect_err("must be refused");
    assert!(
        matches!(err, EngineError::ContextOverflow { prompt_tokens, context } if prompt_tokens == ctx + 5 && context == ctx)
    );
    assert_eq!(e.stats.completed.load(Ordering::Relaxed), before);
}

#[test]
fn dropping_the_receiver_cancels_promptly() {
    let e = engine();
    let before = e.stats.cancelled.load(Ordering::Relaxed);
    let mut req = greedy(
        chat_prompt(e, "Count from one to two hundred in words."),
        Some(400),
        vec![],
    );
    req.ignore_eos = true;
    let mut rx = e.submit(req).unwrap();
    // Wait for real output, then walk away.
    loop {
        match rx.blocking_recv() {
            Some(Event::Delta { .. }) => break,
            Some(_) => continue,
            None => panic!("stream ended early"),
        }
    }
    drop(rx);
    let deadline = Instant::now() + Duration::from_secs(120);
    while e.stats.cancelled.load(Ordering::Relaxed) == before {
        assert!(Instant::now() < deadline, "generation was not cancelled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let produced = e.stats.last_cancelled_tokens.load(Ordering::Relaxed);
    assert!(
        produced < 400,
        "generation ran to the end ({produced} tokens) instead of stopping"
    );
    // The engine keeps serving.
    let (_, c) = run(greedy(chat_prompt(e, "Hi"), Some(2), vec![]));
    assert_eq!(c.usage.completion_tokens, 2);
}

#[test]
fn utf8_never_broken_in_deltas() {
    // An engine of its own: on llama.cpp a sampled reply depends on what
    // shares its decode steps (the attention kernel follows the step's size),
    // and the reply this test checks must be this prompt's and seed's alone.
    let e = &own_engine();
    let mut rx = e
        .submit(GenerateRequest {
            prompt: chat_prompt(
                e,
                "Reply with five different emoji and some Japanese words.",
            ),
            max_tokens: Some(48),
            sampling: SamplingParams {
                temperature: 0.9,
                seed: Some(3),
                ..SamplingParams::default()
            },
            stop: vec![],
            ignore_eos: false,
            cancel: Default::default(),
            reasoning: None,
            grammar: None,
            tools: None,
            cache_salt: 0,
            cache_breakpoints: Vec::new(),
            images: Vec::new(),
        })
        .unwrap();
    let mut all = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Delta { text, .. } => {
                assert!(
                    !text.contains('\u{FFFD}'),
                    "broken character in delta {text:?}"
                );
                all.push_str(&text);
            }
            Event::Done(c) => {
                assert!(c.usage.completion_tokens > 0);
                break;
            }
            Event::Started { .. }
            | Event::Reasoning { .. }
            | Event::ToolCallStart { .. }
            | Event::ToolCallArgs { .. } => {}
        }
    }
    assert!(!all.is_empty());
}

#[test]
fn logprobs_are_reported_per_token() {
    let e = engine();
    let mut req = greedy(
        chat_prompt(e, "What is the capital of France? Answer in one sentence."),
        Some(5),
        vec![],
    );
    req.sampling.top_logprobs = Some(3);
    let mut rx = e.submit(req).unwrap();
    let mut lps = Vec::new();
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Delta { text: t, logprobs } => {
                text.push_str(&t);
                lps.extend(logprobs);
            }
            Event::Done(c) => {
                assert_eq!(c.usage.completion_tokens, 5);
                break;
            }
            _ => {}
        }
    }
    assert_eq!(lps.len(), 5);
    let joined: String = lps.iter().map(|l| l.text.clone()).collect();
    assert_eq!(joined, text);
    for l in &lps {
        assert!(l.logprob <= 0.0);
        assert_eq!(l.top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(l.top[0].0, l.token);
        assert!((l.top[0].2 - l.logprob).abs() < 1e-5);
    }
}

#[test]
fn cancel_flag_ends_with_a_cancelled_record_and_exact_usage() {
    let e = engine();
    let mut req = greedy(
        chat_prompt(e, "Count from one to two hundred in words."),
        Some(400),
        vec![],
    );
    req.ignore_eos = true;
    let flag = req.cancel.clone();
    let n_prompt = req.prompt.len();
    let mut rx = e.submit(req).unwrap();
    let mut deltas = 0;
    let done = loop {
        match rx.blocking_recv().expect("stream must end with Done") {
            Event::Delta { .. } => {
                deltas += 1;
                if deltas == 3 {
                    flag.cancel();
                }
            }
            Event::Done(c) => break c,
            Event::Started { .. }
            | Event::Reasoning { .. }
            | Event::ToolCallStart { .. }
            | Event::ToolCallArgs { .. } => {}
        }
    };
    assert_eq!(done.finish, FinishReason::Cancelled);
    assert_eq!(done.usage.prompt_tokens, n_prompt);
    assert!(done.usage.completion_tokens >= 3 && done.usage.completion_tokens < 400);
}

#[test]
fn prefix_cache_reuses_shared_prompts_with_identical_greedy_output() {
    let e = own_engine();
    let system = "You are a careful assistant who answers in one sentence. ".repeat(8);
    let msgs = |user: &str| {
        let m = [
            ChatMessage {
                role: "system".into(),
                content: system.clone(),
            },
            ChatMessage {
                role: "user".into(),
                content: user.into(),
            },
        ];
        let text = e
            .model
            .vocab
            .render_chat(&m, true, &Default::default())
            .expect("render");
        e.model.vocab.encode(&text).expect("encode")
    };
    let run_on = |prompt: Vec<u32>| {
        collect_blocking(e.submit(greedy(prompt, Some(16), vec![])).unwrap()).unwrap()
    };
    let a = msgs("What is the capital of France? Answer in one sentence.");
    let (cold_text, cold) = run_on(a.clone());
    assert_eq!(cold.usage.cached_tokens, 0);
    // Same prompt again: all but the last token come from the cache.
    let (warm_text, warm) = run_on(a.clone());
    assert_eq!(warm.usage.cached_tokens, a.len() - 1);
    assert_eq!(
        warm.usage.prompt_tokens,
        a.len(),
        "a cache hit never shortens the prompt"
    );
    assert_eq!(
        warm_text, cold_text,
        "greedy output must not depend on the cache"
    );
    assert_eq!(warm.usage.completion_tokens, cold.usage.completion_tokens);
    // A different question after the same system prompt shares exactly the common prefix.
    let b = msgs("What is the capital of Italy?");
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let (_, c) = run_on(b.clone());
    assert_eq!(c.usage.cached_tokens, shared);
    // A second turn reuses the first turn's prompt and reply.
    let mut turn2 = a.clone();
    turn2.extend(e.model.vocab.encode(&format!("{cold_text}<|im_end|>\n<|im_start|>user\nAnd Italy?<|im_end|>\n<|im_start|>assistant\n")).unwrap());
    let (_, t2) = run_on(turn2.clone());
    assert!(
        t2.usage.cached_tokens >= a.len(),
        "second turn reused {} of {}",
        t2.usage.cached_tokens,
        a.len()
    );
    assert_eq!(t2.usage.prompt_tokens, turn2.len());
    assert_eq!(
        e.stats.cached_tokens.load(Ordering::Relaxed) as usize,
        warm.usage.cached_tokens + c.usage.cached_tokens + t2.usage.cached_tokens
    );
}
