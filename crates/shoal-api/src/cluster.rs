//! The cluster over HTTP. `/v1/cluster/status` is the control route peers
//! call with signed heartbeats (a bad or missing signature is a 401, and a
//! good one is how a node joins); `/v1/cluster/nodes` and
//! `/v1/cluster/events` (SSE) show every node to the UI.
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use shoal_cluster::{Cluster, ModelLoad, NodeStatus, Requests, Signed, StatusReply};

use crate::error::{ApiError, Dialect, DialectError};
use crate::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(shoal_cluster::STATUS_PATH, get(status))
        .route("/v1/cluster/nodes", get(nodes))
        .route("/v1/cluster/events", get(events))
}

impl AppState {
    /// This node's status with the models it holds and its load.
    pub fn self_status(&self) -> NodeStatus {
        let models = self
            .pool
            .loaded()
            .iter()
            .map(|e| ModelLoad {
                id: e.model.id.clone(),
                memory_bytes: e.model.info.weight_bytes as u64,
            })
            .collect();
        let (in_flight, queued) = self.busy();
        self.node.status(models, Requests { in_flight, queued })
    }

    /// The cluster this node belongs to, once serving with a secret.
    pub fn cluster(&self) -> Option<Arc<Cluster>> {
        self.cluster.get().cloned()
    }

    /// Checks a control request's signature; the sender becomes a peer.
    pub fn verify_peer(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(Arc<Cluster>, Signed), DialectError> {
        let deny = |m: String| ApiError::unauthorized(m).in_dialect(Dialect::OpenAi);
        let cluster = self
            .cluster()
            .ok_or_else(|| deny("this node is not in a cluster (no cluster secret)".into()))?;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let who = cluster
            .secret()
            .verify(method.as_str(), uri.path(), header, body)
            .map_err(|e| {
                tracing::warn!(error = %e, "cluster request refused");
                deny(format!("cluster authentication failed: {e}"))
            })?;
        cluster.heard_from(&who);
        Ok((cluster, who))
    }
}

async fn status(
    State(s): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, DialectError> {
    let (cluster, _) = s.verify_peer(&method, &uri, &headers, b"")?;
    let reply = StatusReply {
        node: s.self_status(),
        peers: cluster.peer_addresses(),
    };
    Ok(Json(reply).into_response())
}

/// Every node: this one first, then its peers (online or unreachable).
async fn nodes(State(s): State<AppState>) -> impl IntoResponse {
    let mut all = vec![s.self_status()];
    if let Some(c) = s.cluster() {
        all.extend(c.peers());
    }
    Json(json!({"nodes": all}))
}

/// A `nodes` snapshot, then `joined` / `updated` / `unreachable` /
/// `removed` events as they happen.
async fn events(State(s): State<AppState>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut all = vec![s.self_status()];
    let cluster = s.cluster();
    if let Some(c) = &cluster {
        all.extend(c.peers());
    }
    let _ = tx.send(crate::sse::frame(
        Some("nodes"),
        &json!({"nodes": all}).to_string(),
    ));
    if let Some(c) = cluster {
        let mut sub = c.subscribe();
        tokio::spawn(async move {
            loop {
                let ev = match sub.recv().await {
                    Ok(ev) => ev,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => break,
                };
                let data = serde_json::to_string(&ev).unwrap_or_default();
                if tx.send(crate::sse::frame(Some(ev.kind), &data)).is_err() {
                    break;
                }
            }
        });
    }
    crate::sse::response(rx)
}
