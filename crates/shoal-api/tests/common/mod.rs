//! Helpers the HTTP test files share.
#![allow(dead_code)]

#[path = "../../../shoal-engine/tests/common/fixtures.rs"]
mod fixtures;
#[allow(unused_imports)] // not every test file uses a fixture
pub use fixtures::*;

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

/// Every dialect the server registers, as the recorder client speaks it: the
/// "every dialect" tests loop over this, so a dialect added to the server's
/// registry is in them, or fails here until the client has a module for it.
/// Embeddings are the one dialect no chat client speaks (tests/embeddings.rs).
#[allow(dead_code)]
pub fn recorder_dialects() -> Vec<shoal_client::Dialect> {
    shoal_api::dialects::registry()
        .all()
        .filter_map(|d| {
            let client = shoal_client::Dialect::for_ledger_name(d.ledger_name());
            assert!(
                client.is_some() || d.ledger_name() == "openai.embeddings",
                "the recorder client does not speak {d:?}: give it a module in shoal-client/src/wire/"
            );
            client
        })
        .collect()
}

/// POSTs `body` as JSON; the status and the body (JSON, or the text as a
/// JSON string when it is not JSON).
pub async fn post(base: &str, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("send");
    let s = r.status().as_u16();
    let t = r.text().await.expect("body");
    (
        s,
        serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t)),
    )
}

/// GETs `path`; the status and the body's text.
pub async fn get(base: &str, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("{base}{path}")).await.expect("send");
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// A `logit_bias` that bans the model's end tokens, so a reply runs until
/// its limit or until its client leaves.
pub fn no_eos(engine: &shoal_engine::Engine) -> serde_json::Value {
    engine
        .model
        .vocab
        .eos
        .iter()
        .map(|id| (id.to_string(), serde_json::json!(-100)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Starts a streamed chat with `body`; its ledger id and the response, whose
/// body is still to be read.
pub async fn open_stream(base: &str, body: &serde_json::Value) -> (String, reqwest::Response) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    let id = resp.headers()[shoal_api::ledger::REQUEST_ID_HEADER]
        .to_str()
        .expect("id")
        .to_string();
    (id, resp)
}

/// Starts a streamed chat with `body`, reads its first chunk and hangs up;
/// returns the request's ledger id.
pub async fn leave_after_first_chunk(base: &str, body: &serde_json::Value) -> String {
    use futures::StreamExt;
    let (id, resp) = open_stream(base, body).await;
    let first = resp
        .bytes_stream()
        .next()
        .await
        .expect("a chunk")
        .expect("bytes");
    assert!(!first.is_empty());
    id
}
