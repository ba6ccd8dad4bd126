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
