//! The prefix cache's disk tier on the real default model, on the backend
//! under test (`make test` runs this file on MLX and on llama.cpp): a prefix
//! outlives its engine, kept in blocks that prompts sharing a prefix share, a
//! damaged entry costs a cold prefill and nothing else, a tiny budget keeps
//! serving, and two engines share one folder.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{chat, gguf};
use shoal_engine::disk_cache::{
    DiskCache, DiskCacheOptions, DEFAULT_MIN_TOKENS, DEFAULT_SAVE_AFTER_PREFILL,
};
use shoal_engine::{collect_blocking, Completion, Engine, EngineOptions, Event, GenerateRequest};

/// A system prompt of a few hundred tokens (an agent's instructions stand-in)
/// and a question with one clear answer.
fn long_prompt(e: &Engine, question: &str) -> Vec<u32> {
    let rules: String = (1..=24)
        .map(|i| format!("Rule {i}: answer briefly, in plain words, and only what is asked. "))
        .collect();
    let p = chat(e, &[("system", &rules), ("user", question)]);
    assert!(
        p.len() > DEFAULT_MIN_TOKENS + 32,
        "prompt of {} tokens",
        p.len()
    );
    p
}

fn disk(dir: &Path, budget_bytes: u64) -> Arc<DiskCache> {
    disk_saving_after(dir, budget_bytes, DEFAULT_SAVE_AFTER_PREFILL)
}

/// A tier that writes a prompt after a prefill of `save_after_prefill` tokens.
fn disk_saving_after(dir: &Path, budget_bytes: u64, save_after_prefill: usize) -> Arc<DiskCache> {
    DiskCache::open(DiskCacheOptions {
        dir: dir.to_path_buf(),
        budget_bytes,
        min_tokens: DEFAULT_MIN_TOKENS,
        save_after_prefill,
    })
    .expect("open the disk tier")
}

fn engine(cache: &Arc<DiskCache>) -> Engine {
    let opts = EngineOptions {
        disk_cache: Some(cache.clone()),
        ..common::options()
    };
    Engine::start(&gguf(), "smollm2", opts).expect("load default model")
}

fn greedy(e: &Engine, prompt: Vec<u32>) -> (String, Completion) {
    let mut req = GenerateRequest::new(prompt);
    req.max_tokens = Some(24);
    req.sampling.temperature = 0.0;
    collect_blocking(e.submit(req).expect("submit")).expect("complete")
}

/// Stops `e` and waits for the disk tier to write what it was handed.
fn stop(e: Engine, cache: &DiskCache) {
    assert!(e.stop_and_wait(Duration::from_secs(120)), "engine stopped");
    assert!(cache.wait_idle(Duration::from_secs(120)), "writes landed");
}

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

/// The reply and usage of `QUESTION` after the system prompt, cold, with a
/// fresh engine on an empty folder that then holds its prefix.
fn cold_run(cache: &Arc<DiskCache>) -> (Vec<u32>, String, Completion) {
    let e = engine(cache);
    let prompt = long_prompt(&e, QUESTION);
    let (text, c) = greedy(&e, prompt.clone());
    assert_eq!(c.usage.cached_tokens, 0, "an empty cache");
    stop(e, cache);
    let s = cache.summary();
    assert_eq!(s.entries, 1, "the prefix was written");
    // The backend's payload was read and cut into blocks, not kept whole.
    let held = cache.entries()[0].tokens;
    assert!(held >= prompt.len());
    assert_eq!(s.blocks, held.div_ceil(256));
    (prompt, text, c)
}

#[test]
fn a_restarted_engine_restores_the_prefix_from_disk_and_replies_the_same() {
    let dir = tempfile::tempdir().expect("tmp");
    let (prompt, text, cold) = {
        let cache = disk(dir.path(), 1 << 30);
        cold_run(&cache)
    };
    // A new process's tier on the same folder: nothing in RAM.
    let cache = disk(dir.path(), 1 << 30);
    let e = engine(&cache);
    let (again, c) = greedy(&e, prompt.clone());
    assert_eq!(again, text, "greedy reply equal to the cold one");
    assert_eq!(c.finish, cold.finish);
    assert_eq!(c.usage.completion_tokens, cold.usage.completion_tokens);
    assert_eq!(c.usage.prompt_tokens, prompt.len());
    // Everything but the last prompt token came from disk.
    assert_eq!(c.usage.cached_tokens, prompt.len() - 1);
    assert_eq!(c.usage.cached_disk_tokens, c.usage.cached_tokens);
    let s = cache.summary();
    assert_eq!((s.hits, s.bad_entries), (1, 0));
    assert!(s.bytes_read > 0);
    // The next turn extends the prefix: served from RAM now, not disk.
    let (_, c2) = greedy(&e, prompt.clone());
    assert_eq!(c2.usage.cached_tokens, prompt.len() - 1);
    assert_eq!(c2.usage.cached_disk_tokens, 0);
    stop(e, &cache);
}

/// Rewrites every block file of the one entry under `dir` with `damage`.
fn damage_payload(dir: &Path, damage: impl Fn(&mut Vec<u8>)) {
    let mut found = 0;
    for model in std::fs::read_dir(dir).expect("ls").flatten() {
        for f in std::fs::read_dir(model.path()).expect("ls").flatten() {
            let p = f.path();
            if p.extension().and_then(|x| x.to_str()) == Some("blk") {
                let mut bytes = std::fs::read(&p).expect("read");
                damage(&mut bytes);
                std::fs::write(&p, bytes).expect("write");
                found += 1;
            }
        }
    }
    assert!(found >= 2, "the entry's blocks");
}

#[test]
fn a_corrupted_truncated_or_foreign_entry_is_removed_and_prefilled_cold() {
    type Damage = fn(&mut Vec<u8>);
    let cases: [(&str, Damage); 2] = [
        ("flipped", |b| {
            let mid = b.len() / 2;
            b[mid] ^= 0x55;
        }),
        ("truncated", |b| b.truncate(b.len() / 3)),
    ];
    for (what, damage) in cases {
        let dir = tempfile::tempdir().expect("tmp");
        let (prompt, text, _) = cold_run(&disk(dir.path(), 1 << 30));
        damage_payload(dir.path(), damage);
        // A meta file of no format at all, beside it.
        let model_dir = std::fs::read_dir(dir.path())
            .expect("ls")
            .flatten()
            .next()
            .expect("model folder")
            .path();
        std::fs::write(model_dir.join("garbage.meta"), b"not an entry").expect("write");
        let cache = disk(dir.path(), 1 << 30);
        let e = engine(&cache);
        let (again, c) = greedy(&e, prompt.clone());
        assert_eq!(again, text, "{what}: the cold answer");
        assert_eq!(c.usage.cached_tokens, 0, "{what}: prefilled cold");
        let s = cache.summary();
        assert_eq!(s.bad_entries, 2, "{what}: the entry and the garbage");
        assert!(!model_dir.join("garbage.meta").exists());
        stop(e, &cache);
        // The cold run wrote a good entry again, which the next start uses.
        let cache = disk(dir.path(), 1 << 30);
        let e = engine(&cache);
        let (_, c) = greedy(&e, prompt.clone());
        assert_eq!(c.usage.cached_disk_tokens, prompt.len() - 1, "{what}");
        stop(e, &cache);
    }
}

#[test]
fn a_budget_too_small_for_any_entry_writes_nothing_and_serves_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let cache = disk(dir.path(), 64 << 10);
    let e = engine(&cache);
    let prompt = long_prompt(&e, QUESTION);
    let (first, _) = greedy(&e, prompt.clone());
    let (second, c) = greedy(&e, prompt.clone());
    assert_eq!(first, second);
    // RAM still serves the prefix.
    assert_eq!(c.usage.cached_tokens, prompt.len() - 1);
    stop(e, &cache);
    let s = cache.summary();
    assert_eq!((s.entries, s.bytes), (0, 0));
    assert_eq!(s.write_errors, 0);
}

#[test]
fn two_engines_on_one_folder_write_and_read_each_others_entries() {
    let dir = tempfile::tempdir().expect("tmp");
    // Two tiers on one folder, as two servers sharing a data directory.
    let (a, b) = (disk(dir.path(), 1 << 30), disk(dir.path(), 1 << 30));
    let (ea, eb) = (engine(&a), engine(&b));
    let pa = long_prompt(&ea, QUESTION);
    // A second question with a clear answer: Italy's is a near tie on some
    // CPUs, where a restored prefix and a cold one can part.
    let pb = long_prompt(&eb, "Count from 1 to 20, separated by commas.");
    let (ta, tb) = std::thread::scope(|s| {
        let ha = s.spawn(|| greedy(&ea, pa.clone()).0);
        let hb = s.spawn(|| greedy(&eb, pb.clone()).0);
        (ha.join().expect("a"), hb.join().expect("b"))
    });
    stop(ea, &a);
    stop(eb, &b);
    // Each prompt extends the shared system prompt: both entries are kept,
    // neither a prefix of the other, and the system prompt's first block is
    // on disk once.
    assert_eq!(a.summary().entries, 2);
    let entries = a.entries();
    assert!(
        entries.iter().all(|e| e.blocks == e.tokens.div_ceil(256)),
        "{entries:?}"
    );
    let listed: usize = entries.iter().map(|e| e.blocks).sum();
    assert!(a.summary().blocks < listed, "a shared block is kept once");
    // Each restored by an engine of its own (in one engine the second would
    // find most of its prefix, the shared system prompt, in RAM already).
    let c = disk(dir.path(), 1 << 30);
    for (p, t) in [(pa, ta), (pb, tb)] {
        let e = engine(&c);
        let (again, done) = greedy(&e, p.clone());
        assert_eq!(again, t);
        assert_eq!(done.usage.cached_disk_tokens, p.len() - 1);
        assert_eq!(done.usage.cached_tokens, p.len() - 1);
        stop(e, &c);
    }
    assert_eq!(c.summary().bad_entries, 0);
}

#[test]
fn a_long_prefill_is_on_disk_while_its_reply_still_runs() {
    let dir = tempfile::tempdir().expect("tmp");
    // Every prompt of a block or more counts as a long prefill here.
    let cache = disk_saving_after(dir.path(), 1 << 30, DEFAULT_MIN_TOKENS);
    let e = engine(&cache);
    let prompt = long_prompt(&e, QUESTION);
    // A reply that would run for thousands of tokens.
    let mut req = GenerateRequest::new(prompt.clone());
    req.max_tokens = Some(4096);
    req.ignore_eos = true;
    req.sampling.temperature = 0.0;
    let cancel = req.cancel.clone();
    let mut rx = e.submit(req).expect("submit");
    // The prompt is handed to the tier between the first token and the
    // second: once two have streamed, it is on its way.
    let mut deltas = 0;
    while deltas < 2 {
        match rx.blocking_recv().expect("the reply streams") {
            Event::Delta { .. } => deltas += 1,
            Event::Done(c) => panic!("the reply ended early: {c:?}"),
            _ => {}
        }
    }
    assert!(cache.wait_idle(Duration::from_secs(120)), "writes landed");
    let entries = cache.entries();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0].tokens,
        prompt.len(),
        "the whole prompt, no reply"
    );
    // Another process on the folder (this one might have crashed by now)
    // finds the prompt there.
    let other = disk(dir.path(), 1 << 30);
    let e2 = engine(&other);
    let (_, c) = greedy(&e2, prompt.clone());
    assert_eq!(c.usage.cached_disk_tokens, prompt.len() - 1);
    stop(e2, &other);
    // The reply, cut short, still ends truthfully; the longer prefixes the
    // replies left replace the prompt's entry.
    cancel.cancel();
    let (_, done) = collect_blocking(rx).expect("complete");
    assert_eq!(done.finish, shoal_engine::FinishReason::Cancelled);
    stop(e, &cache);
    let entries = cache.entries();
    assert!(!entries.is_empty());
    assert!(
        entries.iter().all(|x| x.tokens > prompt.len()),
        "{entries:?}"
    );
}

/// The reply's text and every token's logprobs (with the top 5), greedy.
fn logprobs(e: &Engine, prompt: Vec<u32>) -> (String, Vec<shoal_engine::TokenLogprob>, Completion) {
    let mut req = GenerateRequest::new(prompt);
    req.max_tokens = Some(24);
    req.sampling.temperature = 0.0;
    req.sampling.top_logprobs = Some(5);
    let mut rx = e.submit(req).expect("submit");
    let (mut text, mut lps) = (String::new(), Vec::new());
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Delta { text: t, logprobs } => {
                text.push_str(&t);
                lps.extend(logprobs);
            }
            Event::Done(c) => return (text, lps, c),
            _ => {}
        }
    }
    panic!("the stream ended without Done");
}

/// A restored prefix gives the cold run's logprobs: to the bit on llama.cpp
/// in batch-invariant mode (which reuses whole 64-token micro-batches of
/// the prompt only), within float rounding on MLX (whose last prompt token
/// then runs alone instead of in a chunk).
#[test]
fn a_restored_prefix_gives_the_cold_logprobs_to_the_bit_in_batch_invariant_mode() {
    let llama = common::test_backend() == shoal_engine::BackendChoice::Llama;
    let dir = tempfile::tempdir().expect("tmp");
    let start = |cache: &Arc<DiskCache>| {
        let mut opts = EngineOptions {
            disk_cache: Some(cache.clone()),
            // One request: the whole KV pool is its slice.
            max_batch: 1,
            ..common::options()
        };
        opts.llama = opts.llama.batch_invariant(true);
        Engine::start(&gguf(), "smollm2", opts).expect("load default model")
    };
    let cache = disk(dir.path(), 1 << 30);
    let e = start(&cache);
    // A long prompt: many micro-batches, the last one partial.
    let rules: String = (1..=90)
        .map(|i| format!("Rule {i}: answer briefly, in plain words, and only what is asked. "))
        .collect();
    let prompt = chat(&e, &[("system", &rules), ("user", QUESTION)]);
    assert!(prompt.len() > 1100, "prompt of {} tokens", prompt.len());
    let (text, cold, c) = logprobs(&e, prompt.clone());
    assert_eq!(c.usage.cached_tokens, 0);
    stop(e, &cache);
    let cache = disk(dir.path(), 1 << 30);
    let e = start(&cache);
    let (again, restored, c) = logprobs(&e, prompt.clone());
    let reused = if llama {
        (prompt.len() - 1) / 64 * 64
    } else {
        prompt.len() - 1
    };
    assert_eq!(c.usage.cached_disk_tokens, reused);
    assert_eq!(c.usage.cached_tokens, reused);
    assert_eq!(again, text);
    assert_eq!(restored.len(), cold.len());
    let alike = |a: f32, b: f32| {
        if llama {
            a.to_bits() == b.to_bits()
        } else {
            (a - b).abs() <= 1e-4
        }
    };
    for (i, (r, k)) in restored.iter().zip(&cold).enumerate() {
        assert_eq!(r.token, k.token, "token {i}");
        assert!(alike(r.logprob, k.logprob), "token {i}: {r:?} vs {k:?}");
        assert_eq!(r.top.len(), k.top.len());
        for ((ri, _, rl), (ki, _, kl)) in r.top.iter().zip(&k.top) {
            assert_eq!(ri, ki, "token {i}'s alternatives: {r:?} vs {k:?}");
            assert!(alike(*rl, *kl), "token {i}'s alternatives: {r:?} vs {k:?}");
        }
    }
    stop(e, &cache);
}
