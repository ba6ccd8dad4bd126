//! Every MLX architecture against mlx-lm on tiny random-weight models that
//! mlx-lm's own model classes made (tools/py/tiny_models.py, float32 and
//! 4-bit): the prompt tokens from the model's own chat template, the logits
//! after the prompt and at each of 32 greedy steps (within 1e-3), the greedy
//! tokens exactly; then the same prompts through the engine alone, batched
//! and from the prefix cache must give the same replies.
//!
//! The models' sliding windows (8 positions) are shorter than every prompt,
//! so windowed attention is exercised in prefill, decode and batches.
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use serde_json::{json, Value};
use shoal_engine::loader::{self, Loaded};
use shoal_engine::{
    collect_blocking, BackendChoice, ChatMessage, Engine, EngineOptions, FinishReason,
    GenerateRequest, SamplingParams,
};

mod common;
use common::{argmax, floats, ids, max_diff};

const LOGIT_TOL: f32 = 1e-3;
const MAX_TOKENS: usize = 32;

fn tiny(name: &str) -> PathBuf {
    let root = std::env::var("SHOAL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| common::repo().join(".cache"));
    let p = root.join("models/tiny-v1").join(name);
    assert!(
        p.join("config.json").is_file()
            || p.extension().is_some_and(|e| e == "gguf") && p.is_file(),
        "tiny model missing at {} — run `make models`",
        p.display()
    );
    p
}

/// Conversations (a system turn, several turns) and one raw id prompt.
fn corpus() -> Value {
    json!([
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Name three rivers in Europe and say which is longest."}],
        [{"role": "user", "content": "Say hello."},
         {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a short story about a fox."}],
        {"token_ids": [504, 3458, 282, 4649, 314, 1345, 30, 216, 1000, 2000, 3000, 4000,
                       5000, 6000, 7000, 8000, 9000, 10000, 11000, 12000]},
    ])
}

fn reference(dir: &Path) -> Value {
    let prompts = std::env::temp_dir().join(format!(
        "shoal-arch-prompts-{}-{}.json",
        std::process::id(),
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("m")
    ));
    std::fs::write(&prompts, corpus().to_string()).expect("write prompts");
    let out = common::reference_py(dir)
        .args(["--prompts-json", &prompts.display().to_string()])
        .args(["--max-tokens", &MAX_TOKENS.to_string(), "--step-top", "5"])
        .output()
        .expect("run reference.py");
    let _ = std::fs::remove_file(&prompts);
    assert!(
        out.status.success(),
        "reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("reference JSON")
}

fn log_softmax(v: &[f32]) -> Vec<f32> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = v.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    v.iter().map(|&x| x - lse).collect()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .expect("messages")
        .iter()
        .map(|m| ChatMessage {
            role: m["role"].as_str().expect("role").into(),
            content: m["content"].as_str().expect("content").into(),
        })
        .collect()
}

/// The prompt ids Shoal builds for corpus item `i`, checked against mlx-lm's
/// template and tokenizer.
fn prompt(l: &loader::Vocabulary, item: &Value, reference: &Value) -> Vec<u32> {
    let ref_ids = ids(&reference["prompt_ids"]);
    if item.get("token_ids").is_some() {
        return ids(&item["token_ids"]);
    }
    let text = l
        .render_chat(&messages(item), true, &Default::default())
        .expect("render");
    let ours = l.encode(&text).expect("encode");
    assert_eq!(
        ours, ref_ids,
        "prompt ids differ from mlx-lm's template+tokenizer for {item}:\n{text:?}\nvs {:?}",
        reference["prompt_text"]
    );
    ours
}

/// Logits after the prompt and at each greedy step, and the greedy tokens.
fn check_logits(l: &Loaded, dir: &Path, r: &Value) {
    let corpus = corpus();
    let results = r["results"].as_array().expect("results");
    assert_eq!(results.len(), corpus.as_array().map_or(0, Vec::len));
    for (i, (item, res)) in corpus
        .as_array()
        .into_iter()
        .flatten()
        .zip(results)
        .enumerate()
    {
        let p = prompt(&l.vocab, item, res);
        assert!(p.len() > 8, "prompt {i} is not longer than the window");
        let mut cache = l.model.new_cache().expect("cache");
        let mut logits = l.model.forward(&p, cache.as_mut()).expect("forward");
        let mut worst = max_diff(&logits, &floats(&res["logits"]));
        assert!(
            worst < LOGIT_TOL,
            "{}: prompt {i}: max |logit diff| {worst} after the prompt",
            dir.display()
        );
        let ref_greedy = ids(&res["greedy_ids"]);
        let steps = res["step_top"].as_array().expect("step_top");
        let mut greedy = Vec::new();
        for (step, top) in steps.iter().enumerate() {
            let lp = log_softmax(&logits);
            for pair in top.as_array().expect("top") {
                let (id, want) = (
                    pair[0].as_u64().expect("id") as usize,
                    pair[1].as_f64().expect("lp") as f32,
                );
                let d = (lp[id] - want).abs();
                worst = worst.max(d);
                assert!(
                    d < LOGIT_TOL,
                    "{}: prompt {i} step {step}: logprob of {id}: {} vs mlx-lm {want}",
                    dir.display(),
                    lp[id]
                );
            }
            let t = argmax(&logits);
            greedy.push(t);
            if l.vocab.eos.contains(&t) || greedy.len() == ref_greedy.len() {
                break;
            }
            logits = l.model.forward(&[t], cache.as_mut()).expect("forward");
        }
        assert_eq!(
            greedy,
            ref_greedy,
            "{}: greedy tokens differ for prompt {i}",
            dir.display()
        );
        eprintln!(
            "{}: prompt {i} ({} tokens): max |Δ| = {worst:.2e} over {} steps",
            dir.display(),
            p.len(),
            greedy.len()
        );
    }
}

/// The corpus through the engine one at a time, all at once (batched) and
/// again (from the prefix cache): the same replies, and mlx-lm's.
fn check_engine(dir: &Path, r: &Value) {
    let opts = EngineOptions {
        backend: BackendChoice::Mlx,
        max_batch: 8,
        ..EngineOptions::default()
    };
    let e = Engine::start(dir, "tiny", opts).expect("engine");
    let corpus = corpus();
    let results = r["results"].as_array().expect("results");
    let reqs: Vec<GenerateRequest> = corpus
        .as_array()
        .into_iter()
        .flatten()
        .zip(results)
        .map(|(item, res)| {
            let mut g = GenerateRequest::new(prompt(&e.model.vocab, item, res));
            g.max_tokens = Some(MAX_TOKENS);
            g.sampling = SamplingParams::greedy();
            g
        })
        .collect();
    let run = |g: &GenerateRequest| {
        collect_blocking(e.submit(g.clone()).expect("submit")).expect("complete")
    };
    let single: Vec<_> = reqs.iter().map(run).collect();
    let streams: Vec<_> = reqs
        .iter()
        .map(|g| e.submit(g.clone()).expect("submit"))
        .collect();
    let batched: Vec<_> = streams
        .into_iter()
        .map(|rx| collect_blocking(rx).expect("complete"))
        .collect();
    assert!(
        e.stats.peak_batch.load(Ordering::Relaxed) >= 2,
        "{}: requests were not decoded together",
        dir.display()
    );
    let cached: Vec<_> = reqs.iter().map(run).collect();
    for (i, res) in results.iter().enumerate() {
        let mut want = ids(&res["greedy_ids"]);
        let stopped = res["finish_reason"] == "stop";
        if stopped {
            want.pop();
        }
        let text = e.model.vocab.decode(&want, true).expect("decode");
        let (s, b, c) = (&single[i], &batched[i], &cached[i]);
        assert_eq!(
            s.0,
            text,
            "{}: prompt {i}: reply differs from mlx-lm",
            dir.display()
        );
        assert_eq!(
            b.0,
            s.0,
            "{}: prompt {i}: batched reply differs",
            dir.display()
        );
        assert_eq!(
            c.0,
            s.0,
            "{}: prompt {i}: cached reply differs",
            dir.display()
        );
        let finish = if stopped {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        for (what, run) in [("single", s), ("batched", b), ("cached", c)] {
            assert_eq!(run.1.finish, finish, "{}: prompt {i} {what}", dir.display());
            assert_eq!(
                run.1.usage.prompt_tokens,
                reqs[i].prompt.len(),
                "{}: prompt {i} {what}",
                dir.display()
            );
            assert_eq!(run.1.usage.completion_tokens, s.1.usage.completion_tokens);
        }
        assert!(
            c.1.usage.cached_tokens > 0,
            "{}: prompt {i}: the repeat did not use the prefix cache",
            dir.display()
        );
    }
}

fn check(name: &str) {
    let dir = tiny(name);
    check_against(&dir, &dir);
}

/// `model` on MLX against mlx-lm's run of `dir`: logits, greedy steps, and
/// the engine alone, batched and prefix-cached.
fn check_against(model: &Path, dir: &Path) {
    let r = reference(dir);
    let l = loader::load(
        model,
        &shoal_engine::LoadOptions {
            backend: BackendChoice::Mlx,
            ..Default::default()
        },
    )
    .expect("load");
    assert_eq!(l.model.info().backend, shoal_engine::BackendKind::Mlx);
    check_logits(&l, model, &r);
    drop(l);
    check_engine(model, &r);
}

/// The float32 model written as GGUF the way llama.cpp lays it out
/// (tools/py/tiny_gguf.py) runs on MLX's GGUF path exactly as mlx-lm runs the
/// directory, with tokens from the file's own vocabulary and template.
fn check_gguf(name: &str) {
    check_against(
        &tiny(&format!("{name}-f32.gguf")),
        &tiny(&format!("{name}-f32")),
    );
}

#[test]
fn qwen3_moe_gguf() {
    check_gguf("qwen3_moe");
}

#[test]
fn phi3_gguf() {
    check_gguf("phi3");
}

/// A Phi-3 GGUF without `rope.scaling.attn_factor`: the factor the loader
/// derives from the context lengths gives mlx-lm's logits all the same.
#[test]
fn phi3_gguf_without_its_attention_factor() {
    check_against(&tiny("phi3-f32-no-attn-factor.gguf"), &tiny("phi3-f32"));
}

macro_rules! archs {
    ($($test:ident => $dir:literal,)*) => {$(
        #[test]
        fn $test() {
            check($dir);
        }
    )*};
}

archs! {
    mistral_f32 => "mistral-f32",
    mistral_q4 => "mistral-q4",
    gemma3_f32 => "gemma3_text-f32",
    gemma3_q4 => "gemma3_text-q4",
    phi3_f32 => "phi3-f32",
    phi3_q4 => "phi3-q4",
    qwen3_moe_f32 => "qwen3_moe-f32",
    qwen3_moe_q4 => "qwen3_moe-q4",
    gpt_oss_f32 => "gpt_oss-f32",
    gpt_oss_q4 => "gpt_oss-q4",
}

/// Two pipeline stages (layers 0..2 and 2..4) chained compute what the
/// whole model computes, and each holds only its own layers' weights (for
/// a mixture of experts, only its own layers' experts).
fn check_stages(name: &str) {
    use shoal_engine::backend::LanguageModel;
    use shoal_engine::backends::mlx::{MlxCache, Transformer};
    let dir = tiny(name);
    let (first, _) = loader::load_stage(&dir, Some(0..2)).expect("first stage");
    let (last, _) = loader::load_stage(&dir, Some(2..4)).expect("last stage");
    let (whole, _) = loader::load_stage(&dir, None).expect("whole");
    // Longer than the sliding window, then one decode step.
    let prompt: Vec<u32> = (0..20).map(|i| 300 + 97 * i).collect();
    let run = |stages: &[&Transformer]| -> Vec<Vec<f32>> {
        let mut caches: Vec<MlxCache> = stages.iter().map(|_| MlxCache::default()).collect();
        let mut out = Vec::new();
        for step in [&prompt[..], &[4242u32][..]] {
            let mut h = stages[0].embed_tokens(step).expect("embed");
            for (s, c) in stages.iter().zip(caches.iter_mut()) {
                h = s.run_layers(h, c).expect("layers");
            }
            let logits = stages[stages.len() - 1].logits_last(&h).expect("logits");
            logits.eval().expect("eval");
            out.push(logits.as_slice::<f32>().to_vec());
        }
        out
    };
    let split = run(&[&first, &last]);
    let one = run(&[&whole]);
    for (s, o) in split.iter().zip(&one) {
        let d = max_diff(s, o);
        assert!(d < 1e-5, "{name}: split logits differ by {d}");
    }
    let bytes = |m: &Transformer| m.info().weight_bytes;
    assert!(bytes(&first) < bytes(&whole) && bytes(&last) < bytes(&whole));
    // Untied: the first stage holds the table, the last the head, and
    // every layer's weights are on exactly one stage.
    assert_eq!(
        bytes(&first) + bytes(&last),
        bytes(&whole),
        "{name}: stages hold more or less than the model"
    );
}

macro_rules! stages {
    ($($test:ident => $dir:literal,)*) => {$(
        #[test]
        fn $test() {
            check_stages($dir);
        }
    )*};
}

stages! {
    mistral_splits_by_layers => "mistral-f32",
    phi3_splits_by_layers => "phi3-q4",
    qwen3_moe_splits_with_each_stage_holding_its_experts => "qwen3_moe-q4",
    gpt_oss_splits_with_each_stage_holding_its_experts => "gpt_oss-f32",
    qwen3_moe_gguf_splits_with_each_stage_holding_its_experts => "qwen3_moe-f32.gguf",
    phi3_gguf_splits_by_layers => "phi3-f32.gguf",
}
