//! Harmony replies (gpt-oss) through the real engine: first with a scripted
//! model that emits a fixed token sequence (the tiny gpt_oss model's own
//! vocabulary and chat template), so channels, tool calls and budgets are
//! checked exactly; then the tiny random gpt_oss model itself, whose
//! reasoning tokens must be the analysis channel's tokens as an independent
//! greedy run finds them.
use std::any::Any;
use std::path::PathBuf;

use shoal_engine::backend::{CacheRows, DecodeBatch, KvCache, LanguageModel, ModelInfo};
use shoal_engine::harmony::CLOSE_ANALYSIS;
use shoal_engine::loader::{self, Loaded, Vocabulary};
use shoal_engine::prompt::chat_prompt;
use shoal_engine::{
    BackendChoice, ChatMessage, Completion, Engine, EngineOptions, Event, FinishReason,
    GenerateRequest, Result, SamplingParams,
};

fn tiny_gpt_oss() -> PathBuf {
    let root = std::env::var("SHOAL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache")));
    let p = root.join("models/tiny-v1/gpt_oss-f32");
    assert!(
        p.join("config.json").is_file(),
        "tiny model missing at {} — run `make models`",
        p.display()
    );
    p
}

fn load() -> Loaded {
    loader::load(
        &tiny_gpt_oss(),
        &shoal_engine::LoadOptions {
            backend: BackendChoice::Mlx,
            ..Default::default()
        },
    )
    .expect("load the tiny gpt_oss model")
}

/// A model that answers with `script`, one token per step. Its cache
/// remembers how far along the script the sequence is: a fed token that is
/// the script's next one moves it on; tokens the engine forces in (a closed
/// analysis channel) do not, so the script resumes after them.
struct Script {
    ids: Vec<u32>,
    eos: u32,
    info: ModelInfo,
}

#[derive(Clone, Default)]
struct ScriptCache {
    len: usize,
    cursor: usize,
}

impl KvCache for ScriptCache {
    fn len(&self) -> usize {
        self.len
    }
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    fn nbytes(&self) -> usize {
        0
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn clone_box(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }
}

impl LanguageModel for Script {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn new_cache(&self) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(ScriptCache::default()))
    }
    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> Result<Vec<f32>> {
        let c = cache
            .as_any_mut()
            .downcast_mut::<ScriptCache>()
            .expect("script cache");
        let decoding = c.len > 0;
        c.len += tokens.len();
        if decoding && self.ids.get(c.cursor) == tokens.first() {
            c.cursor += 1;
        }
        let next = self.ids.get(c.cursor).copied().unwrap_or(self.eos);
        let mut logits = vec![0.0; self.info.vocab_size];
        logits[next as usize] = 10.0;
        Ok(logits)
    }
    fn new_batch(&self) -> Result<Box<dyn DecodeBatch>> {
        Ok(Box::new(CacheRows::default()))
    }
    fn forward_batch(&self, tokens: &[u32], batch: &mut dyn DecodeBatch) -> Result<Vec<Vec<f32>>> {
        let rows = CacheRows::of(batch, tokens)?;
        tokens
            .iter()
            .zip(rows.rows.iter_mut())
            .map(|(t, c)| self.forward(&[*t], c.as_mut()))
            .collect()
    }
}

/// The script's ids: `<|marker|>` names are special tokens, the rest text.
fn script(vocab: &Vocabulary, text: &str) -> Vec<u32> {
    vocab.encode_plain(text).expect("encode the script")
}

/// An engine whose model is `ids`, with the tiny model's vocabulary.
fn engine_with(l: Loaded, ids: Vec<u32>) -> Engine {
    engine_blocking(l, ids, Vec::new())
}

/// [`engine_with`], its content filter blocking `phrases`.
fn engine_blocking(l: Loaded, ids: Vec<u32>, phrases: Vec<String>) -> Engine {
    let vocab = l.vocab.clone();
    let eos = *vocab.eos.first().expect("an EOS");
    let info = ModelInfo {
        architecture: "script".into(),
        ..l.model.info().clone()
    };
    drop(l);
    assert!(ids.iter().all(|&t| (t as usize) < info.vocab_size));
    let model = Script { ids, eos, info };
    let opts = EngineOptions {
        prefix_cache_bytes: 0,
        blocked_phrases: phrases,
        ..EngineOptions::default()
    };
    Engine::start_with(&tiny_gpt_oss(), "script", opts, move |p| {
        Ok(Loaded {
            model: Box::new(model),
            vocab,
            path: p.to_path_buf(),
        })
    })
    .expect("engine")
}

/// Everything a reply streamed, by kind.
#[derive(Debug, Default)]
struct Reply {
    reasoning: String,
    content: String,
    calls: Vec<(String, String)>,
    done: Option<Completion>,
}

fn collect(e: &Engine, req: GenerateRequest) -> Reply {
    let mut rx = e.submit(req).expect("submit");
    let mut r = Reply::default();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Reasoning { text } => r.reasoning.push_str(&text),
            Event::Delta { text, .. } => r.content.push_str(&text),
            Event::ToolCallStart { index, name } => {
                assert_eq!(index, r.calls.len());
                r.calls.push((name, String::new()));
            }
            Event::ToolCallArgs { index, delta } => r.calls[index].1.push_str(&delta),
            Event::Done(c) => r.done = Some(c),
            Event::Started { .. } => {}
        }
    }
    r
}

fn request(vocab: &Vocabulary, reasoning: Option<Option<usize>>) -> GenerateRequest {
    let msgs = [ChatMessage::new("user", "What is the weather in Paris?")];
    let p = chat_prompt(vocab, &msgs, reasoning, None).expect("prompt");
    let spec = p.reasoning.clone().expect("a harmony model always reasons");
    assert!(spec.harmony.is_some(), "{spec:?}");
    let mut g = GenerateRequest::new(p.tokens);
    g.reasoning = p.reasoning;
    g.sampling = SamplingParams::greedy();
    g.max_tokens = Some(200);
    g
}

/// Tokens of `ids` up to and including the first `<|end|>`.
fn through_end(vocab: &Vocabulary, ids: &[u32]) -> usize {
    let end = script(vocab, "<|end|>")[0];
    ids.iter()
        .position(|&t| t == end)
        .map_or(ids.len(), |i| i + 1)
}

#[test]
fn a_tool_call_in_the_commentary_channel_after_reasoning() {
    let l = load();
    let vocab = l.vocab.clone();
    let ids = script(
        &vocab,
        "Let me check the weather.<|end|><|start|>assistant<|channel|>commentary \
         to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
    );
    let e = engine_with(l, ids.clone());
    let r = collect(&e, request(&vocab, Some(None)));
    let c = r.done.expect("done");
    assert_eq!(r.reasoning, "Let me check the weather.");
    assert_eq!(r.content, "");
    assert_eq!(
        r.calls,
        [(
            "get_weather".to_string(),
            "{\"city\": \"Paris\"}".to_string()
        )]
    );
    assert_eq!(c.finish, FinishReason::ToolCalls);
    assert_eq!(c.usage.completion_tokens, ids.len());
    // The analysis channel's tokens: its text and its end marker.
    assert_eq!(c.usage.reasoning_tokens, through_end(&vocab, &ids));
}

#[test]
fn the_model_opens_analysis_then_answers_in_final() {
    let vocab = load().vocab;
    let ids = script(
        &vocab,
        "<|channel|>analysis<|message|>The user asks about Paris<|end|>\
         <|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>",
    );
    // Also with a content filter: "Paris" could begin its blocked phrase, so
    // the filter holds it until the analysis channel ends, which rules the
    // phrase out; it stays in that channel.
    for blocked in [vec![], vec!["Paris rain".to_string()]] {
        let e = engine_blocking(load(), ids.clone(), blocked.clone());
        // Reasoning not asked for: the model still reasons in its own channel.
        let r = collect(&e, request(&vocab, None));
        let c = r.done.expect("done");
        assert_eq!(r.reasoning, "The user asks about Paris", "{blocked:?}");
        assert_eq!(r.content, "It is sunny in Paris.", "{blocked:?}");
        assert!(r.calls.is_empty());
        assert_eq!(c.finish, FinishReason::Stop);
        assert_eq!(c.usage.completion_tokens, ids.len());
        // The whole analysis message, header to end marker, is reasoning; the
        // final message's header is not.
        assert_eq!(c.usage.reasoning_tokens, through_end(&vocab, &ids));
    }
}

#[test]
fn a_budget_cuts_the_analysis_channel_short() {
    let l = load();
    let vocab = l.vocab.clone();
    let words = " one two three four five six seven eight";
    let ids = script(&vocab, &format!("{words}<|return|>"));
    let e = engine_with(l, ids.clone());
    let budget = 3;
    let r = collect(&e, request(&vocab, Some(Some(budget))));
    let c = r.done.expect("done");
    let first: String = vocab.decode(&ids[..budget], true).expect("decode");
    let rest: String = vocab
        .decode(&ids[budget..ids.len() - 1], true)
        .expect("decode");
    assert_eq!(c.usage.reasoning_tokens, budget);
    assert_eq!(r.reasoning, first);
    // The engine closed the channel and opened the answer; the model's
    // next tokens are the answer.
    assert_eq!(r.content, rest);
    let forced = script(&vocab, CLOSE_ANALYSIS).len();
    assert_eq!(c.usage.completion_tokens, ids.len() + forced);
    assert_eq!(c.finish, FinishReason::Stop);
}

/// The tiny random gpt_oss model, asked to reason: what the engine counts
/// as reasoning is what a plain greedy run of the same model spends in the
/// analysis channel (up to its end marker, or all of it).
#[test]
fn reasoning_tokens_are_the_analysis_channel_on_the_tiny_model() {
    let l = load();
    let max = 24;
    let mut req = request(&l.vocab, Some(None));
    req.max_tokens = Some(max);
    // An independent greedy run.
    let mut cache = l.model.new_cache().expect("cache");
    let mut logits = l
        .model
        .forward(&req.prompt, cache.as_mut())
        .expect("forward");
    let mut ids = Vec::new();
    while ids.len() < max {
        let t = logits
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32;
        ids.push(t);
        if l.vocab.eos.contains(&t) {
            break;
        }
        logits = l.model.forward(&[t], cache.as_mut()).expect("forward");
    }
    let vocab = l.vocab.clone();
    drop(l);
    let e = Engine::start(
        &tiny_gpt_oss(),
        "tiny",
        EngineOptions {
            backend: BackendChoice::Mlx,
            ..EngineOptions::default()
        },
    )
    .expect("engine");
    let r = collect(&e, req);
    let c = r.done.expect("done");
    assert_eq!(c.usage.completion_tokens, ids.len());
    assert_eq!(c.usage.reasoning_tokens, through_end(&vocab, &ids));
    assert!(c.usage.reasoning_tokens > 0 && !r.reasoning.is_empty());
}
