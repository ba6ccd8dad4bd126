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

use crate::error::{ApiError, DialectError, ErrorShape};
use crate::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(shoal_cluster::STATUS_PATH, get(status))
        .route(LOAD_PATH, axum::routing::post(control_load))
        .route(UNLOAD_PATH, axum::routing::post(control_unload))
        .route("/v1/cluster/nodes", get(nodes))
        .route("/v1/cluster/events", get(events))
        .route(
            crate::shards::PREPARE_PATH,
            axum::routing::post(crate::shards::prepare),
        )
        .route(
            crate::shards::START_PATH,
            axum::routing::post(crate::shards::start),
        )
        .route(
            crate::shards::STOP_PATH,
            axum::routing::post(crate::shards::stop),
        )
        .route(INSTANCES_PATH, axum::routing::post(own_instances))
        .route(INSTANCE_REMOVE_PATH, axum::routing::post(remove_for_peer))
        .route("/v1/instances", get(list_instances).post(place))
        .route("/v1/instances/preview", axum::routing::post(preview))
        .route("/v1/instances/{id}", axum::routing::delete(remove_instance))
}

/// Control routes a node calls on another to place or drop a model, or to
/// read the instances it placed.
const LOAD_PATH: &str = "/v1/cluster/load";
pub const INSTANCES_PATH: &str = "/v1/cluster/instances";
pub const INSTANCE_REMOVE_PATH: &str = "/v1/cluster/instances/remove";
const UNLOAD_PATH: &str = "/v1/cluster/unload";

#[derive(serde::Deserialize)]
struct ModelBody {
    model: String,
}

/// A control request from a peer: its signature checked (the sender
/// becomes a peer), its JSON body parsed. Every control route takes one.
pub struct Peer<T>(pub T);

impl<T: serde::de::DeserializeOwned> axum::extract::FromRequest<AppState> for Peer<T> {
    type Rejection = DialectError;

    async fn from_request(
        req: axum::extract::Request,
        s: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, s.access.max_body_bytes)
            .await
            .map_err(|_| {
                crate::body::too_large(Some(s.access.max_body_bytes)).in_dialect(ErrorShape::OpenAi)
            })?;
        s.verify_peer(&parts.method, &parts.uri, &parts.headers, &bytes)?;
        let json: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        serde_json::from_slice(json)
            .map(Peer)
            .map_err(|e| ApiError::invalid(e.to_string()).in_dialect(ErrorShape::OpenAi))
    }
}

async fn control_load(
    State(s): State<AppState>,
    Peer(req): Peer<ModelBody>,
) -> Result<Response, DialectError> {
    let engine = s
        .pool
        .engine(&req.model)
        .await
        .map_err(|e| e.in_dialect(ErrorShape::OpenAi))?;
    Ok(Json(
        json!({"model": engine.model.id, "memory_bytes": engine.model.info.resident_bytes(),
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

/// A model placed on a node by `POST /v1/instances`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Instance {
    pub id: String,
    pub model: String,
    pub sharding: String,
    pub nodes: Vec<String>,
    /// The node requests for the model go to.
    pub entry: String,
    pub created: u64,
    /// Each node's layers, `[first, end)`, in rank order (pipelines).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<(usize, usize)>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlaceRequest {
    model: String,
    #[serde(default)]
    nodes: Option<serde_json::Value>,
    /// `pipeline` (by layers) is the only scheme; one node needs none.
    #[serde(default)]
    sharding: Option<String>,
}

fn bad(message: impl Into<String>) -> DialectError {
    ApiError::invalid(message).in_dialect(ErrorShape::OpenAi)
}

/// An instance as listed: `ready` while its node is up with the model
/// loaded, `failed` once the node is unreachable or gone, else `unloaded`.
pub fn describe(s: &AppState, i: &Instance) -> serde_json::Value {
    let self_id = s.node.identity().id.clone();
    let status = if i.sharding == "pipeline" {
        if crate::shards::healthy(s, i).is_ok() {
            "ready"
        } else {
            "failed"
        }
    } else if i.entry == self_id {
        if s.pool.loaded_engine(&i.model).is_some() {
            "ready"
        } else {
            "unloaded"
        }
    } else {
        let peers = s.cluster().map(|c| c.peers()).unwrap_or_default();
        match peers.iter().find(|p| p.id == i.entry) {
            Some(p) if p.status == "online" && p.models.iter().any(|m| m.id == i.model) => "ready",
            Some(p) if p.status == "online" => "unloaded",
            _ => "failed",
        }
    };
    let mut v = serde_json::to_value(i).unwrap_or_default();
    v["object"] = json!("instance");
    v["status"] = json!(status);
    v
}

/// The instances this node placed.
fn placed_here(s: &AppState) -> Vec<serde_json::Value> {
    s.instances
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .map(|i| describe(s, i))
        .collect()
}

/// A peer asks for the instances this node placed (signed).
async fn own_instances(
    State(s): State<AppState>,
    Peer(_): Peer<serde_json::Value>,
) -> impl IntoResponse {
    Json(json!({"object": "list", "data": placed_here(&s)}))
}

/// Every instance in the cluster: the ones placed here and, asked of each
/// online peer, the ones placed there (a peer that does not answer within a
/// few seconds is left out rather than holding the list up).
async fn list_instances(State(s): State<AppState>) -> impl IntoResponse {
    let mut all = placed_here(&s);
    if let Some(cluster) = s.cluster() {
        let asks = cluster.peers().into_iter().filter_map(|p| {
            let addr = cluster.address_of(&p.id)?;
            let req = cluster
                .signed(reqwest::Method::POST, &addr, INSTANCES_PATH, b"{}".to_vec())
                .timeout(std::time::Duration::from_secs(3));
            Some(async move {
                let v: serde_json::Value = req.send().await.ok()?.json().await.ok()?;
                v["data"].as_array().cloned()
            })
        });
        for list in futures::future::join_all(asks).await.into_iter().flatten() {
            for inst in list {
                if !all.iter().any(|i| i["id"] == inst["id"]) {
                    all.push(inst);
                }
            }
        }
    }
    all.sort_by(|a, b| {
        (a["created"].as_u64(), a["id"].as_str()).cmp(&(b["created"].as_u64(), b["id"].as_str()))
    });
    Json(json!({"object": "list", "data": all}))
}

/// Places a model on one node: the named one, or with `"nodes": "auto"` the
/// online node with the most free memory.
async fn place(
    State(s): State<AppState>,
    body: crate::body::Body,
) -> Result<Response, DialectError> {
    let req: PlaceRequest =
        crate::body::parse(&body).map_err(|e| e.in_dialect(ErrorShape::OpenAi))?;
    let self_id = s.node.identity().id.clone();
    let mut candidates = vec![s.self_status()];
    if let Some(c) = s.cluster() {
        candidates.extend(c.peers().into_iter().filter(|p| p.status == "online"));
    }
    let chosen: Vec<String> = match &req.nodes {
        None => vec![self_id.clone()],
        Some(serde_json::Value::String(a)) if a == "auto" => {
            let best = candidates
                .iter()
                .max_by_key(|n| n.memory.total_bytes.saturating_sub(n.memory.used_bytes))
                .map(|n| n.id.clone());
            best.into_iter().collect()
        }
        Some(serde_json::Value::Array(ids)) => ids
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("'nodes' lists node ids"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("'nodes' is a list of node ids or \"auto\"")),
    };
    if req.sharding.as_deref().is_some_and(|x| x != "pipeline") {
        return Err(bad("'sharding' is \"pipeline\" (by layers)"));
    }
    if req.sharding.is_some() && chosen.len() <= 1 {
        crate::shards::splittable(&s, &req.model)
            .await
            .map_err(|e| e.in_dialect(ErrorShape::OpenAi))?;
    }
    if chosen.len() > 1 {
        return crate::shards::place(&s, &req.model, chosen, true)
            .await
            .map(|v| Json(v).into_response())
            .map_err(|e| e.in_dialect(ErrorShape::OpenAi));
    }
    if chosen.is_empty() {
        return Err(bad("'nodes' is empty"));
    }
    let node = chosen[0].clone();
    if !candidates.iter().any(|n| n.id == node) {
        return Err(
            ApiError::not_found(format!("no online node '{node}'")).in_dialect(ErrorShape::OpenAi)
        );
    }
    if node == self_id {
        s.pool
            .engine(&req.model)
            .await
            .map_err(|e| e.in_dialect(ErrorShape::OpenAi))?;
    } else {
        let cluster = s.cluster().ok_or_else(|| bad("not in a cluster"))?;
        let addr = cluster.address_of(&node).ok_or_else(|| {
            ApiError::not_found(format!("no online node '{node}'")).in_dialect(ErrorShape::OpenAi)
        })?;
        let body = json!({"model": req.model}).to_string().into_bytes();
        let resp = cluster
            .signed(reqwest::Method::POST, &addr, LOAD_PATH, body)
            .header("content-type", "application/json")
            .timeout(std::time::Duration::from_secs(600))
            .send()
            .await
            .map_err(|e| {
                ApiError::unavailable(format!("node {node}: {e}")).in_dialect(ErrorShape::OpenAi)
            })?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            let mut out = Response::new(axum::body::Body::from(text));
            *out.status_mut() = axum::http::StatusCode::from_u16(status.as_u16())
                .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
            out.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            return Ok(out);
        }
        // The peer's next heartbeat lists the model; wait for it so the
        // instance is routable when this call returns.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline
            && !cluster
                .peers()
                .iter()
                .any(|p| p.id == node && p.models.iter().any(|m| m.id == req.model))
        {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    let instance = Instance {
        id: crate::run::new_id("inst_"),
        model: req.model.clone(),
        sharding: "none".into(),
        nodes: vec![node.clone()],
        entry: node,
        created: crate::run::now_secs(),
        layers: Vec::new(),
    };
    s.instances
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(instance.id.clone(), instance.clone());
    Ok(Json(describe(&s, &instance)).into_response())
}

#[derive(serde::Deserialize)]
struct IdBody {
    id: String,
}

/// Removes an instance wherever it was placed: here, or on the peer that
/// placed it (every node lists them all, so any node can remove them).
async fn remove_instance(
    State(s): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, DialectError> {
    if let Some(done) = remove_placed_here(&s, &id).await {
        return Ok(done);
    }
    if let Some(cluster) = s.cluster() {
        let body = json!({ "id": id }).to_string().into_bytes();
        for peer in cluster.peers() {
            let Some(addr) = cluster.address_of(&peer.id) else {
                continue;
            };
            let sent = cluster
                .signed(
                    reqwest::Method::POST,
                    &addr,
                    INSTANCE_REMOVE_PATH,
                    body.clone(),
                )
                .timeout(std::time::Duration::from_secs(10))
                .send()
                .await;
            if let Ok(r) = sent.and_then(|r| r.error_for_status()) {
                if let Ok(v) = r.json::<serde_json::Value>().await {
                    return Ok(Json(v).into_response());
                }
            }
        }
    }
    Err(ApiError::not_found(format!("no instance '{id}'")).in_dialect(ErrorShape::OpenAi))
}

/// A peer removes an instance this node placed (signed).
async fn remove_for_peer(
    State(s): State<AppState>,
    Peer(body): Peer<IdBody>,
) -> Result<Response, DialectError> {
    remove_placed_here(&s, &body.id).await.ok_or_else(|| {
        ApiError::not_found(format!("no instance '{}'", body.id)).in_dialect(ErrorShape::OpenAi)
    })
}

/// Removes an instance this node placed; `None` if it placed none by that id.
async fn remove_placed_here(s: &AppState, id: &str) -> Option<Response> {
    let removed = s
        .instances
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(id)?;
    if removed.sharding == "pipeline" {
        crate::shards::stop_all(s, &removed);
    } else if removed.entry == s.node.identity().id {
        s.pool.unload(&removed.model);
    } else if let Some((c, addr)) = s
        .cluster()
        .and_then(|c| c.address_of(&removed.entry).map(|a| (c, a)))
    {
        let body = json!({"model": removed.model}).to_string().into_bytes();
        let _ = c
            .signed(reqwest::Method::POST, &addr, UNLOAD_PATH, body)
            .send()
            .await;
    }
    Some(Json(json!({"id": id, "object": "instance", "deleted": true})).into_response())
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
                memory_bytes: e.model.info.resident_bytes() as u64,
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
            if crate::shards::healthy(self, &i).is_ok() && !models.iter().any(|m| m.id == i.model) {
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
        let deny = |m: String| ApiError::unauthorized(m).in_dialect(ErrorShape::OpenAi);
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

/// Marks a request one node forwarded to another, so it is never forwarded again.
pub const FORWARDED_HEADER: &str = "x-shoal-forwarded";

/// Routes whose body names a model and may run on another node.
const FORWARDABLE: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

/// Sends requests for a model this node does not have to a peer that has
/// it loaded, and streams the peer's answer back unchanged. If the peer
/// goes away mid-answer, the stream ends with the dialect's error event.
pub async fn forward(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path().to_string();
    let Some(cluster) = s.cluster() else {
        return next.run(req).await;
    };
    if req.method() != Method::POST
        || !FORWARDABLE.contains(&path.as_str())
        || req.headers().contains_key(FORWARDED_HEADER)
    {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, s.access.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return crate::body::too_large(Some(s.access.max_body_bytes))
                .in_dialect(ErrorShape::for_path(&path))
                .into_response()
        }
    };
    let model = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_string));
    // A model split over nodes from here goes to its first stage.
    if let Some(target) = model.as_deref().and_then(|m| crate::shards::route(&s, m)) {
        return proxy(target, parts, bytes, ErrorShape::for_path(&path)).await;
    }
    // A model loaded here is served here; one loaded on a peer goes there
    // (no second copy in memory); otherwise this node loads it if it can.
    let target = model
        .as_deref()
        .filter(|m| s.pool.loaded_engine(m).is_none())
        .and_then(|m| {
            cluster
                .peers()
                .into_iter()
                .find(|p| p.status == "online" && p.models.iter().any(|x| x.id == m))
        });
    let Some(peer) = target else {
        let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
        return next.run(req).await;
    };
    let Some(addr) = cluster.address_of(&peer.id) else {
        let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
        return next.run(req).await;
    };
    tracing::info!(model = model.as_deref().unwrap_or(""), peer = %peer.id, "forwarding");
    let watched = cluster.clone();
    let id = peer.id.clone();
    let target = Target {
        addr,
        what: format!("node {}", peer.id),
        signer: Some(cluster),
        watch: Box::new(move || {
            watched
                .address_of(&id)
                .is_none()
                .then(|| format!("node {id} became unreachable mid-answer"))
        }),
    };
    proxy(target, parts, bytes, ErrorShape::for_path(&path)).await
}

/// Where a request is passed on to, and what tells that it has failed.
pub struct Target {
    /// `host:port` of the API that answers.
    pub addr: String,
    /// Names it in error messages.
    pub what: String,
    /// Sign the request as this cluster (peers); `None` for a local shard.
    pub signer: Option<Arc<Cluster>>,
    /// Checked twice a second while an answer streams: `Some(reason)` ends it.
    pub watch: Box<dyn Fn() -> Option<String> + Send + Sync>,
}

pub async fn proxy(
    target: Target,
    parts: axum::http::request::Parts,
    body: axum::body::Bytes,
    dialect: ErrorShape,
) -> Response {
    let Target {
        addr,
        what: peer,
        signer,
        watch: check,
    } = target;
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str())
        .to_string();
    let mut req = match &signer {
        Some(cluster) => cluster.signed(reqwest::Method::POST, &addr, &path, body.to_vec()),
        None => reqwest::Client::new()
            .post(format!("http://{addr}{path}"))
            .body(body.to_vec()),
    }
    .header(FORWARDED_HEADER, "1");
    for name in [
        "content-type",
        "accept",
        "anthropic-version",
        "anthropic-beta",
        "authorization",
        "x-api-key",
    ] {
        if let Some(v) = parts.headers.get(name).and_then(|v| v.to_str().ok()) {
            req = req.header(name, v);
        }
    }
    // Generations can take long: no overall timeout, but the peer's health
    // is watched while the answer streams.
    let resp = match req
        .timeout(std::time::Duration::from_secs(24 * 3600))
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return ApiError::unavailable(format!("{peer} holding the model did not answer: {e}"))
                .in_dialect(dialect)
                .into_response()
        }
    };
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let sse = content_type.starts_with("text/event-stream");
    let out_status = axum::http::StatusCode::from_u16(status.as_u16())
        .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
    if !sse {
        // A whole JSON answer: passed on as one sized body, or an error if
        // the peer died before finishing it.
        return match resp.bytes().await {
            Ok(b) => (
                out_status,
                [(axum::http::header::CONTENT_TYPE, content_type)],
                b,
            )
                .into_response(),
            Err(e) => ApiError::unavailable(format!("{peer} failed mid-answer: {e}"))
                .in_dialect(dialect)
                .into_response(),
        };
    }
    let (tx, rx) =
        tokio::sync::mpsc::unbounded_channel::<Result<axum::body::Bytes, std::io::Error>>();
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut upstream = resp.bytes_stream();
        let mut watch = tokio::time::interval(std::time::Duration::from_millis(500));
        loop {
            tokio::select! {
                chunk = upstream.next() => match chunk {
                    Some(Ok(b)) => {
                        if tx.send(Ok(b)).is_err() {
                            return; // client gone: dropping the upstream cancels there
                        }
                    }
                    Some(Err(e)) => {
                        fail(&tx, sse, dialect, &format!("{peer} failed mid-answer: {e}"));
                        return;
                    }
                    None => return,
                },
                _ = watch.tick() => {
                    if let Some(reason) = check() {
                        fail(&tx, sse, dialect, &reason);
                        return;
                    }
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let mut out = Response::new(axum::body::Body::from_stream(stream));
    *out.status_mut() = out_status;
    if let Ok(v) = axum::http::HeaderValue::from_str(&content_type) {
        out.headers_mut()
            .insert(axum::http::header::CONTENT_TYPE, v);
    }
    out
}

/// Ends a forwarded answer with the dialect's error (an SSE error event, or
/// a cut body for plain JSON, which a client reports as a broken response).
fn fail(
    tx: &tokio::sync::mpsc::UnboundedSender<Result<axum::body::Bytes, std::io::Error>>,
    sse: bool,
    dialect: ErrorShape,
    message: &str,
) {
    tracing::warn!("{message}");
    if sse {
        let err = ApiError::unavailable(message.to_string()).body(dialect);
        let frame = match dialect {
            ErrorShape::Anthropic => crate::sse::frame(Some("error"), &err.to_string()),
            ErrorShape::OpenAi => crate::sse::frame(None, &err.to_string()),
        };
        let _ = tx.send(Ok(frame.into()));
    } else {
        let _ = tx.send(Err(std::io::Error::other(message.to_string())));
    }
}

/// The memory each node would use for a placement, without placing it.
async fn preview(
    State(s): State<AppState>,
    body: crate::body::Body,
) -> Result<Response, DialectError> {
    let req: PlaceRequest =
        crate::body::parse(&body).map_err(|e| e.in_dialect(ErrorShape::OpenAi))?;
    let nodes: Vec<String> = match &req.nodes {
        Some(serde_json::Value::Array(ids)) => ids
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => vec![s.node.identity().id.clone()],
    };
    crate::shards::place(&s, &req.model, nodes, false)
        .await
        .map(|v| Json(v).into_response())
        .map_err(|e| e.in_dialect(ErrorShape::OpenAi))
}
