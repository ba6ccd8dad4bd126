//! An engine fault in the middle of generating (the backend returning an
//! error, as MLX does when an operation fails) ends the affected requests
//! with a clear error in each dialect's shape, keeps their usage in the
//! ledger, and leaves the server serving the next requests.
mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::gguf;
use serde_json::{json, Value};
use shoal_api::AppState;
use shoal_engine::backend::{DecodeBatch, KvCache, LanguageModel, ModelInfo};
use shoal_engine::loader::Loaded;
use shoal_engine::{Engine, EngineError, EngineOptions};

const MODEL: &str = "smollm2";

/// The real model, except that the decode passes whose numbers are in
/// `fail` return an error.
struct Faulty {
    inner: Box<dyn LanguageModel>,
    passes: AtomicUsize,
    fail: Vec<usize>,
}

impl LanguageModel for Faulty {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }
    fn new_cache(&self) -> shoal_engine::Result<Box<dyn KvCache>> {
        self.inner.new_cache()
    }
    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> shoal_engine::Result<Vec<f32>> {
        self.inner.forward(tokens, cache)
    }
    fn new_batch(&self) -> shoal_engine::Result<Box<dyn DecodeBatch>> {
        self.inner.new_batch()
    }
    fn forward_batch(
        &self,
        tokens: &[u32],
        batch: &mut dyn DecodeBatch,
    ) -> shoal_engine::Result<Vec<Vec<f32>>> {
        let pass = self.passes.fetch_add(1, Ordering::SeqCst);
        if self.fail.contains(&pass) {
            return Err(EngineError::Backend(format!(
                "injected fault in decode pass {pass}"
            )));
        }
        self.inner.forward_batch(tokens, batch)
    }
}

async fn server(fail: Vec<usize>) -> String {
    let opts = EngineOptions {
        prefix_cache_bytes: 0,
        ..common::options()
    };
    let load = shoal_engine::LoadOptions {
        backend: opts.backend,
        ..Default::default()
    };
    let engine = Engine::start_with(&gguf(), MODEL, opts, move |p: &Path| {
        let Loaded { model, vocab, path } = shoal_engine::loader::load(p, &load)?;
        let model: Box<dyn LanguageModel> = Box::new(Faulty {
            inner: model,
            passes: AtomicUsize::new(0),
            fail,
        });
        Ok(Loaded { model, vocab, path })
    })
    .expect("load");
    let state = AppState::new(engine);
    common::serve(state).await
}

async fn post(base: &str, path: &str, body: Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn chat(stream: bool) -> Value {
    json!({"model": MODEL, "max_tokens": 30, "temperature": 0, "stream": stream,
           "messages": [{"role": "user", "content": "Tell me about the sea."}]})
}

#[tokio::test]
async fn a_fault_mid_generation_fails_that_request_only() {
    // Passes 5 and 40 fail: the first request's sixth decode step, and a
    // step of the streamed Anthropic request.
    let base = server(vec![5, 40]).await;
    let (status, body) = post(&base, "/v1/chat/completions", chat(false)).await;
    assert_eq!(status, 500, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "server_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("injected fault"),
        "{v}"
    );

    // The next request is served in full.
    let (status, body) = post(&base, "/v1/chat/completions", chat(false)).await;
    assert_eq!(status, 200, "{body}");
    let ok: Value = serde_json::from_str(&body).unwrap();
    let full = ok["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(full > 6, "{ok}");

    let (status, sse) = post(
        &base,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 30, "temperature": 0, "stream": true,
               "messages": [{"role": "user", "content": "Tell me about the sea."}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        sse.contains("event: error") && sse.contains("injected fault"),
        "{sse}"
    );
    assert!(!sse.contains("event: message_stop"), "{sse}");

    // The ledger keeps the failed requests with the tokens they used.
    let ledger: Value = reqwest::get(format!("{base}/v1/usage"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = ledger["data"].as_array().unwrap();
    let failed: Vec<&Value> = entries
        .iter()
        .filter(|e| e["finish_reasons"][0] == "error")
        .collect();
    assert_eq!(failed.len(), 2, "{ledger}");
    for e in failed {
        let u = &e["usage"];
        let out = u["completion_tokens"]
            .as_u64()
            .or(u["output_tokens"].as_u64())
            .unwrap();
        assert!(out >= 1 && out < full, "{e}");
    }
    let (status, _) = post(&base, "/v1/chat/completions", chat(true)).await;
    assert_eq!(status, 200);
}
