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

use crate::error::{ApiError, ErrorKind};
use crate::state::AppState;

pub use crate::state::access::{Access, Key, Limits, APP_ORIGINS};

/// Routes open without a key: liveness, the web UI's files, and the cluster
/// control routes (signed with the cluster secret instead).
fn open_route(path: &str, routed: crate::dialect::Routed) -> bool {
    path == "/health"
        || !(path.starts_with("/v1/")
            || path == "/v1"
            || path == "/metrics"
            || routed.dialect.is_some())
        || matches!(
            path,
            shoal_cluster::STATUS_PATH
                | crate::cluster::PEER_USAGE_PATH
                | "/v1/cluster/load"
                | "/v1/cluster/unload"
                | crate::cluster::INSTANCES_PATH
                | crate::cluster::INSTANCE_REMOVE_PATH
                | crate::cluster::placement::PREPARE_PATH
                | crate::cluster::placement::START_PATH
                | crate::cluster::placement::STOP_PATH
        )
}

/// The key a request carries: in a header some dialect's SDKs send it in
/// (Anthropic's `x-api-key`), else as `Authorization: Bearer`.
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    let own = crate::dialects::registry().key_headers();
    if let Some(v) = own.iter().find_map(|h| headers.get(*h)) {
        return Some(v.as_bytes());
    }
    let auth = headers.get(header::AUTHORIZATION)?.as_bytes();
    auth.strip_prefix(b"Bearer ")
        .or_else(|| auth.strip_prefix(b"bearer "))
}

/// The access check, run before every route.
pub async fn guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let routed = crate::dialect::Routed::of(req.extensions());
    let dialect = routed.error_shape();
    let access = &s.access;
    if let Some(origin) = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
    {
        if !access.origin_ok(origin, req.headers()) {
            tracing::warn!(%origin, %path, "request from a foreign origin refused");
            return ApiError::new(
                ErrorKind::Forbidden,
                format!("origin {origin} may not use this server (allow it with --cors-origin)"),
            )
            .with_code("origin_not_allowed")
            .in_dialect(dialect)
            .into_response();
        }
    }
    if !access.requires_key() || open_route(&path, routed) || req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    if let Some(key) = presented_key(req.headers()).and_then(|k| access.key_for(k)) {
        if let Some(tracked) = req.extensions().get::<crate::ledger::Tracked>() {
            let _ = tracked.client.set(key.name.clone());
            if let Err(e) = s.limits.admit(key, &s.ledger) {
                return e.in_dialect(dialect).into_response();
            }
        }
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
        .allow_headers(
            [
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static(crate::ledger::TURN_HEADER),
            ]
            .into_iter()
            .chain(
                crate::dialects::registry()
                    .request_headers()
                    .into_iter()
                    .map(header::HeaderName::from_static),
            )
            .collect::<Vec<_>>(),
        )
}
