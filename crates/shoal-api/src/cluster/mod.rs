//! The cluster over HTTP. `/v1/cluster/status` is the control route peers
//! call with signed heartbeats (a bad or missing signature is a 401, and a
//! good one is how a node joins); `/v1/cluster/nodes` and
//! `/v1/cluster/events` (SSE) show every node to the UI.
//!
//! Beside this file: `instances` (`/v1/instances`: placing a model on a
//! node, listing and removing placements), `shards` (a model split by layers
//! over several nodes on MLX's ring) and `forward` (passing a request for a
//! model this node does not hold to the node that does).
pub mod forward;
pub mod instances;
mod peer;
pub use crate::state::placement;
pub mod shards;

pub use forward::forward;
pub(crate) use peer::peer_rows;
pub use peer::Peer;
pub use placement::{
    Instance, Upstream, FORWARDED_HEADER, INSTANCES_PATH, INSTANCE_REMOVE_PATH, PEER_USAGE_PATH,
};
use placement::{LOAD_PATH, UNLOAD_PATH};
pub use shards::describe;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use shoal_cluster::{Cluster, ModelLoad, NodeStatus, Requests, Signed, StatusReply};

use crate::error::{ApiError, DialectError, ErrorShape};
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(shoal_cluster::STATUS_PATH, get(status))
        .route(LOAD_PATH, axum::routing::post(control_load))
        .route(UNLOAD_PATH, axum::routing::post(control_unload))
        .route("/v1/cluster/nodes", get(nodes))
        .route("/v1/cluster/events", get(events))
        .route(
            placement::PREPARE_PATH,
            axum::routing::post(shards::prepare),
        )
        .route(placement::START_PATH, axum::routing::post(shards::start))
        .route(placement::STOP_PATH, axum::routing::post(shards::stop))
        .route(
            INSTANCES_PATH,
            axum::routing::post(instances::own_instances),
        )
        .route(
            INSTANCE_REMOVE_PATH,
            axum::routing::post(instances::remove_for_peer),
        )
        .route(
            "/v1/instances",
            get(instances::list_instances).post(instances::place),
        )
        .route(
            "/v1/instances/preview",
            axum::routing::post(instances::preview),
        )
        .route(
            "/v1/instances/{id}",
            axum::routing::delete(instances::remove_instance),
        )
}

#[derive(serde::Deserialize)]
struct ModelBody {
    model: String,
}

async fn control_load(
    State(s): State<AppState>,
    Peer(req): Peer<ModelBody>,
) -> Result<Response, DialectError> {
    let engine = s
        .pool
        .engine(&req.model)
        .await
        .map_err(|e| e.in_dialect(ErrorShape::OPENAI))?;
    Ok(Json(
        json!({"model": engine.model.id, "memory_bytes": engine.model.resident_bytes(),
                    "backend": engine.model.info.backend}),
    )
    .into_response())
}

async fn control_unload(
    State(s): State<AppState>,
    Peer(req): Peer<ModelBody>,
) -> Result<Response, DialectError> {
    Ok(Json(json!({"model": req.model, "unloaded": s.pool.unload(&req.model)})).into_response())
}

impl AppState {
    /// This node's status with the models it holds and its load.
    pub fn self_status(&self) -> NodeStatus {
        let mut models: Vec<ModelLoad> = self
            .pool
            .loaded()
            .iter()
            .map(|e| ModelLoad {
                id: e.model.id.clone(),
                memory_bytes: e.model.resident_bytes() as u64,
                backend: e.model.info.backend.to_string(),
            })
            .collect();
        // Models split over nodes from here are served here too.
        let pipelines: Vec<Instance> = self
            .instances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|i| i.sharding == "pipeline" && i.entry == self.node.identity().id)
            .cloned()
            .collect();
        for i in pipelines {
            if shards::healthy(self, &i).is_ok() && !models.iter().any(|m| m.id == i.model) {
                models.push(ModelLoad {
                    id: i.model.clone(),
                    memory_bytes: 0,
                    backend: shoal_engine::BackendKind::Mlx.to_string(),
                });
            }
        }
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
        let deny = |m: String| ApiError::unauthorized(m).in_dialect(ErrorShape::OPENAI);
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
