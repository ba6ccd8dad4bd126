//! Helpers shared by the engine's end-to-end test files.
use std::path::PathBuf;

use shoal_engine::{ChatMessage, Engine};

pub mod fixtures;
#[allow(unused_imports)] // not every test file uses a fixture
pub use fixtures::*;

/// A one-message chat prompt through the model's own template.
#[allow(dead_code)] // not every test file needs it
pub fn chat_prompt(e: &Engine, user: &str) -> Vec<u32> {
    chat(e, &[("user", user)])
}

/// A conversation of `(role, content)` turns through the model's own
/// template, ending with the assistant's turn opened.
#[allow(dead_code)] // not every test file needs it
pub fn chat(e: &Engine, turns: &[(&str, &str)]) -> Vec<u32> {
    let msgs: Vec<ChatMessage> = turns
        .iter()
        .map(|(role, content)| ChatMessage {
            role: (*role).into(),
            content: (*content).into(),
        })
        .collect();
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

/// mlx-lm's reference run (`tools/py/reference.py`) on the model at `dir`.
/// MLX's CPU backend compiles fused kernels into a cache under the temp
/// directory and loads them from there; two processes compiling the same
/// kernel at once can load a half-written library ("file too short"), so
/// each run gets a cache of its own.
#[allow(dead_code)]
pub fn reference_py(dir: &std::path::Path) -> std::process::Command {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let kernels = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mlx-kernels-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&kernels).expect("kernel cache dir");
    let mut cmd = std::process::Command::new(python());
    cmd.env("TMPDIR", &kernels)
        .arg(repo().join("tools/py/reference.py"))
        .arg(dir);
    cmd
}

/// A JSON list of token ids (the reference's output).
#[allow(dead_code)]
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// A JSON list of floats.
#[allow(dead_code)]
pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("float list")
        .iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

/// The first index of the largest value (greedy decoding's choice).
#[allow(dead_code)]
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The largest absolute difference of two equally long vectors.
#[allow(dead_code)]
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
