//! Who may use the API. With API keys configured, every API route wants
//! `Authorization: Bearer <key>` or `x-api-key: <key>` (compared in constant
//! time); a request a peer forwarded is admitted by its cluster signature
//! instead. Browsers are held to an origin allow-list: a page from another
//! origin cannot drive the local model (403), and CORS grants only the
//! listed origins. Request-size limits live here too.
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, ErrorKind, ErrorShape};
use crate::AppState;

/// Origins of the desktop app's webview, allowed by default.
pub const APP_ORIGINS: &[&str] = &[
    "tauri://localhost",
    "http://tauri.localhost",
    "https://tauri.localhost",
];

/// Access rules and request limits.
#[derive(Clone, Debug)]
pub struct Access {
    /// SHA-256 digests of the keys.
    keys: Vec<[u8; 32]>,
    /// Browser origins besides the server's own.
    pub origins: Vec<String>,
    /// Most messages one request may carry.
    pub max_messages: usize,
    /// Most tools one request may offer.
    pub max_tools: usize,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Longest a request may run; then it stops with a timeout error that
    /// still carries its usage (`None`: no limit).
    pub request_timeout: Option<std::time::Duration>,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            keys: Vec::new(),
            origins: APP_ORIGINS.iter().map(|s| s.to_string()).collect(),
            max_messages: 2048,
            max_tools: 256,
            max_body_bytes: 8 << 20,
            request_timeout: Some(std::time::Duration::from_secs(600)),
        }
    }
}

impl Access {
    /// Requires one of `keys` on every API request (none: open, loopback only).
    pub fn with_keys(mut self, keys: &[String]) -> Self {
        self.keys = keys
            .iter()
            .filter(|k| !k.is_empty())
            .map(|k| Sha256::digest(k.as_bytes()).into())
            .collect();
        self
    }

    pub fn requires_key(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether `given` is one of the keys. Every key is compared in full,
    /// as SHA-256 digests so that the comparison's time does not depend on
    /// the keys' lengths either.
    fn key_ok(&self, given: &[u8]) -> bool {
        let given = Sha256::digest(given);
        self.keys.iter().fold(false, |ok, k| {
            ok | bool::from(k.as_slice().ct_eq(given.as_slice()))
        })
    }

    /// The server's own origin (its Host) or a listed one.
    fn origin_ok(&self, origin: &str, headers: &HeaderMap) -> bool {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        let own = !host.is_empty()
            && (origin == format!("http://{host}") || origin == format!("https://{host}"));
        own || self.origins.iter().any(|o| o == origin || o == "*")
    }
}

/// Routes open without a key: liveness, the web UI's files, and the cluster
/// control routes (signed with the cluster secret instead).
fn open_route(path: &str) -> bool {
    path == "/health"
        || !(path.starts_with("/v1/") || path == "/v1" || path == "/metrics")
        || matches!(
            path,
            shoal_cluster::STATUS_PATH
                | "/v1/cluster/load"
                | "/v1/cluster/unload"
                | crate::cluster::INSTANCES_PATH
                | crate::cluster::INSTANCE_REMOVE_PATH
                | crate::cluster::shards::PREPARE_PATH
                | crate::cluster::shards::START_PATH
                | crate::cluster::shards::STOP_PATH
        )
}

/// The key a request carries, from either header SDKs use.
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get("x-api-key") {
        return Some(v.as_bytes());
    }
    let auth = headers.get(header::AUTHORIZATION)?.as_bytes();
    auth.strip_prefix(b"Bearer ")
        .or_else(|| auth.strip_prefix(b"bearer "))
}

/// The access check, run before every route.
pub async fn guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let dialect = ErrorShape::for_path(&path);
    let access = &s.access;
    if let Some(origin) = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
    {
        if !access.origin_ok(origin, req.headers()) {
            tracing::warn!(%origin, %path, "request from a foreign origin refused");
            return ApiError {
                kind: ErrorKind::Forbidden,
                message: format!(
                    "origin {origin} may not use this server (allow it with --cors-origin)"
                ),
                param: None,
                code: Some("origin_not_allowed"),
            }
            .in_dialect(dialect)
            .into_response();
        }
    }
    if !access.requires_key() || open_route(&path) || req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    if presented_key(req.headers()).is_some_and(|k| access.key_ok(k)) {
        return next.run(req).await;
    }
    // A peer's forwarded request: admitted by its cluster signature.
    if req.headers().contains_key(crate::cluster::FORWARDED_HEADER) {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, access.max_body_bytes).await else {
            return crate::body::too_large(Some(access.max_body_bytes))
                .in_dialect(dialect)
                .into_response();
        };
        return match s.verify_peer(&parts.method, &parts.uri, &parts.headers, &bytes) {
            Ok(_) => {
                next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                    .await
            }
            Err(e) => e.into_response(),
        };
    }
    let message = if presented_key(req.headers()).is_some() {
        "invalid API key"
    } else {
        "an API key is required: send `Authorization: Bearer <key>` or `x-api-key: <key>`"
    };
    ApiError::unauthorized(message)
        .in_dialect(dialect)
        .into_response()
}

/// CORS for the allowed origins (the app's own pages need none).
pub fn cors(access: &Access) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins: Vec<HeaderValue> = access
        .origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    let allow = if access.origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins)
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::PATCH, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("x-api-key"),
            header::HeaderName::from_static("anthropic-version"),
            header::HeaderName::from_static("anthropic-beta"),
        ])
}
