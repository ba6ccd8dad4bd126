//! Settings for `shoal serve` (and the model settings of `generate` and
//! `bench`), layered so that each source overrides the one before it:
//! built-in defaults, the TOML config file, environment variables,
//! command-line flags. `shoal config` prints the result with each value's source.
//!
//! Every setting is one row of the [`settings!`] table below: field, type,
//! default, environment variable, flag and help. The config structs, the
//! clap flags, the environment reading, the file's keys and the printout
//! all come from that table, so adding a setting touches one place.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use shoal_engine::EngineOptions;

mod cli;
mod defs;
mod resolve;
#[cfg(test)]
mod tests;

pub use cli::*;
pub use defs::*;
pub use resolve::*;

impl Config {
    pub fn model_path(&self) -> PathBuf {
        self.model
            .path
            .clone()
            .unwrap_or_else(shoal_engine::loader::default_model_path)
    }

    /// `models.memory_budget_mb` in bytes, `None` when 0 (the pool's default).
    fn memory_budget_bytes(&self) -> Result<Option<u64>> {
        let budget = self.models.memory_budget_mb;
        (budget > 0)
            .then(|| budget.checked_mul(1 << 20))
            .map(|b| b.context("models.memory_budget_mb is too large"))
            .transpose()
    }

    /// The memory all loaded models may take together, in bytes.
    fn memory_budget(&self) -> Result<u64> {
        Ok(self
            .memory_budget_bytes()?
            .unwrap_or_else(shoal_api::pool::default_budget))
    }

    /// The engine options of a server: [`Config::engine_options`] with the
    /// prefix cache's disk tier (one-shot commands and benches keep to RAM).
    pub fn serve_engine_options(&self) -> Result<EngineOptions> {
        Ok(EngineOptions {
            disk_cache: self.open_disk_cache(),
            ..self.engine_options()?
        })
    }

    /// How the model pool loads, budgets and unloads models.
    pub fn pool_options(&self) -> Result<shoal_api::pool::PoolOptions> {
        Ok(shoal_api::pool::PoolOptions {
            engine: self.serve_engine_options()?,
            budget_bytes: self.memory_budget_bytes()?,
            idle_unload: (self.models.idle_unload_secs > 0)
                .then(|| std::time::Duration::from_secs(self.models.idle_unload_secs)),
            hub: shoal_models::HubOptions::from_env(),
        })
    }

    /// API keys, allowed origins and request limits for the server.
    pub fn access(&self) -> Result<shoal_api::access::Access> {
        let mut a = shoal_api::access::Access::default()
            .with_keys(&self.server.api_keys)
            .map_err(|e| anyhow!("server.api_keys: {e}"))?;
        a.origins.extend(self.server.cors_origins.iter().cloned());
        a.max_messages = self.server.max_messages.max(1);
        a.max_tools = self.server.max_tools;
        a.max_body_bytes = self.server.max_body_mb.max(1).saturating_mul(1 << 20);
        a.request_timeout = (self.server.request_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(self.server.request_timeout_secs));
        a.stream_heartbeat = (self.server.stream_heartbeat_secs > 0)
            .then(|| std::time::Duration::from_secs(self.server.stream_heartbeat_secs));
        a.share_cache_across_keys = self.cache.share_across_keys;
        a.images = shoal_engine::vision::ImageLimits {
            max_bytes: self.server.max_image_mb.max(1).saturating_mul(1 << 20),
            max_images: self.server.max_images,
            max_pixels: self.server.max_image_pixels.max(1),
        };
        a.fetch_image_urls = self.server.fetch_image_urls;
        a.max_chat_image_bytes = self.server.max_chat_images_mb.saturating_mul(1 << 20);
        Ok(a)
    }

    /// How long the usage ledger keeps its records.
    pub fn retention(&self) -> shoal_api::ledger::Retention {
        shoal_api::ledger::Retention {
            days: self.usage.retention_days,
            rows: usize::try_from(self.usage.retention_rows).unwrap_or(usize::MAX),
        }
    }

    /// Refuses to listen beyond loopback without an API key: a LAN must not
    /// get an open model server by accident.
    pub fn check_exposure(&self) -> Result<()> {
        let keyed = self.server.api_keys.iter().any(|k| !k.is_empty());
        if !self.server.host.is_loopback() && !keyed {
            bail!(
                "listening on {} (beyond this machine) needs an API key: pass --api-key KEY, \
                 set SHOAL_API_KEYS, or add api_keys to [server] in the config file",
                self.server.host
            );
        }
        Ok(())
    }

    /// Cluster settings for the server, when a secret is set.
    pub fn cluster_options(&self) -> Option<shoal_cluster::ClusterOptions> {
        let c = &self.cluster;
        if c.secret.is_empty() {
            return None;
        }
        let mut o = shoal_cluster::ClusterOptions::new(&c.secret, c.peers.clone());
        o.mdns = c.mdns;
        o.unreachable_after = std::time::Duration::from_secs(c.unreachable_after_secs.max(1));
        o.remove_after =
            std::time::Duration::from_secs(c.remove_after_secs.max(c.unreachable_after_secs + 1));
        Some(o)
    }

    /// The disk tier's folder: the configured one, else `kv-cache` beside
    /// the conversation store.
    pub fn disk_cache_dir(&self) -> Result<PathBuf> {
        if let Some(d) = &self.cache.disk_dir {
            return Ok(d.clone());
        }
        let db = self.db_path()?;
        Ok(db
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            .join("kv-cache"))
    }

    /// The MCP servers of `[mcp] file` (else `fallback`, the default
    /// mcp.json), read now; a missing or broken file is no servers (the
    /// broken one's error shows on the Server page and in `/v1/mcp/servers`).
    pub fn mcp_hub(&self, fallback: Option<PathBuf>) -> shoal_mcp::McpHub {
        let limits = shoal_mcp::Limits {
            timeout: std::time::Duration::from_secs(self.mcp.timeout_secs.max(1)),
            start_timeout: std::time::Duration::from_secs(self.mcp.start_timeout_secs.max(1)),
            max_result_chars: self.mcp.max_result_chars.max(1),
        };
        shoal_mcp::McpHub::open(self.mcp.file.clone().or(fallback), limits)
    }

    /// The prefix cache's disk tier as configured, opened once per folder in
    /// a process (one writer thread, one view of its files); `None` when it
    /// is off. A folder that cannot be made is logged and the tier left off:
    /// the server serves either way.
    pub fn open_disk_cache(&self) -> Option<std::sync::Arc<shoal_engine::disk_cache::DiskCache>> {
        use shoal_engine::disk_cache::DiskCache;
        use std::sync::{Arc, Mutex, OnceLock};
        static OPEN: OnceLock<Mutex<BTreeMap<PathBuf, Arc<DiskCache>>>> = OnceLock::new();
        // The disk tier is behind the prefix cache: off with it.
        if self.cache.prefix_cache_mb == 0 {
            return None;
        }
        let budget = self.cache.disk_mb.bytes()?;
        let dir = match self.disk_cache_dir() {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "the prefix cache's disk tier is off");
                return None;
            }
        };
        let mut open = OPEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = open.get(&dir) {
            return Some(c.clone());
        }
        match DiskCache::open(shoal_engine::disk_cache::DiskCacheOptions {
            dir: dir.clone(),
            budget_bytes: budget,
            min_tokens: shoal_engine::disk_cache::DEFAULT_MIN_TOKENS,
            save_after_prefill: shoal_engine::disk_cache::DEFAULT_SAVE_AFTER_PREFILL,
        }) {
            Ok(c) => {
                tracing::info!(dir = %dir.display(), budget_mb = budget >> 20, "prefix cache on disk");
                open.insert(dir, c.clone());
                Some(c)
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "the prefix cache's disk tier is off");
                None
            }
        }
    }

    /// The conversation store file: the configured one or the default.
    pub fn db_path(&self) -> Result<PathBuf> {
        match &self.server.db {
            Some(p) => Ok(p.clone()),
            None => crate::default_db_path(),
        }
    }

    pub fn model_id(&self) -> String {
        match &self.model.id {
            Some(id) => id.clone(),
            None => crate::id_from_path(&self.model_path()),
        }
    }

    /// Engine options from these settings. Empty phrases and patterns are
    /// dropped: an empty environment line must not block every reply.
    pub fn engine_options(&self) -> Result<EngineOptions> {
        let non_empty = |v: &[String]| v.iter().filter(|p| !p.is_empty()).cloned().collect();
        Ok(EngineOptions {
            queue_capacity: self.server.queue.max(1),
            max_batch: self.server.max_batch.max(1),
            prefix_cache_bytes: self
                .cache
                .prefix_cache_mb
                .checked_mul(1 << 20)
                .context("cache.prefix_cache_mb is too large")?,
            blocked_phrases: non_empty(&self.content_filter.phrases),
            blocked_patterns: non_empty(&self.content_filter.patterns),
            backend: self.model.backend,
            llama: self.llama_options()?,
            draft: shoal_engine::DraftOptions::new(self.model.draft, self.model.draft_tokens),
            draft_model: self.model.draft_model.clone(),
            ..EngineOptions::default()
        })
    }

    /// The llama.cpp backend's options from these settings (before an
    /// engine sizes them for its batch): what `shoal models` reads a
    /// model's window from without starting anything.
    pub fn llama_options(&self) -> Result<shoal_engine::LlamaOptions> {
        Ok(shoal_engine::LlamaOptions::new(
            self.model.threads,
            self.model.kv_cache_tokens.positions(),
        )
        // `auto` KV takes its share of the pool's budget.
        .memory_budget(Some(self.memory_budget()?))
        .split(self.model.split_kv_cache)
        .batch_invariant(self.model.batch_invariant)
        .kv_type(self.model.kv_cache_type)
        .projector(self.projector()?))
    }

    /// Where each model's vision projector comes from: `--mmproj` for the
    /// served model (`off`: none for any model), then `[models] projectors`,
    /// then a projector beside the model file.
    fn projector(&self) -> Result<shoal_engine::backends::llama::Projector> {
        use shoal_engine::backends::llama::Projector;
        let file = |f: &str| (f != "off").then(|| std::path::PathBuf::from(f));
        let mut p = match (self.model.mmproj.as_deref(), &self.model.path) {
            (Some("off"), _) => return Ok(Projector::off()),
            (Some(f), Some(model)) if !f.is_empty() => {
                Projector::default().named(model.to_string_lossy(), file(f))
            }
            _ => Projector::default(),
        };
        let mut library = None;
        for entry in self
            .models
            .projectors
            .iter()
            .filter(|e| !e.trim().is_empty())
        {
            let (model, f) = entry
                .split_once('=')
                .filter(|(m, f)| !m.trim().is_empty() && !f.trim().is_empty())
                .with_context(|| {
                    format!("models.projectors: {entry:?} is not MODEL=PATH (or MODEL=off)")
                })?;
            let (model, f) = (model.trim(), f.trim());
            // A pulled model's id names its file in the hub cache; a path or
            // a file name is matched as it is.
            let lib = library.get_or_insert_with(shoal_models::Library::from_env);
            let key = match lib.find(model) {
                Some(m) => m.path.to_string_lossy().into_owned(),
                None => model.to_string(),
            };
            p = p.named(key, file(f));
        }
        Ok(p)
    }
}
