//! `shoal generate`: one chat turn through the model's own template, built
//! as the server builds a chat prompt (`shoal_engine::prompt`).
use std::io::Write;

use anyhow::{Context, Result};
use serde_json::json;
use shoal_engine::{ChatMessage, Engine, Event, FinishReason, GenerateRequest, SamplingParams};

use crate::common::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Stop after this many tokens.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Stop sequence (repeatable); the matched text is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// System prompt (the template's default is used when absent).
    #[arg(long)]
    pub system: Option<String>,
    /// Print exactly one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// The user message.
    pub prompt: String,
}

pub fn run(a: Args) -> Result<()> {
    let cfg = a.model.config()?;
    let engine = shoal::OwnedEngine::new(
        Engine::start(&cfg.model_path(), &cfg.model_id(), cfg.engine_options()?)
            .with_context(|| format!("loading {}", cfg.model_path().display()))?,
    );
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(ChatMessage {
            role: "system".into(),
            content: s.clone(),
        });
    }
    messages.push(ChatMessage {
        role: "user".into(),
        content: a.prompt.clone(),
    });
    // The same prompt decision as the server's chat dialects.
    let prompt = shoal_engine::prompt::chat_prompt(&engine.model.vocab, &messages, None, None)?;
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
        seed: a.seed,
        repetition_penalty: a.repetition_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        ..SamplingParams::default()
    };
    let mut rx = engine.submit(GenerateRequest {
        prompt: prompt.tokens,
        max_tokens: a.max_tokens,
        sampling,
        stop: a.stop.clone(),
        ignore_eos: false,
        cancel: Default::default(),
        reasoning: prompt.reasoning,
        grammar: None,
        tools: None,
        cache_salt: 0,
        cache_breakpoints: Vec::new(),
        images: Vec::new(),
    })?;
    let mut out = String::new();
    let mut reasoning = String::new();
    let mut stdout = std::io::stdout().lock();
    let completion = loop {
        match rx.blocking_recv() {
            Some(Event::Delta { text, .. }) => {
                if !a.json {
                    stdout.write_all(text.as_bytes())?;
                    stdout.flush()?;
                }
                out.push_str(&text);
            }
            Some(Event::Reasoning { text }) => {
                if !a.json {
                    eprint!("{text}");
                }
                reasoning.push_str(&text);
            }
            Some(Event::Done(c)) => break c,
            // Raw generation parses no tool calls.
            Some(
                Event::Started { .. } | Event::ToolCallStart { .. } | Event::ToolCallArgs { .. },
            ) => {}
            None => anyhow::bail!("engine stopped mid-request"),
        }
    };
    let u = completion.usage;
    let stop_sequence = match &completion.finish {
        FinishReason::StopSequence(s) => Some(s.clone()),
        _ => None,
    };
    let error = match &completion.finish {
        FinishReason::Error(e) => Some(e.clone()),
        _ => None,
    };
    if a.json {
        let obj = json!({
            "text": out,
            "reasoning": reasoning,
            "finish_reason": completion.finish.as_str(),
            "stop_sequence": stop_sequence,
            "error": error,
            "usage": {
                "prompt_tokens": u.prompt_tokens,
                "cached_tokens": u.cached_tokens,
                "completion_tokens": u.completion_tokens,
                "reasoning_tokens": u.reasoning_tokens,
                "total_tokens": u.total_tokens(),
            },
            "timings": completion.timings,
        });
        writeln!(stdout, "{obj}")?;
    } else {
        let t = completion.timings;
        writeln!(stdout)?;
        let mut reason = completion.finish.as_str().to_string();
        if let Some(s) = stop_sequence {
            reason.push_str(&format!(" {s:?}"));
        }
        if let Some(e) = error {
            reason.push_str(&format!(": {e}"));
        }
        eprintln!(
            "\n[finish: {reason}] prompt {} (cached {}) + completion {} (reasoning {}) = {} tokens | ttft {:.0} ms, prefill {:.1} tok/s, decode {:.1} tok/s",
            u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.reasoning_tokens, u.total_tokens(),
            t.ttft_ms, t.prefill_tokens_per_s, t.decode_tokens_per_s
        );
    }
    if let FinishReason::Error(e) = completion.finish {
        anyhow::bail!("generation failed: {e}");
    }
    Ok(())
}
