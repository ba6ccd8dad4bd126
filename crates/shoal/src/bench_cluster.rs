//! `shoal bench --server URL`: decode speed of a model split over cluster
//! nodes, measured at the wire, against the same model on one node.
//!
//! The model is first asked on the entry node alone, then placed as a
//! pipeline instance over the chosen nodes (`POST /v1/instances`), asked the
//! same greedy questions, and removed again. Decode speed is completion tokens
//! after the first over the time between the first and the last streamed
//! text, so it holds the hops and the HTTP forwarding a client sees.
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use shoal_client::target::{Dialect, Message, Request, Target, TargetConfig};

use crate::common::{median, Args};

struct Run {
    text: String,
    completion_tokens: u64,
    decode_tok_s: f64,
}

async fn ask(target: &Target, prompt: &str, max_tokens: usize) -> Result<Run> {
    let req = Request {
        messages: vec![Message {
            role: "user".into(),
            content: prompt.into(),
            images: Vec::new(),
        }],
        max_tokens: Some(max_tokens as u64),
        temperature: Some(0.0),
        ..Request::default()
    };
    let (mut first, mut last) = (None, None);
    let reply = target
        .send_streaming(&req, &mut |_, t| {
            if !t.is_empty() {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
            }
        })
        .await;
    let piece = reply.pieces.first().context("no reply")?;
    if reply.http_status != 200 || piece.kind != shoal_client::target::PieceKind::Text {
        bail!("HTTP {}: {}", reply.http_status, piece.text);
    }
    let tokens = piece
        .metadata
        .get("token_usage_completion_tokens")
        .and_then(Value::as_u64)
        .context("the reply reported no completion tokens")?;
    let span = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    ensure!(
        tokens >= 8 && span > 0.0,
        "the reply was too short to time ({tokens} tokens)"
    );
    Ok(Run {
        text: piece.text.clone(),
        completion_tokens: tokens,
        decode_tok_s: (tokens - 1) as f64 / span,
    })
}

async fn series(target: &Target, a: &Args) -> Result<(f64, Vec<Run>)> {
    // The first answer warms up (loads, first allocations) and is not timed.
    ask(target, PROMPT, 8).await?;
    let mut runs = Vec::new();
    for _ in 0..a.runs {
        runs.push(ask(target, PROMPT, a.gen_tokens).await?);
    }
    Ok((median(runs.iter().map(|r| r.decode_tok_s).collect()), runs))
}

/// A prompt the small default model answers at length.
const PROMPT: &str = "Count from 1 to 200, separated by commas.";

pub fn run(a: &Args, server: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(a, server.trim_end_matches('/')))
}

async fn run_async(a: &Args, server: &str) -> Result<()> {
    let http = reqwest::Client::new();
    let auth = |rb: reqwest::RequestBuilder| match &a.api_key {
        Some(k) => rb.bearer_auth(k),
        None => rb,
    };
    let get = |path: &str| auth(http.get(format!("{server}{path}")));
    let nodes: Value = get("/v1/cluster/nodes")
        .send()
        .await
        .with_context(|| format!("reaching {server}"))?
        .error_for_status()
        .context("listing the cluster's nodes")?
        .json()
        .await?;
    let online: Vec<String> = nodes["nodes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter(|x| x["status"] == "online")
                .filter_map(|x| x["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let chosen = match &a.nodes {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => online.clone(),
    };
    ensure!(
        chosen.len() >= 2,
        "a split needs at least 2 nodes; {server} sees {} online",
        online.len()
    );
    let model = a.model.config()?.model_id();
    let target = Target::new(TargetConfig {
        dialect: Dialect::Chat,
        base_url: server.to_string(),
        model: model.clone(),
        api_key: a.api_key.clone(),
        headers: vec![],
        stream: true,
        price: None,
    })?;

    let (one, one_runs) = series(&target, a).await.context("the model on one node")?;
    let placed: Value = auth(http.post(format!("{server}/v1/instances")))
        .json(&json!({"model": model, "nodes": chosen, "sharding": "pipeline"}))
        .send()
        .await?
        .json()
        .await?;
    let id = placed["id"]
        .as_str()
        .with_context(|| format!("placing the instance: {placed}"))?
        .to_string();
    let split = series(&target, a).await;
    let removed = auth(http.delete(format!("{server}/v1/instances/{id}")))
        .send()
        .await;
    let (split, split_runs) = split.context("the model split over the nodes")?;
    removed
        .context("removing the benchmark's instance")?
        .error_for_status()
        .context("removing the benchmark's instance")?;
    let same = one_runs
        .iter()
        .zip(&split_runs)
        .all(|(x, y)| x.text == y.text && x.completion_tokens == y.completion_tokens);
    let hops = (chosen.len() - 1) as f64;
    let hop_ms = (1000.0 / split - 1000.0 / one) / hops;
    let out = json!({
        "engine": "shoal",
        "server": server,
        "model": model,
        "nodes": chosen,
        "gen_tokens": a.gen_tokens,
        "runs": a.runs,
        "single_node_decode_tok_s": one,
        "split_decode_tok_s": split,
        "hop_ms_per_token": hop_ms,
        "same_greedy_output": same,
        "layers": placed["layers"],
    });
    if a.json {
        println!("{out}");
    } else {
        println!(
            "shoal cluster bench {server}: {model}, {} runs of {} tokens\n  one node: decode {one:.1} tok/s\n  split over {} nodes (pipeline, MLX ring): decode {split:.1} tok/s | {hop_ms:.2} ms per token per hop | same greedy output: {}",
            a.runs,
            a.gen_tokens,
            chosen.len(),
            if same { "yes" } else { "NO" }
        );
    }
    ensure!(same, "the split model answered differently from one node");
    Ok(())
}
