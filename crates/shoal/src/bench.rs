//! `shoal bench`: prefill and decode speed, and time to first token.
//!
//! Each run feeds a fixed prompt of exactly `--prompt-tokens` tokens (a text
//! repeated and cut to length), generates exactly `--gen-tokens` with EOS
//! ignored, and takes the median over runs. Decode speed counts the tokens
//! after the first over the time after the first, as mlx-lm and exo do.
use anyhow::{Context, Result};
use serde_json::json;
use shoal_engine::{collect_blocking, Engine, EngineOptions, GenerateRequest, SamplingParams};

use crate::common::{median, Args};

const FILLER: &str =
    "The quick brown fox jumps over the lazy dog while the river runs past old mills, \
and scholars in the library count the pages of a thousand forgotten books. ";

/// A timed request: greedy, exactly `max_tokens` long (EOS ignored).
fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens: Some(max_tokens),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: vec![],
        ignore_eos: true,
        cancel: Default::default(),
        reasoning: None,
        grammar: None,
        tools: None,
        cache_salt: 0,
        cache_breakpoints: Vec::new(),
        images: Vec::new(),
    }
}

/// Peak resident memory of this process in MiB (Linux), for the memory figure.
fn blas() -> String {
    #[cfg(target_os = "linux")]
    {
        shoal_engine::cpu_blas::describe()
    }
    #[cfg(not(target_os = "linux"))]
    {
        "system".to_string()
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.embeddings {
        return crate::bench_embed::run(&a, a.against.as_deref());
    }
    if a.drafting {
        return crate::bench_draft::run(&a);
    }
    if a.kv_types {
        return crate::bench_draft::kv_types(&a);
    }
    anyhow::ensure!(
        a.prompt_tokens > 0 && a.gen_tokens > 1 && a.runs > 0,
        "sizes must be positive (gen-tokens >= 2)"
    );
    let cfg = a.model.config()?;
    let load_start = std::time::Instant::now();
    // One token a step, as llama-bench and mlx-lm decode: the repeated
    // filler would otherwise be drafted (`--drafting` measures that).
    let opts = EngineOptions {
        max_batch: EngineOptions::default().max_batch.max(a.concurrency),
        queue_capacity: EngineOptions::default().queue_capacity.max(a.concurrency),
        draft: shoal_engine::DraftOptions::off(),
        ..cfg.engine_options()?
    };
    let llama_threads = opts.llama.threads;
    let engine = shoal::OwnedEngine::new(
        Engine::start(&cfg.model_path(), &cfg.model_id(), opts)
            .with_context(|| format!("loading {}", cfg.model_path().display()))?,
    );
    let load_s = load_start.elapsed().as_secs_f64();
    // Before any request: what loading alone holds (weights, reserved KV).
    let rss_after_load = shoal_engine::process::resident_mb();
    let vocab = &engine.model.vocab;
    let mut filler = Vec::new();
    while filler.len() < a.prompt_tokens {
        filler.extend(vocab.encode(FILLER)?);
    }
    filler.truncate(a.prompt_tokens);
    // Each run gets its own first token so no run reuses another's prefix.
    let prompt_for = |run: usize| {
        let mut p = filler.clone();
        p[0] = 1000 + run as u32;
        p
    };
    let req = greedy;
    // One warm-up run so one-time allocation does not count.
    collect_blocking(engine.submit(req(prompt_for(a.runs + 1), 2))?)?;
    let (mut pre, mut dec, mut ttft) = (vec![], vec![], vec![]);
    for run in 0..a.runs {
        let (_, c) = collect_blocking(engine.submit(req(prompt_for(run), a.gen_tokens))?)?;
        anyhow::ensure!(
            c.usage.completion_tokens == a.gen_tokens,
            "run generated {} tokens",
            c.usage.completion_tokens
        );
        anyhow::ensure!(
            c.usage.cached_tokens == 0,
            "a timed run hit the prefix cache"
        );
        pre.push(c.timings.prefill_tokens_per_s);
        dec.push(c.timings.decode_tokens_per_s);
        ttft.push(c.timings.ttft_ms);
    }
    // Prefix cache: the same prompt minus its last 1% (at least one token) is
    // seen first; then the full prompt only computes the rest.
    let (mut cached_ttft, mut cached_tokens) = (vec![], 0);
    for run in 0..a.runs {
        let full = prompt_for(a.runs + 2 + run);
        let keep = a.prompt_tokens - (a.prompt_tokens / 100).max(1);
        collect_blocking(engine.submit(req(full[..keep.max(1)].to_vec(), 1))?)?;
        let (_, c) = collect_blocking(engine.submit(req(full, 1))?)?;
        cached_tokens = c.usage.cached_tokens;
        cached_ttft.push(c.timings.ttft_ms);
    }
    // Concurrency: C streams submitted together. Aggregate decode speed is
    // tokens decoded per second of the engine's decode passes (prefill
    // excluded, as in the single-stream figure); the overall figure is
    // every token over wall time, prefill included. Each concurrent run is
    // paired with a single-stream run just before it, so the speedup compares
    // the two under the same machine conditions (a shared host drifts).
    let (mut agg, mut per_stream, mut wall, mut paired) = (vec![], vec![], vec![], vec![]);
    let mut mean_batch = vec![];
    let passes = || {
        engine
            .stats
            .decode_passes
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let steps = || {
        engine
            .stats
            .decode_steps
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let micros = || {
        engine
            .stats
            .decode_micros
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    if a.concurrency > 1 {
        for run in 0..a.runs {
            let (_, alone) =
                collect_blocking(engine.submit(req(prompt_for(2000 + run), a.gen_tokens))?)?;
            let (s0, m0, p0) = (steps(), micros(), passes());
            let t0 = std::time::Instant::now();
            let streams = (0..a.concurrency)
                .map(|i| {
                    engine.submit(req(
                        prompt_for(1000 + run * a.concurrency + i),
                        a.gen_tokens,
                    ))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut tokens = 0;
            for rx in streams {
                let (_, c) = collect_blocking(rx)?;
                anyhow::ensure!(
                    c.usage.completion_tokens == a.gen_tokens,
                    "a concurrent stream generated {} tokens",
                    c.usage.completion_tokens
                );
                tokens += c.usage.completion_tokens;
            }
            wall.push(tokens as f64 / t0.elapsed().as_secs_f64());
            let rate = (steps() - s0) as f64 / ((micros() - m0) as f64 / 1e6).max(1e-9);
            agg.push(rate);
            per_stream.push(rate / a.concurrency as f64);
            mean_batch.push((steps() - s0) as f64 / (passes() - p0).max(1) as f64);
            if alone.timings.decode_tokens_per_s > 0.0 {
                paired.push(rate / alone.timings.decode_tokens_per_s);
            }
        }
    }
    let info = &engine.model.info;
    // The split's stages share this machine's cores, so it is compared with
    // one process given the same number of BLAS threads as each stage.
    let threads =
        (std::thread::available_parallelism().map_or(1, |n| n.get()) / a.split.max(1)).max(1);
    let (pipeline, single_same_threads) = if a.split > 1 {
        #[cfg(target_os = "linux")]
        shoal_engine::cpu_blas::set_threads(threads);
        let mut same = Vec::new();
        for run in 0..a.runs {
            let (_, c) =
                collect_blocking(engine.submit(req(prompt_for(3000 + run), a.gen_tokens))?)?;
            same.push(c.timings.decode_tokens_per_s);
        }
        (
            Some(pipeline_decode(&a, &filler, threads).context("pipeline benchmark")?),
            Some(median(same)),
        )
    } else {
        (None, None)
    };
    let out = json!({
        "engine": "shoal",
        "model": engine.model.id,
        "device": info.device,
        "dtype": info.dtype,
        "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
        "runs": a.runs,
        "load_s": load_s,
        "prefill_tok_s": median(pre),
        "decode_tok_s": median(dec),
        "ttft_ms": median(ttft),
        "ttft_prefix_cached_ms": median(cached_ttft),
        "prefix_cached_tokens": cached_tokens,
        "weight_mb": info.weight_bytes as f64 / (1 << 20) as f64,
        "backend": info.backend,
        "kv_mb": info.kv_capacity_bytes as f64 / (1 << 20) as f64,
        "memory_mb": info.resident_bytes() as f64 / (1 << 20) as f64,
        "threads": llama_threads,
        "blas": blas(),
        "peak_rss_mb": shoal_engine::process::peak_resident_mb(),
        "rss_after_load_mb": rss_after_load,
        "concurrency": a.concurrency,
        "concurrent_aggregate_decode_tok_s": (a.concurrency > 1).then(|| median(agg.clone())),
        "concurrent_per_stream_decode_tok_s": (a.concurrency > 1).then(|| median(per_stream.clone())),
        "concurrent_wall_tok_s": (a.concurrency > 1).then(|| median(wall.clone())),
        "concurrent_speedup": (a.concurrency > 1 && !paired.is_empty()).then(|| median(paired.clone())),
        "concurrent_mean_batch": (a.concurrency > 1).then(|| median(mean_batch.clone())),
        "split_processes": (a.split > 1).then_some(a.split),
        "split_decode_tok_s": pipeline,
        "split_blas_threads": (a.split > 1).then_some(threads),
        "single_decode_tok_s_same_threads": single_same_threads,
        "split_hop_ms_per_token": pipeline.zip(single_same_threads).filter(|(p, o)| *p > 0.0 && *o > 0.0)
            .map(|(p, o)| (1000.0 / p - 1000.0 / o) / (a.split - 1) as f64),
    });
    if a.json {
        println!("{out}");
    } else {
        println!(
            "shoal {} on {} ({} {}): prompt {} tok, gen {} tok, {} runs\n  prefill {:.1} tok/s | decode {:.1} tok/s | ttft {:.1} ms | ttft with {} of {} prompt tokens cached {:.1} ms | load {:.2} s",
            engine.model.id, info.backend, info.device, info.dtype, a.prompt_tokens, a.gen_tokens, a.runs,
            out["prefill_tok_s"].as_f64().unwrap_or(0.0), out["decode_tok_s"].as_f64().unwrap_or(0.0),
            out["ttft_ms"].as_f64().unwrap_or(0.0), cached_tokens, a.prompt_tokens,
            out["ttft_prefix_cached_ms"].as_f64().unwrap_or(0.0), load_s
        );
        if a.concurrency > 1 {
            let aggregate = median(agg);
            println!(
                "  {} concurrent streams: aggregate decode {:.1} tok/s ({:.2}x one stream run just before, median of {} pairs) | per stream {:.1} tok/s | mean batch {:.1} | overall incl. prefill {:.1} tok/s",
                a.concurrency,
                aggregate,
                median(paired.clone()),
                paired.len(),
                median(per_stream),
                median(mean_batch.clone()),
                median(wall)
            );
        }
        if let (Some(p), Some(o)) = (pipeline, single_same_threads) {
            println!(
                "  split over {} processes (MLX ring, loopback, {} BLAS thread(s) each): decode {:.1} tok/s vs {:.1} in one process with as many threads | {:.2} ms per token per hop",
                a.split,
                threads,
                p,
                o,
                out["split_hop_ms_per_token"].as_f64().unwrap_or(0.0)
            );
        }
        if let (Some(peak), Some(loaded)) =
            (shoal_engine::process::peak_resident_mb(), rss_after_load)
        {
            println!(
                "  RSS after load {loaded:.0} MiB, peak {peak:.0} MiB (weights {:.0} MiB, KV reserved {:.0} MiB)",
                info.weight_bytes as f64 / (1 << 20) as f64,
                info.kv_capacity_bytes as f64 / (1 << 20) as f64
            );
        }
    }
    Ok(())
}

/// Decode speed with the model split over `a.split` processes: this one is
/// rank 0 (the engine), `shoal shard` children run the other layers.
fn pipeline_decode(a: &Args, filler: &[u32], threads: usize) -> Result<f64> {
    use shoal_engine::backends::mlx::pipeline::{Group, PipelineModel};
    let path = a.model.config()?.model_path();
    let layers = shoal_models::ModelCard::read(&path)?
        .layers
        .context("the model does not say how many layers it has")? as usize;
    let ranges = shoal_api::cluster::shards::split(layers, &vec![1; a.split]);
    let ports: Vec<String> = (0..a.split)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            Ok(l.local_addr()?.to_string())
        })
        .collect::<std::io::Result<_>>()?;
    let hosts: Vec<Vec<String>> = ports.into_iter().map(|p| vec![p]).collect();
    let hostfile =
        std::env::temp_dir().join(format!("shoal-bench-ring-{}.json", std::process::id()));
    std::fs::write(&hostfile, serde_json::to_vec(&hosts)?)?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for (rank, (first, end)) in ranges.iter().enumerate().skip(1) {
        children.push(
            std::process::Command::new(&exe)
                .arg("shard")
                .arg("--model")
                .arg(&path)
                .args(["--model-id", "bench", "--layers", &format!("{first}:{end}")])
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .env("OPENBLAS_NUM_THREADS", threads.to_string())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()?,
        );
    }
    let first = ranges[0];
    let hostfile_for_engine = hostfile.clone();
    let result = (|| -> Result<f64> {
        // This process is rank 0 of the ring.
        std::env::set_var("MLX_RANK", "0");
        std::env::set_var("MLX_HOSTFILE", &hostfile_for_engine);
        let opts = EngineOptions {
            prefix_cache_bytes: 0,
            ..EngineOptions::default()
        };
        let engine =
            shoal::OwnedEngine::new(Engine::start_with(&path, "bench-split", opts, move |p| {
                let group = Group::init_ring()?;
                let (stage, vocab) = shoal_engine::loader::load_stage(p, Some(first.0..first.1))?;
                Ok(shoal_engine::loader::Loaded {
                    model: Box::new(PipelineModel::new(stage, group)?),
                    vocab,
                    path: p.to_path_buf(),
                })
            })?);
        let mut dec = Vec::new();
        for run in 0..=a.runs {
            let mut prompt = filler.to_vec();
            prompt[0] = 5000 + run as u32;
            let (_, c) = collect_blocking(engine.submit(greedy(prompt, a.gen_tokens))?)?;
            // The first run warms up.
            if run > 0 {
                dec.push(c.timings.decode_tokens_per_s);
            }
        }
        Ok(median(dec))
    })();
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_file(&hostfile);
    result
}
