//! The server's shared state (`AppState`: the model pool, the ledger, the
//! node, access rules …) and one request's view of it (`Served`: the state
//! plus the engine of the model it named).
use std::sync::Arc;

use shoal_cluster::LocalNode;
use shoal_engine::Engine;

pub mod access;
pub mod placement;

use crate::dialects::ollama::port::OllamaPort;
use crate::error::ApiError;
use crate::ledger::Ledger;
use crate::{ledger, metrics, pool};
use access::{Access, Limits};
use placement::{Instance, Shards};

/// The conversation store, shared by the handlers that read and write it.
pub type SharedStore = Arc<std::sync::Mutex<shoal_store::Store>>;

/// Shared server state.
#[derive(Clone)]
pub struct AppState {
    /// The models this server answers with, loaded on demand.
    pub pool: Arc<pool::ModelPool>,
    pub ledger: Arc<Ledger>,
    /// This node's identity and live status.
    pub node: Arc<LocalNode>,
    /// Generations in progress (cancelled when the server shuts down).
    pub running: Arc<Running>,
    /// Log each request's prompt text (off by default: prompts are private).
    pub log_prompts: bool,
    /// Counters and histograms behind `/metrics`.
    pub metrics: Arc<metrics::Metrics>,
    /// Conversation history for `/v1/conversations`; `None` serves 503s.
    pub store: Option<SharedStore>,
    /// Join a cluster with these settings once listening (`None`: alone).
    pub cluster_options: Option<shoal_cluster::ClusterOptions>,
    /// The cluster, set when serving starts.
    pub cluster: Arc<std::sync::OnceLock<Arc<shoal_cluster::Cluster>>>,
    /// API keys, browser origins and request limits.
    pub access: Arc<Access>,
    /// The keys' recent requests, for their per-minute limits.
    pub limits: Arc<Limits>,
    /// This node's `shoal shard` processes, by instance.
    pub shards: Shards,
    /// Models placed on nodes through `/v1/instances`.
    pub instances: Arc<std::sync::Mutex<std::collections::BTreeMap<String, Instance>>>,
    /// Per-million-token prices by model (`[prices.MODEL]`): `/v1/usage`
    /// shows what its traffic would have cost there. Empty: no costs.
    pub prices: Arc<ledger::Prices>,
    /// The switch for Ollama's own port beside the main one (off: `None`
    /// port); what listening on it gave shows in `/health`.
    pub ollama: Arc<OllamaPort>,
    /// The state each dialect keeps for itself, by type (added by its
    /// registration: see [`Self::dialect_state`]).
    pub dialects: Arc<axum::http::Extensions>,
    /// The MCP servers of `mcp.json`, behind `/v1/mcp`.
    pub mcp: Arc<shoal_mcp::McpHub>,
}

/// One request's view of the server: the shared state and the engine of
/// the model the request named.
#[derive(Clone)]
pub struct Served {
    pub state: AppState,
    pub engine: Engine,
    /// How long the request waited for its model to be in memory (a
    /// load, or another request's load); Ollama reports it.
    pub ready_after: std::time::Duration,
}

impl std::ops::Deref for Served {
    type Target = AppState;
    fn deref(&self) -> &AppState {
        &self.state
    }
}

impl AppState {
    /// The requested model's engine (loading it if needed); unknown names are a 404.
    pub async fn serve(&self, model: &str) -> Result<Served, ApiError> {
        let asked = std::time::Instant::now();
        let engine = self.pool.engine(model).await?;
        Ok(Served {
            state: self.clone(),
            engine,
            ready_after: asked.elapsed(),
        })
    }

    /// The state of type `T` a dialect keeps for itself.
    pub fn dialect_state<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.dialects.get::<T>()
    }

    /// Requests running and queued over every loaded model.
    pub fn busy(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.pool.loaded().iter().fold((0, 0), |(r, q), e| {
            (
                r + e.stats.running.load(Relaxed),
                q + e.stats.queued.load(Relaxed),
            )
        })
    }
}

/// The generations in progress, so that shutting the server down can cancel
/// them: each then ends with its final event instead of being cut off.
#[derive(Default)]
pub struct Running {
    next: std::sync::atomic::AtomicU64,
    flags: std::sync::Mutex<std::collections::HashMap<u64, Vec<shoal_engine::CancelFlag>>>,
}

/// Unregisters a request's flags when dropped.
pub struct RunningGuard {
    set: std::sync::Arc<Running>,
    id: u64,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.set
            .flags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl Running {
    pub fn register(
        self: &std::sync::Arc<Self>,
        flags: Vec<shoal_engine::CancelFlag>,
    ) -> RunningGuard {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.flags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, flags);
        RunningGuard {
            set: self.clone(),
            id,
        }
    }

    /// Cancels every generation in progress; returns how many requests.
    pub fn cancel_all(&self) -> usize {
        let map = self.flags.lock().unwrap_or_else(|p| p.into_inner());
        map.values()
            .flatten()
            .for_each(shoal_engine::CancelFlag::cancel);
        map.len()
    }
}
