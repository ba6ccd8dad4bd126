//! How many KV positions a llama.cpp model reserves and what window one
//! request gets: `auto` from the trained window and the memory budget, a
//! fixed number, and a split pool.
use super::*;
use shoal_gguf::testing::{gguf_bytes, MetaValue};

const GIB: u64 = 1 << 30;
/// Qwen2.5-0.5B's KV per position in f16: 24 layers x 2 KV heads x (64 + 64) x 2 bytes.
const QWEN_F16: u64 = 24 * 2 * 128 * 2;

/// A header with Qwen2.5-0.5B's attention shape and a trained window of `trained`.
fn qwen(trained: u32) -> shoal_gguf::Header {
    let bytes = gguf_bytes(
        &[
            ("general.architecture", MetaValue::Str("qwen2")),
            ("qwen2.context_length", MetaValue::U32(trained)),
            ("qwen2.block_count", MetaValue::U32(24)),
            ("qwen2.embedding_length", MetaValue::U32(896)),
            ("qwen2.attention.head_count", MetaValue::U32(14)),
            ("qwen2.attention.head_count_kv", MetaValue::U32(2)),
        ],
        &[("token_embd.weight", &[8, 8])],
    );
    let len = bytes.len() as u64;
    shoal_gguf::Header::from_prefix(&bytes, len, std::path::Path::new("qwen.gguf")).expect("header")
}

#[test]
fn auto_takes_the_trained_window_when_its_share_of_memory_holds_it() {
    // Qwen2.5-Coder's 32768 positions take 384 MiB, well within a quarter of 12 GiB.
    assert_eq!(auto_kv_tokens(32768, QWEN_F16, Some(12 * GIB)), 32768);
    // No budget known: the trained window.
    assert_eq!(auto_kv_tokens(32768, QWEN_F16, None), 32768);
    // Never more than the trained window, however much memory there is.
    assert_eq!(auto_kv_tokens(4096, QWEN_F16, Some(1 << 40)), 4096);
}

#[test]
fn auto_is_bounded_by_a_quarter_of_the_budget_and_floored() {
    // Llama-3.1-8B: 32 layers x 8 KV heads x (128 + 128) x 2 bytes = 128 KiB a
    // position, trained on 131072. A 6 GiB budget (an 8 GiB machine) gives KV
    // 1.5 GiB: 12288 positions.
    let llama8b = 32 * 8 * 256 * 2;
    assert_eq!(auto_kv_tokens(131072, llama8b, Some(6 * GIB)), 12288);
    // 16 GiB of RAM: 12 GiB budget, 3 GiB of KV.
    assert_eq!(auto_kv_tokens(131072, llama8b, Some(12 * GIB)), 24576);
    // Whole 256-position blocks, rounded down: a quarter of 4 GiB holds
    // 10737 positions of 100000 bytes, so 10496.
    assert_eq!(auto_kv_tokens(131072, 100_000, Some(4 * GIB)), 10496);
    // Too little memory for the floor: the floor all the same (the pool's
    // memory check then says whether it fits)...
    assert_eq!(auto_kv_tokens(131072, llama8b, Some(GIB)), AUTO_KV_FLOOR);
    // ...or the trained window when that is smaller.
    assert_eq!(auto_kv_tokens(2048, llama8b, Some(GIB / 64)), 2048);
}

#[test]
fn the_pool_and_the_window_follow_the_header_and_the_budget() {
    let h = qwen(32768);
    let auto = LlamaOptions::new(4, 0).memory_budget(Some(12 * GIB));
    assert_eq!(auto.kv_tokens, AUTO_KV_TOKENS);
    assert_eq!(auto.kv_tokens_for(&h), 32768);
    assert_eq!(auto.window_for(&h), 32768);
    assert_eq!(auto.for_model(&h).kv_tokens, 32768);
    // A q8_0 cache takes 34/64 of f16's bytes a position: more fit in the
    // same share (and the trained window still bounds them).
    let small = LlamaOptions::new(4, 0).memory_budget(Some(GIB / 2));
    assert_eq!(small.kv_tokens_for(&h), 10752); // 128 MiB / 12288 bytes = 10922
    assert_eq!(small.window_for(&h), 10752);
    let small_q8 = small.clone().kv_type(KvType::Q8_0);
    assert_eq!(small_q8.kv_tokens_for(&h), 20480); // 128 MiB / 6528 bytes = 20560
                                                   // Tiny budget: the floor.
    let tiny = LlamaOptions::new(4, 0).memory_budget(Some(64 << 20));
    assert_eq!(tiny.kv_tokens_for(&h), AUTO_KV_FLOOR);
    // A model trained on fewer positions than the floor keeps its own window.
    assert_eq!(tiny.kv_tokens_for(&qwen(2048)), 2048);
    assert_eq!(tiny.window_for(&qwen(2048)), 2048);
}

#[test]
fn a_number_is_kept_as_llama_cpp_rounds_it() {
    let h = qwen(32768);
    let fixed = LlamaOptions::new(4, 1000).memory_budget(Some(1 << 40));
    assert_eq!(fixed.kv_tokens_for(&h), 1024);
    assert_eq!(fixed.window_for(&h), 1024);
    // More than the model was trained on: reserved, but a request still
    // gets the trained window only.
    let big = LlamaOptions::new(4, 65536);
    assert_eq!(big.kv_tokens_for(&h), 65536);
    assert_eq!(big.window_for(&h), 32768);
    // Below the least a pool holds: raised to it.
    assert_eq!(LlamaOptions::new(4, 10).kv_tokens_for(&h), MIN_KV_TOKENS);
}

#[test]
fn a_split_pool_gives_each_sequence_its_slice() {
    let h = qwen(32768);
    // auto sizes the pool as for a shared one; each of 16 sequences gets a 16th.
    let split = LlamaOptions::new(4, 0)
        .memory_budget(Some(12 * GIB))
        .split(true)
        .for_batch(16);
    assert_eq!(split.kv_tokens_for(&h), 32768);
    assert_eq!(split.window_for(&h), 2048);
    // llama.cpp rounds each slice up to 256 positions: 300 asked of 17
    // sequences (batch-invariant mode's companion included) is 17 x 256.
    let invariant = LlamaOptions::new(4, 300)
        .batch_invariant(true)
        .for_batch(16);
    assert_eq!(invariant.context_sequences(), 17);
    assert_eq!(invariant.kv_tokens_for(&h), 17 * 256);
    assert_eq!(invariant.window_for(&h), 256);
}

#[test]
fn the_setting_reads_auto_or_a_number() {
    for (text, want) in [
        ("auto", KvTokens::Auto),
        ("AUTO", KvTokens::Auto),
        ("0", KvTokens::Auto),
        (" 32768 ", KvTokens::Fixed(32768)),
    ] {
        assert_eq!(text.parse::<KvTokens>(), Ok(want), "{text}");
    }
    assert!("lots".parse::<KvTokens>().is_err());
    assert!("-1".parse::<KvTokens>().is_err());
    let read = |j: &str| serde_json::from_str::<KvTokens>(j).map_err(|e| e.to_string());
    assert_eq!(read("\"auto\""), Ok(KvTokens::Auto));
    assert_eq!(read("0"), Ok(KvTokens::Auto));
    assert_eq!(read("4096"), Ok(KvTokens::Fixed(4096)));
    assert_eq!(read("\"4096\""), Ok(KvTokens::Fixed(4096)));
    assert!(read("\"many\"").is_err());
    assert_eq!(serde_json::to_string(&KvTokens::Auto).unwrap(), "\"auto\"");
    assert_eq!(
        serde_json::to_string(&KvTokens::Fixed(8192)).unwrap(),
        "8192"
    );
    assert_eq!(KvTokens::Auto.positions(), AUTO_KV_TOKENS);
    assert_eq!(KvTokens::Fixed(512).positions(), 512);
    assert_eq!(KvTokens::Fixed(512).to_string(), "512");
}
