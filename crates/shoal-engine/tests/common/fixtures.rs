//! The model files `make models` fetches or derives, for every test crate
//! (the API's and the CLI's include this file too): `$SHOAL_TEST_*` where
//! set, else their place in the setup cache.
#![allow(dead_code)] // each test file uses its own share of these
use std::path::PathBuf;

/// A model `make models` puts under the cache's `models/`: `$env`, else `rel` there.
pub fn made_model(env: &str, rel: &str) -> PathBuf {
    let p = std::env::var(env)
        .map(PathBuf::from)
        .unwrap_or_else(|_| shoal_engine::loader::cache_dir().join("models").join(rel));
    assert!(p.is_file(), "{} missing — run `make models`", p.display());
    p
}

/// The default model, SmolLM2-135M-Instruct Q4_1: `$SHOAL_TEST_GGUF`, else
/// the server's own default.
pub fn gguf() -> PathBuf {
    let p = std::env::var("SHOAL_TEST_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|_| shoal_engine::loader::default_model_path());
    assert!(
        p.is_file(),
        "default model missing at {} — run `make models`",
        p.display()
    );
    p
}

/// The default model with a `</think>` token of its own (an unused special
/// renamed by `tools/py/gguf_edit.py`): a model the server opens a
/// reasoning section for, and a vocabulary one token off the default's.
pub fn think_gguf() -> PathBuf {
    made_model(
        "SHOAL_TEST_THINK_GGUF",
        "smollm2-think-v1/SmolLM2-135M-Instruct-think.Q4_1.gguf",
    )
}

/// The default model requantized to Q8_0 (`tools/py/gguf_f32.py --type
/// q8_0`): a target of the same vocabulary that the default model drafts for.
pub fn q8_gguf() -> PathBuf {
    made_model(
        "SHOAL_TEST_Q8_GGUF",
        "smollm2-q8-v1/SmolLM2-135M-Instruct.Q8_0.gguf",
    )
}

/// all-MiniLM-L6-v2 converted to GGUF (`tools/fetch-embedding-model.sh`).
pub fn embed_gguf() -> PathBuf {
    made_model(
        "SHOAL_TEST_EMBED_GGUF",
        "all-minilm-l6-v2-0.1.2/all-MiniLM-L6-v2-F16.gguf",
    )
}

/// The default model beside a random-weight projector
/// (`tools/py/vision_fixture.py`): a vision model, 16 tokens an image.
pub fn vision_gguf() -> PathBuf {
    made_model(
        "SHOAL_TEST_VISION_GGUF",
        "smollm2-vision-v1/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
}

/// Qwen2.5-Coder's weights as a Qwen2-VL text model beside a random-weight
/// Qwen2-VL patch-merger projector: a vision model with M-RoPE positions.
pub fn mrope_gguf() -> PathBuf {
    made_model(
        "SHOAL_TEST_MROPE_GGUF",
        "qwen2vl-mrope-v2/qwen2vl-coder-0.5b-q4_k_m.gguf",
    )
}

/// The vision fixture's projector (`mmproj-*.gguf`), beside its model.
pub fn vision_projector() -> PathBuf {
    let model = vision_gguf();
    std::fs::read_dir(model.parent().expect("folder"))
        .expect("list")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("mmproj"))
        })
        .expect("the fixture's projector")
}
