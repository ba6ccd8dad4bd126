//! llama.cpp alone, timed as llama-bench times it: `pp` prompt tokens
//! decoded in one batch, then `tg` tokens one at a time after them (llama-bench's
//! tg at depth `pp`; a tiny `pp` is its plain tg128), with no sampling. It links the very llama.cpp build Shoal uses (same
//! source, same options), so `make bench` can set Shoal's llama.cpp backend
//! beside llama.cpp's own speed. The crate's vendored source does not carry
//! llama-bench itself.
//!
//! `cargo run --release -p shoal-engine --example llama_reference -- MODEL PP TG THREADS [PAR]`
//! prints one JSON object: `{"pp_tok_s": …, "tg_tok_s": …}`. With `PAR` > 1 it
//! runs `PAR` sequences in one unified KV cache instead (llama-batched-bench's
//! method, the ceiling of any server's `--parallel PAR`): each prompt of `PP`
//! tokens, then `TG` steps that each decode one token of every sequence, and
//! `tg_tok_s` is the aggregate.
//!
//! `llama_reference MODEL --resident KV SEQS` loads the model with the
//! context Shoal's backend makes (`LlamaOptions::context_params`: KV
//! positions in one pool, `SEQS` sequences) and prints
//! `{"rss_after_load_mb": …, "heap_growth_on_load_mb": …, "vocab_table_mb": …}`:
//! what llama.cpp alone holds once loaded, what loading the model (before
//! its context) allocated beside the mapped weights, and Shoal's estimate of
//! that allocation (`vocab_table_bytes`, from the header).
use std::num::NonZeroU32;
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, m, flag, kv, seqs] = args.as_slice() {
        if flag == "--resident" {
            return resident(m, kv.parse()?, seqs.parse()?);
        }
    }
    let (model, pp, tg, threads, par) = match args.as_slice() {
        [_, m, pp, tg, th] => (m, pp, tg, th, "1"),
        [_, m, pp, tg, th, par] => (m, pp, tg, th, par.as_str()),
        _ => return Err("usage: llama_reference MODEL PP TG THREADS [PAR]".into()),
    };
    let (pp, tg, threads, par): (usize, usize, i32, usize) =
        (pp.parse()?, tg.parse()?, threads.parse()?, par.parse()?);
    let backend = shoal_engine::backends::llama::runtime()?;
    let model = LlamaModel::load_from_file(backend, model, &LlamaModelParams::default())?;
    let n_vocab = model.n_vocab().max(1);
    let ctx_params = || {
        LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new((pp + tg + 16) as u32))
            .with_n_batch(pp.max(1) as u32)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
    };
    // Token ids spread over the vocabulary, as llama-bench uses random ones.
    let token = |i: usize| LlamaToken(((i * 7919 + 13) % n_vocab as usize) as i32);

    if par > 1 {
        return parallel(&model, backend, pp, tg, threads, par, &token);
    }

    // A fresh context: `pp` prompt tokens in one batch, then `tg` tokens one
    // at a time after them (the depth a reply to that prompt decodes at).
    let mut ctx = model.new_context(backend, ctx_params())?;
    let mut batch = LlamaBatch::new(pp, 1);
    for i in 0..pp {
        batch.add(token(i), i as i32, &[0], i + 1 == pp)?;
    }
    let t = Instant::now();
    ctx.decode(&mut batch)?;
    let pp_s = t.elapsed().as_secs_f64();
    let mut one = LlamaBatch::new(1, 1);
    let t = Instant::now();
    for i in pp..pp + tg {
        one.clear();
        one.add(token(i), i as i32, &[0], true)?;
        ctx.decode(&mut one)?;
    }
    let tg_s = t.elapsed().as_secs_f64();
    println!(
        "{{\"pp_tok_s\": {:.3}, \"tg_tok_s\": {:.3}}}",
        pp as f64 / pp_s.max(1e-9),
        tg as f64 / tg_s.max(1e-9)
    );
    Ok(())
}

/// `par` sequences side by side: their prompts in one batch, then `tg` steps
/// of one token per sequence, every token's logits asked for (a server samples
/// each).
fn parallel(
    model: &LlamaModel,
    backend: &llama_cpp_2::llama_backend::LlamaBackend,
    pp: usize,
    tg: usize,
    threads: i32,
    par: usize,
    token: &dyn Fn(usize) -> LlamaToken,
) -> Result<(), Box<dyn std::error::Error>> {
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new((par * (pp + tg) + 256) as u32))
        .with_n_batch((par * pp).max(par) as u32)
        .with_n_seq_max(par as u32)
        .with_kv_unified(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = model.new_context(backend, params)?;
    let mut batch = LlamaBatch::new((par * pp).max(par), par as i32);
    for s in 0..par {
        for i in 0..pp {
            batch.add(token(s * 1000 + i), i as i32, &[s as i32], i + 1 == pp)?;
        }
    }
    let t = Instant::now();
    ctx.decode(&mut batch)?;
    let pp_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in pp..pp + tg {
        batch.clear();
        for s in 0..par {
            batch.add(token(s * 1000 + i), i as i32, &[s as i32], true)?;
        }
        ctx.decode(&mut batch)?;
    }
    let tg_s = t.elapsed().as_secs_f64();
    println!(
        "{{\"pp_tok_s\": {:.3}, \"tg_tok_s\": {:.3}}}",
        (par * pp) as f64 / pp_s.max(1e-9),
        (par * tg) as f64 / tg_s.max(1e-9)
    );
    Ok(())
}

/// Loads `model` with the context Shoal's llama.cpp backend makes for `kv`
/// positions and `seqs` sequences, and prints the process's resident memory.
fn resident(model: &str, kv: usize, seqs: usize) -> Result<(), Box<dyn std::error::Error>> {
    let vocab_mb = shoal_engine::backends::llama::vocab_table_bytes(&shoal_gguf::Header::read(
        std::path::Path::new(model),
    )?) as f64
        / (1u64 << 20) as f64;
    let backend = shoal_engine::backends::llama::runtime()?;
    let anon =
        || shoal_engine::process::anonymous_resident_mb().ok_or("no resident memory figure here");
    let before = anon()?;
    let model = LlamaModel::load_from_file(backend, model, &LlamaModelParams::default())?;
    let growth = anon()? - before;
    let params = shoal_engine::LlamaOptions::new(0, kv)
        .for_batch(seqs)
        .context_params();
    let _ctx = model.new_context(backend, params)?;
    let mb = shoal_engine::process::resident_mb().ok_or("no resident memory figure here")?;
    println!(
        "{{\"rss_after_load_mb\": {mb:.1}, \"heap_growth_on_load_mb\": {growth:.1}, \"vocab_table_mb\": {vocab_mb:.1}}}"
    );
    Ok(())
}
