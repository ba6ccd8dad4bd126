//! KV state kept between requests: the RAM prefix cache, its disk tier
//! and the draft model's own cache, looked up for a new request and filled
//! by finished ones.
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::debug;

use crate::backend::{KvCache, LanguageModel};
use crate::disk_cache::{DiskCache, Fingerprint, ModelDisk};
use crate::draft_model::DraftModel;
use crate::error::{EngineError, Result};
use crate::prefix_cache::PrefixCache;
use crate::request::EngineStats;
use crate::sequence::Sequence;

/// KV state kept between requests: the model's prefix cache (in RAM, and
/// its disk tier), and the draft model with its own.
pub(super) struct Kept {
    pub(super) prefixes: PrefixCache,
    pub(super) disk: Option<ModelDisk>,
    pub(super) draft: Option<DraftModel>,
}

impl Kept {
    /// The cache a request starts from and how many of its tokens came from
    /// disk: the longest prefix in RAM, or on disk where that holds at least
    /// a block more; else an empty cache. A disk entry that fails its
    /// checksum or will not restore is removed, and the request goes on with
    /// what RAM had.
    pub(super) fn lookup(
        &mut self,
        model: &dyn LanguageModel,
        prompt: &[u32],
        salt: u64,
        stats: &EngineStats,
    ) -> Result<(Box<dyn KvCache>, usize)> {
        let ram = self.prefixes.lookup(prompt, salt);
        let counter = if ram.is_some() {
            &stats.ram_hits
        } else {
            &stats.ram_misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let ram_tokens = ram.as_ref().map_or(0, |h| h.tokens);
        if let Some(disk) = &self.disk {
            if let Some(hit) = disk.lookup(prompt, salt, ram_tokens) {
                if let Some(read) = disk.open(&hit) {
                    match model.restore_cache(&read.payload, &read.tokens) {
                        Ok(mut cache) => {
                            cache.truncate(hit.tokens);
                            disk.restored(&hit, &read);
                            debug!(tokens = hit.tokens, "prefix restored from disk");
                            return Ok((cache, hit.tokens));
                        }
                        // No room in the KV pool now: not the entry's fault.
                        Err(EngineError::KvCacheFull) => {}
                        Err(e) => disk.refused(&hit, &e.to_string()),
                    }
                }
            }
        }
        match ram {
            Some(hit) => Ok((hit.cache, 0)),
            None => Ok((model.new_cache()?, 0)),
        }
    }

    /// Whether a finished request's prefix is kept at all.
    pub(super) fn stores(&self) -> bool {
        self.prefixes.enabled() || self.disk.is_some()
    }

    /// Whether the disk tier wants `cache` (holding `context`'s first tokens).
    pub(super) fn disk_wants(&self, context: &[u32], cache: &dyn KvCache, salt: u64) -> bool {
        let held = &context[..cache.len().min(context.len())];
        cache.persistable()
            && self
                .disk
                .as_ref()
                .is_some_and(|d| d.wants(held, salt, cache.nbytes()))
    }

    /// Writes `cache` to the disk tier (the payload here, the rest on the
    /// tier's own thread).
    pub(super) fn save_to_disk(
        &self,
        context: &[u32],
        cache: &mut dyn KvCache,
        salt: u64,
        keep_secs: Option<u64>,
    ) {
        let Some(disk) = &self.disk else { return };
        let held = &context[..cache.len().min(context.len())];
        let (tmp, name) = disk.temp_payload();
        match cache.save(&tmp, held) {
            Ok(()) => disk.commit(tmp, name, held, salt, keep_secs),
            Err(e) => disk.write_failed(&tmp, &e.to_string()),
        }
    }

    /// Whether only a request's prompt positions are kept, not its reply's:
    /// where hits are cut to exact micro-batches (see
    /// [`LanguageModel::exact_prefix_unit`]).
    pub(super) fn prompt_only(&self) -> bool {
        self.prefixes.alignment() > 1
    }

    /// Writes the prompt of `seq`, just prefilled, to the disk tier if its
    /// prefill was long (its reply's own write later supersedes it).
    pub(super) fn save_prefill(&self, seq: &mut Sequence) {
        let Some(disk) = &self.disk else { return };
        if !disk.saves_after_prefill(seq.computed_prompt_tokens()) {
            return;
        }
        let req = &seq.job.req;
        if self.disk_wants(&req.prompt, seq.cache.as_ref(), req.cache_salt) {
            debug!(tokens = req.prompt.len(), "long prefill written to disk");
            self.save_to_disk(
                &req.prompt,
                seq.cache.as_mut(),
                req.cache_salt,
                req.keep_secs(),
            );
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.prefixes.bytes() + self.draft.as_ref().map_or(0, |d| d.prefixes.bytes())
    }

    /// Frees the least recently used kept prefix (the draft model's are
    /// in its own KV pool, so they go only when that pool is full).
    pub(super) fn evict_oldest(&mut self) -> bool {
        self.prefixes.evict_oldest()
    }
}

/// The disk tier of `model`, in a folder named by everything that makes its
/// KV state valid (the backend adds its own facts); `None` (with a warning)
/// if it cannot be opened.
pub(super) fn model_disk(
    cache: &Arc<DiskCache>,
    path: &Path,
    id: &str,
    model: &dyn LanguageModel,
) -> Option<ModelDisk> {
    let info = model.info();
    let mut settings = vec![
        ("engine", env!("CARGO_PKG_VERSION").to_string()),
        ("backend", info.backend.as_str().to_string()),
        ("dtype", info.dtype.clone()),
        ("context", info.context_length.to_string()),
        ("kv_capacity_bytes", info.kv_capacity_bytes.to_string()),
        ("layers", info.num_layers.to_string()),
    ];
    settings.extend(model.kv_fingerprint());
    let made = Fingerprint::of(path, &settings).and_then(|fp| {
        cache
            .for_model(fp, id, info.backend.as_str())
            .map(|d| d.with_layout(model.payload_layout()))
    });
    match made {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!(model = id, error = %e, "the prefix cache's disk tier is off for this model");
            None
        }
    }
}
