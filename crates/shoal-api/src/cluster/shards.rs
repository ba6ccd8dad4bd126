//! Models split by layers over several nodes (pipeline instances). The
//! node a placement request reaches becomes rank 0: it asks every node for a
//! ring address, splits the layers in proportion to each node's free
//! memory, has the others start their `shoal shard` processes (signed
//! control routes) and starts its own rank-0 shard, whose API then answers
//! every request for the model — forwarded here from any node. If a node of
//! the instance goes away, its requests end with an error event, the
//! shards are stopped and the instance shows `failed`.

use std::path::Path;
use std::sync::Mutex;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tokio::io::AsyncBufReadExt;

use super::peer::Peer;
use super::placement::{Instance, ShardProc, Upstream, PREPARE_PATH, START_PATH, STOP_PATH};
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::state::AppState;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn openai(e: ApiError) -> DialectError {
    e.in_dialect(ErrorShape::OPENAI)
}

/// Starts one rank. Rank 0 returns once its API listens, which is when
/// every rank has joined the ring and loaded its layers.
async fn spawn(
    instance: &str,
    model: &Path,
    model_id: &str,
    layers: (usize, usize),
    rank: usize,
    hosts: &[Vec<String>],
) -> Result<ShardProc, ApiError> {
    let exe = std::env::var_os("SHOAL_BIN")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::current_exe().ok())
        .ok_or_else(|| ApiError::internal("cannot find the shoal binary to start a shard"))?;
    let hostfile = std::env::temp_dir().join(format!("shoal-ring-{instance}-{rank}.json"));
    std::fs::write(&hostfile, serde_json::to_vec(hosts).unwrap_or_default())
        .map_err(|e| ApiError::internal(format!("writing the ring's host file: {e}")))?;
    let mut cmd = tokio::process::Command::new(exe);
    // Stages that share this machine share its cores: idle OpenBLAS threads
    // spin, and one stage per core keeps them from starving each other.
    let host = |h: &Vec<String>| {
        h.first()
            .and_then(|a| a.rsplit_once(':'))
            .map(|(ip, _)| ip.to_string())
    };
    let mine = hosts.get(rank).and_then(host);
    let local = hosts.iter().filter(|h| host(h) == mine).count();
    if local > 1 && std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cmd.env("OPENBLAS_NUM_THREADS", (cores / local).max(1).to_string());
    }
    cmd.arg("shard")
        .arg("--model")
        .arg(model)
        .args(["--model-id", model_id])
        .args(["--layers", &format!("{}:{}", layers.0, layers.1)])
        .env("MLX_RANK", rank.to_string())
        .env("MLX_HOSTFILE", &hostfile)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| ApiError::internal(format!("starting a shard: {e}")))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let mut addr = None;
    if let Some(out) = stdout {
        let mut lines = tokio::io::BufReader::new(out).lines();
        if rank == 0 {
            let wait = tokio::time::timeout(std::time::Duration::from_secs(300), async {
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(rest) = line.split("http://").nth(1) {
                        return rest.split_whitespace().next().map(str::to_string);
                    }
                }
                None
            })
            .await;
            addr = wait.ok().flatten();
            if addr.is_none() {
                let _ = child.start_kill();
                return Err(ApiError::unavailable(
                    "the pipeline did not come up (a rank failed to join or load; see the logs)",
                ));
            }
        }
        // Keep draining so the shard never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    }
    Ok(ShardProc {
        child,
        addr,
        _stdin: stdin,
    })
}

/// A free port on this node's API address, for its place in the ring.
fn ring_address(s: &AppState) -> Result<String, ApiError> {
    let ip = s
        .node
        .address()
        .map(|a| a.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let l = std::net::TcpListener::bind((ip, 0))
        .map_err(|e| ApiError::internal(format!("no free port for the ring: {e}")))?;
    let addr = l
        .local_addr()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(addr.to_string())
}

pub async fn prepare(
    State(s): State<AppState>,
    Peer(_): Peer<serde::de::IgnoredAny>,
) -> Result<Response, DialectError> {
    let addr = ring_address(&s).map_err(openai)?;
    Ok(Json(json!({"address": addr})).into_response())
}

#[derive(serde::Serialize, serde::Deserialize)]
/// Start one rank of an instance.
pub struct StartRequest {
    instance: String,
    model: String,
    layers: (usize, usize),
    rank: usize,
    hosts: Vec<Vec<String>>,
}

pub async fn start(
    State(s): State<AppState>,
    Peer(req): Peer<StartRequest>,
) -> Result<Response, DialectError> {
    let (id, path) = s.pool.path_of(&req.model).map_err(openai)?;
    let shard = spawn(&req.instance, &path, &id, req.layers, req.rank, &req.hosts)
        .await
        .map_err(openai)?;
    lock(&s.shards).insert(req.instance, shard);
    Ok(Json(json!({"started": true})).into_response())
}

#[derive(serde::Serialize, serde::Deserialize)]
/// Stop this node's shard of an instance.
pub struct StopRequest {
    instance: String,
}

pub async fn stop(
    State(s): State<AppState>,
    Peer(req): Peer<StopRequest>,
) -> Result<Response, DialectError> {
    let stopped = lock(&s.shards).remove(&req.instance).is_some();
    Ok(Json(json!({"stopped": stopped})).into_response())
}

/// Layers per node in proportion to free memory; every node gets one at
/// least and the ranges cover all layers in order.
pub fn split(layers: usize, free: &[u64]) -> Vec<(usize, usize)> {
    let n = free.len().max(1);
    let total: u128 = free.iter().map(|&f| u128::from(f.max(1))).sum();
    let mut counts: Vec<usize> = free
        .iter()
        .map(|&f| ((layers as u128 * u128::from(f.max(1))) / total.max(1)) as usize)
        .map(|c| c.max(1))
        .collect();
    // Fix rounding: add to or take from the largest shares.
    while counts.iter().sum::<usize>() > layers {
        if let Some(m) = counts.iter_mut().filter(|c| **c > 1).max() {
            *m -= 1;
        } else {
            break;
        }
    }
    while counts.iter().sum::<usize>() < layers {
        if let Some((i, _)) = free.iter().enumerate().max_by_key(|(_, f)| **f) {
            counts[i] += 1;
        }
    }
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for c in counts {
        out.push((at, at + c));
        at += c;
    }
    out
}

/// Places a pipeline instance over `nodes` (this node first).
/// Refuses to split a model that runs on llama.cpp: splitting by layers runs
/// over MLX's own ring, and a llama.cpp model is placed whole on one node.
pub async fn splittable(s: &AppState, model: &str) -> Result<(), ApiError> {
    let pool = s.pool.clone();
    let name = model.to_string();
    let backend = tokio::task::spawn_blocking(move || pool.backend_of(&name))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    if backend == shoal_engine::BackendKind::Llama {
        return Err(ApiError::param(
            "sharding",
            format!(
                "model '{model}' runs on llama.cpp, which places a model whole on one node; \
                 splitting by layers runs over MLX's ring (start the nodes with --backend mlx \
                 to split this model)"
            ),
        ));
    }
    Ok(())
}

pub async fn place(
    s: &AppState,
    model: &str,
    nodes: Vec<String>,
    start: bool,
) -> Result<serde_json::Value, ApiError> {
    let cluster = s
        .cluster()
        .ok_or_else(|| ApiError::invalid("splitting a model needs a cluster (--cluster-secret)"))?;
    let self_id = s.node.identity().id.clone();
    if !nodes.contains(&self_id) {
        return Err(ApiError::param(
            "nodes",
            "send the placement to one of the instance's nodes: it becomes the first stage",
        ));
    }
    splittable(s, model).await?;
    let mut order = vec![self_id.clone()];
    order.extend(nodes.iter().filter(|n| **n != self_id).cloned());
    let (model_id, path) = s.pool.path_of(model)?;
    let card_path = path.clone();
    let card = tokio::task::spawn_blocking(move || shoal_models::ModelCard::read(&card_path))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::unavailable(format!("model '{model}' cannot be read: {e}")))?;
    let layers = card.layers.ok_or_else(|| {
        ApiError::unavailable(format!(
            "model '{model}' does not say how many layers it has"
        ))
    })? as usize;
    if layers < order.len() {
        return Err(ApiError::param(
            "nodes",
            format!("{layers} layers cannot be split over {} nodes", order.len()),
        ));
    }
    let mut statuses = vec![s.self_status()];
    statuses.extend(cluster.peers().into_iter().filter(|p| p.status == "online"));
    let mut free = Vec::with_capacity(order.len());
    for id in &order {
        let st = statuses
            .iter()
            .find(|n| &n.id == id)
            .ok_or_else(|| ApiError::not_found(format!("no online node '{id}'")))?;
        free.push(st.memory.total_bytes.saturating_sub(st.memory.used_bytes));
    }
    let ranges = split(layers, &free);
    let memory = card.weight_memory(cfg!(target_os = "macos"));
    let placements: Vec<serde_json::Value> = order
        .iter()
        .zip(&ranges)
        .map(|(node, (a, b))| {
            json!({"node": node, "layers": [a, b],
                   "memory_bytes": memory * (*b - *a) as u64 / layers as u64})
        })
        .collect();
    if !start {
        return Ok(json!({"model": model_id, "sharding": "pipeline", "placements": placements}));
    }
    let instance_id = crate::ids::new_id("inst_");
    // Every rank's address first: the ring needs them all up front.
    let mut hosts = Vec::with_capacity(order.len());
    for id in &order {
        let addr = if *id == self_id {
            ring_address(s)?
        } else {
            let peer = cluster
                .address_of(id)
                .ok_or_else(|| ApiError::not_found(format!("no online node '{id}'")))?;
            let resp = cluster
                .signed(reqwest::Method::POST, &peer, PREPARE_PATH, Vec::new())
                .send()
                .await
                .map_err(|e| ApiError::unavailable(format!("node {id}: {e}")))?;
            let v: serde_json::Value = resp
                .json()
                .await
                .map_err(|e| ApiError::unavailable(format!("node {id}: {e}")))?;
            v["address"]
                .as_str()
                .ok_or_else(|| ApiError::unavailable(format!("node {id} gave no ring address")))?
                .to_string()
        };
        hosts.push(vec![addr]);
    }
    // The peers' shards started so far (rank 0 is this node's own).
    let stop_others = |upto: usize| stop_shards(&cluster, &instance_id, &order[1..upto.max(1)]);
    for (rank, id) in order.iter().enumerate().skip(1) {
        let peer = cluster
            .address_of(id)
            .ok_or_else(|| ApiError::not_found(format!("no online node '{id}'")))?;
        let body = StartRequest {
            instance: instance_id.clone(),
            model: model_id.clone(),
            layers: ranges[rank],
            rank,
            hosts: hosts.clone(),
        };
        let ok = cluster
            .post_json(&peer, START_PATH, &body, std::time::Duration::from_secs(60))
            .send()
            .await
            .map(|r| r.status().is_success())
            .unwrap_or(false);
        if !ok {
            stop_others(rank).await;
            return Err(ApiError::unavailable(format!(
                "node {id} could not start its shard (does it have '{model_id}'?)"
            )));
        }
    }
    let first = match spawn(&instance_id, &path, &model_id, ranges[0], 0, &hosts).await {
        Ok(p) => p,
        Err(e) => {
            stop_others(order.len()).await;
            return Err(e);
        }
    };
    lock(&s.shards).insert(instance_id.clone(), first);
    let instance = Instance {
        id: instance_id.clone(),
        model: model_id,
        sharding: "pipeline".into(),
        nodes: order.clone(),
        entry: self_id,
        created: crate::ids::now_secs(),
        layers: ranges,
    };
    lock(&s.instances).insert(instance_id, instance.clone());
    let mut v = super::describe(s, &instance);
    v["placements"] = json!(placements);
    Ok(v)
}

/// Whether this node's shard of `instance` is running and every node of
/// the instance is online.
pub fn healthy(s: &AppState, i: &Instance) -> Result<(), String> {
    let alive = lock(&s.shards).get_mut(&i.id).is_some_and(ShardProc::alive);
    if !alive {
        return Err("its first stage is not running".into());
    }
    let self_id = s.node.identity().id.clone();
    let cluster = s.cluster();
    for n in &i.nodes {
        if *n != self_id && cluster.as_ref().and_then(|c| c.address_of(n)).is_none() {
            return Err(format!("node {n} is unreachable"));
        }
    }
    Ok(())
}

/// Stops every shard of a failed or removed instance.
pub fn stop_all(s: &AppState, i: &Instance) {
    lock(&s.shards).remove(&i.id);
    if let Some(cluster) = s.cluster() {
        let nodes = i.nodes.clone();
        let instance = i.id.clone();
        tokio::spawn(async move {
            stop_shards(&cluster, &instance, nodes.get(1..).unwrap_or_default()).await
        });
    }
}

/// Asks each of `nodes` to stop its shard of `instance`. Best effort: a
/// node that is gone or does not answer has nothing left running for it.
async fn stop_shards(cluster: &shoal_cluster::Cluster, instance: &str, nodes: &[String]) {
    let body = json!({ "instance": instance }).to_string().into_bytes();
    for id in nodes {
        if let Some(peer) = cluster.address_of(id) {
            let _ = cluster
                .signed(reqwest::Method::POST, &peer, STOP_PATH, body.clone())
                .send()
                .await;
        }
    }
}

/// Where a request for `model` goes when a healthy pipeline here serves it.
pub fn route(s: &AppState, model: &str) -> Option<Upstream> {
    let instance = lock(&s.instances)
        .values()
        .find(|i| i.sharding == "pipeline" && i.model == model)
        .cloned()?;
    if healthy(s, &instance).is_err() {
        return None;
    }
    let addr = lock(&s.shards).get(&instance.id)?.addr.clone()?;
    let state = s.clone();
    Some(Upstream {
        addr,
        what: format!("the pipeline of '{model}'"),
        signer: None,
        ledger: Some(s.ledger.clone()),
        // Every stage's node, in rank order.
        ran_on: Some(instance.nodes.join(",")),
        watch: Box::new(move || {
            let bad = healthy(&state, &instance).err()?;
            tracing::warn!(instance = %instance.id, reason = %bad, "pipeline failed");
            stop_all(&state, &instance);
            Some(format!(
                "the pipeline serving '{}' failed: {bad}",
                instance.model
            ))
        }),
    })
}

/// An instance as listed: `ready` while its node is up with the model
/// loaded, `failed` once the node is unreachable or gone, else `unloaded`.
pub fn describe(s: &AppState, i: &Instance) -> serde_json::Value {
    let self_id = s.node.identity().id.clone();
    let status = if i.sharding == "pipeline" {
        if healthy(s, i).is_ok() {
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

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn layers_follow_free_memory_and_cover_the_model() {
        assert_eq!(split(30, &[1, 1]), vec![(0, 15), (15, 30)]);
        assert_eq!(split(30, &[3, 1]), vec![(0, 23), (23, 30)]);
        assert_eq!(split(4, &[100, 1, 1]), vec![(0, 2), (2, 3), (3, 4)]);
        let r = split(7, &[5, 5, 5]);
        assert_eq!(r.first().map(|x| x.0), Some(0));
        assert_eq!(r.last().map(|x| x.1), Some(7));
        assert!(r.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1));
    }
}
