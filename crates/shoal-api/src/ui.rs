//! The web UI, built into `ui/dist` and compiled into the binary, served at
//! `/` with single-page-app fallback (unknown paths get `index.html`).
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
// Relative to this crate's directory.
#[folder = "../../ui/dist"]
#[allow_missing = true]
struct Assets;

const NOT_BUILT: &str = "<!doctype html><title>Shoal</title><h1>Shoal</h1>\
<p>The API is running, but this binary was built without the web UI. Build it with \
<code>make ui</code> and rebuild, or use the API under <code>/v1</code>.</p>";

pub fn serve(path: &str) -> Response {
    let name = path.trim_start_matches('/');
    let name = if name.is_empty() { "index.html" } else { name };
    if let Some(file) = Assets::get(name) {
        let mime = file.metadata.mimetype().to_string();
        // Hashed asset names can be cached forever; the page itself cannot.
        let cache = if name.starts_with("assets/") {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        return (
            [
                (header::CONTENT_TYPE, mime),
                (header::CACHE_CONTROL, cache.to_string()),
            ],
            file.data.into_owned(),
        )
            .into_response();
    }
    // A missing file with an extension is a real 404; anything else is a UI route.
    if name
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains('.'))
        && name != "index.html"
    {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    }
    match Assets::get("index.html") {
        Some(index) => (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
                (header::CACHE_CONTROL, "no-cache".to_string()),
            ],
            index.data.into_owned(),
        )
            .into_response(),
        None => Html(NOT_BUILT).into_response(),
    }
}
