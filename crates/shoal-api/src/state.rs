//! The server's shared state (`AppState`: the model pool, the ledger, the
//! node, access rules …) and one request's view of it (`Served`: the state
//! plus the engine of the model it named).
use std::sync::Arc;

use shoal_cluster::{LocalNode, NodeIdentity};
use shoal_engine::{ChatMessage, Engine};

use crate::error::ApiError;
use crate::ledger::Ledger;
use crate::{access, cluster, conversations, dialects, ledger, metrics, pool, run, tools};

/// Shared server state.
#[derive(Clone)]
pub struct AppState {
    /// The models this server answers with, loaded on demand.
    pub pool: Arc<pool::ModelPool>,
    pub ledger: Arc<Ledger>,
    pub responses: Arc<dialects::openai_responses::ResponseStore>,
    /// This node's identity and live status.
    pub node: Arc<LocalNode>,
    /// Generations in progress (cancelled when the server shuts down).
    pub running: Arc<run::Running>,
    /// Log each request's prompt text (off by default: prompts are private).
    pub log_prompts: bool,
    /// Counters and histograms behind `/metrics`.
    pub metrics: Arc<metrics::Metrics>,
    /// Conversation history for `/v1/conversations`; `None` serves 503s.
    pub store: Option<conversations::SharedStore>,
    /// Join a cluster with these settings once listening (`None`: alone).
    pub cluster_options: Option<shoal_cluster::ClusterOptions>,
    /// The cluster, set when serving starts.
    pub cluster: Arc<std::sync::OnceLock<Arc<shoal_cluster::Cluster>>>,
    /// API keys, browser origins and request limits.
    pub access: Arc<access::Access>,
    /// The keys' recent requests, for their per-minute limits.
    pub limits: Arc<access::Limits>,
    /// This node's `shoal shard` processes, by instance.
    pub shards: cluster::shards::Shards,
    /// Models placed on nodes through `/v1/instances`.
    pub instances: Arc<std::sync::Mutex<std::collections::BTreeMap<String, cluster::Instance>>>,
    /// Per-million-token prices by model (`[prices.MODEL]`): `/v1/usage`
    /// shows what its traffic would have cost there. Empty: no costs.
    pub prices: Arc<ledger::Prices>,
    /// The switch for Ollama's own port beside the main one (off: `None`
    /// port); what listening on it gave shows in `/health`.
    pub ollama: Arc<dialects::ollama::port::OllamaPort>,
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
    /// A server on one already started engine (kept loaded).
    pub fn new(engine: Engine) -> Self {
        let pool = pool::ModelPool::new(pool::PoolOptions::default());
        pool.insert(engine, Vec::new());
        AppState::with_pool(pool)
    }

    /// A server on a pool of models.
    pub fn with_pool(pool: Arc<pool::ModelPool>) -> Self {
        let backend = if cfg!(target_os = "macos") {
            "metal"
        } else {
            "cpu"
        };
        AppState {
            node: LocalNode::start(NodeIdentity::for_this_machine(), backend),
            pool,
            ledger: Arc::new(Ledger::in_memory(10_000, crate::dialects::registry())),
            responses: Arc::new(dialects::openai_responses::ResponseStore::new(256)),
            running: Arc::new(run::Running::default()),
            store: None,
            cluster_options: None,
            cluster: Arc::default(),
            instances: Arc::default(),
            shards: Arc::default(),
            access: Arc::new(access::Access::default()),
            limits: Arc::default(),
            metrics: Arc::new(metrics::Metrics::new()),
            log_prompts: false,
            prices: Arc::default(),
            ollama: Arc::default(),
        }
    }

    /// Opens (creating or migrating) the conversation store at `path`, and
    /// the usage ledger in the same file, kept for `retention`.
    pub fn with_store(
        mut self,
        path: &std::path::Path,
        retention: ledger::Retention,
    ) -> Result<Self, shoal_store::StoreError> {
        let store = shoal_store::Store::open(path)?;
        self.store = Some(Arc::new(std::sync::Mutex::new(store)));
        self.ledger = Arc::new(Ledger::open(path, retention, crate::dialects::registry())?);
        Ok(self)
    }

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

impl Served {
    /// A chat request's prompt: the server's limits on messages and tools,
    /// then the engine's one prompt decision (`shoal_engine::prompt`).
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
        tools: Option<&tools::ToolRequest>,
    ) -> Result<shoal_engine::prompt::ChatPrompt, ApiError> {
        let limits = &self.access;
        if messages.len() > limits.max_messages {
            return Err(ApiError::param(
                "messages",
                format!(
                    "{} messages is more than this server accepts ({}; server.max_messages)",
                    messages.len(),
                    limits.max_messages
                ),
            ));
        }
        if let Some(t) = tools.filter(|t| t.defs.len() > limits.max_tools) {
            return Err(ApiError::param(
                "tools",
                format!(
                    "{} tools is more than this server accepts ({}; server.max_tools)",
                    t.defs.len(),
                    limits.max_tools
                ),
            ));
        }
        Ok(shoal_engine::prompt::chat_prompt(
            &self.engine.model.vocab,
            messages,
            want,
            offer(tools),
        )?)
    }

    /// The tokens of `messages` as whole turns, without the generation
    /// prompt (see [`shoal_engine::prompt::turns_prompt`]).
    pub fn turns_prompt(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
        tools: Option<&tools::ToolRequest>,
    ) -> Result<Vec<u32>, ApiError> {
        Ok(shoal_engine::prompt::turns_prompt(
            &self.engine.model.vocab,
            messages,
            want.is_some(),
            offer(tools),
        )?)
    }
}

/// The tools a request offers, as the engine's prompt builder takes them.
fn offer(tools: Option<&tools::ToolRequest>) -> Option<shoal_engine::prompt::ToolOffer<'_>> {
    tools.map(|t| shoal_engine::prompt::ToolOffer {
        defs: &t.defs,
        choice: &t.choice,
    })
}
