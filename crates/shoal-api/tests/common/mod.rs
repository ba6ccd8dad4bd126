//! Helpers the HTTP test files share.
#![allow(dead_code)]
use std::path::PathBuf;

/// The real default model: `$SHOAL_TEST_GGUF`, else where `make models` puts it.
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

/// A model file `make models` puts under `.cache/models`: `$env`, else `rel` there.
fn made_model(env: &str, rel: &str) -> PathBuf {
    let p = std::env::var(env).map(PathBuf::from).unwrap_or_else(|_| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache/models")).join(rel)
    });
    assert!(p.is_file(), "{} missing — run `make models`", p.display());
    p
}

/// The default model with a `</think>` token of its own (an unused special
/// renamed by `tools/py/gguf_edit.py`): a model the server opens a
/// reasoning section for, to test the section's mechanics (budgets,
/// counts, streaming) on real weights.
pub fn think_gguf() -> PathBuf {
    made_model(
        "SHOAL_TEST_THINK_GGUF",
        "smollm2-think-v1/SmolLM2-135M-Instruct-think.Q4_1.gguf",
    )
}

/// The default model requantized to Q8_0 (`tools/py/gguf_f32.py --type
/// q8_0`): a target of the same vocabulary the default model drafts for.
#[allow(dead_code)]
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

/// Serves `state` on a free loopback port until the test ends; returns the base URL.
pub async fn serve(state: shoal_api::AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = shoal_api::serve_until(listener, state, std::future::pending()).await;
    });
    format!("http://{addr}")
}

/// The backend the behaviour tests run on: `SHOAL_TEST_BACKEND` (`mlx`, the
/// default, `llama` or `auto`). `make test` runs these suites on each.
#[allow(dead_code)]
pub fn test_backend() -> shoal_engine::BackendChoice {
    match std::env::var("SHOAL_TEST_BACKEND") {
        Ok(v) if !v.is_empty() => v
            .parse()
            .unwrap_or_else(|e| panic!("SHOAL_TEST_BACKEND: {e}")),
        _ => shoal_engine::BackendChoice::Mlx,
    }
}

/// Engine options on the backend under test.
#[allow(dead_code)]
pub fn options() -> shoal_engine::EngineOptions {
    shoal_engine::EngineOptions {
        backend: test_backend(),
        ..shoal_engine::EngineOptions::default()
    }
}
