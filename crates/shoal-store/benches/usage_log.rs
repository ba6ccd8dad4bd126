//! What the usage ledger costs: a request's row is one committed SQLite
//! write (WAL, `synchronous=FULL`) before its final event, so its latency is
//! added to every request; a query reads rows back. Prints figures; asserts
//! nothing.
use std::time::Instant;

use shoal_store::{ChoiceRow, UsageFilter, UsageLog, UsageRow};

fn row(i: usize) -> UsageRow {
    UsageRow {
        id: format!("chatcmpl-{i:024}"),
        created_ms: 1_796_169_600_000 + i as i64 * 1000,
        dialect: "openai.chat".into(),
        endpoint: "/v1/chat/completions".into(),
        model: if i.is_multiple_of(2) { "a" } else { "b" }.into(),
        backend: "llama.cpp".into(),
        stream: i.is_multiple_of(3),
        status: 200,
        finishes: vec!["length".into(), "stop".into()],
        client: Some(format!("key-{}", i % 4)),
        user_agent: Some("OpenAI/Python 2.0".into()),
        node: Some("node-1".into()),
        prompt_tokens: 42,
        cached_tokens: 10,
        completion_tokens: 12,
        per_prompt: 1,
        choices: vec![ChoiceRow {
            finish: "length".into(),
            prompt_tokens: 42,
            cached_tokens: 10,
            completion_tokens: 12,
            queue_ms: 0.1,
            ttft_ms: i as f64,
            prefill_tokens_per_s: 900.0,
            decode_tokens_per_s: 80.0,
            total_ms: 200.0,
            ..ChoiceRow::default()
        }],
        ..UsageRow::default()
    }
}

fn main() {
    let dir = std::env::temp_dir().join(format!("shoal-bench-ledger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = UsageLog::open(&dir.join("store.sqlite")).expect("open");
    const N: usize = 2000;
    let mut each = Vec::with_capacity(N);
    for i in 0..N {
        let t = Instant::now();
        log.insert(&row(i)).expect("insert");
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    each.sort_by(f64::total_cmp);
    let pct = |p: f64| each[((N as f64 - 1.0) * p) as usize];
    println!(
        "ledger insert (committed, on disk): median {:.0} µs, p90 {:.0} µs, p99 {:.0} µs over {N} rows",
        pct(0.5),
        pct(0.9),
        pct(0.99)
    );
    for (what, f) in [
        (
            "newest 100",
            UsageFilter {
                limit: Some(100),
                ..UsageFilter::default()
            },
        ),
        (
            "one client, all",
            UsageFilter {
                client: Some("key-1".into()),
                ..UsageFilter::default()
            },
        ),
        ("all rows", UsageFilter::default()),
    ] {
        let t = Instant::now();
        let rows = log.select(&f).expect("select");
        println!(
            "ledger select {what}: {} rows in {:.2} ms",
            rows.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let t = Instant::now();
    let used = log.client_tokens_since("key-1", 0).expect("sum");
    println!(
        "ledger quota sum (one client): {used} tokens in {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}
