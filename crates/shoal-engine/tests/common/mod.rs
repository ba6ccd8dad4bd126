//! Helpers shared by the engine's end-to-end test files.
use std::path::PathBuf;

use shoal_engine::{ChatMessage, Engine};

/// The default model: `SHOAL_TEST_GGUF`, else where `make` fetches it.
#[allow(dead_code)] // not every test file needs it
pub fn gguf_path() -> PathBuf {
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

/// A one-message chat prompt through the model's own template.
#[allow(dead_code)] // not every test file needs it
pub fn chat_prompt(e: &Engine, user: &str) -> Vec<u32> {
    let msgs = [ChatMessage {
        role: "user".into(),
        content: user.into(),
    }];
    let text = e
        .model
        .vocab
        .render_chat(&msgs, true, &Default::default())
        .expect("render");
    e.model.vocab.encode(&text).expect("encode")
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

/// The repository root.
#[allow(dead_code)]
pub fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The test venv's Python (mlx-lm, the `gguf` package), made by `tools/setup-pyenv.sh`.
#[allow(dead_code)]
pub fn python() -> PathBuf {
    let out = std::process::Command::new("bash")
        .arg(repo().join("tools/setup-pyenv.sh"))
        .output()
        .expect("run tools/setup-pyenv.sh");
    assert!(out.status.success(), "setup-pyenv failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("bin/python")
}
