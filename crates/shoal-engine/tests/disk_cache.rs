//! The prefix cache's disk tier on the real default model, on the backend
//! under test (`make test` runs this file on MLX and on llama.cpp): a prefix
//! outlives its engine, a damaged entry costs a cold prefill and nothing
//! else, a tiny budget keeps serving, and two engines share one folder.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{chat, gguf};
use shoal_engine::disk_cache::{DiskCache, DiskCacheOptions, DEFAULT_MIN_TOKENS};
use shoal_engine::{collect_blocking, Completion, Engine, EngineOptions, GenerateRequest};

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
    DiskCache::open(DiskCacheOptions {
        dir: dir.to_path_buf(),
        budget_bytes,
        min_tokens: DEFAULT_MIN_TOKENS,
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
    assert_eq!(cache.summary().entries, 1, "the prefix was written");
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

/// Rewrites the one payload file under `dir` with `damage`.
fn damage_payload(dir: &Path, damage: impl Fn(&mut Vec<u8>)) {
    let mut found = 0;
    for model in std::fs::read_dir(dir).expect("ls").flatten() {
        for f in std::fs::read_dir(model.path()).expect("ls").flatten() {
            let p = f.path();
            if p.extension().and_then(|x| x.to_str()) == Some("kv") {
                let mut bytes = std::fs::read(&p).expect("read");
                damage(&mut bytes);
                std::fs::write(&p, bytes).expect("write");
                found += 1;
            }
        }
    }
    assert_eq!(found, 1, "one payload");
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
        assert_eq!(s.bad_entries, 2, "{what}: the payload and the garbage");
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
    let pb = long_prompt(&eb, "What is the capital of Italy? Answer in one sentence.");
    let (ta, tb) = std::thread::scope(|s| {
        let ha = s.spawn(|| greedy(&ea, pa.clone()).0);
        let hb = s.spawn(|| greedy(&eb, pb.clone()).0);
        (ha.join().expect("a"), hb.join().expect("b"))
    });
    stop(ea, &a);
    stop(eb, &b);
    // Each prompt extends the shared system prompt: both entries are kept,
    // neither a prefix of the other.
    assert_eq!(a.summary().entries, 2);
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
