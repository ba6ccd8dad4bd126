//! Images end to end on a real vision model: the default GGUF on llama.cpp
//! with a projector beside it (`tools/py/vision_fixture.py`: random
//! weights, 16 tokens an image). Every dialect's image form, its image
//! tokens in that dialect's usage, the ledger and `/metrics`; the prefix
//! cache reusing an image by its content; images beside each other in one
//! batch; every refusal in the dialect's own shape; a model that cannot see.
mod common;

use std::io::Cursor;
use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use serde_json::{json, Value};
use shoal_api::AppState;
use shoal_engine::{BackendChoice, Engine, EngineOptions};

const MODEL: &str = "smollm2-vision";
/// Positions one image takes with the fixture's projector (64 px in 16 px
/// patches).
const IMAGE_TOKENS: u64 = 16;

fn engine() -> Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| own_engine(false)).clone()
}

/// An engine no other test sends to, so a reply depends on this test's
/// requests alone; `exact` keeps each reply equal to its lone run whatever
/// runs beside it (llama.cpp's batch-invariant mode).
fn own_engine(exact: bool) -> Engine {
    let mut opts = EngineOptions {
        backend: BackendChoice::Llama,
        ..EngineOptions::default()
    };
    opts.llama = opts.llama.batch_invariant(exact);
    Engine::start(&common::vision_gguf(), MODEL, opts).expect("load")
}

fn state() -> AppState {
    AppState::new(engine())
}

fn png(w: u32, h: u32, rgb: [u8; 3]) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        // A gradient, so the picture is not one flat colour.
        image::Rgb([
            rgb[0].wrapping_add((x * 3) as u8),
            rgb[1].wrapping_add((y * 5) as u8),
            rgb[2],
        ])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("png");
    out.into_inner()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", b64(bytes))
}

fn red() -> Vec<u8> {
    png(40, 30, [200, 10, 10])
}

use common::{get, post};

fn chat(image: &[u8], extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": data_url(image), "detail": "auto"}},
        ]}],
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_sends_images_and_counts_their_tokens() {
    let base = common::serve(state()).await;
    let (red, img) = (red(), b64(&red()));
    let question = "What is in this picture?";

    // OpenAI Chat Completions: image tokens are part of the prompt tokens.
    let (s, v) = post(&base, "/v1/chat/completions", chat(&red, json!({}))).await;
    assert_eq!(s, 200, "{v}");
    let u = &v["usage"];
    assert_eq!(
        u["prompt_tokens_details"]["image_tokens"], IMAGE_TOKENS,
        "{v}"
    );
    let prompt = u["prompt_tokens"].as_u64().expect("prompt tokens");
    assert!(prompt > IMAGE_TOKENS, "{v}");
    let chat_id = v["id"].as_str().expect("id").to_string();

    // Streamed, the usage chunk says the same.
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat(
            &red,
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.expect("stream");
    let usage: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|c| c["usage"].is_object())
        .map(|c| c["usage"].clone())
        .unwrap_or_else(|| panic!("no usage chunk in {text}"));
    assert_eq!(usage["prompt_tokens"], prompt, "{text}");
    assert_eq!(usage["prompt_tokens_details"]["image_tokens"], IMAGE_TOKENS);

    // Responses: `input_image` with its URL as a string.
    let (s, v) = post(
        &base,
        "/v1/responses",
        json!({"model": MODEL, "max_output_tokens": 16, "temperature": 0, "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": question},
            {"type": "input_image", "image_url": data_url(&red)},
        ]}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["usage"]["input_tokens"], prompt, "{v}");
    assert_eq!(
        v["usage"]["input_tokens_details"]["image_tokens"],
        IMAGE_TOKENS
    );
    // A follow-up through previous_response_id still has its image.
    let prev = v["id"].as_str().expect("id");
    let (s, v2) = post(
        &base,
        "/v1/responses",
        json!({"model": MODEL, "max_output_tokens": 16, "previous_response_id": prev,
               "input": "And the colours?"}),
    )
    .await;
    assert_eq!(s, 200, "{v2}");
    assert_eq!(
        v2["usage"]["input_tokens_details"]["image_tokens"], IMAGE_TOKENS,
        "{v2}"
    );

    // Anthropic Messages: a base64 image block; count_tokens counts it, and
    // the usage adds up to that count.
    let blocks = json!([
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": img}},
        {"type": "text", "text": question},
    ]);
    let (s, counted) = post(
        &base,
        "/v1/messages/count_tokens",
        json!({"model": MODEL, "messages": [{"role": "user", "content": blocks}]}),
    )
    .await;
    assert_eq!(s, 200, "{counted}");
    let (s, text_only) = post(
        &base,
        "/v1/messages/count_tokens",
        json!({"model": MODEL, "messages": [{"role": "user", "content": question}]}),
    )
    .await;
    assert_eq!(s, 200, "{text_only}");
    let with = counted["input_tokens"].as_u64().expect("count");
    assert_eq!(
        with,
        text_only["input_tokens"].as_u64().expect("count") + IMAGE_TOKENS
    );
    let (s, v) = post(
        &base,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": blocks}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let u = &v["usage"];
    let whole = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .iter()
    .map(|k| u[*k].as_u64().expect(k))
    .sum::<u64>();
    assert_eq!(whole, with, "{v}");

    // Ollama: `images` on /api/chat messages and on /api/generate.
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "stream": false, "options": {"num_predict": 8, "temperature": 0},
               "messages": [{"role": "user", "content": question, "images": [img]}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["prompt_eval_image_count"], IMAGE_TOKENS, "{v}");
    assert!(v["prompt_eval_count"].as_u64().expect("count") > IMAGE_TOKENS);
    let (s, v) = post(
        &base,
        "/api/generate",
        json!({"model": MODEL, "stream": false, "prompt": question, "images": [img],
               "options": {"num_predict": 8, "temperature": 0}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["prompt_eval_image_count"], IMAGE_TOKENS, "{v}");

    // The ledger keeps them as typed figures, and /metrics counts images.
    let (s, entry) = get(&base, &format!("/v1/usage/{chat_id}")).await;
    assert_eq!(s, 200, "{entry}");
    let entry: Value = serde_json::from_str(&entry).expect("json");
    assert_eq!(entry["tokens"]["image"], IMAGE_TOKENS, "{entry}");
    assert_eq!(entry["tokens"]["images"], 1, "{entry}");
    // The ledger's CSV has the column too.
    let (s, csv) = get(&base, "/v1/usage?format=csv&dialect=openai.chat").await;
    assert_eq!(s, 200, "{csv}");
    let mut rows = csv.lines().map(|l| l.split(',').collect::<Vec<_>>());
    let head = rows.next().expect("header");
    let col = head
        .iter()
        .position(|c| *c == "image_tokens")
        .expect("an image_tokens column");
    let row = rows
        .find(|r| r.first() == Some(&chat_id.as_str()))
        .unwrap_or_else(|| panic!("{chat_id} in {csv}"));
    assert_eq!(row[col], IMAGE_TOKENS.to_string(), "{csv}");
    let (_, metrics) = get(&base, "/metrics").await;
    let images = metrics
        .lines()
        .find(|l| l.starts_with("shoal_image_inputs_total{") && l.contains("openai.chat"))
        .unwrap_or_else(|| panic!("no image_inputs_total for chat in {metrics}"));
    let n: f64 = images
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count");
    assert!(n >= 2.0, "{images}");

    // It says it can see, loaded or not.
    let (_, models) = get(&base, "/v1/models").await;
    let models: Value = serde_json::from_str(&models).expect("json");
    let me = models["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"] == MODEL))
        .unwrap_or_else(|| panic!("{models}"));
    assert_eq!(me["shoal"]["capabilities"]["vision"], true, "{me}");
    let (s, show) = post(&base, "/api/show", json!({"model": MODEL})).await;
    assert_eq!(s, 200, "{show}");
    assert!(
        show["capabilities"]
            .as_array()
            .is_some_and(|c| c.contains(&json!("vision"))),
        "{show}"
    );
}

/// The first token's top alternatives and their logprobs: the model's view
/// of the prompt, image included.
fn first_top(v: &Value) -> Vec<(String, f64)> {
    v["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no top_logprobs: {v}"))
        .iter()
        .map(|t| {
            (
                t["token"].as_str().unwrap_or_default().to_string(),
                t["logprob"].as_f64().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_image_is_reused_from_the_cache_and_another_is_seen_anew() {
    let base = common::serve(AppState::new(own_engine(false))).await;
    // A question of its own, so no other test's prefix is in the cache.
    let ask = |image: &[u8]| {
        json!({
            "model": MODEL, "max_tokens": 6, "temperature": 0,
            "logprobs": true, "top_logprobs": 5,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Describe the cache test picture:"},
                {"type": "image_url", "image_url": {"url": data_url(image)}},
                {"type": "text", "text": "Be brief."},
            ]}],
        })
    };
    let (red, blue) = (png(64, 64, [250, 120, 0]), png(20, 90, [0, 90, 250]));
    let (s, cold) = post(&base, "/v1/chat/completions", ask(&red)).await;
    assert_eq!(s, 200, "{cold}");
    let prompt = cold["usage"]["prompt_tokens"].as_u64().expect("prompt");
    let (s, warm) = post(&base, "/v1/chat/completions", ask(&red)).await;
    assert_eq!(s, 200, "{warm}");
    // The whole prompt but its last token came from the cache, the image
    // included, and the answer is the cold one.
    assert_eq!(
        warm["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt - 1
    );
    assert_eq!(
        warm["choices"][0]["message"]["content"],
        cold["choices"][0]["message"]["content"]
    );
    assert_eq!(first_top(&warm), first_top(&cold));
    // Another picture: the text before it is reused, the image is not.
    let (s, other) = post(&base, "/v1/chat/completions", ask(&blue)).await;
    assert_eq!(s, 200, "{other}");
    let cached = other["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    assert!(cached > 0 && cached < prompt - IMAGE_TOKENS, "{other}");
    // And the model sees the difference: its first token's odds move.
    let (a, b) = (first_top(&other), first_top(&cold));
    let moved = a
        .iter()
        .zip(&b)
        .any(|(x, y)| x.0 != y.0 || (x.1 - y.1).abs() > 0.05);
    assert!(moved, "{a:?} / {b:?}");
}

/// An M-RoPE vision model (Qwen2.5-Coder's weights as a Qwen2-VL text model
/// beside a random-weight Qwen2-VL patch merger, `make models`): an image
/// takes fewer positions than tokens, and the text after it goes on from its
/// last position, whether computed cold or after a prefix reused from the
/// cache with the image in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_m_rope_model_reads_the_text_after_an_image_cold_and_from_the_cache() {
    const QWEN: &str = "qwen2vl";
    let opts = EngineOptions {
        backend: BackendChoice::Llama,
        ..EngineOptions::default()
    };
    let e = Engine::start(&common::mrope_gguf(), QWEN, opts).expect("load");
    let base = common::serve(AppState::new(e)).await;
    let ask = |image: &[u8], question: &str| {
        json!({
            "model": QWEN, "max_tokens": 8, "temperature": 0,
            "logprobs": true, "top_logprobs": 5,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(image)}},
                {"type": "text", "text": question},
            ]}],
        })
    };
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let pic = png(64, 64, [30, 160, 90]);
    let france = "What is the capital of France? Answer in one word.";
    let (s, cold) = post(&base, "/v1/chat/completions", ask(&pic, france)).await;
    assert_eq!(s, 200, "{cold}");
    // The words after the image are read as the text model reads them.
    assert!(text(&cold).contains("Paris"), "{cold}");
    let u = &cold["usage"];
    let prompt = u["prompt_tokens"].as_u64().expect("prompt");
    let image = u["prompt_tokens_details"]["image_tokens"]
        .as_u64()
        .expect("image tokens");
    // Qwen-VL's least: 8 merged patches.
    assert!(image >= 8 && image < prompt, "{cold}");
    // Again: all of it but the last token from the cache, the same odds.
    let (s, warm) = post(&base, "/v1/chat/completions", ask(&pic, france)).await;
    assert_eq!(s, 200, "{warm}");
    assert_eq!(
        warm["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt - 1
    );
    assert_eq!(text(&warm), text(&cold));
    assert_eq!(first_top(&warm), first_top(&cold));
    // Another question about the same image: the prefix through the image is
    // reused, and the new words go on from the image's last position.
    let sum = "What is 2 + 3? Answer with a number.";
    let (s, second) = post(&base, "/v1/chat/completions", ask(&pic, sum)).await;
    assert_eq!(s, 200, "{second}");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    assert!(cached > image, "{second}");
    assert!(text(&second).contains('5'), "{second}");
}

/// The M-RoPE fixture's trained window is 256 positions (`make models`), its
/// KV pool here 1,024 cells. The window is counted in positions and the pool
/// in cells: a prompt of more tokens than the window has positions is served
/// when its images take fewer, and its reply runs until the positions fill
/// the window; Ollama's `num_ctx` is a window in positions too; a prompt
/// that fits the window but not the pool's cells, or whose positions do not
/// fit the window, is a 400 that says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_m_rope_model_counts_its_window_in_positions_and_its_pool_in_cells() {
    const QWEN: &str = "qwen2vl";
    let mut opts = EngineOptions {
        backend: BackendChoice::Llama,
        ..EngineOptions::default()
    };
    opts.llama.kv_tokens = 1024;
    let e = Engine::start(&common::mrope_gguf(), QWEN, opts).expect("load");
    let window = e.model.info.window();
    assert_eq!((window.positions, window.cells), (256, 1024));
    // What one picture takes, as llama.cpp's multimodal library reports it.
    let pic = png(224, 224, [200, 40, 40]);
    let limits = shoal_engine::vision::ImageLimits::default();
    let decoded = shoal_engine::vision::decode("pic", &pic, &limits).expect("decode");
    let one = e
        .model
        .vocab
        .vision
        .prepare(QWEN, &decoded)
        .expect("prepare");
    let (tokens, positions) = (one.tokens as u64, one.positions as u64);
    assert!(positions < tokens, "{tokens} tokens, {positions} positions");
    // The random pictures make the model stop at once; with its ends of
    // turn barred it runs until a bound stops it.
    let no_end: serde_json::Map<String, Value> = e
        .model
        .vocab
        .eos
        .iter()
        .map(|t| (t.to_string(), json!(-100)))
        .collect();
    let base = common::serve(AppState::new(e)).await;

    let count = "Count from 1 to 500, one number per line.";
    let content = |n: usize, text: &str| {
        let mut parts = vec![json!({"type": "image_url", "image_url": {"url": data_url(&pic)}}); n];
        parts.push(json!({"type": "text", "text": text}));
        Value::Array(parts)
    };
    let ask = |n: usize, text: &str, max_tokens: u64| {
        json!({"model": QWEN, "max_tokens": max_tokens, "temperature": 0, "logit_bias": no_end,
               "messages": [{"role": "user", "content": content(n, text)}]})
    };
    let n = 4;
    let (s, v) = post(&base, "/v1/chat/completions", ask(n, count, 1000)).await;
    assert_eq!(s, 200, "{v}");
    let u = &v["usage"];
    let prompt = u["prompt_tokens"].as_u64().expect("prompt");
    assert_eq!(
        u["prompt_tokens_details"]["image_tokens"],
        n as u64 * tokens,
        "{v}"
    );
    // More tokens than the window has positions: counted by tokens, the
    // prompt would have been refused.
    assert!(prompt >= 256, "{v}");
    let prompt_positions = prompt - n as u64 * (tokens - positions);
    // The reply ran until its positions, not its tokens, filled the window.
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(
        u["completion_tokens"].as_u64(),
        Some(256 - prompt_positions),
        "{v}"
    );

    // Ollama's num_ctx, a smaller window in positions: the prompt's
    // positions and five more, fewer than its tokens. One picture (Ollama
    // has no logit bias, and with one the model goes on). A first request
    // learns the prompt's size.
    let chat = |options: Value| {
        json!({"model": QWEN, "stream": false, "options": options,
               "messages": [{"role": "user", "content": count, "images": [b64(&pic)]}]})
    };
    let (s, v) = post(
        &base,
        "/api/chat",
        chat(json!({"num_predict": 1, "temperature": 0})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let ollama_prompt = v["prompt_eval_count"].as_u64().expect("prompt_eval_count");
    let num_ctx = ollama_prompt - (tokens - positions) + 5;
    assert!(num_ctx < ollama_prompt, "{v}");
    let options = json!({"num_ctx": num_ctx, "temperature": 0});
    let (s, v) = post(&base, "/api/chat", chat(options)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["eval_count"].as_u64(), &v["done_reason"]),
        (Some(5), &json!("length")),
        "{v}"
    );

    // Enough pictures to pass the pool's 1,024 cells while their positions
    // stay inside the window: refused by the pool, in cells.
    let text = prompt - n as u64 * tokens;
    let many = (1024 - text).div_ceil(tokens);
    assert!(many <= limits.max_images as u64 && text + many * positions < 256);
    let (s, v) = post(&base, "/v1/chat/completions", ask(many as usize, count, 8)).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("the KV cache holds at most 1024 for one request"),
        "{v}"
    );

    // Text that alone takes the window, after a picture: refused by the
    // window, in positions.
    let long = "word ".repeat(300);
    let (s, v) = post(&base, "/v1/chat/completions", ask(1, &long, 8)).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("positions") && msg.contains("window is 256 positions"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_requests_run_side_by_side_as_they_run_alone() {
    let base = common::serve(AppState::new(own_engine(true))).await;
    let pictures = [png(30, 30, [0, 200, 0]), png(60, 40, [90, 0, 90])];
    let ask = |image: &[u8]| {
        json!({
            "model": MODEL, "max_tokens": 10, "temperature": 0,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(image)}},
                {"type": "text", "text": "Two at once: what is this?"},
            ]}],
        })
    };
    let mut alone = Vec::new();
    for p in &pictures {
        let (s, v) = post(&base, "/v1/chat/completions", ask(p)).await;
        assert_eq!(s, 200, "{v}");
        alone.push(v["choices"][0]["message"]["content"].clone());
    }
    // Cleared, so both prefill their images again, together.
    let r = reqwest::Client::new()
        .delete(format!("{base}/v1/cache"))
        .send()
        .await
        .expect("clear");
    assert!(r.status().is_success());
    let (a, b) = tokio::join!(
        post(&base, "/v1/chat/completions", ask(&pictures[0])),
        post(&base, "/v1/chat/completions", ask(&pictures[1])),
    );
    for ((s, v), want) in [a, b].iter().zip(&alone) {
        assert_eq!(*s, 200, "{v}");
        assert_eq!(&v["choices"][0]["message"]["content"], want, "{v}");
        assert_eq!(
            v["usage"]["prompt_tokens_details"]["image_tokens"],
            IMAGE_TOKENS
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_are_400s_in_each_dialect_and_the_server_keeps_serving() {
    let mut state = state();
    let mut access = shoal_api::access::Access::default();
    access.images.max_images = 2;
    access.images.max_pixels = 100 * 100;
    state.access = Arc::new(access);
    let base = common::serve(state).await;
    let good = red();
    let cut = &good[..good.len() / 2];
    let with_url = |url: &str| {
        chat(
            &[],
            json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]}]}),
        )
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "not an image",
            with_url(&format!("data:image/png;base64,{}", b64(b"hello"))),
            "not a PNG, JPEG, WebP or GIF",
        ),
        (
            "cut short",
            with_url(&data_url(cut)),
            "could not be decoded",
        ),
        (
            "too many pixels",
            with_url(&data_url(&png(200, 100, [1, 2, 3]))),
            "200×100",
        ),
        (
            "not base64",
            with_url("data:image/png;base64,@@@"),
            "not valid base64",
        ),
        (
            "a web address",
            with_url("https://example.com/cat.png"),
            "does not fetch image URLs for clients",
        ),
        (
            "another scheme",
            with_url("ftp://example.com/cat.png"),
            "must be data:",
        ),
        (
            "too many",
            chat(
                &[],
                json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(&good)}},
            {"type": "image_url", "image_url": {"url": data_url(&good)}},
            {"type": "image_url", "image_url": {"url": data_url(&good)}},
            {"type": "text", "text": "hi"}]}]}),
            ),
            "3 images is more than",
        ),
        (
            "from the assistant",
            chat(
                &[],
                json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": data_url(&good)}}]},
            {"role": "user", "content": "and?"}]}),
            ),
            "images go in user messages",
        ),
    ];
    for (what, body, says) in cases {
        let (s, v) = post(&base, "/v1/chat/completions", body).await;
        assert_eq!(s, 400, "{what}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "{what}: {msg}");
    }
    // Anthropic's shape.
    let (s, v) = post(
        &base,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(cut)}},
            {"type": "text", "text": "hi"}]}]}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    // Ollama's plain shape.
    let (s, v) = post(
        &base,
        "/api/chat",
        json!({"model": MODEL, "stream": false, "messages": [
            {"role": "user", "content": "hi", "images": [b64(b"not a picture")]}]}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("not a PNG")),
        "{v}"
    );
    // Still serving.
    let (s, v) = post(&base, "/v1/chat/completions", chat(&good, json!({}))).await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_projector_refuses_images_saying_so() {
    let engine = Engine::start(&common::gguf(), "text-only", common::options()).expect("load");
    let base = common::serve(AppState::new(engine)).await;
    let body = json!({"model": "text-only", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(&red())}}]}]});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("cannot read images"), "{msg}");
    let (s, v) = post(
        &base,
        "/api/generate",
        json!({"model": "text-only", "stream": false, "prompt": "hi", "images": [b64(&red())]}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    // Text still works, and the model does not claim sight.
    let (s, v) = post(
        &base,
        "/v1/chat/completions",
        json!({"model": "text-only", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(sees(&base, "text-only").await, false);
}

/// Whether `/v1/models` says the model `id` reads images.
async fn sees(base: &str, id: &str) -> Value {
    let (_, models) = get(base, "/v1/models").await;
    let models: Value = serde_json::from_str(&models).expect("json");
    let me = models["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"] == id))
        .unwrap_or_else(|| panic!("{models}"));
    me["shoal"]["capabilities"]["vision"].clone()
}

/// `model` on llama.cpp as `id`, its projector found as `projector` says.
fn with_projector(
    model: &std::path::Path,
    id: &str,
    projector: shoal_engine::backends::llama::Projector,
) -> Engine {
    let mut opts = EngineOptions {
        backend: BackendChoice::Llama,
        ..EngineOptions::default()
    };
    opts.llama = opts.llama.projector(projector);
    Engine::start(model, id, opts).expect("load")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projector_named_for_a_model_is_the_one_it_loads() {
    use shoal_engine::backends::llama::Projector;
    // The text-only default model, in a folder with no projector, sees
    // with the one a setting names for it by file name.
    let text_only = common::gguf();
    let name = text_only.file_name().expect("file name").to_string_lossy();
    let engine = with_projector(
        &text_only,
        "named",
        Projector::default().named(name, Some(common::vision_projector())),
    );
    let base = common::serve(AppState::new(engine)).await;
    assert_eq!(sees(&base, "named").await, true);
    let mut body = chat(&red(), json!({}));
    body["model"] = json!("named");
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["image_tokens"], IMAGE_TOKENS,
        "{v}"
    );

    // A vision model whose projector a setting turns off (by file stem)
    // reads text only, though one lies beside it.
    let vision = common::vision_gguf();
    let stem = vision.file_stem().expect("stem").to_string_lossy();
    let engine = with_projector(&vision, "blind", Projector::default().named(stem, None));
    let base = common::serve(AppState::new(engine)).await;
    assert_eq!(sees(&base, "blind").await, false);
    let mut body = chat(&red(), json!({}));
    body["model"] = json!("blind");
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot read images")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_chat_keeps_real_images_within_its_bound() {
    let dir = tempfile_dir("chat-images");
    let red = red();
    let mut state = AppState::new(engine())
        .with_store(&dir.join("store.sqlite"), Default::default())
        .expect("store");
    let mut access = shoal_api::access::Access::default();
    access.images.max_images = 2;
    // Room for two of the red picture, not three.
    access.max_chat_image_bytes = 2 * red.len() + 8;
    state.access = Arc::new(access);
    let base = common::serve(state).await;
    let (s, conv) = post(&base, "/v1/conversations", json!({})).await;
    assert_eq!(s, 200, "{conv}");
    let at = format!("/v1/conversations/{}/messages", conv["id"]);
    let message =
        |images: Value| json!({"role": "user", "content": "Look", "metadata": {"images": images}});
    let image = |data: String| json!({"media_type": "image/png", "data": data, "name": "red.png"});
    let (s, v) = post(&base, &at, message(json!([image(b64(&red))]))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["pieces"][0]["metadata"]["images"][0]["data"], b64(&red));

    // Each refusal says what is wrong, where, and stores nothing.
    for (images, status, says) in [
        (json!("red.png"), 400, "metadata.images"),
        (
            json!([image(b64(b"not a picture at all"))]),
            400,
            "metadata.images[0]: not a PNG",
        ),
        (json!([image("%%%".into())]), 400, "not valid base64"),
        (json!([{"data": b64(&red)}]), 400, "media_type"),
        (
            json!([image(b64(&red)), image(b64(&red)), image(b64(&red))]),
            400,
            "3 images",
        ),
    ] {
        let (s, v) = post(&base, &at, message(images.clone())).await;
        assert_eq!(s, status, "{images}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "{says}: {msg}");
    }
    let (s, v) = post(&base, &at, message(json!([image(b64(&red))]))).await;
    assert_eq!(s, 200, "{v}");
    // The chat is full: a third picture is a 413 naming the setting.
    let (s, v) = post(&base, &at, message(json!([image(b64(&red))]))).await;
    assert_eq!(s, 413, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server.max_chat_images_mb"), "{msg}");
    // What was kept is whole, and text still goes in.
    let (s, v) = post(&base, &at, json!({"role": "user", "content": "No picture"})).await;
    assert_eq!(s, 200, "{v}");
    let (_, stored) = get(&base, &format!("/v1/conversations/{}", conv["id"])).await;
    let stored: Value = serde_json::from_str(&stored).expect("json");
    let kept: Vec<usize> = stored["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            m["pieces"][0]["metadata"]["images"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .collect();
    assert_eq!(kept, [1, 1, 0], "{stored}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorder_sends_images_in_every_dialect_and_keeps_their_tokens() {
    use shoal_client::{Dialect, Image, Message, Request, Target, TargetConfig};
    let base = common::serve(state()).await;
    let req = Request {
        messages: vec![Message {
            role: "user".into(),
            content: "What does the recorder's picture show?".into(),
            images: vec![Image {
                media_type: "image/png".into(),
                data: b64(&png(32, 48, [30, 160, 90])),
            }],
        }],
        max_tokens: Some(6),
        temperature: Some(0.0),
        ..Request::default()
    };
    for dialect in common::recorder_dialects() {
        for stream in [false, true] {
            let target = Target::new(TargetConfig {
                dialect,
                base_url: base.clone(),
                model: MODEL.into(),
                api_key: None,
                headers: Vec::new(),
                stream,
                price: None,
            })
            .expect("target");
            let reply = target.send(&req).await;
            let piece = &reply.pieces[0];
            let get = |k: &str| piece.metadata.get(k).and_then(Value::as_u64);
            if dialect == Dialect::Completions {
                // Legacy Completions has no way to carry an image: said, not dropped.
                assert_eq!(reply.http_status, 0, "{reply:?}");
                let error = piece.metadata.get("error").and_then(Value::as_str);
                assert!(
                    error.is_some_and(|e| e.contains("cannot carry images")),
                    "{reply:?}"
                );
                continue;
            }
            assert_eq!(reply.http_status, 200, "{dialect:?} {stream}: {reply:?}");
            let prompt = get("token_usage_prompt_tokens").expect("prompt tokens");
            assert!(prompt > IMAGE_TOKENS, "{dialect:?}: {reply:?}");
            // Anthropic's usage has no image field; the others say 16.
            let want = (dialect != Dialect::Messages).then_some(IMAGE_TOKENS);
            assert_eq!(
                get("token_usage_image_tokens"),
                want,
                "{dialect:?} {stream}: {reply:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulling_a_vision_gguf_brings_its_projector_and_the_model_sees() {
    use shoal_hub_fixture::{FixtureFile, FixtureRepo, HubFixture};
    use shoal_models::{HubOptions, Library};
    let model = common::vision_gguf();
    let projector = common::vision_projector();
    let hub = HubFixture::start(vec![FixtureRepo {
        id: "test/SmolVision-GGUF".into(),
        commit: "2222222222222222222222222222222222222222".into(),
        files: vec![
            FixtureFile::new(
                "SmolVision-Q4_1.gguf",
                std::fs::read(&model).expect("model"),
                true,
            ),
            FixtureFile::new(
                "mmproj-SmolVision-f16.gguf",
                std::fs::read(&projector).expect("mmproj"),
                true,
            ),
        ],
        token: None,
    }]);
    let home = std::env::temp_dir().join(format!("shoal-vision-pull-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let pool = shoal_api::pool::ModelPool::new(shoal_api::pool::PoolOptions {
        engine: EngineOptions {
            backend: BackendChoice::Llama,
            ..EngineOptions::default()
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
    });
    let base = common::serve(AppState::with_pool(pool)).await;
    // Ollama's pull of a hub GGUF.
    let (s, v) = post(
        &base,
        "/api/pull",
        json!({"model": "hf.co/test/SmolVision-GGUF:Q4_1", "stream": false}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    // One model listed, not two: the projector is not a model of its own,
    // and it says it can see before it is loaded.
    let (_, models) = get(&base, "/v1/models").await;
    let models: Value = serde_json::from_str(&models).expect("json");
    let listed: Vec<&Value> = models["data"].as_array().expect("data").iter().collect();
    assert_eq!(listed.len(), 1, "{models}");
    assert!(
        !listed[0]["id"]
            .as_str()
            .unwrap_or_default()
            .contains("mmproj"),
        "{models}"
    );
    assert_eq!(
        listed[0]["shoal"]["capabilities"]["vision"], true,
        "{models}"
    );
    let id = listed[0]["id"].as_str().expect("id").to_string();
    let mut body = chat(&red(), json!({}));
    body["model"] = json!(id);
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["image_tokens"], IMAGE_TOKENS,
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fetching_allowed_an_image_url_is_fetched_under_the_limits() {
    use axum::routing::get as route;
    let picture = red();
    // Over the limit before it is even read as an image.
    let big = vec![7u8; 200_000];
    let app = axum::Router::new()
        .route("/cat.png", route(move || async move { picture }))
        .route("/big.png", route(move || async move { big }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let pictures = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let mut state = state();
    let mut access = shoal_api::access::Access::default();
    access.fetch_image_urls = true;
    access.images.max_bytes = 100_000;
    state.access = Arc::new(access);
    let base = common::serve(state).await;
    let with_url = |url: String| {
        json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}]})
    };
    let (s, v) = post(
        &base,
        "/v1/chat/completions",
        with_url(format!("{pictures}/cat.png")),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["image_tokens"], IMAGE_TOKENS,
        "{v}"
    );
    for (path, says) in [
        ("/missing.png", "HTTP 404"),
        ("/big.png", "over 100000 bytes"),
    ] {
        let (s, v) = post(
            &base,
            "/v1/chat/completions",
            with_url(format!("{pictures}{path}")),
        )
        .await;
        assert_eq!(s, 400, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("could not fetch") && msg.contains(says),
            "{msg}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_prefix_outlives_a_restart_on_the_disk_tier() {
    use shoal_engine::disk_cache::{DiskCache, DiskCacheOptions, DEFAULT_MIN_TOKENS};
    let dir = tempfile_dir("vision-disk");
    let open = || {
        DiskCache::open(DiskCacheOptions {
            dir: dir.clone(),
            budget_bytes: 1 << 30,
            min_tokens: DEFAULT_MIN_TOKENS,
            save_after_prefill: usize::MAX,
        })
        .expect("disk tier")
    };
    let start = |cache: &Arc<DiskCache>| {
        let opts = EngineOptions {
            backend: BackendChoice::Llama,
            disk_cache: Some(cache.clone()),
            ..EngineOptions::default()
        };
        Engine::start(&common::vision_gguf(), MODEL, opts).expect("load")
    };
    // Long enough for a file of its own (256+ tokens), the image in the middle.
    let system = "You describe pictures for a catalogue of paintings. ".repeat(30);
    let body = json!({
        "model": MODEL, "max_tokens": 8, "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(&png(48, 48, [120, 60, 200]))}},
                {"type": "text", "text": "Describe it for the catalogue."}]}],
    });
    let cache = open();
    let first = common::serve(AppState::new(start(&cache))).await;
    let (s, cold) = post(&first, "/v1/chat/completions", body.clone()).await;
    assert_eq!(s, 200, "{cold}");
    // The reply's prefix is handed to the tier on the engine thread after its
    // last event, before the thread takes its next request: once a short one
    // (too short for a file of its own) has an answer, the write is queued,
    // and `wait_idle` waits for it to land.
    let short =
        json!({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    let (s, v) = post(&first, "/v1/chat/completions", short).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        cache.wait_idle(std::time::Duration::from_secs(120)),
        "written"
    );
    assert_eq!(cache.summary().entries, 1, "the image's prefix is on disk");
    drop(cache);
    // Another engine (a restarted server's) with its tier on the same
    // folder and nothing in RAM: the prefix, image and all, comes back from
    // disk, and the reply is the cold one.
    let cache = open();
    let second = common::serve(AppState::new(start(&cache))).await;
    let (s, warm) = post(&second, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{warm}");
    let prompt = cold["usage"]["prompt_tokens"].as_u64().expect("prompt");
    assert!(prompt >= DEFAULT_MIN_TOKENS as u64, "{cold}");
    let details = &warm["usage"]["prompt_tokens_details"];
    assert_eq!(details["cached_tokens"], prompt - 1, "{warm}");
    assert_eq!(details["cached_disk_tokens"], prompt - 1, "{warm}");
    assert_eq!(details["image_tokens"], IMAGE_TOKENS);
    assert_eq!(
        warm["choices"][0]["message"]["content"],
        cold["choices"][0]["message"]["content"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_an_image_reply_is_cancelled_with_its_image_counted() {
    let engine = own_engine(false);
    let base = common::serve(AppState::new(engine.clone())).await;
    // No end token, so the reply runs until the client leaves.
    let body = chat(
        &png(36, 36, [10, 200, 200]),
        json!({"max_tokens": 400, "stream": true, "logit_bias": common::no_eos(&engine)}),
    );
    let id = common::leave_after_first_chunk(&base, &body).await;
    // The ledger waits for the request to wind down, then says what it spent.
    let (s, entry) = get(&base, &format!("/v1/usage/{id}")).await;
    assert_eq!(s, 200, "{entry}");
    let entry: Value = serde_json::from_str(&entry).expect("json");
    assert_eq!(entry["finish_reasons"], json!(["cancelled"]), "{entry}");
    assert_eq!(entry["tokens"]["image"], IMAGE_TOKENS, "{entry}");
    let completion = entry["tokens"]["completion"].as_u64().expect("completion");
    assert!(completion < 400, "{entry}");
    // And the engine goes on serving images.
    let (s, v) = post(&base, "/v1/chat/completions", chat(&red(), json!({}))).await;
    assert_eq!(s, 200, "{v}");
}
