//! The models this server can answer with, and which of them are in memory.
//!
//! A model is named in the config (by path) or pulled into the local library
//! (`shoal pull`, `POST /v1/models/pull`). It loads on first use or on
//! `POST /v1/models/{id}/load`, after a memory check: the estimate from its
//! card must fit in the budget once idle models are unloaded, and in the
//! RAM free now. Idle models unload after `idle_unload`. Unloading only
//! drops the pool's handle: requests already running on the engine finish.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shoal_engine::{Capabilities, Engine, EngineOptions};
use shoal_models::{HubOptions, Library, LocalModel, ModelCard, ModelsError};

use crate::error::{ApiError, ErrorKind};

/// How the pool loads and keeps models.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub engine: EngineOptions,
    /// Memory all loaded models may take together; `None`: three quarters of RAM.
    pub budget_bytes: Option<u64>,
    /// Unload a model nobody used for this long; `None`: keep it.
    pub idle_unload: Option<Duration>,
    /// Where pulls come from and go to.
    pub hub: HubOptions,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            engine: EngineOptions::default(),
            budget_bytes: None,
            idle_unload: None,
            hub: HubOptions::from_env(),
        }
    }
}

/// A model named by path (the config's model), with its other names.
#[derive(Clone, Debug)]
struct Named {
    id: String,
    path: PathBuf,
    aliases: Vec<String>,
}

struct Slot {
    engine: Engine,
    last_used: Instant,
    /// How long it stays loaded after its last use when a request said so
    /// (Ollama's `keep_alive`; `Some(None)`: until unloaded), instead of
    /// the pool's `idle_unload`.
    keep: Option<Option<Duration>>,
}

/// Loaded engines by id, plus what can be loaded.
pub struct ModelPool {
    opts: PoolOptions,
    named: Mutex<Vec<Named>>,
    loaded: Mutex<BTreeMap<String, Slot>>,
    /// One load at a time: two requests for a cold model load it once, and
    /// memory checks never race.
    loading: tokio::sync::Mutex<()>,
    gpu: bool,
    /// What each model not in memory can do, read from its files once per
    /// version of them (its path and modification time).
    capabilities: Mutex<BTreeMap<(PathBuf, Option<std::time::SystemTime>), Capabilities>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A model whose files are damaged (truncated, corrupt, missing parts):
/// the request cannot be served, but the server and other models are fine.
fn broken(id: &str, what: &str, e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(model = %id, error = %e, "model {what}");
    ApiError::unavailable(format!("model '{id}' {what}: {e}"))
        .with_param("model")
        .with_code("model_unavailable")
}

fn insufficient(message: String) -> ApiError {
    ApiError::unavailable(message)
        .with_param("model")
        .with_code("insufficient_memory")
}

/// The memory budget when none is set: three quarters of RAM.
pub fn default_budget() -> u64 {
    shoal_cluster::memory_now().0 / 4 * 3
}

impl ModelPool {
    pub fn new(mut opts: PoolOptions) -> Arc<ModelPool> {
        // An `auto` KV pool takes its share of this pool's budget: the
        // loads and the estimates before them size it alike.
        opts.engine.llama.memory_budget = Some(opts.budget_bytes.unwrap_or_else(default_budget));
        Arc::new(ModelPool {
            opts,
            named: Mutex::new(Vec::new()),
            loaded: Mutex::new(BTreeMap::new()),
            loading: tokio::sync::Mutex::new(()),
            gpu: cfg!(target_os = "macos"),
            capabilities: Mutex::new(BTreeMap::new()),
        })
    }

    /// What `path`'s template and vocabulary can do, whether or not it is
    /// loaded (the same rule a load applies), remembered per file version.
    pub fn capabilities_at(&self, path: &std::path::Path) -> Capabilities {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let key = (path.to_path_buf(), modified);
        if let Some(c) = lock(&self.capabilities).get(&key) {
            return *c;
        }
        let mut caps = shoal_engine::loader::capabilities_at(path);
        // A GGUF on llama.cpp with a projector to load reads images.
        caps.vision = shoal_engine::backends::route(path, self.opts.engine.backend)
            .is_ok_and(|r| r.backend == shoal_engine::BackendKind::Llama)
            && self.opts.engine.llama.projector.for_model(path).is_some();
        lock(&self.capabilities).insert(key, caps);
        caps
    }

    /// Makes a model given by path known under `id` (and `aliases`).
    pub fn add_named(&self, id: &str, path: PathBuf, aliases: Vec<String>) {
        let mut named = lock(&self.named);
        named.retain(|n| n.id != id);
        named.push(Named {
            id: id.to_string(),
            path,
            aliases,
        });
    }

    /// Adopts an engine started elsewhere (its model becomes a named one).
    pub fn insert(&self, engine: Engine, aliases: Vec<String>) {
        let id = engine.model.id.clone();
        self.add_named(&id, engine.model.path.clone(), aliases);
        lock(&self.loaded).insert(
            id,
            Slot {
                engine,
                last_used: Instant::now(),
                keep: None,
            },
        );
    }

    pub fn library(&self) -> &Library {
        &self.opts.hub.library
    }

    pub fn hub(&self) -> &HubOptions {
        &self.opts.hub
    }

    /// The prefix cache's disk tier every model of the pool shares, if on.
    pub fn disk_cache(&self) -> Option<&std::sync::Arc<shoal_engine::disk_cache::DiskCache>> {
        self.opts.engine.disk_cache.as_ref()
    }

    /// The memory budget in bytes.
    pub fn budget(&self) -> u64 {
        self.opts.budget_bytes.unwrap_or_else(default_budget)
    }

    /// Whether `requested` names a model of the config (a file of the
    /// user's, never the library's to delete).
    pub fn is_named(&self, requested: &str) -> bool {
        self.named_id(requested).is_some()
    }

    /// The canonical id for a name: a named model or one of its aliases.
    fn named_id(&self, requested: &str) -> Option<Named> {
        lock(&self.named)
            .iter()
            .find(|n| n.id == requested || n.aliases.iter().any(|a| a == requested))
            .cloned()
    }

    /// The loaded engine for a name, without loading anything.
    pub fn loaded_engine(&self, requested: &str) -> Option<Engine> {
        self.loaded_exactly(requested)
            .or_else(|| untagged(requested).and_then(|id| self.loaded_exactly(id)))
    }

    /// [`ModelPool::loaded_engine`] for `requested` as it is spelled.
    fn loaded_exactly(&self, requested: &str) -> Option<Engine> {
        let id = self
            .named_id(requested)
            .map_or_else(|| requested.to_string(), |n| n.id);
        let mut loaded = lock(&self.loaded);
        if !loaded.contains_key(&id) {
            // A repo id names its one GGUF file (`org/name` → `org/name/x.gguf`).
            let prefix = format!("{id}/");
            let mut under = loaded.keys().filter(|k| k.starts_with(&prefix));
            if let (Some(only), None) = (under.next(), under.next()) {
                let only = only.clone();
                let slot = loaded.get_mut(&only)?;
                slot.last_used = Instant::now();
                return Some(slot.engine.clone());
            }
        }
        let slot = loaded.get_mut(&id)?;
        slot.last_used = Instant::now();
        Some(slot.engine.clone())
    }

    /// Loaded engines by id.
    pub fn loaded(&self) -> Vec<Engine> {
        lock(&self.loaded)
            .values()
            .map(|s| s.engine.clone())
            .collect()
    }

    /// The id and file of a model this node has (loaded or not).
    pub fn path_of(&self, requested: &str) -> Result<(String, PathBuf), ApiError> {
        if let Some(e) = self.loaded_engine(requested) {
            return Ok((e.model.id.clone(), e.model.path.clone()));
        }
        self.resolve(requested)
    }

    /// The backend a model runs on: the one it is loaded on, else the one
    /// this pool's backend setting would load it on. Reads a GGUF header, so
    /// call it off the async runtime.
    pub fn backend_of(&self, requested: &str) -> Result<shoal_engine::BackendKind, ApiError> {
        if let Some(e) = self.loaded_engine(requested) {
            return Ok(e.model.info.backend);
        }
        let (_, path) = self.resolve(requested)?;
        shoal_engine::backends::route(&path, self.opts.engine.backend)
            .map(|r| r.backend)
            .map_err(|e| ApiError::unavailable(format!("model '{requested}' cannot run here: {e}")))
    }

    /// What a name refers to: a named model, else a model in the library.
    fn resolve(&self, requested: &str) -> Result<(String, PathBuf), ApiError> {
        self.resolve_exactly(requested)
            .or_else(|| untagged(requested).and_then(|id| self.resolve_exactly(id)))
            .ok_or_else(|| ApiError::model_not_found(requested))
    }

    /// [`ModelPool::resolve`] for `requested` as it is spelled.
    fn resolve_exactly(&self, requested: &str) -> Option<(String, PathBuf)> {
        if let Some(n) = self.named_id(requested) {
            return Some((n.id, n.path));
        }
        self.library().find(requested).map(|m| (m.id, m.path))
    }

    /// The engine for `requested`, loading the model first if it is not in
    /// memory.
    pub async fn engine(&self, requested: &str) -> Result<Engine, ApiError> {
        if let Some(e) = self.loaded_engine(requested) {
            return Ok(e);
        }
        let (id, path) = self.resolve(requested)?;
        let _one = self.loading.lock().await;
        if let Some(e) = self.loaded_engine(&id) {
            return Ok(e);
        }
        let card_path = path.clone();
        let card = tokio::task::spawn_blocking(move || ModelCard::read(&card_path))
            .await
            .map_err(|e| ApiError::internal(format!("reading the model: {e}")))?
            .map_err(|e| broken(&id, "cannot be read", e))?;
        let route = shoal_engine::backends::route(&path, self.opts.engine.backend).ok();
        let need = self.estimate(&card, route.as_ref());
        self.make_room(&id, need)?;
        let opts = self.opts.engine.clone();
        let (load_id, load_path) = (id.clone(), path.clone());
        let started = Instant::now();
        let engine = tokio::task::spawn_blocking(move || Engine::start(&load_path, &load_id, opts))
            .await
            .map_err(|e| ApiError::internal(format!("loading the model: {e}")))?
            .map_err(|e| broken(&id, "failed to load", e))?;
        tracing::info!(model = %id, estimate_mb = need >> 20,
            memory_mb = engine.model.info.weight_bytes >> 20,
            ms = started.elapsed().as_millis() as u64, "model loaded on demand");
        lock(&self.loaded).insert(
            id,
            Slot {
                engine: engine.clone(),
                last_used: Instant::now(),
                keep: None,
            },
        );
        Ok(engine)
    }

    /// Unloads idle models, least recently used first, until `need` more
    /// bytes fit in the budget; refuses if they cannot, or if the machine
    /// does not have them free.
    fn make_room(&self, id: &str, need: u64) -> Result<(), ApiError> {
        let budget = self.budget();
        if need > budget {
            return Err(insufficient(format!(
                "model '{id}' needs about {} and the memory budget is {} (models.memory_budget_mb)",
                gib(need),
                gib(budget)
            )));
        }
        let mut loaded = lock(&self.loaded);
        let used =
            |l: &BTreeMap<String, Slot>| -> u64 { l.values().map(|s| held_bytes(&s.engine)).sum() };
        let mut freed = 0u64;
        while used(&loaded) + need > budget {
            let victim = loaded
                .iter()
                .filter(|(_, s)| idle(&s.engine))
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else {
                return Err(insufficient(format!(
                    "model '{id}' needs about {} but {} of the {} budget is held by models serving requests; retry when they finish",
                    gib(need),
                    gib(used(&loaded)),
                    gib(budget)
                )));
            };
            if let Some(s) = loaded.remove(&victim) {
                freed += held_bytes(&s.engine);
                tracing::info!(model = %victim, "unloaded to make room for {id}");
            }
        }
        let (_, available) = shoal_cluster::memory_now();
        if need > available + freed {
            return Err(insufficient(format!(
                "model '{id}' needs about {} but only {} of RAM is free",
                gib(need),
                gib(available + freed)
            )));
        }
        Ok(())
    }

    /// Drops the pool's handle on a model. Returns whether it was loaded.
    pub fn unload(&self, requested: &str) -> bool {
        let id = self
            .named_id(requested)
            .map_or_else(|| requested.to_string(), |n| n.id);
        let gone = lock(&self.loaded).remove(&id).is_some();
        if gone {
            tracing::info!(model = %id, "unloaded");
        }
        gone
    }

    /// Unloads every model and waits (up to `limit` each) for its engine to
    /// free it: called when the server stops, before the process exits.
    pub fn shutdown(&self, limit: Duration) {
        let slots: Vec<Slot> = std::mem::take(&mut *lock(&self.loaded))
            .into_values()
            .collect();
        for slot in slots {
            let id = slot.engine.model.id.clone();
            if !slot.engine.stop_and_wait(limit) {
                tracing::warn!(model = %id, "engine still busy at shutdown");
            }
        }
    }

    /// Keeps a loaded model for `keep` after its last use (`None`: until
    /// it is unloaded), overriding the pool's idle time for it.
    pub fn keep_alive(&self, requested: &str, keep: Option<Duration>) {
        let Some(e) = self.loaded_engine(requested) else {
            return;
        };
        if let Some(slot) = lock(&self.loaded).get_mut(&e.model.id) {
            slot.keep = Some(keep);
            slot.last_used = Instant::now();
        }
    }

    /// How long a slot stays loaded after its last use (`None`: for ever).
    fn idle_limit(&self, slot: &Slot) -> Option<Duration> {
        slot.keep.unwrap_or(self.opts.idle_unload)
    }

    /// Loaded engines, each with the moment it unloads if still idle then
    /// (`None`: never), for Ollama's `/api/ps`.
    pub fn expiries(&self) -> Vec<(Engine, Option<Instant>)> {
        lock(&self.loaded)
            .values()
            .map(|s| {
                let at = if idle(&s.engine) {
                    self.idle_limit(s).map(|l| s.last_used + l)
                } else {
                    // Busy now: its time starts when it is idle again.
                    self.idle_limit(s).map(|l| Instant::now() + l)
                };
                (s.engine.clone(), at)
            })
            .collect()
    }

    /// Unloads models idle for longer than their keep-alive or the
    /// configured idle time.
    pub fn sweep(&self) {
        let mut loaded = lock(&self.loaded);
        for slot in loaded.values_mut() {
            // A model busy now counts as used now.
            if !idle(&slot.engine) {
                slot.last_used = Instant::now();
            }
        }
        let stale: Vec<(String, Duration)> = loaded
            .iter()
            .filter_map(|(k, s)| {
                let limit = self.idle_limit(s)?;
                (s.last_used.elapsed() >= limit).then(|| (k.clone(), limit))
            })
            .collect();
        for (id, limit) in stale {
            loaded.remove(&id);
            tracing::info!(model = %id, idle_ms = limit.as_millis() as u64, "unloaded after idling");
        }
    }

    /// Runs `sweep` twice a second until the pool is dropped.
    pub fn start_sweeper(pool: &Arc<ModelPool>) {
        let weak: Weak<ModelPool> = Arc::downgrade(pool);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else { break };
                pool.sweep();
            }
        });
    }

    /// Every model that can be served: named ones, then the library.
    pub(crate) fn local_models(&self) -> Vec<(LocalModel, Vec<String>)> {
        let mut out = Vec::new();
        for n in lock(&self.named).iter() {
            let card = ModelCard::read(&n.path).unwrap_or_default();
            out.push((
                LocalModel {
                    id: n.id.clone(),
                    path: n.path.clone(),
                    source: shoal_models::Source::Path,
                    card,
                },
                n.aliases.clone(),
            ));
        }
        for m in self.library().list() {
            if !out.iter().any(|(o, _)| o.id == m.id) {
                out.push((m, Vec::new()));
            }
        }
        out
    }

    /// Memory a model will take once loaded: on llama.cpp the file as it is
    /// plus the KV cells and logits rows it reserves and its vocabulary
    /// tables; on MLX what the card says for this device.
    fn estimate(&self, card: &ModelCard, route: Option<&shoal_engine::backends::Route>) -> u64 {
        match route {
            Some(shoal_engine::backends::Route {
                backend: shoal_engine::BackendKind::Llama,
                header: Some(h),
            }) => self.gguf_estimate(h, card.size_bytes),
            _ => card.weight_memory(self.gpu),
        }
    }

    /// The memory a GGUF file not downloaded yet will be counted at once
    /// loaded, from its header alone (its `file_len` the file's size), as
    /// for the same file on disk; or why this server cannot run it.
    pub fn estimate_header(&self, h: shoal_gguf::Header, name: &Path) -> Result<u64, String> {
        let card = ModelCard::of_gguf(&h);
        let route = shoal_engine::backends::route_gguf(h, self.opts.engine.backend, name)
            .map_err(|e| e.to_string())?;
        Ok(self.estimate(&card, Some(&route)))
    }

    /// Memory a GGUF file of `size_bytes` whose header is `h` will take on
    /// llama.cpp: the file as it is plus the KV cells and logits rows it
    /// reserves and its vocabulary tables.
    fn gguf_estimate(&self, h: &shoal_gguf::Header, size_bytes: u64) -> u64 {
        use shoal_engine::backends::llama::{
            embed, kv_bytes_per_position_as, logits_bytes_per_sequence, vocab_table_bytes,
        };
        // An embedding model reserves for one pass, not a KV pool.
        if let Some((kv, buffers)) = embed::reserved_bytes(h) {
            return size_bytes + kv + buffers;
        }
        let llama = self.llama_options();
        let reserved = |h: &shoal_gguf::Header| {
            // The positions the load will reserve, `auto` sized by the same rule.
            let kv = (llama.kv_tokens_for(h) as u64)
                .saturating_mul(kv_bytes_per_position_as(h, llama.kv_type));
            let logits = (self.opts.engine.max_batch.max(1) as u64)
                .saturating_mul(logits_bytes_per_sequence(h));
            kv + logits + vocab_table_bytes(h)
        };
        size_bytes + reserved(h) + self.draft_estimate(h, reserved)
    }

    /// The llama.cpp options a model loads with (an engine's options for its
    /// batch, as `Engine::start` gives them).
    fn llama_options(&self) -> shoal_engine::LlamaOptions {
        self.opts
            .engine
            .llama
            .clone()
            .for_batch(self.opts.engine.max_batch)
    }

    /// The window one request gets on a model: the loaded model's, else the
    /// one it would load with here (on llama.cpp its trained window within
    /// its share of the KV pool, [`shoal_engine::LlamaOptions::window_for`];
    /// on MLX, whose cache grows to it, the trained window).
    fn served_window(
        &self,
        card: &ModelCard,
        route: Option<&shoal_engine::backends::Route>,
        loaded: Option<&shoal_engine::backend::ModelInfo>,
    ) -> Option<u64> {
        if let Some(info) = loaded {
            return Some(info.context_length as u64);
        }
        match route {
            Some(shoal_engine::backends::Route {
                backend: shoal_engine::BackendKind::Llama,
                header: Some(h),
            }) => Some(self.llama_options().window_for(h) as u64),
            _ => card.context_length,
        }
    }

    /// [`ModelPool::served_window`] of a local model (reads a GGUF header
    /// when it is not loaded: call it off the async runtime).
    pub(crate) fn window_of(&self, m: &LocalModel) -> Option<u64> {
        if let Some(slot) = lock(&self.loaded).get(&m.id) {
            return Some(slot.engine.model.info.context_length as u64);
        }
        let route = shoal_engine::backends::route(&m.path, self.opts.engine.backend).ok();
        self.served_window(&m.card, route.as_ref(), None)
    }

    /// The draft model's share of a llama.cpp model's estimate: its file and
    /// what it reserves, when one is configured and has as many tokens as
    /// the target (the engine loads it only for a vocabulary it shares).
    fn draft_estimate(
        &self,
        target: &shoal_gguf::Header,
        reserved: impl Fn(&shoal_gguf::Header) -> u64,
    ) -> u64 {
        let e = &self.opts.engine;
        let Some(path) = e.draft_model.as_ref().filter(|_| e.draft.enabled()) else {
            return 0;
        };
        let tokens = "tokenizer.ggml.tokens";
        match (shoal_gguf::Header::read(path), std::fs::metadata(path)) {
            (Ok(d), Ok(file)) if d.array_len(tokens) == target.array_len(tokens) => {
                file.len() + reserved(&d)
            }
            _ => 0,
        }
    }

    /// `/v1/models` entries: every local model with its card and whether
    /// (and in how much memory) it is loaded, then aliases.
    pub fn entries(&self) -> Vec<Value> {
        let mut data = Vec::new();
        let mut aliases = Vec::new();
        for (m, names) in self.local_models() {
            let e = self.entry(&m);
            for a in names {
                aliases.push(json!({"id": a, "object": "model", "created": e["created"],
                    "owned_by": "shoal", "shoal": {"alias_of": m.id}}));
            }
            data.push(e);
        }
        data.extend(aliases);
        data
    }

    fn entry(&self, m: &LocalModel) -> Value {
        let created = std::fs::metadata(&m.path)
            .and_then(|md| md.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let (loaded, capabilities, embedding, held, draft) = match lock(&self.loaded).get(&m.id) {
            Some(s) => (
                Some(s.engine.model.info.clone()),
                Some(s.engine.model.vocab.capabilities()),
                s.engine.model.embedding().cloned(),
                Some(s.engine.model.resident_bytes()),
                s.engine.model.draft.clone(),
            ),
            None => (None, Some(self.capabilities_at(&m.path)), None, None, None),
        };
        // The backend it runs on, or would run on, or why none can.
        let route = shoal_engine::backends::route(&m.path, self.opts.engine.backend);
        // The window a request gets: never more than is served.
        let window = self.served_window(&m.card, route.as_ref().ok(), loaded.as_ref());
        // An embedding model says so whether or not it is loaded: its card
        // reads the pooling from the file; the rest is known once loaded.
        let embedding = match (embedding, &m.card.embedding_pooling) {
            (Some(e), _) => json!(e),
            (None, Some(pooling)) => json!({
                "dimensions": m.card.embedding_length,
                "pooling": pooling,
                "normalize": true,
                "max_input_tokens": window,
            }),
            (None, None) => Value::Null,
        };
        let kind = if embedding.is_null() {
            "chat"
        } else {
            "embedding"
        };
        let (backend, unavailable) = match (&loaded, &route) {
            (Some(i), _) => (Some(i.backend.as_str()), None),
            (None, Ok(r)) => (Some(r.backend.as_str()), None),
            (None, Err(e)) => (None, Some(e.to_string())),
        };
        json!({
            "id": m.id, "object": "model", "created": created, "owned_by": "shoal",
            "shoal": {
                // `embedding`: answers /v1/embeddings and /api/embed, never chat.
                "kind": kind,
                "embedding": embedding,
                "architecture": m.card.architecture,
                "quantization": m.card.quantization,
                // The window served (as loaded, or as it would load here),
                // and the one the model was trained on.
                "context_length": window,
                "trained_context_length": m.card.context_length,
                "format": m.card.format,
                "parameters": m.card.parameters,
                "size_bytes": m.card.size_bytes,
                "path": m.path,
                "source": m.source,
                "backend": backend,
                "unavailable": unavailable,
                "estimated_memory_bytes": self.estimate(&m.card, route.as_ref().ok()),
                "loaded": loaded.is_some(),
                // With the draft model's, when one drafts for it.
                "memory_bytes": held,
                "kv_cache_bytes": loaded.as_ref().map(|i| i.kv_capacity_bytes
                    + draft.as_ref().map_or(0, |d| d.info.kv_capacity_bytes)),
                // The model drafting for it (speculative decoding): its
                // file, and the memory it holds.
                "draft_model": draft.as_ref().map(|d| json!({
                    "path": d.path,
                    "memory_bytes": d.info.resident_bytes(),
                    "kv_cache_bytes": d.info.kv_capacity_bytes,
                    "quantization": d.info.quantization,
                    // Whether it can pay at all: it is tried only where its
                    // best case beats a plain step.
                    "timed_at_load": d.timed_at_load,
                })),
                // What its chat template can do (read from its files when
                // it is not in memory).
                "capabilities": capabilities,
                // What a request that leaves them out gets, and from where.
                "sampling_defaults": shoal_engine::SamplingDefaults::read(&m.path),
                "dtype": loaded.as_ref().map(|i| i.dtype.clone()),
                "device": loaded.as_ref().map(|i| i.device.clone()),
            }
        })
    }

    pub(crate) fn entry_for(&self, requested: &str) -> Option<Value> {
        let id = self
            .named_id(requested)
            .map(|n| n.id)
            .or_else(|| self.library().find(requested).map(|m| m.id))?;
        self.local_models()
            .into_iter()
            .find(|(m, _)| m.id == id)
            .map(|(m, _)| self.entry(&m))
    }
}

impl Drop for ModelPool {
    /// Waits for engines only this pool held to free their models, so a
    /// process that ends right after never tears MLX down under them.
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(10));
    }
}

/// Engines are idle when nothing is queued or running on them.
fn idle(e: &Engine) -> bool {
    e.stats.running.load(Relaxed) == 0 && e.stats.queued.load(Relaxed) == 0
}

impl From<ModelsError> for ApiError {
    fn from(e: ModelsError) -> Self {
        let (kind, code) = match &e {
            ModelsError::BadSpec(_)
            | ModelsError::ChooseFile { .. }
            | ModelsError::NoModelFiles(_) => (ErrorKind::InvalidRequest, None),
            ModelsError::RepoNotFound { .. } | ModelsError::MissingFile { .. } => {
                (ErrorKind::NotFound, Some("hub_not_found"))
            }
            ModelsError::NotFound(_) => (ErrorKind::NotFound, Some("model_not_found")),
            ModelsError::Unauthorized(_) => (ErrorKind::Upstream, Some("hub_unauthorized")),
            ModelsError::Checksum { .. } => (ErrorKind::Upstream, Some("checksum_mismatch")),
            ModelsError::Hub(_) => (ErrorKind::Upstream, Some("hub_error")),
            ModelsError::Unreadable { .. } | ModelsError::Io(_) => (ErrorKind::Internal, None),
        };
        ApiError {
            code,
            ..ApiError::new(kind, e.to_string())
        }
    }
}

/// Memory a loaded engine holds: its weights and what it reserved up front.
pub(crate) fn held_bytes(e: &Engine) -> u64 {
    e.model.resident_bytes() as u64
}

/// `requested` without Ollama's tag (`ID:latest`, the name `/api/tags`
/// gives): clients reuse that name on every route, OpenAI's and
/// Anthropic's too, so it names `ID` wherever no model has the whole name.
fn untagged(requested: &str) -> Option<&str> {
    requested.strip_suffix(":latest")
}
