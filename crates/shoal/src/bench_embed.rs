//! `shoal bench --embeddings`: embeddings per second and tokens per second
//! of an embedding model, for requests of 1, 16 and 256 short inputs.
//!
//! The model is served in this process on loopback and asked over HTTP
//! (`/v1/embeddings`), so a comparison with another server (`--against URL`,
//! e.g. `llama-server --embeddings` on the same file and threads) pays the
//! same transport and JSON on both sides. Runs alternate between the two,
//! each batch size in turn, and each side's median is compared (a shared
//! host drifts; interleaving keeps the ratio fair).
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use shoal_engine::{Engine, EngineOptions};

use crate::common::{median, Args};

/// Input counts per request.
const BATCHES: [usize; 3] = [1, 16, 256];
const WORDS: &str = "the quick brown fox jumps over a lazy dog while seven tired cats \
watch from the old stone wall near the river";

/// `n` distinct short inputs (about a dozen tokens each).
fn inputs(n: usize, salt: usize) -> Vec<String> {
    let words: Vec<&str> = WORDS.split(' ').collect();
    (0..n)
        .map(|i| {
            let at = (i * 7 + salt) % words.len();
            let s: Vec<&str> = (0..9).map(|j| words[(at + j) % words.len()]).collect();
            format!("{} {}", s.join(" "), i + salt)
        })
        .collect()
}

/// One request's wall time and the tokens the server says it embedded.
async fn time_one(
    http: &reqwest::Client,
    url: &str,
    model: &str,
    input: &[String],
) -> Result<(f64, u64)> {
    let t = Instant::now();
    let r = http
        .post(format!("{}/v1/embeddings", url.trim_end_matches('/')))
        .json(&json!({"model": model, "input": input}))
        .send()
        .await
        .with_context(|| format!("POST {url}/v1/embeddings"))?;
    let status = r.status();
    let v: Value = r.json().await.context("an embeddings body")?;
    let secs = t.elapsed().as_secs_f64();
    ensure!(status.is_success(), "{url}: HTTP {status}: {v}");
    let n = v["data"].as_array().map_or(0, Vec::len);
    ensure!(
        n == input.len(),
        "{url}: {n} vectors for {} inputs",
        input.len()
    );
    Ok((secs, v["usage"]["prompt_tokens"].as_u64().unwrap_or(0)))
}

struct Side {
    secs: Vec<f64>,
    tokens: u64,
}

impl Side {
    fn rates(&self, inputs: usize) -> (f64, f64) {
        let s = median(self.secs.clone()).max(1e-9);
        (inputs as f64 / s, self.tokens as f64 / s)
    }
}

pub fn run(a: &Args, against: Option<&str>) -> Result<()> {
    let cfg = a.model.config()?;
    let path = cfg.model_path();
    let opts = EngineOptions {
        backend: shoal_engine::BackendChoice::Llama,
        ..cfg.engine_options()?
    };
    let threads = opts.llama.threads;
    let engine = Engine::start(&path, "bench-embed", opts)
        .with_context(|| format!("loading {}", path.display()))?;
    let info = engine
        .model
        .embedding()
        .cloned()
        .with_context(|| format!("{} is not an embedding model", path.display()))?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        // The server's pool owns the engine and frees it when the server ends.
        let state = shoal_api::AppState::new(engine);
        tokio::spawn(shoal_api::serve_until(
            listener,
            state,
            std::future::pending(),
        ));
        let http = reqwest::Client::new();
        println!(
            "embeddings: {} ({} dims, {} pooling) on llama.cpp, {threads} threads; {} runs per size, over HTTP{}",
            path.display(),
            info.dimensions,
            info.pooling.as_str(),
            a.runs,
            against.map_or(String::new(), |u| format!(", interleaved with {u}"))
        );
        println!(
            "{:>7} {:>8} {:>12} {:>12} {:>12} {:>12} {:>7}",
            "inputs", "tokens", "shoal emb/s", "shoal tok/s", "other emb/s", "other tok/s", "ratio"
        );
        let mut rows = Vec::new();
        for n in BATCHES {
            // Warm both sides once at this size.
            time_one(&http, &url, "bench-embed", &inputs(n, 1)).await?;
            if let Some(o) = against {
                time_one(&http, o, "bench-embed", &inputs(n, 1)).await?;
            }
            let mut ours = Side { secs: vec![], tokens: 0 };
            let mut theirs = Side { secs: vec![], tokens: 0 };
            for run in 0..a.runs {
                let batch = inputs(n, run + 2);
                // Alternate which side goes first.
                for first in [run % 2 == 0, run % 2 != 0] {
                    match (first, against) {
                        (true, _) => {
                            let (s, t) = time_one(&http, &url, "bench-embed", &batch).await?;
                            ours.secs.push(s);
                            ours.tokens = t;
                        }
                        (false, Some(o)) => {
                            let (s, t) = time_one(&http, o, "bench-embed", &batch).await?;
                            theirs.secs.push(s);
                            theirs.tokens = t;
                        }
                        (false, None) => {}
                    }
                }
            }
            let (emb, tok) = ours.rates(n);
            let other = against.map(|_| theirs.rates(n));
            let ratio = other.map(|(e, _)| emb / e.max(1e-9));
            println!(
                "{n:>7} {:>8} {emb:>12.1} {tok:>12.1} {:>12} {:>12} {:>7}",
                ours.tokens,
                other.map_or("-".into(), |(e, _)| format!("{e:.1}")),
                other.map_or("-".into(), |(_, t)| format!("{t:.1}")),
                ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            );
            rows.push(json!({"inputs": n, "tokens": ours.tokens, "shoal_emb_s": emb,
                             "shoal_tok_s": tok, "other_emb_s": other.map(|o| o.0),
                             "other_tok_s": other.map(|o| o.1), "ratio": ratio}));
        }
        if a.json {
            println!("{}", json!({"embeddings": rows}));
        }
        anyhow::Ok(())
    })?;
    drop(rt);
    Ok(())
}
