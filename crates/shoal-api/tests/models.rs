//! The model pool over HTTP on the real default model: `/v1/models` with
//! local metadata, `POST /v1/models/pull` streaming progress from a loopback
//! hub fixture, load on first use, the memory budget, idle unload, explicit
//! load / unload and deletion.
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gguf;
use serde_json::{json, Value};
use shoal_api::pool::{ModelPool, PoolOptions};
use shoal_api::AppState;
use shoal_engine::EngineOptions;
use shoal_hub_fixture::{FixtureFile, FixtureRepo, HubFixture};
use shoal_models::{HubOptions, Library};

const DEFAULT: &str = "smollm2";
const PULLED: &str = "test/SmolLM2-GGUF";

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-models-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A hub serving the default model's GGUF file as `test/SmolLM2-GGUF`.
fn hub() -> HubFixture {
    let bytes = std::fs::read(gguf()).unwrap();
    HubFixture::start(vec![FixtureRepo {
        id: PULLED.into(),
        commit: "1111111111111111111111111111111111111111".into(),
        files: vec![
            FixtureFile::new("SmolLM2-135M-Instruct.Q4_1.gguf", bytes, true),
            FixtureFile::new("README.md", b"# SmolLM2".to_vec(), false),
        ],
        token: None,
    }])
}

fn options(hub: &HubFixture, home: &Path) -> PoolOptions {
    PoolOptions {
        engine: EngineOptions {
            prefix_cache_bytes: 0,
            ..common::options()
        },
        budget_bytes: None,
        idle_unload: None,
        hub: HubOptions {
            endpoint: hub.endpoint.clone(),
            token: None,
            library: Library::at(home.join("hub")),
            chunk_bytes: 10 << 20,
            retries: 0,
        },
    }
}

async fn serve(pool: Arc<ModelPool>) -> String {
    common::serve(AppState::with_pool(pool)).await
}

async fn send(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, String) {
    let mut r = reqwest::Client::new().request(method, url);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn get_json(base: &str, path: &str) -> Value {
    let (status, text) = send(reqwest::Method::GET, format!("{base}{path}"), None).await;
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

async fn post_json(base: &str, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = send(reqwest::Method::POST, format!("{base}{path}"), Some(body)).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn entry<'a>(list: &'a Value, id: &str) -> &'a Value {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in {list}"))
}

/// Splits an SSE body into (event, data) pairs.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.into();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (!data.is_empty()).then(|| (name, serde_json::from_str(&data).unwrap()))
        })
        .collect()
}

async fn chat(base: &str, model: &str) -> (u16, Value) {
    post_json(
        base,
        "/v1/chat/completions",
        json!({"model": model, "max_tokens": 12, "temperature": 0,
               "messages": [{"role": "user", "content": "Name a colour."}]}),
    )
    .await
}

/// Waits (bounded) until `model`'s `loaded` flag is `want`.
async fn until_loaded(base: &str, model: &str, want: bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = get_json(base, "/v1/models").await;
        if entry(&list, model)["shoal"]["loaded"] == want || Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn pull_lists_loads_on_demand_and_answers_like_the_same_weights() {
    let hub = hub();
    let home = temp("pull");
    let pool = ModelPool::new(options(&hub, &home));
    pool.add_named(DEFAULT, gguf(), vec!["default".into()]);
    let base = serve(pool).await;

    // Nothing is loaded until asked; the alias is listed after the models.
    let list = get_json(&base, "/v1/models").await;
    let d = entry(&list, DEFAULT);
    assert_eq!(d["shoal"]["loaded"], false);
    assert_eq!(d["shoal"]["architecture"], "llama");
    assert_eq!(d["shoal"]["quantization"], "Q4_1");
    assert_eq!(d["shoal"]["context_length"], 8192);
    assert_eq!(d["shoal"]["source"]["kind"], "path");
    assert_eq!(entry(&list, "default")["shoal"]["alias_of"], DEFAULT);

    let (status, text) = send(
        reqwest::Method::POST,
        format!("{base}/v1/models/pull"),
        Some(json!({"model": PULLED})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let evs = events(&text);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"plan"), "{names:?}");
    assert_eq!(names.last(), Some(&"done"), "{names:?}");
    let plan = &evs[0].1;
    assert_eq!(
        plan["files"].as_array().unwrap().len(),
        1,
        "README is not pulled: {plan}"
    );
    let total = plan["total_bytes"].as_u64().unwrap();
    assert_eq!(total, std::fs::metadata(gguf()).unwrap().len());
    let progress: Vec<u64> = evs
        .iter()
        .filter(|(n, _)| n == "progress")
        .map(|(_, v)| v["bytes"].as_u64().unwrap())
        .collect();
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    assert_eq!(progress.last(), Some(&total));
    assert!(evs
        .iter()
        .any(|(n, v)| n == "file_done" && v["verified"] == true));
    let done = &evs.last().unwrap().1;
    let id = done["model"]["id"].as_str().unwrap().to_string();
    assert_eq!(id, format!("{PULLED}/SmolLM2-135M-Instruct.Q4_1.gguf"));

    let list = get_json(&base, "/v1/models").await;
    let p = entry(&list, &id);
    assert_eq!(p["shoal"]["source"]["kind"], "hub");
    assert_eq!(p["shoal"]["source"]["repo"], PULLED);
    assert_eq!(p["shoal"]["size_bytes"], total);
    assert_eq!(p["shoal"]["loaded"], false);
    assert_eq!(list["shoal"]["library_bytes"], total);

    // Both names load on first use and, being the same weights, answer alike.
    let (s1, a) = chat(&base, DEFAULT).await;
    assert_eq!(s1, 200, "{a}");
    let (s2, b) = chat(&base, PULLED).await;
    assert_eq!(s2, 200, "{b}");
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
    assert_eq!(a["usage"], b["usage"]);
    assert_eq!(b["model"], PULLED);

    let list = get_json(&base, "/v1/models").await;
    for m in [DEFAULT, id.as_str()] {
        let e = &entry(&list, m)["shoal"];
        assert_eq!(e["loaded"], true, "{m}");
        let actual = e["memory_bytes"].as_f64().unwrap();
        let estimate = e["estimated_memory_bytes"].as_f64().unwrap();
        assert!(
            (estimate / actual - 1.0).abs() < 0.25,
            "{m}: estimated {estimate} for {actual}"
        );
    }
    let health = get_json(&base, "/health").await;
    assert_eq!(health["loaded"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn the_budget_unloads_idle_models_and_refuses_what_cannot_fit() {
    let hub = hub();
    let home = temp("budget");
    // The pool's own estimate for the backend under test (llama.cpp keeps
    // the quantized weights, MLX on a CPU expands them).
    let probe = ModelPool::new(options(&hub, &home));
    probe.add_named(DEFAULT, gguf(), vec![]);
    let listed = get_json(&serve(probe).await, "/v1/models").await;
    let one = entry(&listed, DEFAULT)["shoal"]["estimated_memory_bytes"]
        .as_u64()
        .expect("an estimate");
    let mut opts = options(&hub, &home);
    // Room for one copy, not two.
    opts.budget_bytes = Some(one * 3 / 2);
    let pool = ModelPool::new(opts);
    pool.add_named(DEFAULT, gguf(), vec![]);
    pool.add_named("copy", gguf(), vec![]);
    let base = serve(pool).await;

    assert_eq!(chat(&base, DEFAULT).await.0, 200);
    assert_eq!(chat(&base, "copy").await.0, 200);
    let list = get_json(&base, "/v1/models").await;
    assert_eq!(entry(&list, "copy")["shoal"]["loaded"], true);
    assert_eq!(
        entry(&list, DEFAULT)["shoal"]["loaded"],
        false,
        "idle model kept over budget"
    );
    assert!(list["shoal"]["memory_loaded_bytes"].as_u64().unwrap() <= one * 3 / 2);

    // Explicit unload and load.
    let (status, v) = post_json(&base, "/v1/models/copy/unload", json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["shoal"]["loaded"], false);
    let (status, v) = post_json(&base, &format!("/v1/models/{DEFAULT}/load"), json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["shoal"]["loaded"], true);
    let (status, v) = post_json(&base, "/v1/models/nope/load", json!({})).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found");

    // A budget smaller than the model: refused with the figures.
    let mut small = options(&hub, &home);
    small.budget_bytes = Some(one / 2);
    let pool = ModelPool::new(small);
    pool.add_named(DEFAULT, gguf(), vec![]);
    let tight = serve(pool).await;
    let (status, v) = chat(&tight, DEFAULT).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_memory");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("budget") && msg.contains("GiB"), "{msg}");
    // The server keeps serving.
    assert_eq!(
        get_json(&tight, "/v1/models").await["data"][0]["shoal"]["loaded"],
        false
    );
}

#[tokio::test]
async fn idle_models_unload_and_come_back_on_the_next_request() {
    let hub = hub();
    let home = temp("idle");
    let mut opts = options(&hub, &home);
    opts.idle_unload = Some(Duration::from_secs(1));
    let pool = ModelPool::new(opts);
    pool.add_named(DEFAULT, gguf(), vec![]);
    let base = serve(pool).await;
    let (status, first) = chat(&base, DEFAULT).await;
    assert_eq!(status, 200);
    let list = until_loaded(&base, DEFAULT, false).await;
    assert_eq!(
        entry(&list, DEFAULT)["shoal"]["loaded"],
        false,
        "never unloaded"
    );
    let (status, again) = chat(&base, DEFAULT).await;
    assert_eq!(status, 200);
    assert_eq!(
        first["choices"][0]["message"],
        again["choices"][0]["message"]
    );
}

#[tokio::test]
async fn deleting_and_pull_errors_answer_in_the_openai_shape() {
    let hub = hub();
    let home = temp("delete");
    let pool = ModelPool::new(options(&hub, &home));
    pool.add_named(DEFAULT, gguf(), vec![]);
    let base = serve(pool).await;

    let (status, v) = post_json(&base, "/v1/models/pull", json!({"model": "not a repo"})).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "model");
    let (status, v) = post_json(
        &base,
        "/v1/models/pull",
        json!({"model": PULLED, "bogus": 1}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let (_, text) = send(
        reqwest::Method::POST,
        format!("{base}/v1/models/pull"),
        Some(json!({"model": "test/absent"})),
    )
    .await;
    let evs = events(&text);
    let (name, err) = evs.last().unwrap();
    assert_eq!(name, "error", "{text}");
    assert_eq!(err["error"]["code"], "hub_not_found");
    let (status, v) = post_json(
        &base,
        "/v1/models/pull",
        json!({"model": PULLED, "file": "missing.gguf", "stream": false}),
    )
    .await;
    assert_eq!(status, 404, "{v}");

    let (status, v) = post_json(
        &base,
        "/v1/models/pull",
        json!({"model": PULLED, "stream": false}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    // The repo id finds its only GGUF file.
    assert_eq!(chat(&base, PULLED).await.0, 200);
    let (status, text) = send(
        reqwest::Method::DELETE,
        format!("{base}/v1/models/{PULLED}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["deleted"].as_bool()),
        (Some(id.as_str()), Some(true))
    );
    let list = get_json(&base, "/v1/models").await;
    assert!(list["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["id"] != id.as_str()));
    assert_eq!(chat(&base, PULLED).await.0, 404);
    let (status, _) = send(
        reqwest::Method::DELETE,
        format!("{base}/v1/models/{PULLED}"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, text) = send(
        reqwest::Method::DELETE,
        format!("{base}/v1/models/{DEFAULT}"),
        None,
    )
    .await;
    assert_eq!(status, 400, "{text}");
}

/// Damaged model files (and a broken tokenizer) fail their own requests with a clear 503, in each
/// dialect's shape, while the server goes on serving the good model.
#[tokio::test]
async fn truncated_and_corrupt_models_fail_clearly_and_the_server_keeps_serving() {
    let hub = hub();
    let home = temp("damaged");
    let bytes = std::fs::read(gguf()).unwrap();
    let truncated = home.join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let corrupt = home.join("corrupt.gguf");
    let mut garbled = bytes.clone();
    // Keep the magic, garble the header after it.
    for b in garbled.iter_mut().skip(8).take(4096) {
        *b = 0xA5;
    }
    std::fs::write(&corrupt, &garbled).unwrap();
    let not_gguf = home.join("text.gguf");
    std::fs::write(&not_gguf, b"this is not a model").unwrap();
    // A model directory whose tokenizer is broken (the weights are fine).
    let hf = std::env::var("SHOAL_TEST_HF_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../.cache/models/smollm2-135m-mlx-f32")
        });
    let bad_tok = home.join("bad-tokenizer");
    std::fs::create_dir_all(&bad_tok).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer_config.json"] {
        std::os::unix::fs::symlink(hf.join(f), bad_tok.join(f)).unwrap();
    }
    std::fs::write(
        bad_tok.join("tokenizer.json"),
        br#"{"model": {"type": "BPE", "vocab": 7}}"#,
    )
    .unwrap();
    // A directory of an architecture no backend runs.
    let falcon = home.join("falcon-dir");
    std::fs::create_dir_all(&falcon).unwrap();
    std::fs::write(
        falcon.join("config.json"),
        br#"{"model_type": "falcon", "hidden_size": 64}"#,
    )
    .unwrap();
    let pool = ModelPool::new(options(&hub, &home));
    pool.add_named(DEFAULT, gguf(), vec![]);
    for (id, path) in [
        ("truncated", &truncated),
        ("corrupt", &corrupt),
        ("text", &not_gguf),
        ("tokenizer", &bad_tok),
        ("falcon", &falcon),
    ] {
        pool.add_named(id, path.clone(), vec![]);
    }
    let base = serve(pool).await;
    // Listed before anyone tries it: no backend, and the sentence why.
    let list = get_json(&base, "/v1/models").await;
    let f = &entry(&list, "falcon")["shoal"];
    assert!(f["backend"].is_null(), "{f}");
    let why = f["unavailable"].as_str().unwrap_or_else(|| panic!("{f}"));
    if common::test_backend() != shoal_engine::BackendChoice::Llama {
        assert!(
            why.contains("'falcon'") && why.contains("tried: mlx"),
            "{why}"
        );
    }
    for id in ["truncated", "corrupt", "text", "tokenizer", "falcon"] {
        let (status, v) = chat(&base, id).await;
        assert_eq!(status, 503, "{id}: {v}");
        assert_eq!(v["error"]["code"], "model_unavailable", "{id}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(id), "{v}");
        let (status, v) = post_json(
            &base,
            "/v1/messages",
            json!({"model": id, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
        assert_eq!(status, 503, "{id}: {v}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "api_error");
        let (status, v) = chat(&base, DEFAULT).await;
        assert_eq!(status, 200, "after {id}: {v}");
    }
}

/// Ollama's pull, tags, chat and delete on the pool and the library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_pull_streams_progress_and_delete_removes() {
    let hub = hub();
    let home = temp("ollama");
    let pool = ModelPool::new(options(&hub, &home));
    pool.add_named(DEFAULT, gguf(), vec![]);
    let base = serve(pool).await;
    let lines = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    };

    // Ollama's name for a hub GGUF of one quantization.
    let (status, text) = send(
        reqwest::Method::POST,
        format!("{base}/api/pull"),
        Some(json!({"model": format!("hf.co/{PULLED}:Q4_1")})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let got = lines(&text);
    assert_eq!(
        got.first(),
        Some(&json!({"status": "pulling manifest"})),
        "{text}"
    );
    assert_eq!(got.last(), Some(&json!({"status": "success"})), "{text}");
    let total = std::fs::metadata(gguf()).unwrap().len();
    let progress: Vec<&Value> = got.iter().filter(|l| l["digest"].is_string()).collect();
    assert!(!progress.is_empty(), "{text}");
    assert!(progress.iter().all(|l| l["total"] == total
        && l["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:"))
        && l["status"]
            .as_str()
            .is_some_and(|s| s.starts_with("pulling "))));
    let done: Vec<u64> = progress
        .iter()
        .map(|l| l["completed"].as_u64().unwrap())
        .collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
    assert_eq!(done.last(), Some(&total));
    assert!(got.iter().any(|l| l["status"] == "verifying sha256 digest"));

    let name = format!("{PULLED}/SmolLM2-135M-Instruct.Q4_1.gguf:latest");
    let tags = get_json(&base, "/api/tags").await;
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        names.contains(&name.as_str()) && names.contains(&"smollm2:latest"),
        "{names:?}"
    );
    let (status, v) = post_json(
        &base,
        "/api/chat",
        json!({"model": name, "stream": false, "options": {"num_predict": 2},
               "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], name.as_str());

    let (status, text) = send(
        reqwest::Method::DELETE,
        format!("{base}/api/delete"),
        Some(json!({"model": name})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let tags = get_json(&base, "/api/tags").await;
    assert!(!tags.to_string().contains(&name), "{tags}");
    let (status, text) = send(
        reqwest::Method::DELETE,
        format!("{base}/api/delete"),
        Some(json!({"model": name})),
    )
    .await;
    assert_eq!(status, 404, "{text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string());

    // A quantization the repo lacks and a repo the hub lacks end the
    // stream with Ollama's error line.
    for model in [format!("hf.co/{PULLED}:Q8_0"), "test/absent".to_string()] {
        let (status, text) = send(
            reqwest::Method::POST,
            format!("{base}/api/pull"),
            Some(json!({ "model": model })),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let last = lines(&text).pop().unwrap();
        assert!(last["error"].is_string(), "{model}: {text}");
    }
    let (status, v) = post_json(&base, "/api/pull", json!({"model": "llama3"})).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].is_string());
}

/// Finding a model before downloading it: the hub's search by name, a
/// repository's files with their quantization and size, and for each GGUF
/// the memory the pool will count it at once pulled, read from the first
/// bytes of one file (never the whole of it), and whether that fits the
/// budget.
#[tokio::test]
async fn hub_search_lists_files_with_the_estimate_they_get_once_pulled() {
    let q4 = std::fs::read(gguf()).unwrap();
    let q8 = std::fs::read(common::q8_gguf()).unwrap();
    let (q4_len, q8_len) = (q4.len() as u64, q8.len() as u64);
    let hub = HubFixture::start(vec![
        FixtureRepo {
            id: PULLED.into(),
            commit: "1111111111111111111111111111111111111111".into(),
            files: vec![
                FixtureFile::new("SmolLM2-135M-Instruct.Q8_0.gguf", q8, true),
                FixtureFile::new("SmolLM2-135M-Instruct.Q4_1.gguf", q4, true),
                FixtureFile::new("README.md", b"# SmolLM2".to_vec(), false),
            ],
            token: None,
        },
        FixtureRepo {
            id: "test/other-model".into(),
            commit: "2222222222222222222222222222222222222222".into(),
            files: vec![FixtureFile::new("README.md", b"# nothing".to_vec(), false)],
            token: None,
        },
    ]);
    let home = temp("find");
    // The estimate once pulled, from the pool as it lists the file on disk.
    let probe = ModelPool::new(options(&hub, &home));
    probe.add_named("q4", gguf(), vec![]);
    probe.add_named("q8", common::q8_gguf(), vec![]);
    let listed = get_json(&serve(probe).await, "/v1/models").await;
    let on_disk = |id: &str| {
        entry(&listed, id)["shoal"]["estimated_memory_bytes"]
            .as_u64()
            .unwrap()
    };
    let (q4_need, q8_need) = (on_disk("q4"), on_disk("q8"));

    let mut opts = options(&hub, &home);
    // Room for the smaller of the two only (MLX on a CPU expands both
    // alike, so there both fit or neither does).
    opts.budget_bytes = Some((q4_need + q8_need) / 2);
    let base = serve(ModelPool::new(opts)).await;

    let found = get_json(&base, "/v1/hub/search?q=smollm2").await;
    assert_eq!(found["data"].as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found["data"][0]["id"], PULLED);
    assert_eq!(found["data"][0]["gguf"], true);
    let none = get_json(&base, "/v1/hub/search?q=no-such-model").await;
    assert_eq!(none["data"], json!([]));

    let requests_before = hub.requests().len();
    let files = get_json(&base, &format!("/v1/hub/files?repo={PULLED}")).await;
    let rows = files["files"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct.Q8_0.gguf"
        ],
        "GGUF files, smallest first; the README is not a model"
    );
    assert_eq!(files["architecture"], "llama");
    assert_eq!(files["context_length"], 8192);
    for (row, quant, len, need) in [
        (&rows[0], "Q4_1", q4_len, q4_need),
        (&rows[1], "Q8_0", q8_len, q8_need),
    ] {
        assert_eq!(row["quantization"], quant);
        assert_eq!(row["size_bytes"], len);
        assert_eq!(row["estimated_memory_bytes"], need, "{row}: as once pulled");
        assert_eq!(
            row["fits"],
            need <= files["memory_budget_bytes"].as_u64().unwrap()
        );
        assert_eq!(row["pull"]["file"], row["name"]);
    }
    if q4_need != q8_need {
        assert_eq!(
            (rows[0]["fits"].clone(), rows[1]["fits"].clone()),
            (json!(true), json!(false))
        );
    }
    // One header was read, by ranges, not a whole file.
    let reads: Vec<_> = hub.requests()[requests_before..]
        .iter()
        .filter(|r| r.path.contains("/resolve/"))
        .cloned()
        .collect();
    assert!(
        !reads.is_empty()
            && reads
                .iter()
                .all(|r| r.range.is_some_and(|(a, b)| a == 0 && b + 1 < q4_len)),
        "{reads:?}"
    );

    // Pulling the listed file as the listing says gives the model it described.
    let (status, text) = send(
        reqwest::Method::POST,
        format!("{base}/v1/models/pull"),
        Some(json!({"model": rows[0]["pull"]["model"], "file": rows[0]["pull"]["file"], "stream": false})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let pulled: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(pulled["shoal"]["estimated_memory_bytes"], q4_need);

    // Errors in the OpenAI shape: no text, no such repository, no model files.
    for (path, status) in [
        ("/v1/hub/search?q=%20", 400),
        ("/v1/hub/files?repo=test/missing", 404),
        ("/v1/hub/files?repo=not-a-repo", 400),
        ("/v1/hub/files?repo=test/other-model", 400),
    ] {
        let (got, text) = send(reqwest::Method::GET, format!("{base}{path}"), None).await;
        assert_eq!(got, status, "{path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{path}: {v}"
        );
    }
}

/// What a model can do is known before it loads, by the rule a load
/// applies: `/v1/models` says the same of each model unloaded as loaded
/// (the UI's Reasoning control reads it, loaded or not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_the_same_before_and_after_a_model_loads() {
    let hub = hub();
    let home = temp("capabilities");
    let pool = ModelPool::new(options(&hub, &home));
    let mut models = vec![(DEFAULT, gguf()), ("thinker", common::think_gguf())];
    // A model directory runs on MLX only.
    if common::test_backend() != shoal_engine::BackendChoice::Llama {
        if let Ok(dir) = std::env::var("SHOAL_TEST_HF_DIR") {
            models.push(("hf-dir", PathBuf::from(dir)));
        }
    }
    for (id, path) in &models {
        pool.add_named(id, path.clone(), vec![]);
    }
    let base = serve(pool).await;
    let cold = get_json(&base, "/v1/models").await;
    for (id, _) in &models {
        let before = &entry(&cold, id)["shoal"];
        assert_eq!(before["loaded"], false, "{id}");
        assert!(
            before["capabilities"]["chat"].is_boolean(),
            "{id}: {before}"
        );
        let (status, v) = post_json(&base, &format!("/v1/models/{id}/load"), json!({})).await;
        assert_eq!(status, 200, "{id}: {v}");
        let warm = until_loaded(&base, id, true).await;
        assert_eq!(
            entry(&warm, id)["shoal"]["capabilities"],
            before["capabilities"],
            "{id}"
        );
        let (status, v) = post_json(&base, &format!("/v1/models/{id}/unload"), json!({})).await;
        assert_eq!(status, 200, "{id}: {v}");
    }
    // The thinking build has `</think>` in its vocabulary; the plain one has not.
    assert_eq!(
        entry(&cold, "thinker")["shoal"]["capabilities"]["reasoning"],
        true
    );
    assert_eq!(
        entry(&cold, DEFAULT)["shoal"]["capabilities"]["reasoning"],
        false
    );
}
