//! The `shoal` binary end to end on the real default model.
use std::process::Command;

use serde_json::Value;

fn shoal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
}

fn run_json(args: &[&str]) -> Value {
    let out = shoal()
        .args(["generate", "--json"])
        .args(args)
        .output()
        .expect("run shoal");
    assert!(
        out.status.success(),
        "shoal failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf8");
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "--json prints exactly one object, got {stdout:?}"
    );
    serde_json::from_str(lines[0]).expect("valid JSON")
}

#[test]
fn generate_json_natural_stop() {
    let v = run_json(&["What is the capital of France?"]);
    assert_eq!(v["text"], "The capital of France is Paris.");
    assert_eq!(v["finish_reason"], "stop");
    assert!(v["stop_sequence"].is_null());
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], 37);
    assert_eq!(u["completion_tokens"], 8);
    assert_eq!(u["total_tokens"], 45);
    assert_eq!(u["cached_tokens"], 0);
    assert_eq!(u["reasoning_tokens"], 0);
    assert!(v["timings"]["ttft_ms"].as_f64().unwrap_or(0.0) > 0.0);
}

#[test]
fn generate_json_max_tokens_and_stop_sequence() {
    let v = run_json(&["--max-tokens", "3", "What is the capital of France?"]);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["text"], "The capital of");

    let v = run_json(&[
        "--stop",
        "Paris",
        "--stop",
        "Berlin",
        "What is the capital of France?",
    ]);
    assert_eq!(v["finish_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "Paris");
    assert_eq!(v["text"], "The capital of France is ");
}

#[test]
fn generate_with_custom_system_prompt_changes_prompt_size() {
    let a = run_json(&["--max-tokens", "1", "Hi"]);
    let b = run_json(&["--max-tokens", "1", "--system", "Be brief.", "Hi"]);
    // The default system prompt is longer than "Be brief.".
    assert!(a["usage"]["prompt_tokens"].as_u64() > b["usage"]["prompt_tokens"].as_u64());
}

#[test]
fn missing_and_unsupported_models_fail_clearly() {
    let out = shoal()
        .args(["generate", "--model", "/nonexistent/model.gguf", "hi"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/model.gguf") && err.contains("does not exist"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("shoal-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "gpt_neox", "hidden_size": 8}"#,
    )
    .expect("write");
    let out = shoal()
        .args(["generate", "--model"])
        .arg(&dir)
        .arg("hi")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gpt_neox") && err.contains("unsupported"),
        "{err}"
    );

    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "vocab_size": 10}"#,
    )
    .expect("write");
    let out = shoal()
        .args(["generate", "--model"])
        .arg(&dir)
        .arg("hi")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokenizer.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_reports_figures() {
    let out = shoal()
        .args([
            "bench",
            "--prompt-tokens",
            "16",
            "--gen-tokens",
            "4",
            "--runs",
            "1",
            "--json",
        ])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["prompt_tokens"], 16);
    assert_eq!(v["gen_tokens"], 4);
    assert!(v["prefill_tok_s"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(v["decode_tok_s"].as_f64().unwrap_or(0.0) > 0.0);
}
