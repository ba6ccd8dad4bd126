//! A model's own sampling defaults (`generation_config.json`) apply wherever a
//! request leaves a parameter out, in every dialect; an explicit value wins.
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use shoal_api::AppState;
use shoal_engine::{BackendChoice, Engine, EngineOptions};

mod common;

/// The default model as an MLX directory (`make models`), linked into a fresh
/// folder with `generation` as its generation_config.json (none when `None`).
fn model_dir(name: &str, generation: Option<&str>) -> PathBuf {
    let src = std::env::var("SHOAL_TEST_HF_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.cache/models/smollm2-135m-mlx-f32"
            ))
        });
    assert!(
        src.join("config.json").is_file(),
        "MLX model missing at {} — run `make models`",
        src.display()
    );
    let dir = std::env::temp_dir().join(format!("shoal-defaults-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    for entry in std::fs::read_dir(&src).expect("read model dir") {
        let p = entry.expect("entry").path();
        let name = p.file_name().expect("name");
        if name != "generation_config.json" {
            std::os::unix::fs::symlink(&p, dir.join(name)).expect("link");
        }
    }
    if let Some(g) = generation {
        std::fs::write(dir.join("generation_config.json"), g).expect("write");
    }
    dir
}

async fn serve(dir: &Path) -> String {
    let engine = Engine::start(
        dir,
        "m",
        EngineOptions {
            backend: BackendChoice::Mlx,
            prefix_cache_bytes: 0,
            ..EngineOptions::default()
        },
    )
    .expect("load");
    common::serve(AppState::new(engine)).await
}

/// The reply's text in each dialect's response shape.
async fn reply(base: &str, dialect: &str, extra: Value) -> String {
    let user = "Tell me something about the sea.";
    let (path, mut body) = match dialect {
        "chat" => (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": user}], "max_tokens": 24}),
        ),
        "completions" => (
            "/v1/completions",
            json!({"prompt": "Once upon a time, by the sea, there lived", "max_tokens": 24}),
        ),
        "messages" => (
            "/v1/messages",
            json!({"messages": [{"role": "user", "content": user}], "max_tokens": 24}),
        ),
        _ => (
            "/v1/responses",
            json!({"input": user, "max_output_tokens": 24}),
        ),
    };
    body["model"] = json!("m");
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    let text = match dialect {
        "chat" => v["choices"][0]["message"]["content"].as_str(),
        "completions" => v["choices"][0]["text"].as_str(),
        "messages" => v["content"][0]["text"].as_str(),
        _ => v["output"][0]["content"][0]["text"].as_str(),
    };
    text.unwrap_or_else(|| panic!("{dialect}: no text in {v}"))
        .to_string()
}

const DIALECTS: [&str; 4] = ["chat", "completions", "messages", "responses"];

/// The served model's `shoal.sampling_defaults` in `/v1/models`.
async fn sampling_defaults(base: &str) -> Value {
    let models: Value = reqwest::get(format!("{base}/v1/models"))
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    models["data"][0]["shoal"]["sampling_defaults"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_defaults_fill_what_a_request_leaves_out_and_explicit_values_win() {
    // The model says: greedy.
    let greedy = serve(&model_dir(
        "greedy",
        Some(r#"{"do_sample": false, "temperature": 0.9}"#),
    ))
    .await;
    // The same weights with nothing to say: Shoal's defaults (temperature 1).
    let plain = serve(&model_dir("plain", None)).await;

    let d = sampling_defaults(&greedy).await;
    assert_eq!(
        d["temperature"],
        json!({"value": 0.0, "source": "generation_config.json"}),
        "{d}"
    );
    assert_eq!(d["top_p"]["source"], "shoal default");
    assert_eq!(sampling_defaults(&plain).await["temperature"]["value"], 1.0);

    for dialect in DIALECTS {
        // Left out: the model's greedy default, the same words as asking for temperature 0.
        let left_out = reply(&greedy, dialect, json!({})).await;
        let explicit_zero = reply(&greedy, dialect, json!({"temperature": 0})).await;
        assert_eq!(
            left_out, explicit_zero,
            "{dialect}: the model's default was not applied"
        );
        // Given: the request's temperature wins over the model's, so both servers
        // sample alike from the same seed (the dialects that take a seed).
        if matches!(dialect, "chat" | "completions") {
            let seeded = json!({"temperature": 1.0, "seed": 7});
            let a = reply(&greedy, dialect, seeded.clone()).await;
            let b = reply(&plain, dialect, seeded).await;
            assert_eq!(a, b, "{dialect}: an explicit temperature did not win");
            assert_ne!(
                a, explicit_zero,
                "{dialect}: temperature 1 sampled the greedy reply"
            );
        }
    }
}

/// The default model's GGUF carries no sampling keys; its family's card
/// (SmolLM2: temperature 0.2, top_p 0.9) fills them, on either backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_models_card_settings_apply_when_a_request_leaves_them_out() {
    let engine = Engine::start(&common::gguf(), "m", common::options()).expect("load");
    let base = common::serve(AppState::new(engine)).await;
    let d = sampling_defaults(&base).await;
    let card = "model card (HuggingFaceTB/SmolLM2)";
    assert_eq!(d["temperature"]["source"], card, "{d}");
    assert_eq!(d["top_p"]["source"], card, "{d}");
    // As written on the card, not an f32 widened (0.20000000298023224).
    assert_eq!(d["temperature"]["value"], json!(0.2), "{d}");
    assert_eq!(d["top_p"]["value"], json!(0.9), "{d}");
    for dialect in ["chat", "completions"] {
        // Left out, the card's values sample: from one seed, the same words
        // as asking for them.
        let left_out = reply(&base, dialect, json!({"seed": 11, "max_tokens": 40})).await;
        let card_values = json!({"temperature": 0.2, "top_p": 0.9, "seed": 11, "max_tokens": 40});
        assert_eq!(
            left_out,
            reply(&base, dialect, card_values).await,
            "{dialect}: the card's settings were not applied"
        );
    }
}
