//! `shoal bench --drafting` and `--kv-types`: speculative decoding against
//! plain decoding, and the KV cache types against f16, on one model.
use anyhow::{Context, Result};
use serde_json::json;
use shoal_engine::{
    collect_blocking, ChatMessage, Completion, DraftOptions, Engine, EngineOptions,
    GenerateRequest, KvType, SamplingParams,
};

use crate::common::{median, Args};

/// A function of about 400 tokens to hand back with one line changed: what
/// an agent editing a file asks for.
const FUNCTION: &str = include_str!("../bench/sync_inventory.py");

/// The tasks: (name, user message, token limit).
fn tasks() -> Vec<(&'static str, String, usize)> {
    vec![
        (
            "code edit",
            format!(
                "In the Python function below, change the line `    retries = 3` to \
                 `    retries = 5`. Reply with the whole updated function in one Python code \
                 block and nothing else.\n\n```python\n{FUNCTION}```"
            ),
            640,
        ),
        (
            "open chat",
            "Write a short story about a lighthouse keeper who finds a message in a bottle."
                .to_string(),
            256,
        ),
    ]
}

fn request(engine: &Engine, user: &str, max_tokens: usize) -> Result<GenerateRequest> {
    let msgs = [ChatMessage {
        role: "user".into(),
        content: user.into(),
    }];
    let text = engine
        .model
        .vocab
        .render_chat(&msgs, true, &Default::default())?;
    let mut r = GenerateRequest::new(engine.model.vocab.encode(&text)?);
    r.max_tokens = Some(max_tokens);
    r.sampling = SamplingParams::greedy();
    Ok(r)
}

fn start(a: &Args, opts: EngineOptions) -> Result<shoal::OwnedEngine> {
    let cfg = a.model.config()?;
    Ok(shoal::OwnedEngine::new(
        Engine::start(&cfg.model_path(), &cfg.model_id(), opts)
            .with_context(|| format!("loading {}", cfg.model_path().display()))?,
    ))
}

/// Each task decoded without drafts and with them, in interleaved pairs
/// (the order alternating), prefix cache off so every run computes its
/// prompt. Only one engine is loaded at a time: two llama.cpp contexts in
/// one process slow each other's decoding (plain decoding of the code edit
/// ran at 29 tok/s beside a second engine and 46 tok/s alone).
pub fn run(a: &Args) -> Result<()> {
    let base = EngineOptions {
        prefix_cache_bytes: 0,
        ..a.model.config()?.engine_options()?
    };
    let drafted = if base.draft.enabled() {
        base.draft
    } else {
        DraftOptions::default()
    };
    let plain_opts = EngineOptions {
        draft: DraftOptions::off(),
        draft_model: None,
        ..base.clone()
    };
    // Drafts from the draft model when one is named, else by prompt lookup.
    let source = match &base.draft_model {
        Some(p) => format!("draft model {}", p.display()),
        None => "prompt lookup".to_string(),
    };
    let on_opts = EngineOptions {
        draft: drafted,
        ..base
    };
    // With a draft model, also with it on every step prompt lookup leaves
    // (not only where the load-time timing and measured steps say it pays):
    // what the pair gives by itself, acceptance included.
    let mut variants = vec![("as configured", on_opts.clone())];
    if on_opts.draft_model.is_some() {
        variants.push((
            "model always",
            EngineOptions {
                draft: DraftOptions {
                    measured: false,
                    ..drafted
                },
                ..on_opts.clone()
            },
        ));
    }
    let timing = std::cell::Cell::new(None);
    // One reply on a freshly loaded engine, after a short warm-up request.
    let once = |opts: &EngineOptions, user: &str, max: usize| -> Result<(String, Completion)> {
        let e = start(a, opts.clone())?;
        if opts.draft_model.is_some() && e.model.draft.is_none() {
            anyhow::bail!("the draft model does not share the model's vocabulary");
        }
        if let Some(t) = e.model.draft.as_ref().and_then(|d| d.timed_at_load) {
            timing.set(Some(t));
        }
        collect_blocking(e.submit(request(&e, "Say hello.", 4)?)?)?;
        let out = collect_blocking(e.submit(request(&e, user, max)?)?)?;
        drop(e);
        Ok(out)
    };
    let model_id = a.model.config()?.model_id();
    let mut rows = Vec::new();
    for (name, user, max) in tasks() {
        for (variant, opts) in &variants {
            let (mut off_rate, mut on_rate, mut ratio) = (vec![], vec![], vec![]);
            let mut last: Option<(String, Completion, String, Completion)> = None;
            for run in 0..a.runs {
                let go = |opts: &EngineOptions| once(opts, &user, max);
                let (p, d) = if run % 2 == 0 {
                    let p = go(&plain_opts)?;
                    (p, go(opts)?)
                } else {
                    let d = go(opts)?;
                    (go(&plain_opts)?, d)
                };
                off_rate.push(p.1.timings.decode_tokens_per_s);
                on_rate.push(d.1.timings.decode_tokens_per_s);
                if p.1.timings.decode_tokens_per_s > 0.0 {
                    ratio.push(d.1.timings.decode_tokens_per_s / p.1.timings.decode_tokens_per_s);
                }
                last = Some((p.0, p.1, d.0, d.1));
            }
            let Some((ptext, pc, dtext, dc)) = last else {
                continue;
            };
            let t = dc.timings;
            rows.push(json!({
                "task": name,
                "drafting": variant,
                "completion_tokens": dc.usage.completion_tokens,
                "plain_decode_tok_s": median(off_rate),
                "drafted_decode_tok_s": median(on_rate),
                "speedup": median(ratio),
                "draft_tokens": t.draft_tokens,
                "draft_accepted": t.draft_accepted,
                "acceptance": if t.draft_tokens > 0 { t.draft_accepted as f64 / t.draft_tokens as f64 } else { 0.0 },
                "same_reply": ptext == dtext && pc.usage == dc.usage && pc.finish == dc.finish,
            }));
        }
    }
    let out = json!({
        "model": model_id,
        "drafts_from": source,
        "runs": a.runs,
        "max_draft": drafted.max_tokens,
        "draft_model_timed_at_load": timing.get(),
        "tasks": rows,
    });
    if a.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "shoal {}: speculative decoding ({}, up to {} drafts a step) against plain decoding, {} interleaved pairs",
        model_id, source, drafted.max_tokens, a.runs
    );
    if let Some(t) = timing.get() {
        println!(
            "  draft model timed at load: {:.1} ms per token plain, {:.1} at best drafted \
             (tried only if the second is smaller)",
            t.plain_ms_per_token, t.best_drafted_ms_per_token
        );
    }
    println!(
        "{:12} {:14} {:>7} {:>12} {:>12} {:>8} {:>16} {:>6}",
        "task",
        "drafting",
        "tokens",
        "plain tok/s",
        "draft tok/s",
        "speedup",
        "drafts kept",
        "same"
    );
    for r in &rows {
        println!(
            "{:12} {:14} {:>7} {:>12.1} {:>12.1} {:>7.2}x {:>9}/{:<6} {:>6}",
            r["task"].as_str().unwrap_or(""),
            r["drafting"].as_str().unwrap_or(""),
            r["completion_tokens"],
            r["plain_decode_tok_s"].as_f64().unwrap_or(0.0),
            r["drafted_decode_tok_s"].as_f64().unwrap_or(0.0),
            r["speedup"].as_f64().unwrap_or(0.0),
            r["draft_accepted"],
            r["draft_tokens"],
            if r["same_reply"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
        );
    }
    Ok(())
}

/// Prompts whose greedy replies the KV cache types are compared on.
const AGREEMENT_PROMPTS: &[&str] = &[
    "What is the capital of France? Answer in one sentence.",
    "List the first five prime numbers.",
    "Write a haiku about autumn leaves.",
    "Explain what a hash map is in two sentences.",
    "Write a Python function that reverses a string.",
    "Translate 'good morning' into Spanish, French and German.",
];

/// KV bytes per position of each cache type, and how far each one's greedy
/// replies follow f16's: replies equal, and for the others the token where
/// they first part.
pub fn kv_types(a: &Args) -> Result<()> {
    let base = EngineOptions {
        prefix_cache_bytes: 0,
        draft: DraftOptions::off(),
        ..a.model.config()?.engine_options()?
    };
    let gen = a.gen_tokens.max(2);
    let mut reference: Vec<Vec<u32>> = Vec::new();
    let mut rows = Vec::new();
    for kv in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        let mut opts = base.clone();
        opts.llama = opts.llama.kv_type(kv);
        // The positions the pool reserves (`auto` sized for this model).
        let route = shoal_engine::backends::route(&a.model.config()?.model_path(), opts.backend)?;
        let llama = opts.llama.clone().for_batch(opts.max_batch);
        let positions = route
            .header
            .as_ref()
            .map_or(llama.kv_tokens, |h| llama.kv_tokens_for(h));
        let e = start(a, opts)?;
        let mut replies = Vec::new();
        for p in AGREEMENT_PROMPTS {
            let (text, _) = collect_blocking(e.submit(request(&e, p, gen)?)?)?;
            replies.push(e.model.vocab.encode_plain(&text)?);
        }
        if reference.is_empty() {
            reference = replies.clone();
        }
        let mut equal = 0;
        let mut partings = Vec::new();
        for (got, want) in replies.iter().zip(&reference) {
            match got.iter().zip(want).position(|(g, w)| g != w) {
                None if got.len() == want.len() => equal += 1,
                None => partings.push(got.len().min(want.len())),
                Some(i) => partings.push(i),
            }
        }
        let per_position = e.model.info.kv_capacity_bytes as f64 / positions.max(1) as f64;
        rows.push(json!({
            "kv_cache_type": kv.as_str(),
            "kv_bytes_per_position": per_position,
            "replies_equal_to_f16": equal,
            "replies": AGREEMENT_PROMPTS.len(),
            "first_divergence_tokens": partings,
        }));
    }
    let out = json!({"gen_tokens": gen, "types": rows});
    if a.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "KV cache types: greedy replies of {gen} tokens to {} prompts against f16",
        AGREEMENT_PROMPTS.len()
    );
    for r in &rows {
        println!(
            "  {:5} {:>9.0} bytes/position | {} of {} replies equal to f16 | first divergence at token {}",
            r["kv_cache_type"].as_str().unwrap_or(""),
            r["kv_bytes_per_position"].as_f64().unwrap_or(0.0),
            r["replies_equal_to_f16"],
            r["replies"],
            r["first_divergence_tokens"]
        );
    }
    Ok(())
}
