//! `/v1/cache`: what the prefix cache holds in RAM (per loaded model) and
//! on disk (every model's entries), and clearing it.
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;

use crate::state::AppState;

#[derive(Deserialize)]
pub struct Scope {
    /// One model's entries only (the name it is served under).
    model: Option<String>,
}

/// The RAM tier of each loaded model and the disk tier as a whole.
pub fn summary(s: &AppState) -> Value {
    let engines = s.pool.loaded();
    let ram: Vec<Value> = engines
        .iter()
        .filter(|e| e.model.embedding().is_none())
        .map(|e| {
            json!({
                "model": e.model.id,
                "bytes": e.stats.prefix_cache_bytes.load(Relaxed),
                "hits": e.stats.ram_hits.load(Relaxed),
                "misses": e.stats.ram_misses.load(Relaxed),
                "evictions": e.stats.ram_evictions.load(Relaxed),
                "cached_tokens": e.stats.cached_tokens.load(Relaxed),
                "cached_disk_tokens": e.stats.cached_disk_tokens.load(Relaxed),
            })
        })
        .collect();
    json!({
        "ram": {
            "bytes": ram.iter().filter_map(|r| r["bytes"].as_u64()).sum::<u64>(),
            "models": ram,
        },
        "disk": s.pool.disk_cache().map(|d| d.summary()),
    })
}

/// `GET /v1/cache`: the tiers, and each entry on disk (model, tokens,
/// bytes, last use), newest first.
pub async fn list(State(s): State<AppState>, Query(q): Query<Scope>) -> Json<Value> {
    let mut out = summary(&s);
    let entries: Vec<_> = s
        .pool
        .disk_cache()
        .map(|d| d.entries())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| q.model.as_ref().is_none_or(|m| *m == e.model))
        .collect();
    out["entries"] = json!(entries);
    Json(out)
}

/// `DELETE /v1/cache`: removes the disk entries (all, or `?model=`'s) at
/// once, and has each loaded model (or that one) drop its RAM entries
/// before it admits its next request.
pub async fn clear(State(s): State<AppState>, Query(q): Query<Scope>) -> Json<Value> {
    let removed = s
        .pool
        .disk_cache()
        .map_or(0, |d| d.clear(q.model.as_deref()));
    let mut ram = Vec::new();
    for e in s.pool.loaded() {
        if q.model.as_ref().is_none_or(|m| *m == e.model.id) {
            e.stats.clear_prefixes.store(true, Relaxed);
            ram.push(e.model.id.clone());
        }
    }
    Json(json!({
        "disk_entries_removed": removed,
        "ram_cleared_for": ram,
    }))
}
