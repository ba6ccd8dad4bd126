//! `/v1/instances`: a model placed on a node (the named one, or the online
//! node with the most free memory), listed across the cluster, removed from
//! any node; pipeline placements go through [`super::shards`].

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::body::OpenAiJson;
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::state::AppState;

use super::peer::Peer;
use super::placement::{Instance, INSTANCES_PATH, INSTANCE_REMOVE_PATH, LOAD_PATH, UNLOAD_PATH};
use super::shards::{self, describe};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlaceRequest {
    model: String,
    #[serde(default)]
    nodes: Option<serde_json::Value>,
    /// `pipeline` (by layers) is the only scheme; one node needs none.
    #[serde(default)]
    sharding: Option<String>,
}

pub(crate) fn bad(message: impl Into<String>) -> DialectError {
    ApiError::invalid(message).in_dialect(ErrorShape::OPENAI)
}

/// The instances this node placed.
pub(crate) fn placed_here(s: &AppState) -> Vec<serde_json::Value> {
    s.instances
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .map(|i| describe(s, i))
        .collect()
}

/// A peer asks for the instances this node placed (signed).
pub(crate) async fn own_instances(
    State(s): State<AppState>,
    Peer(_): Peer<serde_json::Value>,
) -> impl IntoResponse {
    Json(json!({"object": "list", "data": placed_here(&s)}))
}

/// Every instance in the cluster: the ones placed here and, asked of each
/// online peer, the ones placed there (a peer that does not answer within a
/// few seconds is left out rather than holding the list up).
pub(crate) async fn list_instances(State(s): State<AppState>) -> impl IntoResponse {
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
pub(crate) async fn place(
    State(s): State<AppState>,
    OpenAiJson(req): OpenAiJson<PlaceRequest>,
) -> Result<Response, DialectError> {
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
        shards::splittable(&s, &req.model)
            .await
            .map_err(|e| e.in_dialect(ErrorShape::OPENAI))?;
    }
    if chosen.len() > 1 {
        return shards::place(&s, &req.model, chosen, true)
            .await
            .map(|v| Json(v).into_response())
            .map_err(|e| e.in_dialect(ErrorShape::OPENAI));
    }
    if chosen.is_empty() {
        return Err(bad("'nodes' is empty"));
    }
    let node = chosen[0].clone();
    if !candidates.iter().any(|n| n.id == node) {
        return Err(
            ApiError::not_found(format!("no online node '{node}'")).in_dialect(ErrorShape::OPENAI)
        );
    }
    if node == self_id {
        s.pool
            .engine(&req.model)
            .await
            .map_err(|e| e.in_dialect(ErrorShape::OPENAI))?;
    } else {
        let cluster = s.cluster().ok_or_else(|| bad("not in a cluster"))?;
        let addr = cluster.address_of(&node).ok_or_else(|| {
            ApiError::not_found(format!("no online node '{node}'")).in_dialect(ErrorShape::OPENAI)
        })?;
        let body = json!({"model": req.model});
        let resp = cluster
            .post_json(&addr, LOAD_PATH, &body, std::time::Duration::from_secs(600))
            .send()
            .await
            .map_err(|e| {
                ApiError::unavailable(format!("node {node}: {e}")).in_dialect(ErrorShape::OPENAI)
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
        id: crate::ids::new_id("inst_"),
        model: req.model.clone(),
        sharding: "none".into(),
        nodes: vec![node.clone()],
        entry: node,
        created: crate::ids::now_secs(),
        layers: Vec::new(),
    };
    s.instances
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(instance.id.clone(), instance.clone());
    Ok(Json(describe(&s, &instance)).into_response())
}

#[derive(serde::Deserialize)]
pub(crate) struct IdBody {
    id: String,
}

/// Removes an instance wherever it was placed: here, or on the peer that
/// placed it (every node lists them all, so any node can remove them).
pub(crate) async fn remove_instance(
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
    Err(ApiError::not_found(format!("no instance '{id}'")).in_dialect(ErrorShape::OPENAI))
}

/// A peer removes an instance this node placed (signed).
pub(crate) async fn remove_for_peer(
    State(s): State<AppState>,
    Peer(body): Peer<IdBody>,
) -> Result<Response, DialectError> {
    remove_placed_here(&s, &body.id).await.ok_or_else(|| {
        ApiError::not_found(format!("no instance '{}'", body.id)).in_dialect(ErrorShape::OPENAI)
    })
}

/// Removes an instance this node placed; `None` if it placed none by that id.
pub(crate) async fn remove_placed_here(s: &AppState, id: &str) -> Option<Response> {
    let removed = s
        .instances
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(id)?;
    if removed.sharding == "pipeline" {
        shards::stop_all(s, &removed);
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

/// The memory each node would use for a placement, without placing it.
pub(crate) async fn preview(
    State(s): State<AppState>,
    OpenAiJson(req): OpenAiJson<PlaceRequest>,
) -> Result<Response, DialectError> {
    let nodes: Vec<String> = match &req.nodes {
        Some(serde_json::Value::Array(ids)) => ids
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => vec![s.node.identity().id.clone()],
    };
    shards::place(&s, &req.model, nodes, false)
        .await
        .map(|v| Json(v).into_response())
        .map_err(|e| e.in_dialect(ErrorShape::OPENAI))
}
