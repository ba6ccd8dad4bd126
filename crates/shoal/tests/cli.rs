//! The `shoal` binary end to end on the real default model.
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use common::*;
use serde_json::{json, Value};

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
    let v = run_json(&["What is the capital of France? Answer in one sentence."]);
    assert_eq!(v["text"], "The capital of France is Paris.");
    assert_eq!(v["finish_reason"], "stop");
    assert!(v["stop_sequence"].is_null());
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], 42);
    assert_eq!(u["completion_tokens"], 8);
    assert_eq!(u["total_tokens"], 50);
    assert_eq!(u["cached_tokens"], 0);
    assert_eq!(u["reasoning_tokens"], 0);
    assert!(v["timings"]["ttft_ms"].as_f64().unwrap_or(0.0) > 0.0);
}

#[test]
fn generate_json_max_tokens_and_stop_sequence() {
    let v = run_json(&[
        "--max-tokens",
        "3",
        "What is the capital of France? Answer in one sentence.",
    ]);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["text"], "The capital of");

    let v = run_json(&[
        "--stop",
        "Paris",
        "--stop",
        "Berlin",
        "What is the capital of France? Answer in one sentence.",
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

/// `shoal generate` builds its prompt as the server's chat dialects do: the
/// same conversation reports the same prompt tokens and the same greedy reply.
#[test]
fn generate_and_the_server_build_the_same_prompt() {
    let dir = temp_dir("same-prompt");
    let (_server, addr) = start_server(&dir, |c| {
        c.args(["serve", "--port", "0", "--prefix-cache-mb", "0"])
            .arg("--model")
            .arg(gguf());
    });
    let question = "What is the capital of France? Answer in one sentence.";
    let cli = run_json(&[
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        "--system",
        "Be brief.",
        "--model",
        gguf().to_str().expect("utf8 path"),
        question,
    ]);
    let body = json!({"model": shoal::id_from_path(&gguf()), "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]});
    let (status, reply) = post_json(&addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        cli["usage"]["prompt_tokens"], reply["usage"]["prompt_tokens"],
        "cli {cli}\nserver {reply}"
    );
    assert_eq!(cli["text"], reply["choices"][0]["message"]["content"]);
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
    // Model directories run on MLX whatever backend the environment asks for.
    let out = shoal()
        .args(["generate", "--backend", "auto", "--model"])
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
    // Model directories run on MLX whatever backend the environment asks for.
    let out = shoal()
        .args(["generate", "--backend", "auto", "--model"])
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

#[test]
fn config_command_shows_file_values_and_overrides() {
    let dir = temp_dir("config-show");
    let file = dir.join("shoal.toml");
    std::fs::write(
        &file,
        r#"
[server]
port = 9100
queue = 3
max_body_mb = 2

[model]
id = "tiny"
aliases = ["gpt-4o-mini"]

[content_filter]
phrases = ["Paris"]
patterns = ['\bRome\b']
"#,
    )
    .expect("write");
    let (ok, out, err) = output(
        shoal_isolated(&dir)
            .args(["config", "--config"])
            .arg(&file)
            .args(["--port", "9200"])
            .env("SHOAL_PREFIX_CACHE_MB", "5"),
    );
    assert!(ok, "{err}");
    let from_file = format!("# config file {}", file.display());
    for line in [
        "host = \"127.0.0.1\"  # default".to_string(),
        "port = 9200  # --port".into(),
        format!("queue = 3  {from_file}"),
        format!("max_body_mb = 2  {from_file}"),
        format!("id = \"tiny\"  {from_file}"),
        format!("aliases = [\"gpt-4o-mini\"]  {from_file}"),
        "prefix_cache_mb = 5  # env SHOAL_PREFIX_CACHE_MB".into(),
        format!("phrases = [\"Paris\"]  {from_file}"),
        format!("patterns = ['\\bRome\\b']  {from_file}"),
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} not in:\n{out}");
    }

    // SHOAL_CONFIG names the file too; a flag still wins over the file.
    let (ok, out, err) = output(
        shoal_isolated(&dir)
            .arg("config")
            .args(["--block", "Berlin"])
            .env("SHOAL_CONFIG", &file),
    );
    assert!(ok, "{err}");
    assert!(out.contains("port = 9100  # config file"), "{out}");
    assert!(out.contains("phrases = [\"Berlin\"]  # --block"), "{out}");

    // Nothing at the default location: built-in defaults, content filter off.
    let (ok, out, err) = output(shoal_isolated(&dir).arg("config"));
    assert!(ok, "{err}");
    assert!(out.contains("(no config file)"), "{out}");
    assert!(out.contains("port = 8421  # default"), "{out}");
    assert!(out.contains("phrases = []  # default"), "{out}");
    assert!(out.contains("patterns = []  # default"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The platform default location is read when it exists (Linux: XDG_CONFIG_HOME).
#[cfg(target_os = "linux")]
#[test]
fn config_is_read_from_the_default_location() {
    let dir = temp_dir("config-default");
    let default = dir.join("xdg/shoal/config.toml");
    std::fs::create_dir_all(default.parent().expect("parent")).expect("mkdir");
    std::fs::write(&default, "[server]\nqueue = 11\n").expect("write");
    let (ok, out, err) = output(shoal_isolated(&dir).arg("config"));
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("queue = 11  # config file {}", default.display())),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn invalid_config_fails_naming_file_and_key() {
    let dir = temp_dir("config-invalid");
    let file = dir.join("bad.toml");
    let fails = |text: &str, sub: &str, expected: &[&str]| {
        std::fs::write(&file, text).expect("write");
        let (ok, _, err) = output(shoal_isolated(&dir).args([sub, "--config"]).arg(&file));
        assert!(!ok, "{sub} accepted {text:?}");
        assert!(err.contains(&file.display().to_string()), "{err}");
        for e in expected {
            assert!(err.contains(e), "{e:?} not in {err}");
        }
    };
    let unknown = "[server]\nport = 9000\ncolour = \"blue\"\n";
    fails(
        unknown,
        "config",
        &["server.colour", "unknown field `colour`", "line 3"],
    );
    fails(
        "[content_filter]\npatterns = [\"(oops\"]\n",
        "config",
        &["content_filter.patterns[0]", "(oops"],
    );
    // `serve` refuses the same files before loading any model.
    fails(unknown, "serve", &["server.colour"]);
    fails(
        "[content_filter]\npatterns = [\"(oops\"]\n",
        "serve",
        &["content_filter.patterns[0]"],
    );

    let missing = dir.join("missing.toml");
    let (ok, _, err) = output(
        shoal_isolated(&dir)
            .args(["config", "--config"])
            .arg(&missing),
    );
    assert!(!ok);
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve` takes its content filter, model, aliases and cache size from the
/// config file: the greedy answer "The capital of France is Paris." is cut at
/// the configured phrase, and the tokens spent before it still count.
#[test]
fn serve_applies_content_filter_from_config_file() {
    let dir = temp_dir("config-serve");
    let file = dir.join("shoal.toml");
    std::fs::write(
        &file,
        format!(
            "[server]\nhost = \"127.0.0.1\"\nport = 0\n\n\
             [model]\npath = {:?}\naliases = [\"filtered\"]\n\n\
             [cache]\nprefix_cache_mb = 0\n\n\
             [content_filter]\nphrases = [\"Paris\"]\n",
            gguf().display().to_string()
        ),
    )
    .expect("write");
    let (server, addr) = start_server(&dir, |c| {
        c.args(["serve", "--config"]).arg(&file);
    });

    let body = serde_json::json!({
        "model": "filtered",
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        "temperature": 0,
        "max_tokens": 20,
    });
    let (status, v) = post_json(&addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "content_filter", "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is "
    );
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{v}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `shoal chat --once` against a live server in all four dialects, streamed
/// and not: the stored usage and stop reason equal what the server recorded
/// sending (its `/v1/usage` ledger), and forged reserved keys are gone.
#[test]
fn chat_records_what_the_server_sent_in_every_dialect() {
    let dir = temp_dir("chat-live");
    let (_server, addr) = start_server(&dir, |c| {
        c.args(["serve", "--port", "0", "--prefix-cache-mb", "0", "--model"])
            .arg(gguf());
    });
    let db = dir.join("conversations.sqlite");
    let n = |v: &Value, p: &str| v.pointer(p).cloned().unwrap_or(Value::Null);
    let mut completion_sum = 0;
    let targets = ["chat", "completions", "responses", "messages", "ollama"];
    for target in targets {
        for stream in [true, false] {
            let mut cmd = shoal_isolated(&dir);
            cmd.args(["chat", "--target", target, "--base-url"])
                .arg(format!("http://{addr}"))
                .arg("--db")
                .arg(&db)
                .args([
                    "--once",
                    "What is the capital of France? Answer in one sentence.",
                    "--max-tokens",
                    "5",
                ])
                .args(["--temperature", "0", "--json"])
                .args([
                    "--metadata",
                    "finish_reason=forged",
                    "--metadata",
                    "token_usage_total_tokens=1",
                ])
                .args(["--metadata", "stop_reason=forged", "--metadata", "run=live"]);
            if !stream {
                cmd.arg("--no-stream");
            }
            let (ok, out, err) = output(&mut cmd);
            assert!(ok, "{target}: {err}");
            let v: Value = serde_json::from_str(&out).expect("chat --json output");
            let meta = &v["pieces"][0]["metadata"];
            assert_eq!(meta["run"], "live", "{target}");
            let entry = get_json(&addr, "/v1/usage?limit=1")["data"][0].clone();
            assert_eq!(
                entry["stream"], stream,
                "{target}: ledger entry is this request"
            );
            let u = &entry["usage"];
            let finish = entry["finish_reasons"][0]
                .as_str()
                .unwrap_or_default()
                .to_string();
            match target {
                "chat" | "completions" => {
                    assert_eq!(meta["finish_reason"], json!(finish), "{target}");
                    assert_eq!(meta["token_usage_prompt_tokens"], n(u, "/prompt_tokens"));
                    assert_eq!(
                        meta["token_usage_completion_tokens"],
                        n(u, "/completion_tokens")
                    );
                    assert_eq!(meta["token_usage_total_tokens"], n(u, "/total_tokens"));
                    assert_eq!(
                        meta["token_usage_cached_tokens"],
                        n(u, "/prompt_tokens_details/cached_tokens")
                    );
                    assert!(meta.get("stop_reason").is_none());
                }
                "responses" => {
                    assert_eq!(finish, "incomplete:max_output_tokens");
                    assert_eq!(meta["status"], "incomplete");
                    assert_eq!(meta["incomplete_reason"], "max_output_tokens");
                    assert_eq!(meta["token_usage_prompt_tokens"], n(u, "/input_tokens"));
                    assert_eq!(
                        meta["token_usage_completion_tokens"],
                        n(u, "/output_tokens")
                    );
                    assert_eq!(meta["token_usage_total_tokens"], n(u, "/total_tokens"));
                    assert!(
                        meta.get("finish_reason").is_none() && meta.get("stop_reason").is_none()
                    );
                }
                "ollama" => {
                    assert_eq!(meta["finish_reason"], json!(finish), "{target}");
                    assert_eq!(
                        meta["token_usage_prompt_tokens"],
                        n(u, "/prompt_eval_count")
                    );
                    assert_eq!(meta["token_usage_completion_tokens"], n(u, "/eval_count"));
                    assert_eq!(
                        meta["token_usage_cached_tokens"],
                        n(u, "/prompt_eval_cached_count")
                    );
                    assert!(meta.get("stop_reason").is_none());
                }
                _ => {
                    assert_eq!(meta["stop_reason"], json!(finish));
                    assert_eq!(meta["token_usage_input_tokens"], n(u, "/input_tokens"));
                    assert_eq!(
                        meta["token_usage_cached_tokens"],
                        n(u, "/cache_read_input_tokens")
                    );
                    assert_eq!(
                        meta["token_usage_completion_tokens"],
                        n(u, "/output_tokens")
                    );
                    assert!(meta.get("finish_reason").is_none());
                }
            }
            let completion = meta["token_usage_completion_tokens"]
                .as_u64()
                .expect("completion");
            // A raw completion of the bare question ends at once; chat turns hit max tokens.
            if target != "completions" {
                assert_eq!(completion, 5, "{target}: cut at max tokens");
            }
            completion_sum += completion;
        }
    }
    // A provider from the providers file, with a price for its model.
    let providers = dir.join("providers.toml");
    std::fs::write(
        &providers,
        format!(
            "[providers.local]\ntarget = \"chat\"\nbase_url = \"http://{addr}/v1\"\n\
             api_key_env = \"SHOAL_TEST_UNSET_KEY\"\nheaders = {{ \"x-trace\" = \"1\" }}\n\
             [providers.local.prices.{:?}]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n",
            crate_model_id()
        ),
    )
    .expect("write providers");
    let (ok, out, err) = output(
        shoal_isolated(&dir)
            .args(["chat", "--provider", "local", "--providers"])
            .arg(&providers)
            .arg("--db")
            .arg(&db)
            .args([
                "--once",
                "Say hi",
                "--max-tokens",
                "4",
                "--temperature",
                "0",
                "--json",
            ])
            .args(["--metadata", "response_cost_usd=0"]),
    );
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    let m = &v["pieces"][0]["metadata"];
    let prompt = m["token_usage_prompt_tokens"].as_f64().expect("prompt");
    let completion = m["token_usage_completion_tokens"]
        .as_f64()
        .expect("completion");
    let cost = m["response_cost_usd"].as_f64().expect("cost");
    assert!(
        (cost - (prompt + 2.0 * completion) / 1e6).abs() < 1e-12,
        "{m}"
    );
    completion_sum += completion as u64;
    let (ok, _, err) = output(
        shoal_isolated(&dir)
            .args(["chat", "--provider", "nope", "--providers"])
            .arg(&providers)
            .args(["--once", "x"]),
    );
    assert!(!ok && err.contains("no provider 'nope'"), "{err}");

    let (ok, out, err) = output(
        shoal_isolated(&dir)
            .args(["history", "--json", "--db"])
            .arg(&db),
    );
    assert!(ok, "{err}");
    let h: Value = serde_json::from_str(&out).expect("history json");
    // Each target streamed and not, and the provider's one reply.
    let replies = 2 * targets.len() + 1;
    assert_eq!(h["conversations"].as_array().map(Vec::len), Some(replies));
    let totals = h["totals"].as_object().expect("totals");
    let t = totals.values().next().expect("one model");
    assert_eq!(t["replies"], replies);
    assert_eq!(t["completion_tokens"], completion_sum);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The id `serve` gives the default test model (its file name).
fn crate_model_id() -> String {
    gguf()
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `--log-format json`: every line is a JSON object; a request's line carries
/// its span (id, dialect, model, finish reason, usage); the prompt's text is
/// logged only with `--log-prompts`.
#[test]
fn json_logs_carry_the_request_span_and_prompts_only_when_asked() {
    for log_prompts in [false, true] {
        let dir = temp_dir(&format!("json-logs-{log_prompts}"));
        let (server, addr) = start_server(&dir, |c| {
            c.args([
                "--log-format",
                "json",
                "serve",
                "--port",
                "0",
                "--prefix-cache-mb",
                "0",
            ])
            .arg("--db")
            .arg(dir.join("c.sqlite"));
            if log_prompts {
                c.arg("--log-prompts");
            }
            c.arg("--model").arg(gguf()).env("SHOAL_LOG", "info");
        });
        let secret = "zebra-umbrella-42";
        let (status, reply) = post_json(
            &addr,
            "/v1/chat/completions",
            &json!({"model": shoal::id_from_path(&gguf()), "messages": [{"role": "user", "content": secret}],
                    "max_tokens": 3, "temperature": 0})
            .to_string(),
        );
        assert_eq!(status, 200, "{reply}");
        drop(server);
        let log = std::fs::read_to_string(dir.join("stderr.log")).expect("log");
        let lines: Vec<Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let done = lines
            .iter()
            .find(|l| l["fields"]["message"] == "request finished")
            .unwrap_or_else(|| panic!("no request line in {log}"));
        let span = &done["span"];
        assert_eq!(span["id"], reply["id"], "{done}");
        assert_eq!(span["dialect"], "openai.chat");
        assert_eq!(span["model"], reply["model"]);
        assert_eq!(span["finish_reason"], "[\"length\"]");
        let usage: Value =
            serde_json::from_str(span["usage"].as_str().expect("usage text")).expect("usage JSON");
        assert_eq!(usage, reply["usage"], "the span's usage is what was sent");
        assert_eq!(log.contains(secret), log_prompts, "{log}");
    }
}

/// `shoal pull`, `shoal models` and `shoal rm` against a loopback hub that
/// serves the default model's file.
#[test]
fn pull_list_and_remove_models_from_a_fixture_hub() {
    use shoal_hub_fixture::{FixtureFile, FixtureRepo, HubFixture};
    let dir = temp_dir("pull");
    let bytes = std::fs::read(gguf()).expect("model");
    let size = bytes.len() as u64;
    let hub = HubFixture::start(vec![
        FixtureRepo {
            id: "test/SmolLM2-GGUF".into(),
            commit: "2222222222222222222222222222222222222222".into(),
            files: vec![FixtureFile::new(
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                bytes,
                true,
            )],
            token: None,
        },
        FixtureRepo {
            id: "test/gated-GGUF".into(),
            commit: "3333333333333333333333333333333333333333".into(),
            files: vec![FixtureFile::new(
                "gated-Q4_0.gguf",
                shoal_hub_fixture::gguf_bytes(
                    "llama",
                    2,
                    2048,
                    &[("token_embd.weight", &[64, 100])],
                ),
                true,
            )],
            token: Some("hf_gate_7".into()),
        },
    ]);
    let cli_with = |env: &[(&str, &str)], args: &[&str]| {
        let mut c = shoal_isolated(&dir);
        c.env("HF_ENDPOINT", &hub.endpoint)
            .envs(env.iter().copied())
            .arg("--log-format")
            .arg("text");
        c.args(args);
        output(&mut c)
    };
    let cli = |args: &[&str]| cli_with(&[], args);
    let (ok, out, err) = cli(&["pull", "test/SmolLM2-GGUF"]);
    assert!(ok, "{err}");
    let id = "test/SmolLM2-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf";
    assert!(out.starts_with(id), "{out}");
    assert!(err.contains("checksum ok"), "{err}");
    // A second pull finds the file in place.
    let (ok, _, err) = cli(&["pull", "test/SmolLM2-GGUF"]);
    assert!(ok && err.contains("already here"), "{err}");

    let model = gguf();
    let model_arg = model.to_str().expect("utf8 path");
    let (ok, out, err) = cli(&["models", "--json", "--model", model_arg]);
    assert!(ok, "{err}");
    let list: Vec<Value> = serde_json::from_str(&out).expect("JSON");
    assert_eq!(list.len(), 2, "{out}");
    for m in &list {
        assert_eq!(m["architecture"], "llama");
        assert_eq!(m["quantization"], "Q4_1");
        // The window served (SmolLM2's whole trained window) beside the trained one.
        assert_eq!(m["context_length"], 8192);
        assert_eq!(m["trained_context_length"], 8192);
        assert_eq!(m["size_bytes"], size);
        assert!(m["parameters"].as_u64().unwrap_or(0) > 100_000_000, "{m}");
    }
    assert_eq!(list[0]["source"]["kind"], "path");
    assert_eq!(list[1]["id"], id);
    assert_eq!(list[1]["source"]["repo"], "test/SmolLM2-GGUF");
    // A projector named for the pulled model by its id goes to that file
    // only: the configured model is the same file name elsewhere.
    let named = format!("{id}={}", vision_projector().display());
    let (ok, out, err) = cli(&[
        "models",
        "--json",
        "--backend",
        "llama",
        "--model",
        model_arg,
        "--projector",
        &named,
    ]);
    assert!(ok, "{err}");
    let list: Vec<Value> = serde_json::from_str(&out).expect("JSON");
    let sees: Vec<(&str, bool)> = list
        .iter()
        .map(|m| {
            (
                m["source"]["kind"].as_str().unwrap_or(""),
                m["vision"] == true,
            )
        })
        .collect();
    assert_eq!(sees, [("path", false), ("hub", true)], "{out}");
    let (ok, table, _) = cli(&["models", "--model", model_arg]);
    assert!(ok);
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains("CONTEXT  TRAINED"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(id) && l.contains("Q4_1")),
        "{table}"
    );

    // A GGUF with a projector beside it reads images on llama.cpp, and says
    // so; not with the projector turned off, nor on MLX.
    let vision = vision_gguf();
    let vision_arg = vision.to_str().expect("utf8 path");
    // A projector named for a model under `[models] projectors` (here by
    // flag) is the one it uses: the text-only default model then sees, and
    // the vision model named `off` does not.
    let projector = vision_projector();
    let file_name = |p: &Path| p.file_name().expect("name").to_string_lossy().into_owned();
    let named = format!("{}={}", file_name(&model), projector.display());
    let blind = format!("{}=off", file_name(&vision));
    for (model, extra, sees) in [
        (vision_arg, &["--backend", "llama"][..], true),
        (
            vision_arg,
            &["--backend", "llama", "--mmproj", "off"][..],
            false,
        ),
        (vision_arg, &["--backend", "mlx"][..], false),
        (
            model_arg,
            &["--backend", "llama", "--projector", &named][..],
            true,
        ),
        (
            vision_arg,
            &["--backend", "llama", "--projector", &blind][..],
            false,
        ),
    ] {
        let mut args = vec!["models", "--json", "--model", model];
        args.extend_from_slice(extra);
        let (ok, out, err) = cli(&args);
        assert!(ok, "{err}");
        let list: Vec<Value> = serde_json::from_str(&out).expect("JSON");
        assert_eq!(list[0]["source"]["kind"], "path", "{out}");
        assert_eq!(list[0]["vision"], sees, "{extra:?}: {out}");
    }
    let (ok, _, err) = cli(&[
        "models",
        "--model",
        model_arg,
        "--projector",
        "no-equals-sign",
    ]);
    assert!(!ok && err.contains("is not MODEL=PATH"), "{err}");
    let (ok, table, _) = cli(&["models", "--backend", "llama", "--model", vision_arg]);
    assert!(
        ok && table
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("chat+vision")),
        "{table}"
    );

    // A configured embedding model is listed with its kind.
    let embed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/models/all-minilm-l6-v2-0.1.2/all-MiniLM-L6-v2-F16.gguf");
    let embed = std::env::var("SHOAL_TEST_EMBED_GGUF").map_or(embed, PathBuf::from);
    let embed_arg = embed.to_str().expect("utf8 path");
    let (ok, out, err) = cli(&[
        "models",
        "--json",
        "--model",
        model_arg,
        "--embedding-model",
        embed_arg,
        "--embedding-model-id",
        "minilm",
    ]);
    assert!(ok, "{err}");
    let list: Vec<Value> = serde_json::from_str(&out).expect("JSON");
    let kinds: Vec<(&str, &str)> = list
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap_or(""),
                m["kind"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (shoal::id_from_path(&model).as_str(), "chat"),
            ("minilm", "embedding"),
            (id, "chat")
        ]
    );
    assert_eq!(list[1]["embedding_pooling"], "mean");
    assert_eq!(list[1]["embedding_length"], 384);
    let (ok, table, _) = cli(&[
        "models",
        "--model",
        model_arg,
        "--embedding-model",
        embed_arg,
    ]);
    assert!(ok);
    assert!(
        table.lines().any(|l| l.starts_with("all-MiniLM-L6-v2-F16 ")
            && l.contains(" embedding ")
            && l.contains("bert")),
        "{table}"
    );

    let (ok, _, err) = cli(&["pull", "test/absent"]);
    assert!(!ok);
    assert!(
        err.contains("test/absent@main was not found on the hub"),
        "{err}"
    );
    let (ok, _, err) = cli(&["pull", "not a repo"]);
    assert!(!ok && err.contains("ORG/NAME"), "{err}");

    // Offline after the pull: serving and using the pulled model never
    // contact the hub, though HF_ENDPOINT points at it.
    let asked = hub.requests().len();
    let (server, addr) = start_server(&dir, |c| {
        c.env("HF_ENDPOINT", &hub.endpoint)
            .args(["serve", "--port", "0", "--prefix-cache-mb", "0"])
            .arg("--db")
            .arg(dir.join("c.sqlite"))
            .arg("--model")
            .arg(gguf());
    });
    let (status, reply) = post_json(
        &addr,
        "/v1/chat/completions",
        &json!({"model": id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                 "temperature": 0})
        .to_string(),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["model"], id, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 2, "{reply}");
    drop(server);
    assert_eq!(
        hub.requests().len(),
        asked,
        "the hub was contacted: {:?}",
        &hub.requests()[asked..]
    );

    let (ok, out, err) = cli(&["rm", id]);
    assert!(ok, "{err}");
    assert!(out.contains("removed"), "{out}");
    let (_, out, _) = cli(&["models", "--json", "--model", model_arg]);
    let list: Vec<Value> = serde_json::from_str(&out).expect("JSON");
    assert_eq!(list.len(), 1, "{out}");
    let (ok, _, err) = cli(&["rm", id]);
    assert!(!ok && err.contains("no local model"), "{err}");

    // A gated repository wants HF_TOKEN, which is read from the environment.
    let (ok, _, err) = cli(&["pull", "test/gated-GGUF"]);
    assert!(!ok && err.contains("HF_TOKEN"), "{err}");
    let (ok, out, err) = cli_with(&[("HF_TOKEN", "hf_gate_7")], &["pull", "test/gated-GGUF"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("test/gated-GGUF/gated-Q4_0.gguf"), "{out}");
}

/// The config file's `server.log_format` is used when no flag says otherwise.
#[test]
fn log_format_comes_from_the_config_file() {
    let dir = temp_dir("log-format-file");
    let file = dir.join("shoal.toml");
    std::fs::write(
        &file,
        "[server]\nlog_format = \"json\"\n\n[models]\nidle_unload_secs = 60\n",
    )
    .expect("write");
    let (ok, out, err) = output(shoal_isolated(&dir).args(["config", "--config"]).arg(&file));
    assert!(ok, "{err}");
    assert!(
        out.contains("log_format = \"json\"  # config file"),
        "{out}"
    );
    assert!(
        out.contains("idle_unload_secs = 60  # config file"),
        "{out}"
    );
    assert!(out.contains("memory_budget_mb = 0  # default"), "{out}");
    let (server, _) = start_server(&dir, |c| {
        c.args(["serve", "--port", "0", "--config"])
            .arg(&file)
            .arg("--model")
            .arg(gguf())
            .env("SHOAL_LOG", "info");
    });
    drop(server);
    let log = std::fs::read_to_string(dir.join("stderr.log")).expect("log");
    let first = log.lines().next().expect("a log line");
    let v: Value = serde_json::from_str(first).unwrap_or_else(|e| panic!("not JSON ({e}): {log}"));
    assert!(v["fields"]["message"].is_string(), "{v}");
}

/// Three nodes on loopback find each other from one static peer each
/// (gossip does the rest), report plausible status, refuse a node with the
/// wrong secret, and see a killed node become unreachable, then go.
#[test]
fn cluster_nodes_join_report_status_refuse_strangers_and_drop_the_dead() {
    let node = |name: &str, secret: &str, peer: Option<&str>| {
        let dir = temp_dir(&format!("cluster-{name}"));
        let cfg = dir.join("shoal.toml");
        std::fs::write(
            &cfg,
            "[cluster]\nunreachable_after_secs = 8\nremove_after_secs = 16\n",
        )
        .expect("config");
        let (server, addr) = start_server(&dir, |c| {
            c.args([
                "serve",
                "--port",
                "0",
                "--prefix-cache-mb",
                "0",
                "--no-mdns",
            ])
            .args(["--cluster-secret", secret, "--config"])
            .arg(&cfg)
            .arg("--model")
            .arg(gguf());
            if let Some(p) = peer {
                c.args(["--peer", p]);
            }
        });
        let me = get_json(&addr, "/v1/cluster/nodes")["nodes"][0].clone();
        let id = me["id"].as_str().expect("id").to_string();
        ((server, dir.join("stderr.log")), addr, id)
    };
    let ((_a, a_log), a, a_id) = node("a", "s3cret", None);
    let (_b, b, b_id) = node("b", "s3cret", Some(&a));
    let ((c_server, _), c, c_id) = node("c", "s3cret", Some(&b));
    let (_d, d, d_id) = node("d", "wrong", Some(&a));
    let ids: std::collections::BTreeSet<&str> =
        [&a_id, &b_id, &c_id, &d_id].map(String::as_str).into();
    assert_eq!(ids.len(), 4, "each node has its own identity");

    let online = |want: usize| {
        move |n: &[Value]| n.len() == want && n.iter().all(|x| x["status"] == "online")
    };
    for addr in [&a, &b, &c] {
        let nodes = wait_nodes(addr, online(3));
        let got: std::collections::BTreeSet<&str> =
            nodes.iter().filter_map(|n| n["id"].as_str()).collect();
        assert_eq!(
            got,
            [&a_id, &b_id, &c_id].map(String::as_str).into(),
            "{addr}: {nodes:?}"
        );
        assert_eq!(nodes.iter().filter(|n| n["self"] == true).count(), 1);
        for n in &nodes {
            assert!(n["cpu"]["cores"].as_u64().unwrap_or(0) >= 1, "{n}");
            let total = n["memory"]["total_bytes"].as_u64().unwrap_or(0);
            let used = n["memory"]["used_bytes"].as_u64().unwrap_or(0);
            assert!(total >= used && used > 0, "{n}");
            assert_eq!(n["backend"], "cpu");
            assert!(n["os"].as_str().is_some_and(|s| !s.is_empty()));
            assert_eq!(n["models"][0]["id"], shoal::id_from_path(&gguf()));
            assert_eq!(n["models"][0]["backend"], gguf_backend(), "{n}");
            assert!(
                n["models"][0]["memory_bytes"].as_u64().unwrap_or(0) > 100 << 20,
                "{n}"
            );
            assert!(n["requests"]["in_flight"].is_u64() && n["address"].is_string());
        }
    }
    // The node with the wrong secret is refused by the node it calls (whose
    // log says why), so it is not let in and sees no one.
    wait_for_log(
        &a_log,
        "the cluster secret differs",
        "the stranger never called",
    );
    let d_view = wait_nodes(&d, |_| true);
    assert_eq!(d_view.len(), 1, "{d_view:?}");
    assert!(wait_nodes(&a, |_| true)
        .iter()
        .all(|n| n["id"] != d_id.as_str()));

    // The control route wants a valid signature.
    let path = shoal_cluster::STATUS_PATH;
    let (status, body) = get_with(&a, path, &[]);
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["type"], "authentication_error");
    let wrong = shoal_cluster::Secret::new("wrong").sign("GET", path, &d_id, &d, b"");
    assert_eq!(get_with(&a, path, &wrong).0, 401);
    let right =
        shoal_cluster::Secret::new("s3cret").sign("GET", path, "tester", "127.0.0.1:9", b"");
    let (status, body) = get_with(&a, path, &right);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["node"]["id"], a_id.as_str());

    // Events: a snapshot, then the killed node going unreachable and away.
    let mut stream = std::net::TcpStream::connect(&a).expect("connect");
    write!(
        stream,
        "GET /v1/cluster/events HTTP/1.1\r\nHost: {a}\r\n\r\n"
    )
    .expect("send");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .expect("timeout");
    drop(c_server);
    let unreachable = wait_nodes(&a, |n| {
        n.iter()
            .any(|x| x["id"] == c_id.as_str() && x["status"] == "unreachable")
    });
    assert!(
        unreachable
            .iter()
            .any(|x| x["id"] == c_id.as_str() && x["status"] == "unreachable"),
        "{unreachable:?}"
    );
    let after = wait_nodes(&a, online(2));
    assert_eq!(after.len(), 2, "{after:?}");
    let mut seen = String::new();
    let mut reader = BufReader::new(stream);
    while !seen.contains("event: removed") {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&line);
    }
    assert!(seen.contains("event: nodes"), "{seen}");
    let lost = seen
        .find("event: unreachable")
        .expect("an unreachable event");
    let removed = seen.find("event: removed").expect("a removed event");
    assert!(lost < removed && seen[lost..].contains(&c_id), "{seen}");
}

/// Reads an SSE response until it ends; returns everything after the head.
fn stream_until_end(addr: &str, path: &str, body: &str, on_first: impl FnOnce()) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut reader = BufReader::new(stream);
    let mut all = String::new();
    let mut first = Some(on_first);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.starts_with("data: ") {
            if let Some(f) = first.take() {
                f();
            }
        }
        all.push_str(&line);
    }
    all
}

/// A request for a model another node holds is forwarded there and comes
/// back unchanged; instances place a model on a node; when that node dies
/// mid-stream the client gets an error event, the instance shows failed,
/// and the model can be placed again on the survivor.
#[test]
fn requests_are_forwarded_and_instances_survive_a_dead_node() {
    let model = "test/beta";
    let a_dir = temp_dir("route-a");
    // Node A has the model on disk (not loaded); B serves it as its model.
    let snap = a_dir
        .join("hf-home/hub/models--test--beta/snapshots/3333333333333333333333333333333333333333");
    std::fs::create_dir_all(&snap).expect("mkdir");
    std::os::unix::fs::symlink(gguf(), snap.join("SmolLM2-135M-Instruct.Q4_1.gguf")).expect("link");
    let start = |dir: &Path, extra: &[&str]| {
        start_server(dir, |c| {
            c.args([
                "serve",
                "--port",
                "0",
                "--prefix-cache-mb",
                "0",
                "--no-mdns",
            ])
            .args(["--cluster-secret", "route", "--model"])
            .arg(gguf())
            .args(extra);
        })
    };
    let (_a, a) = start(&a_dir, &["--model-id", "alpha"]);
    let b_dir = temp_dir("route-b");
    let (b_server, b) = start(&b_dir, &["--model-id", model, "--peer", &a]);
    let nodes = wait_nodes(&a, |n| {
        n.len() == 2 && n.iter().all(|x| x["status"] == "online")
    });
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let b_id = get_json(&b, "/v1/cluster/nodes")["nodes"][0]["id"]
        .as_str()
        .expect("id")
        .to_string();

    // Forwarded: the same greedy answer and usage as asking B directly.
    let ask = json!({"model": model, "max_tokens": 8, "temperature": 0,
                     "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]})
    .to_string();
    let (status, direct) = post_json(&b, "/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{direct}");
    // It names its chat turn in words that are not ASCII: the node that runs
    // it keeps them as the one that received it did.
    let turn = "tour-é/1";
    let (status, via_a) = post_json_with(
        &a,
        "/v1/chat/completions",
        &ask,
        &[("x-shoal-turn", turn.to_string())],
    );
    assert_eq!(status, 200, "{via_a}");
    assert_eq!(via_a["model"], model);
    assert_eq!(
        via_a["choices"][0]["message"],
        direct["choices"][0]["message"]
    );
    assert_eq!(via_a["usage"], direct["usage"]);
    assert!(get_json(&a, "/v1/models")["data"]
        .as_array()
        .expect("list")
        .iter()
        .any(
            |m| m["id"] == format!("{model}/SmolLM2-135M-Instruct.Q4_1.gguf")
                && m["shoal"]["loaded"] == false
        ));
    // Greedy, so the reply cannot end early on a sampled end of turn: it is
    // cut at the cap, and the forwarded stream says so with the exact count.
    let claude = json!({"model": model, "max_tokens": 5, "stream": true, "temperature": 0,
                        "messages": [{"role": "user", "content": "Write a long story about a ship."}]})
    .to_string();
    let sse = stream_until_end(&a, "/v1/messages", &claude, || {});
    assert!(sse.contains("event: message_stop"), "{sse}");
    assert!(sse.contains("\"stop_reason\":\"max_tokens\""), "{sse}");
    assert!(sse.contains("\"output_tokens\":5"), "{sse}");

    // Attribution: a forwarded request is in both ledgers under one id, as
    // received by A and run by B; the cluster-wide view counts it once.
    let a_id = get_json(&a, "/v1/cluster/nodes")["nodes"][0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let claude_id = sse
        .split("\"id\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("message id")
        .to_string();
    for (id, received, ran, named) in [
        (direct["id"].as_str().expect("id"), &b_id, None, None),
        (
            via_a["id"].as_str().expect("id"),
            &a_id,
            Some(&b_id),
            Some(turn),
        ),
        (claude_id.as_str(), &a_id, Some(&b_id), None),
    ] {
        let holders: Vec<&str> = if ran.is_some() {
            vec![&a, &b]
        } else {
            vec![&b]
        };
        for node in holders {
            // A copies its record once the answer has ended: wait for it.
            let entry = poll_until(
                || {
                    get_json(node, "/v1/usage?limit=50")["data"]
                        .as_array()
                        .and_then(|d| d.iter().find(|e| e["id"] == id).cloned())
                },
                Option::is_some,
            )
            .unwrap_or_else(|| panic!("{id} not in {node}'s ledger"));
            assert_eq!(entry["node"], received.as_str(), "{node}: {entry}");
            assert_eq!(
                entry["ran_on"].as_str(),
                ran.map(String::as_str),
                "{node}: {entry}"
            );
            assert_eq!(entry["turn"].as_str(), named, "{node}: {entry}");
        }
    }
    let (_, a_only) = get_with(&a, "/v1/usage?limit=50", &[]);
    assert!(
        a_only["data"]
            .as_array()
            .expect("data")
            .iter()
            .all(|e| e["id"] != direct["id"]),
        "a request B received and ran is B's alone"
    );
    let total = |v: &Value| v["usage"]["total_tokens"].as_u64().unwrap_or(0);
    let claude_total = {
        let e = get_json(&b, "/v1/usage?limit=50")["data"]
            .as_array()
            .and_then(|d| d.iter().find(|e| e["id"] == claude_id.as_str()).cloned())
            .expect("claude entry");
        [
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens",
        ]
        .iter()
        .map(|f| e["usage"][*f].as_u64().unwrap_or(0))
        .sum::<u64>()
    };
    for node in [&a, &b] {
        let groups = get_json(node, "/v1/usage?scope=cluster&group_by=node")["data"].clone();
        let requests: u64 = groups
            .as_array()
            .expect("groups")
            .iter()
            .map(|g| g["requests"].as_u64().unwrap_or(0))
            .sum();
        let tokens: u64 = groups
            .as_array()
            .expect("groups")
            .iter()
            .map(|g| g["total_tokens"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(requests, 3, "{node}: {groups}");
        assert_eq!(
            tokens,
            total(&direct) + total(&via_a) + claude_total,
            "{node}: {groups}"
        );
    }

    // An instance on B.
    let (status, inst) = post_json(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": [b_id]}).to_string(),
    );
    assert_eq!(status, 200, "{inst}");
    assert_eq!(
        (inst["status"].as_str(), inst["entry"].as_str()),
        (Some("ready"), Some(b_id.as_str()))
    );
    let (status, err) = post_json(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": [b_id, "x"], "sharding": "pipeline"}).to_string(),
    );
    assert_eq!(status, 400, "{err}");
    assert_eq!(
        err["error"]["param"], "nodes",
        "A is not among the nodes: {err}"
    );

    // B dies while streaming through A: the stream ends with an error event.
    let long = json!({"model": model, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 3000,
                      "temperature": 0, "stream": true})
    .to_string();
    let mut b_server = Some(b_server);
    // Reads time out after 30 s, so a hang fails below instead of blocking.
    let sse = stream_until_end(&a, "/v1/completions", &long, || drop(b_server.take()));
    let last = sse
        .lines()
        .rev()
        .find(|l| l.starts_with("data: "))
        .expect("events");
    assert!(
        last.contains("\"error\""),
        "the stream ended without an error event: {last}"
    );
    assert!(!sse.contains("[DONE]"));
    // Asked again before A has missed B's heartbeat: B refuses the
    // connection, so nothing ran there and A serves the request itself.
    let answers_like_b = || {
        let (status, got) = post_json(&a, "/v1/chat/completions", &ask);
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["usage"], direct["usage"]);
        assert_eq!(
            got["choices"][0]["message"],
            direct["choices"][0]["message"]
        );
    };
    answers_like_b();

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let failed = loop {
        let list = get_json(&a, "/v1/instances");
        if list["data"][0]["status"] == "failed" || std::time::Instant::now() > deadline {
            break list;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert_eq!(failed["data"][0]["status"], "failed", "{failed}");
    // Re-placed on the survivor, which loads it from its own disk.
    let (status, again) = post_json(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": "auto"}).to_string(),
    );
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["status"], "ready");
    answers_like_b();
}

/// Listening beyond loopback needs a key; keys and secrets never show in
/// `shoal config` or in the logs.
#[test]
fn exposure_needs_a_key_and_keys_stay_out_of_output() {
    let dir = temp_dir("exposure");
    let (ok, _, err) =
        output(shoal_isolated(&dir).args(["serve", "--host", "0.0.0.0", "--port", "0"]));
    assert!(!ok);
    assert!(err.contains("needs an API key"), "{err}");

    let key = "sk-never-print-4242";
    let (ok, out, err) = output(shoal_isolated(&dir).args([
        "config",
        "--api-key",
        key,
        "--cluster-secret",
        "hush-hush-77",
    ]));
    assert!(ok, "{err}");
    // Shown by name (an unnamed key is named after its digest), never itself.
    assert!(out.contains("api_keys = [\"key-"), "{out}");
    assert!(out.contains("=(set)\"]  # --api-key"), "{out}");
    assert!(!out.contains(key) && !out.contains("hush-hush-77"), "{out}");

    let (server, addr) = start_server(&dir, |c| {
        c.args([
            "--log-format",
            "json",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--api-key",
            key,
        ])
        .arg("--model")
        .arg(gguf())
        .env("SHOAL_LOG", "debug");
    });
    let port = addr.rsplit(':').next().expect("port");
    let local = format!("127.0.0.1:{port}");
    let body = json!({"model": shoal::id_from_path(&gguf()), "max_tokens": 2,
                      "messages": [{"role": "user", "content": "Hi"}]})
    .to_string();
    let mut stream = std::net::TcpStream::connect(&local).expect("connect");
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {local}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let (status, _) = post_json(&local, "/v1/chat/completions", &body);
    assert_eq!(status, 401);
    drop(server);
    let log = std::fs::read_to_string(dir.join("stderr.log")).expect("log");
    assert!(log.contains("request finished"), "{log}");
    assert!(!log.contains(key), "the key is in the log");
}

/// A model on llama.cpp is placed whole: asking to split it by layers gets a
/// 400 that says why, and the node lists the model with its backend.
#[test]
fn a_model_on_llama_cpp_is_never_split() {
    let dir = temp_dir("llama-whole");
    let (_server, a) = start_server(&dir, |c| {
        c.args(["serve", "--port", "0", "--no-mdns", "--backend", "llama"])
            .args(["--cluster-secret", "whole", "--model"])
            .arg(gguf());
    });
    let self_id = wait_nodes(&a, |n| !n.is_empty())[0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let model = shoal::id_from_path(&gguf());
    for nodes in [json!([self_id]), json!([self_id, "another"])] {
        let (status, v) = post_json(
            &a,
            "/v1/instances",
            &json!({"model": model, "nodes": nodes, "sharding": "pipeline"}).to_string(),
        );
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], "sharding", "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("llama.cpp") && msg.contains("MLX"), "{msg}");
    }
    let (status, v) = post_json(
        &a,
        "/v1/instances/preview",
        &json!({"model": model, "nodes": [self_id, "another"]}).to_string(),
    );
    assert_eq!(status, 400, "{v}");
    // Placed whole, it loads and the node panel's source says on what.
    let (status, inst) = post_json(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": [self_id]}).to_string(),
    );
    assert_eq!(status, 200, "{inst}");
    let nodes = get_json(&a, "/v1/cluster/nodes");
    let held = &nodes["nodes"][0]["models"][0];
    assert_eq!(held["id"], model.as_str(), "{nodes}");
    assert_eq!(held["backend"], "llama", "{nodes}");
}

/// A cluster node serving `model` on MLX (splitting by layers runs on
/// MLX's ring), without the prefix cache or mDNS, plus `extra` flags.
fn mlx_node(dir: &Path, model: &Path, secret: &str, extra: &[String]) -> (Server, String) {
    start_server(dir, |c| {
        c.args([
            "serve",
            "--port",
            "0",
            "--prefix-cache-mb",
            "0",
            "--no-mdns",
        ])
        .args(["--backend", "mlx", "--cluster-secret", secret, "--model"])
        .arg(model)
        .args(extra);
    })
}

/// A model split by layers over two nodes answers exactly like one node
/// (same greedy text and usage, streaming or not); when a node dies
/// mid-stream the client gets an error event, the instance shows failed,
/// and the model can be placed again on the survivor.
#[test]
fn a_model_split_over_two_nodes_answers_like_one_and_survives_a_dead_node() {
    let start = |name: &str, extra: &[&str]| {
        let dir = temp_dir(&format!("pipe-{name}"));
        let cfg = dir.join("shoal.toml");
        std::fs::write(
            &cfg,
            "[cluster]\nunreachable_after_secs = 8\nremove_after_secs = 16\n",
        )
        .expect("config");
        let mut args = vec!["--config".to_string(), cfg.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        mlx_node(&dir, &gguf(), "pipe", &args)
    };
    let (_a, a) = start("a", &[]);
    let (b_server, b) = start("b", &["--peer", &a]);
    let nodes = wait_nodes(&a, |n| {
        n.len() == 2 && n.iter().all(|x| x["status"] == "online")
    });
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let a_id = nodes[0]["id"].as_str().expect("id").to_string();
    let b_id = nodes[1]["id"].as_str().expect("id").to_string();
    let model = shoal::id_from_path(&gguf());
    let ask = json!({"model": model, "max_tokens": 12, "temperature": 0,
                     "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]})
    .to_string();
    let (status, single) = post_json(&a, "/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{single}");

    // `shoal bench --server` splits the model over both nodes itself, times
    // it against one node, and removes its instance again.
    let (ok, out, err) = output(
        shoal_isolated(&temp_dir("pipe-bench"))
            .args(["bench", "--server", &format!("http://{a}")])
            .args(["--runs", "1", "--gen-tokens", "24", "--json", "--model"])
            .arg(gguf()),
    );
    assert!(ok, "{err}");
    let bench: Value = serde_json::from_str(out.trim()).expect("bench JSON");
    assert_eq!(bench["nodes"], json!([a_id, b_id]), "{bench}");
    assert_eq!(bench["same_greedy_output"], true, "{bench}");
    for k in ["single_node_decode_tok_s", "split_decode_tok_s"] {
        assert!(bench[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {bench}");
    }
    assert!(bench["hop_ms_per_token"]
        .as_f64()
        .is_some_and(f64::is_finite));
    assert_eq!(get_json(&a, "/v1/instances")["data"], json!([]));

    let (status, preview) = post_json(
        &a,
        "/v1/instances/preview",
        &json!({"model": model, "nodes": [a_id, b_id]}).to_string(),
    );
    assert_eq!(status, 200, "{preview}");
    let p = preview["placements"].as_array().expect("placements");
    assert_eq!(p.len(), 2);
    assert_eq!(
        (p[0]["layers"][0].as_u64(), p[1]["layers"][1].as_u64()),
        (Some(0), Some(30))
    );
    assert_eq!(p[0]["layers"][1], p[1]["layers"][0]);
    assert!(
        p.iter()
            .all(|x| x["memory_bytes"].as_u64().unwrap_or(0) > 0),
        "{preview}"
    );

    let (status, inst) = post_json(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": [a_id, b_id], "sharding": "pipeline"}).to_string(),
    );
    assert_eq!(status, 200, "{inst}");
    assert_eq!(inst["status"], "ready", "{inst}");
    assert_eq!(inst["sharding"], "pipeline");
    assert_eq!(inst["nodes"], json!([a_id, b_id]));
    // Every node lists the cluster's instances, not only the one that placed it.
    let on_b = get_json(&b, "/v1/instances");
    assert_eq!(on_b["data"].as_array().map(Vec::len), Some(1), "{on_b}");
    assert_eq!(on_b["data"][0]["id"], inst["id"]);
    assert_eq!(on_b["data"][0]["status"], "ready");

    // Served by the pipeline (not A's own engine: A's ledger stays as it was).
    let before = get_json(&a, "/v1/usage")["data"]
        .as_array()
        .map_or(0, Vec::len);
    let (status, split) = post_json(&a, "/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{split}");
    assert_eq!(
        split["choices"][0]["message"],
        single["choices"][0]["message"]
    );
    assert_eq!(split["usage"], single["usage"]);
    let streamed = stream_until_end(
        &a,
        "/v1/chat/completions",
        &json!({"model": model, "max_tokens": 12, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]})
        .to_string(),
        || {},
    );
    assert!(streamed.contains("data: [DONE]"), "{streamed}");
    let usage_line = streamed
        .lines()
        .find(|l| l.contains("\"usage\":{"))
        .expect("a usage chunk");
    let chunk: Value = serde_json::from_str(usage_line.trim_start_matches("data: ")).expect("JSON");
    assert_eq!(chunk["usage"], single["usage"]);
    // Both are in A's ledger as run by every stage's node (A's own engine
    // ran neither), with what the clients were sent.
    let stages = format!("{a_id},{b_id}");
    let entries = poll_until(
        || get_json(&a, "/v1/usage")["data"].clone(),
        |d| d.as_array().map_or(0, Vec::len) == before + 2,
    );
    for e in entries.as_array().expect("data").iter().take(2) {
        assert_eq!(
            e["ran_on"],
            stages.as_str(),
            "the split model ran in the pipeline: {e}"
        );
        assert_eq!(e["node"], a_id.as_str(), "{e}");
        assert_eq!(e["usage"], single["usage"], "{e}");
    }

    // B dies mid-stream: an error event, the instance fails.
    let long = json!({"model": model, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 3000,
                      "temperature": 0, "stream": true})
    .to_string();
    let mut b_server = Some(b_server);
    // Reads time out after 30 s, so a hang fails below instead of blocking.
    let sse = stream_until_end(&a, "/v1/completions", &long, || drop(b_server.take()));
    // The error comes from the first stage's engine (the ring broke) or from
    // this node's watch on the instance, whichever notices first.
    let err = sse
        .lines()
        .filter(|l| l.starts_with("data: "))
        .find(|l| l.contains("\"error\""))
        .unwrap_or_else(|| panic!("no error event: {sse}"));
    assert!(!err.contains("\"text\""), "{err}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let list = loop {
        let list = get_json(&a, "/v1/instances");
        if list["data"][0]["status"] == "failed" || std::time::Instant::now() > deadline {
            break list;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert_eq!(list["data"][0]["status"], "failed", "{list}");

    // Re-placed on the survivor alone, once the cluster has noticed the
    // dead node (so "auto" cannot pick it).
    let gone = wait_nodes(&a, |n| {
        n.iter()
            .all(|x| x["id"] != b_id.as_str() || x["status"] != "online")
    });
    assert!(
        gone.iter()
            .all(|x| x["id"] != b_id.as_str() || x["status"] != "online"),
        "{gone:?}"
    );
    let (status, again) = post_json(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": "auto"}).to_string(),
    );
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["status"], "ready");
    let (status, local) = post_json(&a, "/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{local}");
    assert_eq!(
        local["choices"][0]["message"],
        single["choices"][0]["message"]
    );
    assert_eq!(local["usage"], single["usage"]);
}

/// Two plain `shoal serve` processes on one machine (one HOME, no special
/// environment) are two nodes that list each other, and each keeps its
/// identity across a restart.
#[test]
fn two_servers_sharing_a_home_are_two_nodes() {
    let home = temp_dir("shared-home");
    // A plain `shoal serve` in `home` (its config directory unless
    // `config_home` names another), joining `peer` if given.
    let serve = |config_home: Option<&Path>, peer: Option<&str>| {
        let mut cmd = shoal();
        for v in ["XDG_DATA_HOME", "SHOAL_CONFIG", "SHOAL_PEERS"] {
            cmd.env_remove(v);
        }
        match config_home {
            Some(c) => cmd.env("XDG_CONFIG_HOME", c),
            None => cmd.env_remove("XDG_CONFIG_HOME"),
        };
        cmd.env("HOME", &home)
            .args([
                "serve",
                "--port",
                "0",
                "--prefix-cache-mb",
                "0",
                "--no-mdns",
            ])
            .args(["--cluster-secret", "shared"])
            .arg("--model")
            .arg(gguf());
        if let Some(p) = peer {
            cmd.args(["--peer", p]);
        }
        cmd
    };
    let start = |name: &str, peer: Option<&str>| {
        let dir = home.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        spawn_server(serve(None, peer), &dir)
    };
    let self_id = |addr: &str| {
        let nodes = get_json(addr, "/v1/cluster/nodes")["nodes"].clone();
        let me = nodes
            .as_array()
            .and_then(|n| n.iter().find(|x| x["self"] == true).cloned())
            .expect("a self entry");
        me["id"].as_str().expect("id").to_string()
    };
    let (a_server, a) = start("a", None);
    let (b_server, b) = start("b", Some(&a));
    let (a_id, b_id) = (self_id(&a), self_id(&b));
    assert_ne!(a_id, b_id, "two processes, two identities");
    for addr in [&a, &b] {
        let nodes = wait_nodes(addr, |n| {
            n.len() == 2 && n.iter().all(|x| x["status"] == "online")
        });
        let ids: std::collections::BTreeSet<&str> =
            nodes.iter().filter_map(|n| n["id"].as_str()).collect();
        assert_eq!(
            ids,
            [a_id.as_str(), b_id.as_str()].into(),
            "{addr}: {nodes:?}"
        );
    }
    drop(b_server);
    drop(a_server);
    // Restarted alone, the first takes its own identity again.
    let (again_server, again) = start("a2", None);
    assert_eq!(self_id(&again), a_id);

    // A copied config directory makes a twin: the node that hears its own
    // id from another address says so in its log.
    let copy = temp_dir("twin-config");
    std::fs::create_dir_all(copy.join("shoal")).expect("mkdir");
    let config = home.join(".config/shoal/node-id");
    std::fs::copy(&config, copy.join("shoal/node-id")).expect("copy node-id");
    let dir = copy.join("run");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (_twin, twin) = spawn_server(serve(Some(&copy), Some(&again)), &dir);
    assert_eq!(self_id(&twin), a_id, "the copy carries the id");
    wait_for_log(
        &dir.join("stderr.log"),
        "another node has this node's id",
        "the twin never warned",
    );
    drop(again_server);
}

/// The usage ledger lasts: requests answered before a `kill -9` are all in
/// it after a restart, and `shoal usage` (reading the store, no server)
/// lists, sums per client and exports them with the totals the clients
/// were sent.
#[test]
fn the_usage_ledger_survives_kill_9_and_shoal_usage_reads_it() {
    let dir = temp_dir("ledger-kill");
    let db = dir.join("store.sqlite");
    let serve = |c: &mut std::process::Command| {
        c.args(["serve", "--port", "0", "--backend", gguf_backend()])
            .arg("--model")
            .arg(gguf())
            .arg("--db")
            .arg(&db)
            .args(["--api-key", "opencode=sk-oc", "--api-key", "ci=sk-ci"]);
    };
    let (mut server, addr) = start_server(&dir, serve);
    let key = |k: &str| [("authorization", format!("Bearer {k}"))];
    let chat = |n: u32| {
        json!({"model": crate_model_id(), "n": n, "max_tokens": 6,
               "messages": [{"role": "user", "content": "Name a colour."}]})
        .to_string()
    };
    // (client, prompt + completion tokens as each client was told)
    let mut sent: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut ids = Vec::new();
    for (client, k, n) in [
        ("opencode", "sk-oc", 1),
        ("opencode", "sk-oc", 2),
        ("ci", "sk-ci", 1),
    ] {
        let (status, v) = post_json_with(&addr, "/v1/chat/completions", &chat(n), &key(k));
        assert_eq!(status, 200, "{v}");
        *sent.entry(client).or_default() += v["usage"]["total_tokens"].as_u64().expect("total");
        ids.push(v["id"].as_str().expect("id").to_string());
    }
    let msg = json!({"model": crate_model_id(), "max_tokens": 5,
                     "messages": [{"role": "user", "content": "Hi"}]});
    let (status, m) = post_json_with(
        &addr,
        "/v1/messages",
        &msg.to_string(),
        &[
            ("x-api-key", "sk-ci".to_string()),
            ("x-shoal-turn", "chat-9/m1/v0".to_string()),
        ],
    );
    assert_eq!(status, 200, "{m}");
    let u = &m["usage"];
    *sent.entry("ci").or_default() += [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens",
    ]
    .iter()
    .map(|f| u[*f].as_u64().unwrap_or(0))
    .sum::<u64>();
    ids.push(m["id"].as_str().expect("id").to_string());

    // SIGKILL: no shutdown, no flush.
    server.0.kill().expect("kill -9");
    let _ = server.0.wait();

    let usage = |args: &[&str]| {
        let (ok, out, err) = output(
            shoal_isolated(&dir)
                .arg("usage")
                .arg("--db")
                .arg(&db)
                .args(args),
        );
        assert!(ok, "shoal usage {args:?}: {err}");
        out
    };
    let listed: Value = serde_json::from_str(&usage(&["--json"])).expect("json");
    let mut listed_ids: Vec<String> = listed["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|e| e["id"].as_str().expect("id").to_string())
        .collect();
    listed_ids.reverse();
    assert_eq!(listed_ids, ids, "every answered request survived, in order");
    let groups: Value =
        serde_json::from_str(&usage(&["--group-by", "client", "--json"])).expect("json");
    for (client, total) in &sent {
        let g = groups
            .as_array()
            .and_then(|g| g.iter().find(|x| x["key"] == *client))
            .unwrap_or_else(|| panic!("no {client} in {groups}"));
        assert_eq!(
            g["total_tokens"].as_u64(),
            Some(*total),
            "{client}: {groups}"
        );
    }
    // The one request that named its chat turn, found by it.
    let turn: Value =
        serde_json::from_str(&usage(&["--turn", "chat-9/m1/v0", "--json"])).expect("json");
    assert_eq!(turn["data"].as_array().map(Vec::len), Some(1), "{turn}");
    assert_eq!(turn["data"][0]["id"], m["id"], "{turn}");
    let csv = usage(&["--csv", "--client", "ci"]);
    assert_eq!(
        csv.lines().count(),
        3,
        "a header and ci's two requests: {csv}"
    );
    let table = usage(&["--since", "today", "--client", "opencode"]);
    assert!(table.contains("2 requests:"), "{table}");
    assert!(
        !table.contains("sk-oc") && !csv.contains("sk-ci"),
        "a key leaked"
    );
    assert!(!table.contains("cost"), "no prices, no cost: {table}");

    // With the config's prices, the same sums say what they would cost.
    let config = dir.join("prices.toml");
    std::fs::write(
        &config,
        format!(
            "[prices.{:?}]\ninput_per_mtok = 2.0\ncached_input_per_mtok = 0.5\noutput_per_mtok = 10.0\n",
            crate_model_id()
        ),
    )
    .expect("write config");
    let config = config.to_string_lossy().into_owned();
    let priced: Value = serde_json::from_str(&usage(&[
        "--config",
        &config,
        "--group-by",
        "client",
        "--json",
    ]))
    .expect("json");
    for g in priced.as_array().expect("groups") {
        let n = |k: &str| g[k].as_f64().expect("count");
        let want = ((n("prompt_tokens") - n("cached_tokens")) * 2.0
            + n("cached_tokens") * 0.5
            + n("completion_tokens") * 10.0)
            / 1e6;
        let cost = g["cost"]["total"].as_f64().expect("cost");
        assert!(want > 0.0 && (cost - want).abs() < 1e-12, "{g}");
    }
    let table = usage(&["--config", &config, "--group-by", "client"]);
    assert!(
        table.lines().next().is_some_and(|h| h.ends_with("cost"))
            && table.contains("cost at the configured prices:"),
        "{table}"
    );

    // A restarted server serves the same ledger, pruned to the newest three
    // by the retention setting.
    let (_server, addr) = start_server(&dir, |c| {
        serve(c);
        c.args(["--usage-retention-rows", "3"]);
    });
    let v = poll_until(
        || get_with(&addr, "/v1/usage", &key("sk-oc")).1,
        |v| v["data"].as_array().map(Vec::len) == Some(3),
    );
    let kept: Vec<&str> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert_eq!(kept, [&ids[3], &ids[2], &ids[1]], "{v}");
    assert_eq!(v["data"][0]["client"], "ci");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mixture-of-experts model (the tiny gpt_oss made by mlx-lm's own class:
/// experts, attention sinks, sliding windows) split by layers over two
/// nodes on MLX's ring answers exactly like one node, and `shoal models`
/// says which backend runs it.
#[test]
fn a_mixture_of_experts_split_over_two_nodes_answers_like_one() {
    let root = std::env::var("SHOAL_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache"))
        });
    let model_dir = root.join("models/tiny-v1/gpt_oss-f32");
    assert!(
        model_dir.join("config.json").is_file(),
        "tiny model missing at {} — run `make models`",
        model_dir.display()
    );
    let (ok, out, err) = output(
        shoal_isolated(&temp_dir("moe-models"))
            .args(["models", "--json", "--backend", "mlx", "--model"])
            .arg(&model_dir),
    );
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(out.trim()).expect("models JSON");
    let row = listed
        .as_array()
        .and_then(|a| a.iter().find(|m| m["architecture"] == "gpt_oss"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(row["backend"], "mlx", "{row}");

    let start = |name: &str, extra: &[&str]| {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        mlx_node(&temp_dir(&format!("moe-{name}")), &model_dir, "moe", &args)
    };
    let (_a, a) = start("a", &[]);
    let (_b, _) = start("b", &["--peer", &a]);
    let nodes = wait_nodes(&a, |n| {
        n.len() == 2 && n.iter().all(|x| x["status"] == "online")
    });
    let ids: Vec<String> = nodes
        .iter()
        .map(|n| n["id"].as_str().expect("id").to_string())
        .collect();
    let model = shoal::id_from_path(&model_dir);
    let ask = json!({"model": model, "max_tokens": 16, "temperature": 0,
                     "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    .to_string();
    let (status, single) = post_json(&a, "/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{single}");
    let (status, inst) = post_json(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": ids, "sharding": "pipeline"}).to_string(),
    );
    assert_eq!(status, 200, "{inst}");
    assert_eq!(inst["status"], "ready", "{inst}");
    let (status, split) = post_json(&a, "/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{split}");
    assert_eq!(
        split["choices"][0]["message"],
        single["choices"][0]["message"]
    );
    assert_eq!(split["usage"], single["usage"]);
    assert_eq!(
        split["choices"][0]["finish_reason"],
        single["choices"][0]["finish_reason"]
    );
}

/// The Ollama port switch, turned on through the API, is remembered in the
/// store: the next `shoal serve` on that store listens there without a flag,
/// and a flag still decides over it, `off` included.
#[test]
fn the_ollama_port_switch_is_remembered_across_restarts() {
    let dir = temp_dir("ollama-switch");
    let db = dir.join("store.sqlite");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let serve = |extra: Vec<String>| {
        let db = db.clone();
        move |c: &mut std::process::Command| {
            c.args(["serve", "--port", "0", "--backend", gguf_backend()])
                .arg("--model")
                .arg(gguf())
                .arg("--db")
                .arg(&db)
                .args(extra);
        }
    };
    let (server, addr) = start_server(&dir, serve(vec![]));
    assert_eq!(get_json(&addr, "/health")["ollama"]["enabled"], false);
    let body = json!({"enabled": true, "port": port}).to_string();
    let (status, _, v) = request(&addr, "PUT", "/v1/settings/ollama-port", &[], Some(&body));
    assert_eq!(status, 200, "{v}");
    drop(server);

    let (server, addr) = start_server(&dir, serve(vec![]));
    let health = get_json(&addr, "/health");
    assert_eq!(health["ollama"]["listening"], true, "{health}");
    assert_eq!(health["ollama"]["port"], port);
    let tags = get_json(&format!("127.0.0.1:{port}"), "/api/tags");
    assert!(
        tags["models"].as_array().is_some_and(|m| !m.is_empty()),
        "{tags}"
    );
    drop(server);

    // A flag decides over what the switch remembered.
    let other = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let (server, addr) = start_server(&dir, serve(vec!["--ollama-port".into(), other.to_string()]));
    assert_eq!(get_json(&addr, "/health")["ollama"]["port"], other);
    drop(server);
    // And `off` says no, as the switch's own off state does.
    let (_server, addr) = start_server(&dir, serve(vec!["--ollama-port".into(), "off".into()]));
    let health = get_json(&addr, "/health");
    assert_eq!(health["ollama"]["enabled"], false, "{health}");
    assert_eq!(health["ollama"]["listening"], false, "{health}");
}

/// `--draft-model` names a model to draft for the served one: a file of
/// another vocabulary stops `serve` with the reason, before it listens.
#[test]
fn serve_refuses_a_draft_model_of_another_vocabulary() {
    let dir = temp_dir("draft-model-mismatch");
    // The default model with one token renamed (`make models`).
    let other = think_gguf();
    let (ok, out, err) = output(
        shoal_isolated(&dir)
            .args(["serve", "--port", "0", "--backend", "llama", "--model"])
            .arg(gguf())
            .arg("--draft-model")
            .arg(&other),
    );
    assert!(!ok, "served with a mismatched draft model: {out}");
    assert!(!out.contains("listening"), "{out}");
    assert!(
        err.contains("draft model") && err.contains("vocabulary") && err.contains("token 4"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The prefix cache's disk tier from the terminal: a server stopped with
/// SIGTERM (as service managers stop it) leaves its long prefix on disk,
/// `shoal cache` lists it (model, tokens, bytes) with no server running, and
/// `--clear` removes it; with the tier off it says so.
#[test]
fn shoal_cache_lists_and_clears_what_a_server_kept_on_disk() {
    let dir = temp_dir("cache-cli");
    let db = dir.join("store.sqlite");
    let serve = |c: &mut std::process::Command| {
        c.args(["serve", "--port", "0", "--backend", gguf_backend()])
            .arg("--model")
            .arg(gguf())
            .arg("--db")
            .arg(&db);
    };
    let (mut server, addr) = start_server(&dir, serve);
    let rules: String = (1..=24)
        .map(|i| format!("Rule {i}: answer briefly, in plain words, and only what is asked. "))
        .collect();
    let body = json!({"model": crate_model_id(), "max_tokens": 4,
                      "messages": [{"role": "system", "content": rules},
                                   {"role": "user", "content": "Name a colour."}]});
    let (status, v) = post_json(&addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().expect("prompt");
    // SIGTERM: a graceful stop, the cache's writes land before exit.
    let pid = server.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let exited = server.0.wait().expect("wait");
    assert!(exited.success(), "a graceful exit: {exited:?}");

    let cache = |args: &[&str]| {
        let (ok, out, err) = output(
            shoal_isolated(&dir)
                .arg("cache")
                .arg("--db")
                .arg(&db)
                .args(args),
        );
        assert!(ok, "shoal cache {args:?}: {err}");
        out
    };
    let listed: Value = serde_json::from_str(&cache(&["--json"])).expect("json");
    let entries = listed["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["model"], crate_model_id());
    // The prompt and the reply's tokens but its last (never fed back).
    let tokens = entries[0]["tokens"].as_u64().expect("tokens");
    assert!(
        tokens >= prompt && tokens < prompt + 4,
        "{tokens} tokens for a {prompt}-token prompt"
    );
    assert!(entries[0]["bytes"].as_u64().expect("bytes") > 1000 * tokens);
    // Kept in blocks of 256 positions.
    assert_eq!(entries[0]["blocks"].as_u64(), Some(tokens.div_ceil(256)));
    let table = cache(&[]);
    assert!(
        table.contains(&crate_model_id()) && table.contains("1 entries"),
        "{table}"
    );
    assert!(cache(&["--clear"]).starts_with("removed 1 entries"));
    let listed: Value = serde_json::from_str(&cache(&["--json"])).expect("json");
    assert_eq!(listed["entries"].as_array().map(Vec::len), Some(0));
    let (ok, _, err) = output(
        shoal_isolated(&dir)
            .args(["cache", "--cache-disk-mb", "off", "--db"])
            .arg(&db),
    );
    assert!(!ok && err.contains("disk tier is off"), "{err}");
}
