//! What the control routes share: the signed-request extractor [`Peer`] and
//! reading another node's ledger rows.
use axum::extract::FromRequest;
use shoal_cluster::Cluster;

use super::placement::PEER_USAGE_PATH;
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::state::AppState;

/// A control request from a peer: its signature checked (the sender
/// becomes a peer), its JSON body parsed. Every control route takes one.
pub struct Peer<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<AppState> for Peer<T> {
    type Rejection = DialectError;

    async fn from_request(
        req: axum::extract::Request,
        s: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, s.access.max_body_bytes)
            .await
            .map_err(|_| {
                crate::body::too_large(Some(s.access.max_body_bytes)).in_dialect(ErrorShape::OPENAI)
            })?;
        s.verify_peer(&parts.method, &parts.uri, &parts.headers, &bytes)?;
        let json: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        serde_json::from_slice(json)
            .map(Peer)
            .map_err(|e| ApiError::invalid(e.to_string()).in_dialect(ErrorShape::OPENAI))
    }
}

/// Another node's ledger rows for `ask` (`{"id"}` or `{"query"}`, see
/// `usage::PeerUsage`): signed through `cluster`, or plain to a local
/// pipeline stage (`cluster` none).
pub(crate) async fn peer_rows(
    cluster: Option<&Cluster>,
    addr: &str,
    ask: &serde_json::Value,
) -> Result<Vec<shoal_store::UsageRow>, reqwest::Error> {
    let body = ask.to_string().into_bytes();
    let req = match cluster {
        Some(c) => c.signed(reqwest::Method::POST, addr, PEER_USAGE_PATH, body),
        None => reqwest::Client::new()
            .post(format!("http://{addr}{PEER_USAGE_PATH}"))
            .body(body),
    };
    #[derive(serde::Deserialize)]
    struct Rows {
        data: Vec<shoal_store::UsageRow>,
    }
    let resp = req
        .header("content-type", "application/json")
        .timeout(std::time::Duration::from_secs(30))
        .send()
        .await?
        .error_for_status()?;
    Ok(resp.json::<Rows>().await?.data)
}
