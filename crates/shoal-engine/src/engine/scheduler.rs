//! The scheduler: the engine thread's loop over admission, prefill chunks
//! and batched decode steps, and how a sequence ends (its record, its cache
//! kept for later requests).
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use tracing::debug;

use super::kept::Kept;
use crate::backend::{DecodeBatch, KvCache, LanguageModel};
use crate::completion::{Completion, Event, FinishReason, Timings, Usage};
use crate::content_filter::ContentPolicy;
use crate::disk_cache::ModelDisk;
use crate::draft::DraftOptions;
use crate::draft_model::DraftModel;
use crate::error::{EngineError, Result};
use crate::loader::Vocabulary;
use crate::prefix_cache::PrefixCache;
use crate::process::release_free_memory;
use crate::request::EngineStats;
use crate::sequence::{ms, record, Job, Next, Sequence, Stall};

/// The scheduler: admits queued requests in FIFO order up to `max_batch`,
/// prefills each newcomer one chunk per round, then advances every decoding
/// sequence by one token in a single batched forward pass. Finished
/// sequences leave at once and their places go to the next in line.
pub(super) fn run(
    model: Box<dyn LanguageModel>,
    vocab: Arc<Vocabulary>,
    jobs: Receiver<Job>,
    cfg: RunConfig,
) {
    let RunConfig {
        chunk,
        max_batch,
        draft,
        draft_model,
        stats,
        prefixes,
        disk,
        blocked,
    } = cfg;
    // Every prefill chunk starts a micro-batch where replies must be exact
    // (the prefix cache was made aligned to it).
    let unit = prefixes.alignment();
    let chunk = chunk.div_ceil(unit) * unit;
    let mut prefixes = Kept {
        prefixes,
        disk,
        draft: draft_model,
    };
    let window = model.info().window();
    let draft = if model.verifies_drafts() {
        draft
    } else {
        DraftOptions::off()
    };
    let mut prefilling: Vec<Sequence> = Vec::new();
    // Row `i` of `batch` is `decoding[i]`.
    let mut decoding: Vec<Sequence> = Vec::new();
    let mut batch = fresh_batch(model.as_ref());
    let mut open = true;
    while open || !prefilling.is_empty() || !decoding.is_empty() {
        stats.running.store(
            (prefilling.len() + decoding.len()) as u64,
            Ordering::Relaxed,
        );
        // Admission: block only when there is nothing else to do.
        while open && prefilling.len() + decoding.len() < max_batch {
            let job = if prefilling.is_empty() && decoding.is_empty() {
                let next = match jobs.try_recv() {
                    Err(TryRecvError::Empty) => {
                        // Idle: hand the pages freed by the last burst back
                        // to the system before waiting.
                        release_free_memory();
                        jobs.recv().ok()
                    }
                    other => other.ok(),
                };
                match next {
                    Some(j) => j,
                    None => {
                        open = false;
                        break;
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            stats.queued.fetch_sub(1, Ordering::Relaxed);
            if stats.clear_prefixes.swap(false, Ordering::Relaxed) {
                let _turn = model.turn();
                prefixes.prefixes.clear();
                stats
                    .prefix_cache_bytes
                    .store(prefixes.bytes() as u64, Ordering::Relaxed);
            }
            if job.gone() {
                debug!("request cancelled while queued");
                let prompt_tokens = job.req.prompt.len();
                let waited = ms(job.submitted.elapsed());
                let c = Completion {
                    finish: FinishReason::Cancelled,
                    usage: Usage {
                        prompt_tokens,
                        image_tokens: job.req.image_tokens(),
                        images: job.req.images.len(),
                        ..Usage::default()
                    },
                    timings: Timings {
                        queue_ms: waited,
                        total_ms: waited,
                        ..Timings::default()
                    },
                };
                record(&stats, &c);
                stats.last_cancelled_tokens.store(0, Ordering::Relaxed);
                // Whoever still listens learns it never ran.
                let _ = job.events.send(Event::Done(c));
                continue;
            }
            let cache = {
                let _turn = model.turn();
                prefixes.lookup(model.as_ref(), &job.req.prompt, job.req.cache_salt, &stats)
            };
            // Drafts come from text: a prompt holding images has none.
            let drafts = if job.req.images.is_empty() {
                draft
            } else {
                DraftOptions::off()
            };
            match cache {
                Ok((cache, from_disk)) => prefilling.push(
                    Sequence::new(job, cache)
                        .with_cache_facts(from_disk, prefixes.stores())
                        .drafting(drafts),
                ),
                Err(e) => retire(
                    Sequence::new(job, Box::new(NoCache)),
                    FinishReason::Error(e.to_string()),
                    &vocab,
                    &stats,
                    &mut prefixes,
                ),
            }
        }
        stats.running.store(
            (prefilling.len() + decoding.len()) as u64,
            Ordering::Relaxed,
        );
        if prefilling.is_empty() && decoding.is_empty() {
            continue;
        }
        let _turn = model.turn();

        // 1. Every decoding sequence samples its next token; finished ones
        //    leave the batch (taking their cache back for the prefix cache).
        //    Drafts the model did not keep leave the cache first.
        let sampling_started = Instant::now();
        let mut spans: Vec<Vec<u32>> = Vec::with_capacity(decoding.len());
        let mut finished = Vec::new();
        for (row, seq) in decoding.iter_mut().enumerate() {
            let (next, drop) = seq.advance(&vocab, window);
            let next = match batch.drop_last(row, drop) {
                Ok(()) => next,
                Err(e) => Next::Finished(FinishReason::Error(e.to_string())),
            };
            match next {
                Next::Feed(t) => {
                    let mut span = vec![t];
                    span.extend(seq.propose(window, prefixes.draft.as_mut()));
                    spans.push(span);
                }
                Next::Finished(r) => {
                    finished.push((row, r));
                    spans.push(Vec::new());
                }
            }
        }
        let mut decode_time = sampling_started.elapsed();
        for (row, reason) in finished.into_iter().rev() {
            let mut seq = decoding.remove(row);
            spans.remove(row);
            match batch.leave(row) {
                Ok(cache) => seq.cache = cache,
                Err(e) => {
                    // The batch may be inconsistent: fail everyone in it.
                    retire(
                        seq,
                        FinishReason::Error(e.to_string()),
                        &vocab,
                        &stats,
                        &mut prefixes,
                    );
                    fail_all(&mut decoding, &e.to_string(), &vocab, &stats, &mut prefixes);
                    spans.clear();
                    batch = fresh_batch(model.as_ref());
                    break;
                }
            }
            retire(seq, reason, &vocab, &stats, &mut prefixes);
        }

        // 2. Newcomers prefill one chunk each; a finished prefill samples its
        //    first token and joins the batch.
        let mut still = Vec::with_capacity(prefilling.len());
        for mut seq in prefilling.drain(..) {
            match seq.prefill(model.as_ref(), chunk, &blocked) {
                Ok(false) => still.push(seq),
                Err(Stall::Finish(r)) => retire(seq, r, &vocab, &stats, &mut prefixes),
                // Out of KV room: free a prefix entry, or wait for running
                // sequences to end, and try the chunk again next round.
                Err(Stall::KvCacheFull) if prefixes.evict_oldest() || !decoding.is_empty() => {
                    still.push(seq)
                }
                Err(Stall::KvCacheFull) => retire(
                    seq,
                    FinishReason::Error(EngineError::KvCacheFull.to_string()),
                    &vocab,
                    &stats,
                    &mut prefixes,
                ),
                Ok(true) => match seq.advance(&vocab, window).0 {
                    Next::Finished(r) => retire(seq, r, &vocab, &stats, &mut prefixes),
                    Next::Feed(t) => {
                        // Its first token is out: a long prefill goes to
                        // disk now, before a crash or a timeout can lose it.
                        prefixes.save_prefill(&mut seq);
                        let cache = std::mem::replace(&mut seq.cache, Box::new(NoCache));
                        match batch.join(cache) {
                            Ok(()) => {
                                let mut span = vec![t];
                                span.extend(seq.propose(window, prefixes.draft.as_mut()));
                                decoding.push(seq);
                                spans.push(span);
                            }
                            Err(e) => retire(
                                seq,
                                FinishReason::Error(e.to_string()),
                                &vocab,
                                &stats,
                                &mut prefixes,
                            ),
                        }
                    }
                },
            }
        }
        prefilling = still;

        // 3. One forward pass for the whole batch.
        if !decoding.is_empty() {
            stats
                .peak_batch
                .fetch_max(spans.len() as u64, Ordering::Relaxed);
            stats.decode_passes.fetch_add(1, Ordering::Relaxed);
            stats
                .decode_steps
                .fetch_add(spans.len() as u64, Ordering::Relaxed);
            let pass = Instant::now();
            let result = loop {
                match model.forward_spans(&spans, batch.as_mut()) {
                    Err(EngineError::KvCacheFull) if prefixes.evict_oldest() => continue,
                    // No room for the drafts: run the tokens alone.
                    Err(EngineError::KvCacheFull) if spans.iter().any(|s| s.len() > 1) => {
                        spans.iter_mut().for_each(|s| s.truncate(1));
                        continue;
                    }
                    other => break other,
                }
            };
            match result {
                Ok(all) => {
                    for ((seq, span), l) in decoding.iter_mut().zip(&spans).zip(all) {
                        seq.set_checked(span, l);
                    }
                }
                Err(e) => {
                    fail_all(&mut decoding, &e.to_string(), &vocab, &stats, &mut prefixes);
                    batch = fresh_batch(model.as_ref());
                }
            }
            decode_time += pass.elapsed();
        }
        stats
            .decode_micros
            .fetch_add(decode_time.as_micros() as u64, Ordering::Relaxed);
    }
    // Freeing the weights and caches is MLX work too.
    let _turn = model.turn();
    drop(batch);
    drop(prefixes);
    drop(model);
}

/// Ends a sequence: final record to its caller, statistics, and its cache
/// to the prefix cache (unless it failed).
fn retire(
    mut seq: Sequence,
    reason: FinishReason,
    vocab: &Vocabulary,
    stats: &EngineStats,
    kept: &mut Kept,
) {
    let (c, context) = seq.finish(reason, vocab);
    let salt = seq.job.req.cache_salt;
    let keep_secs = seq.job.req.keep_secs();
    let keep_until = keep_secs.map(|s| Instant::now() + std::time::Duration::from_secs(s));
    let mut to_disk = None;
    if !matches!(c.finish, FinishReason::Error(_)) {
        let mut cache = std::mem::replace(&mut seq.cache, Box::new(NoCache));
        if kept.prompt_only() {
            cache.truncate(cache.len().min(seq.job.req.prompt.len()));
        }
        if kept.disk_wants(&context, cache.as_ref(), salt) {
            to_disk = Some(cache);
        } else {
            kept.prefixes.insert_kept(&context, cache, salt, keep_until);
        }
        seq.finish_drafting(kept.draft.as_mut());
    }
    stats
        .prefix_cache_bytes
        .store(kept.bytes() as u64, Ordering::Relaxed);
    stats
        .ram_evictions
        .store(kept.prefixes.evictions, Ordering::Relaxed);
    record(stats, &c);
    let _ = seq.job.events.send(Event::Done(c));
    // The disk copy is written after the reply's last event, off its path.
    if let Some(mut cache) = to_disk {
        kept.save_to_disk(&context, cache.as_mut(), salt, keep_secs);
        kept.prefixes.insert_kept(&context, cache, salt, keep_until);
        stats
            .prefix_cache_bytes
            .store(kept.bytes() as u64, Ordering::Relaxed);
    }
}

fn fail_all(
    decoding: &mut Vec<Sequence>,
    error: &str,
    vocab: &Vocabulary,
    stats: &EngineStats,
    prefixes: &mut Kept,
) {
    for seq in decoding.drain(..) {
        retire(
            seq,
            FinishReason::Error(error.to_string()),
            vocab,
            stats,
            prefixes,
        );
    }
}

fn fresh_batch(model: &dyn LanguageModel) -> Box<dyn DecodeBatch> {
    model.new_batch().unwrap_or_else(|_| Box::new(NoBatch))
}

/// A batch nobody can join (only if the backend cannot make one).
struct NoBatch;

impl DecodeBatch for NoBatch {
    fn rows(&self) -> usize {
        0
    }
    fn join(&mut self, _cache: Box<dyn KvCache>) -> Result<()> {
        Err(EngineError::Backend("no decode batch available".into()))
    }
    fn leave(&mut self, row: usize) -> Result<Box<dyn KvCache>> {
        Err(EngineError::Backend(format!("no batch row {row}")))
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// What the engine thread needs besides the model.
pub(super) struct RunConfig {
    pub(super) chunk: usize,
    pub(super) max_batch: usize,
    pub(super) draft: DraftOptions,
    pub(super) draft_model: Option<DraftModel>,
    pub(super) stats: Arc<EngineStats>,
    pub(super) prefixes: PrefixCache,
    pub(super) disk: Option<ModelDisk>,
    pub(super) blocked: ContentPolicy,
}

/// Stands in for a cache that has been handed on (or never existed).
pub(super) struct NoCache;

impl KvCache for NoCache {
    fn len(&self) -> usize {
        0
    }
    fn truncate(&mut self, _len: usize) {}
    fn nbytes(&self) -> usize {
        0
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
    fn clone_box(&self) -> Box<dyn KvCache> {
        Box::new(NoCache)
    }
}
