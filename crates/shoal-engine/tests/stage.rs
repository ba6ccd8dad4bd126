//! Pipeline stages of the default GGUF model read and hold only their layers.
mod common;

use std::collections::BTreeSet;

use mlx_rs::Array;
use shoal_engine::backend::LanguageModel;
use shoal_engine::backends::mlx::gguf_subset::write_stage;
use shoal_engine::backends::mlx::stage::{gguf_part, Span};
use shoal_engine::backends::mlx::{gguf, DevicePolicy, MlxCache, Transformer};
use shoal_engine::loader;

fn names(path: &std::path::Path) -> BTreeSet<String> {
    let f = gguf::open(path).expect("open GGUF");
    f.arrays().expect("tensors").into_keys().collect()
}

#[test]
fn a_stage_copy_holds_only_its_layers_and_all_metadata() {
    let src = common::gguf();
    let dir = tempfile::tempdir().expect("tempdir");
    let dst = dir.path().join("stage.gguf");
    let range = 3..7;
    let s = write_stage(&src, &dst, &range).expect("subset");
    // The default model: 30 blocks, output tied to the embedding table.
    let span = Span {
        layers: range.clone(),
        num_layers: 30,
        tied_output: true,
    };

    let all = names(&src);
    let kept = names(&dst);
    let expected: BTreeSet<String> = all
        .iter()
        .filter(|n| span.keeps(gguf_part(n)))
        .cloned()
        .collect();
    assert_eq!(kept, expected);
    assert!(kept.iter().any(|n| n.starts_with("blk.3.")));
    assert!(kept.iter().any(|n| n.starts_with("blk.6.")));
    assert!(!kept
        .iter()
        .any(|n| n.starts_with("blk.7.") || n.starts_with("blk.2.")));
    // A middle stage needs neither the embedding table nor the head.
    assert!(
        !kept.iter().any(|n| n.starts_with("token_embd.")),
        "{kept:?}"
    );
    assert!(!kept.iter().any(|n| n.starts_with("output")), "{kept:?}");
    assert_eq!(s.tensors_total, gguf_tensor_count(&src));
    assert!(s.tensors_kept < s.tensors_total);

    let (src_len, dst_len) = (
        std::fs::metadata(&src).expect("src").len(),
        std::fs::metadata(&dst).expect("dst").len(),
    );
    assert!(dst_len < src_len / 2, "copy {dst_len} of {src_len} bytes");
    assert!(s.bytes_kept <= dst_len);

    // Same metadata: the same configuration, vocabulary and template.
    let (a, b) = (
        gguf::open(&src).expect("src"),
        gguf::open(&dst).expect("dst"),
    );
    let (ca, cb) = (
        gguf::config(&a).expect("cfg"),
        gguf::config(&b).expect("cfg"),
    );
    assert_eq!(format!("{ca:?}"), format!("{cb:?}"));
    assert_eq!(
        gguf::meta_string(&a, "tokenizer.chat_template").expect("template"),
        gguf::meta_string(&b, "tokenizer.chat_template").expect("template")
    );
}

fn gguf_tensor_count(path: &std::path::Path) -> usize {
    names(path).len()
        - names(path)
            .iter()
            .filter(|n| n.ends_with(".scales") || n.ends_with(".biases"))
            .count()
}

#[test]
fn a_stage_from_its_copy_computes_what_the_whole_file_computes() {
    let src = common::gguf();
    let range = 0..5;
    let (stage, _) = loader::load_stage(&src, Some(range.clone())).expect("stage");

    let f = gguf::open(&src).expect("open");
    let cfg = gguf::config(&f).expect("config");
    let tensors = gguf::tensors(&f, &cfg).expect("tensors");
    let whole = Transformer::new_stage(
        cfg,
        tensors,
        gguf::GGUF_GROUP_SIZE,
        DevicePolicy::detect(),
        Some(range),
    )
    .expect("stage from the whole file");

    let tokens = [1u32, 504, 3458, 314, 260, 1345];
    let run = |m: &Transformer| -> Vec<f32> {
        let mut cache = MlxCache::default();
        let h = m
            .run_layers(m.embed_tokens(&tokens).expect("embed"), &mut cache)
            .expect("layers");
        let h: Array = h.as_dtype(mlx_rs::Dtype::Float32).expect("f32");
        h.eval().expect("eval");
        h.as_slice::<f32>().to_vec()
    };
    assert_eq!(run(&stage), run(&whole));
    assert_eq!(stage.info().weight_bytes, whole.info().weight_bytes);

    let (full, _) = loader::load_stage(&src, None).expect("whole model");
    assert!(stage.info().weight_bytes < full.info().weight_bytes);
}

#[test]
fn the_first_stage_embeds_the_last_projects_and_a_middle_one_does_neither() {
    let src = common::gguf();
    let (first, _) = loader::load_stage(&src, Some(0..10)).expect("first");
    let (middle, _) = loader::load_stage(&src, Some(10..20)).expect("middle");
    let (last, _) = loader::load_stage(&src, Some(20..30)).expect("last");
    let tokens = [1u32, 504, 3458];
    let hidden = first.embed_tokens(&tokens).expect("the first stage embeds");
    for (name, stage) in [("middle", &middle), ("last", &last)] {
        let err = stage.embed_tokens(&tokens).expect_err(name);
        assert!(err.to_string().contains("embedding"), "{name}: {err}");
    }
    for (name, stage) in [("first", &first), ("middle", &middle)] {
        let err = stage.logits_last(&hidden).expect_err(name);
        assert!(err.to_string().contains("head"), "{name}: {err}");
    }
    let logits = last.logits_last(&hidden).expect("the last stage projects");
    assert_eq!(logits.shape(), [1, 49152]);
    // The embedding table (tied output) is held by the first and last
    // stages only: a middle stage of as many layers is the smallest.
    let bytes = |m: &Transformer| m.info().weight_bytes;
    assert!(
        bytes(&middle) < bytes(&first),
        "{} {}",
        bytes(&middle),
        bytes(&first)
    );
    assert!(
        bytes(&middle) < bytes(&last),
        "{} {}",
        bytes(&middle),
        bytes(&last)
    );
}

#[test]
fn a_damaged_gguf_gives_an_error_not_a_stage() {
    let src = common::gguf();
    let bytes = std::fs::read(&src).expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    let dst = dir.path().join("out.gguf");
    for (what, data) in [
        ("empty", Vec::new()),
        ("not gguf", b"PK\x03\x04 not a model at all".to_vec()),
        ("cut in the header", bytes[..4096].to_vec()),
        ("cut in the tensors", bytes[..bytes.len() / 2].to_vec()),
    ] {
        let bad = dir.path().join("bad.gguf");
        std::fs::write(&bad, &data).expect("write");
        let err = write_stage(&bad, &dst, &(0..1)).expect_err(what);
        assert!(err.to_string().contains("GGUF"), "{what}: {err}");
        assert!(loader::load_stage(&bad, Some(0..1)).is_err(), "{what}");
    }
}
