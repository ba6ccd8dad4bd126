//! The engine thread: owns the model, batches the requests of a bounded queue
//! (continuous batching), and streams [`Event`]s back. Dropping the receiver
//! cancels.
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tracing::{debug, info};

use crate::backend::{BackendKind, DecodeBatch, EmbeddingInfo, KvCache, LanguageModel, ModelInfo};
use crate::backends::llama::LlamaOptions;
use crate::backends::BackendChoice;
use crate::completion::{Completion, Event, FinishReason, Timings, Usage};
use crate::constraint::GrammarCompiler;
use crate::content_filter::ContentPolicy;
use crate::defaults::SamplingDefaults;
use crate::disk_cache::{DiskCache, Fingerprint, ModelDisk};
use crate::draft::DraftOptions;
use crate::draft_model::{vocabulary_mismatch, DraftInfo, DraftModel};
use crate::embedding::{run_embeddings, EmbedJob};
use crate::error::{EngineError, Result};
use crate::loader::{self, LoadOptions, Vocabulary};
use crate::prefix_cache::PrefixCache;
pub use crate::request::{CacheBreakpoint, CancelFlag, EngineStats, GenerateRequest};
use crate::sequence::{ms, record, Job, Next, Sequence, Stall};

/// Engine options.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Requests waiting beyond the running ones; more are refused.
    pub queue_capacity: usize,
    /// Sequences decoded together in one forward pass; later ones wait.
    pub max_batch: usize,
    /// Prompt tokens per forward pass during prefill (bounds memory).
    pub prefill_chunk: usize,
    /// Memory for KV state kept between requests to reuse shared prefixes; 0 turns it off.
    pub prefix_cache_bytes: usize,
    /// The prefix cache's disk tier, shared by every engine of the process
    /// (each model in a folder of its own); `None` keeps prefixes in RAM only.
    pub disk_cache: Option<Arc<DiskCache>>,
    /// Content filter: output containing any of these phrases is cut before
    /// the phrase and ends with `ContentFilter` (the tokens spent still count).
    pub blocked_phrases: Vec<String>,
    /// Content filter: regular expressions, checked like the phrases.
    pub blocked_patterns: Vec<String>,
    /// Which backend runs the model (`auto`: MLX for directories, llama.cpp for GGUF).
    pub backend: BackendChoice,
    /// Threads and KV bound of the llama.cpp backend.
    pub llama: LlamaOptions,
    /// Speculative decoding (on backends that can check drafts).
    pub draft: DraftOptions,
    /// A smaller GGUF of the same vocabulary that drafts for the model
    /// (instead of prompt lookup); a model of another vocabulary ignores it.
    pub draft_model: Option<PathBuf>,
    /// A draft model of another vocabulary fails the load (the model it was
    /// named for) instead of being ignored (a pool's other models).
    pub draft_model_required: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            queue_capacity: 64,
            max_batch: 16,
            prefill_chunk: 2048,
            prefix_cache_bytes: 1 << 30,
            disk_cache: None,
            blocked_phrases: Vec::new(),
            blocked_patterns: Vec::new(),
            backend: BackendChoice::Auto,
            llama: LlamaOptions::default(),
            draft: DraftOptions::default(),
            draft_model: None,
            draft_model_required: false,
        }
    }
}

/// The stream of events for one request. Dropping it cancels the generation.
pub type EventStream = UnboundedReceiver<Event>;

/// A handle to a running engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    jobs: SyncSender<Job>,
    /// An embedding model's queue (its thread reads this one, not `jobs`).
    embeds: SyncSender<EmbedJob>,
    pub model: Arc<ModelHandle>,
    pub stats: Arc<EngineStats>,
    /// Set once the engine thread has freed everything and ended.
    stopped: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

/// What callers may know about the loaded model.
pub struct ModelHandle {
    /// The name clients use for it.
    pub id: String,
    pub path: std::path::PathBuf,
    pub info: ModelInfo,
    pub vocab: Arc<Vocabulary>,
    /// Compiles structured-output grammars against this model's vocabulary.
    pub grammars: GrammarCompiler,
    /// What a request gets for the sampling parameters it leaves out.
    pub defaults: SamplingDefaults,
    /// Set for an embedding model, which embeds and never generates.
    pub(crate) embedding: Option<EmbeddingInfo>,
    /// The model drafting for this one (speculative decoding), if any.
    pub draft: Option<DraftInfo>,
}

impl ModelHandle {
    /// Memory the model holds, with its draft model's.
    pub fn resident_bytes(&self) -> usize {
        self.info.resident_bytes() + self.draft.as_ref().map_or(0, |d| d.info.resident_bytes())
    }
}

impl Engine {
    /// Loads the model on a dedicated thread and starts serving requests.
    pub fn start(path: &Path, id: &str, opts: EngineOptions) -> Result<Engine> {
        let load = LoadOptions {
            backend: opts.backend,
            llama: opts.llama.clone().for_batch(opts.max_batch),
        };
        Self::start_with(path, id, opts, move |p| loader::load(p, &load))
    }

    /// Like `start`, with the model built by `load` on the engine thread (a
    /// wrapped backend, e.g. one that injects faults in tests).
    pub fn start_with(
        path: &Path,
        id: &str,
        opts: EngineOptions,
        load: impl FnOnce(&Path) -> Result<loader::Loaded> + Send + 'static,
    ) -> Result<Engine> {
        type Ready = (
            ModelInfo,
            Option<EmbeddingInfo>,
            Arc<Vocabulary>,
            Option<DraftInfo>,
        );
        let (ready_tx, ready_rx) = sync_channel::<Result<Ready>>(1);
        let (jobs_tx, jobs_rx) = sync_channel::<Job>(opts.queue_capacity);
        let (embeds_tx, embeds_rx) = sync_channel::<EmbedJob>(opts.queue_capacity);
        let path_buf = path.to_path_buf();
        let chunk = opts.prefill_chunk.max(1);
        let prefix_bytes = opts.prefix_cache_bytes;
        let max_batch = opts.max_batch.max(1);
        let draft = opts.draft;
        let draft_load = opts.draft_model.clone().map(|p| {
            let load = LoadOptions {
                backend: BackendChoice::Llama,
                // Drafts never change a reply, so the drafter takes the
                // fastest kernels whatever the target's mode.
                llama: opts
                    .llama
                    .clone()
                    .batch_invariant(false)
                    .for_batch(opts.max_batch),
            };
            (p, load, opts.draft_model_required)
        });
        let blocked = ContentPolicy::new(opts.blocked_phrases.clone(), &opts.blocked_patterns)?;
        let disk_cache = opts.disk_cache.clone();
        let model_id = id.to_string();
        let llama = opts.llama.clone();
        let stats = Arc::new(EngineStats::default());
        let thread_stats = stats.clone();
        let stopped = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let thread_stopped = stopped.clone();
        std::thread::Builder::new()
            .name("shoal-engine".into())
            .spawn(move || {
                let turn = mlx_turn();
                let loaded = load(&path_buf);
                drop(turn);
                let loaded = match loaded {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if loaded.model.info().backend == BackendKind::Mlx {
                    hold_mlx_at_exit_once();
                }
                let embedding = loaded.model.embedding().cloned();
                let draft_model = match draft_load {
                    Some((path, load, required))
                        if embedding.is_none()
                            && draft.enabled()
                            && loaded.model.verifies_drafts() =>
                    {
                        match load_draft(&path, &load, &loaded, required) {
                            Ok(d) => d,
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                                return;
                            }
                        }
                        .map(|m| {
                            let mut d = DraftModel::new(m, prefix_bytes);
                            if draft.measured {
                                d.calibrate(loaded.model.as_ref());
                            }
                            (d, path)
                        })
                    }
                    _ => None,
                };
                let draft_info = draft_model.as_ref().map(|(d, p)| d.info(p));
                let align = loaded.model.exact_prefix_unit().unwrap_or(1);
                let disk = disk_cache
                    .as_ref()
                    .filter(|_| embedding.is_none() && loaded.model.persists_cache())
                    .and_then(|c| model_disk(c, &path_buf, &model_id, loaded.model.info(), &llama))
                    .map(|d| d.aligned(align));
                let _ = ready_tx.send(Ok((
                    loaded.model.info().clone(),
                    embedding.clone(),
                    loaded.vocab.clone(),
                    draft_info,
                )));
                if embedding.is_some() {
                    drop(jobs_rx);
                    run_embeddings(loaded.model, embeds_rx, thread_stats);
                    let (done, cv) = &*thread_stopped;
                    *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    cv.notify_all();
                    return;
                }
                drop(embeds_rx);
                let cfg = RunConfig {
                    chunk,
                    max_batch,
                    draft,
                    draft_model: draft_model.map(|(d, _)| d),
                    stats: thread_stats,
                    prefixes: PrefixCache::new(prefix_bytes).aligned(align),
                    disk,
                    blocked,
                };
                run(loaded.model, loaded.vocab, jobs_rx, cfg);
                let (done, cv) = &*thread_stopped;
                *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
                cv.notify_all();
            })?;
        let (info, embedding, vocab, draft_info) = ready_rx
            .recv()
            .map_err(|_| EngineError::Unavailable("engine thread exited while loading".into()))??;
        info!(model = id, arch = %info.architecture, dtype = %info.dtype, device = %info.device,
              weight_mb = info.weight_bytes / (1 << 20), "model loaded");
        Ok(Engine {
            jobs: jobs_tx,
            embeds: embeds_tx,
            stopped,
            stats,
            model: Arc::new(ModelHandle {
                id: id.to_string(),
                path: path.to_path_buf(),
                grammars: GrammarCompiler::new(vocab.clone(), info.vocab_size),
                defaults: SamplingDefaults::read(path),
                embedding,
                info,
                vocab,
                draft: draft_info,
            }),
        })
    }

    /// Lets go of this handle and waits (up to `limit`) for the engine
    /// thread to finish its requests and free the model, so a process can
    /// exit without tearing MLX down under a running thread. Other handles
    /// still open keep the engine alive; then this returns false at `limit`.
    pub fn stop_and_wait(self, limit: std::time::Duration) -> bool {
        let stopped = self.stopped.clone();
        drop(self);
        // Another handle (beside the engine thread's) keeps it running.
        if Arc::strong_count(&stopped) > 2 {
            return false;
        }
        let (done, cv) = &*stopped;
        let guard = done.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = cv
            .wait_timeout_while(guard, limit, |d| !*d)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }

    /// Queues a request. Fails at once if the prompt cannot fit or the queue is full.
    pub fn submit(&self, req: GenerateRequest) -> Result<EventStream> {
        self.validate(&req)?;
        let constraint = match &req.grammar {
            Some(g) => Some(self.model.grammars.compile(g)?),
            None => None,
        };
        let (tx, rx) = unbounded_channel();
        let job = Job {
            req,
            constraint,
            events: tx,
            submitted: Instant::now(),
        };
        // Counted before sending so the engine thread never sees it go negative.
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        match self.jobs.try_send(job) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => {
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                Err(EngineError::Unavailable("request queue is full".into()))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                Err(EngineError::Unavailable("engine has stopped".into()))
            }
        }
    }

    /// Sends an embedding request to the engine thread, counted as queued.
    pub(crate) fn queue_embedding(&self, job: EmbedJob) -> Result<()> {
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        self.embeds.try_send(job).map_err(|e| {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            EngineError::Unavailable(match e {
                TrySendError::Full(_) => "request queue is full".into(),
                TrySendError::Disconnected(_) => "engine has stopped".into(),
            })
        })
    }

    fn validate(&self, req: &GenerateRequest) -> Result<()> {
        if self.model.embedding.is_some() {
            return Err(EngineError::WrongKind(format!(
                "model '{}' is an embedding model; it cannot generate text (use /v1/embeddings or /api/embed)",
                self.model.id
            )));
        }
        let ctx = self.model.info.context_length;
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if req.prompt.len() >= ctx {
            return Err(EngineError::ContextOverflow {
                prompt_tokens: req.prompt.len(),
                context: ctx,
            });
        }
        if req.max_tokens == Some(0) {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        let vocab = self.model.info.vocab_size;
        if let Some(bad) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        if let Some((bad, _)) = req
            .sampling
            .logit_bias
            .iter()
            .find(|(t, _)| *t as usize >= vocab)
        {
            return Err(EngineError::InvalidRequest(format!(
                "logit_bias names token id {bad}, outside the vocabulary of {vocab}"
            )));
        }
        req.sampling.validate()
    }
}

/// MLX is not safe to drive from several threads at once (its streams,
/// graph evaluation and allocator are shared per process). Each engine runs
/// on its own thread, so with several models loaded their steps take turns
/// through this lock; one engine alone never waits on it.
static MLX: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// At process exit, MLX's static objects (allocator, streams) are destroyed
/// while other threads still run: an engine thread mid-step, or freeing a
/// dropped model, would then work on a torn-down allocator (heap corruption
/// at exit). This hook is registered after MLX has built those objects (once
/// a model is loaded), so it runs before their destructors; it waits for the
/// running step to end and keeps the MLX turn, so no engine thread touches
/// MLX again. It gives up after 30 s rather than hang an exit.
extern "C" fn hold_mlx_at_exit() {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match MLX.try_lock() {
            Ok(guard) => return std::mem::forget(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return std::mem::forget(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(std::sync::TryLockError::WouldBlock) => return,
        }
    }
}

fn hold_mlx_at_exit_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function with no captured state.
        if unsafe { libc::atexit(hold_mlx_at_exit) } != 0 {
            tracing::warn!("could not register the MLX exit hook");
        }
    });
}

fn mlx_turn() -> std::sync::MutexGuard<'static, ()> {
    MLX.lock().unwrap_or_else(|p| p.into_inner())
}

/// The MLX turn for a model on MLX; models on other backends need none.
fn turn_for(mlx: bool) -> Option<std::sync::MutexGuard<'static, ()>> {
    mlx.then(mlx_turn)
}

/// The scheduler: admits queued requests in FIFO order up to `max_batch`,
/// prefills each newcomer one chunk per round, then advances every decoding
/// sequence by one token in a single batched forward pass. Finished
/// sequences leave at once and their places go to the next in line.
fn run(model: Box<dyn LanguageModel>, vocab: Arc<Vocabulary>, jobs: Receiver<Job>, cfg: RunConfig) {
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
    let ctx = model.info().context_length;
    let on_mlx = model.info().backend == BackendKind::Mlx;
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
                let _turn = turn_for(on_mlx);
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
                let _turn = turn_for(on_mlx);
                prefixes.lookup(model.as_ref(), &job.req.prompt, job.req.cache_salt, &stats)
            };
            match cache {
                Ok((cache, from_disk)) => prefilling.push(
                    Sequence::new(job, cache)
                        .with_cache_facts(from_disk, prefixes.stores())
                        .drafting(draft),
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
        let _turn = turn_for(on_mlx);

        // 1. Every decoding sequence samples its next token; finished ones
        //    leave the batch (taking their cache back for the prefix cache).
        //    Drafts the model did not keep leave the cache first.
        let sampling_started = Instant::now();
        let mut spans: Vec<Vec<u32>> = Vec::with_capacity(decoding.len());
        let mut finished = Vec::new();
        for (row, seq) in decoding.iter_mut().enumerate() {
            let (next, drop) = seq.advance(&vocab, ctx);
            let next = match batch.drop_last(row, drop) {
                Ok(()) => next,
                Err(e) => Next::Finished(FinishReason::Error(e.to_string())),
            };
            match next {
                Next::Feed(t) => {
                    let mut span = vec![t];
                    span.extend(seq.propose(ctx, prefixes.draft.as_mut()));
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
                Ok(true) => match seq.advance(&vocab, ctx).0 {
                    Next::Finished(r) => retire(seq, r, &vocab, &stats, &mut prefixes),
                    Next::Feed(t) => {
                        // Its first token is out: a long prefill goes to
                        // disk now, before a crash or a timeout can lose it.
                        prefixes.save_prefill(&mut seq);
                        let cache = std::mem::replace(&mut seq.cache, Box::new(NoCache));
                        match batch.join(cache) {
                            Ok(()) => {
                                let mut span = vec![t];
                                span.extend(seq.propose(ctx, prefixes.draft.as_mut()));
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
    let _turn = turn_for(on_mlx);
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
struct RunConfig {
    chunk: usize,
    max_batch: usize,
    draft: DraftOptions,
    draft_model: Option<DraftModel>,
    stats: Arc<EngineStats>,
    prefixes: PrefixCache,
    disk: Option<ModelDisk>,
    blocked: ContentPolicy,
}

/// KV state kept between requests: the model's prefix cache (in RAM, and
/// its disk tier), and the draft model with its own.
struct Kept {
    prefixes: PrefixCache,
    disk: Option<ModelDisk>,
    draft: Option<DraftModel>,
}

impl Kept {
    /// The cache a request starts from and how many of its tokens came from
    /// disk: the longest prefix in RAM, or on disk where that holds at least
    /// a block more; else an empty cache. A disk entry that fails its
    /// checksum or will not restore is removed, and the request goes on with
    /// what RAM had.
    fn lookup(
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
                if disk.verify(&hit) {
                    match model.restore_cache(&hit.payload, hit.stored_tokens()) {
                        Ok(mut cache) => {
                            cache.truncate(hit.tokens);
                            disk.restored(&hit);
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
    fn stores(&self) -> bool {
        self.prefixes.enabled() || self.disk.is_some()
    }

    /// Whether the disk tier wants `cache` (holding `context`'s first tokens).
    fn disk_wants(&self, context: &[u32], cache: &dyn KvCache, salt: u64) -> bool {
        let held = &context[..cache.len().min(context.len())];
        self.disk
            .as_ref()
            .is_some_and(|d| d.wants(held, salt, cache.nbytes()))
    }

    /// Writes `cache` to the disk tier (the payload here, the rest on the
    /// tier's own thread).
    fn save_to_disk(
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
    fn prompt_only(&self) -> bool {
        self.prefixes.alignment() > 1
    }

    /// Writes the prompt of `seq`, just prefilled, to the disk tier if its
    /// prefill was long (its reply's own write later supersedes it).
    fn save_prefill(&self, seq: &mut Sequence) {
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

    fn bytes(&self) -> usize {
        self.prefixes.bytes() + self.draft.as_ref().map_or(0, |d| d.prefixes.bytes())
    }

    /// Frees the least recently used kept prefix (the draft model's are
    /// in its own KV pool, so they go only when that pool is full).
    fn evict_oldest(&mut self) -> bool {
        self.prefixes.evict_oldest()
    }
}

/// The disk tier of a model, in a folder named by everything that makes its
/// KV state valid; `None` (with a warning) if it cannot be opened.
fn model_disk(
    cache: &Arc<DiskCache>,
    path: &Path,
    id: &str,
    info: &ModelInfo,
    llama: &LlamaOptions,
) -> Option<ModelDisk> {
    let mut settings = vec![
        ("engine", env!("CARGO_PKG_VERSION").to_string()),
        ("backend", info.backend.as_str().to_string()),
        ("dtype", info.dtype.clone()),
        ("context", info.context_length.to_string()),
        ("kv_capacity_bytes", info.kv_capacity_bytes.to_string()),
        ("layers", info.num_layers.to_string()),
    ];
    if info.backend == BackendKind::Llama {
        settings.extend([
            ("llama.cpp", LLAMA_CPP_BUILD.to_string()),
            ("kv_type", llama.kv_type.as_str().to_string()),
            ("kv_tokens", llama.kv_tokens.to_string()),
            ("split", llama.splits().to_string()),
            ("batch_invariant", llama.batch_invariant.to_string()),
        ]);
    }
    let made = Fingerprint::of(path, &settings)
        .and_then(|fp| cache.for_model(fp, id, info.backend.as_str()));
    match made {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!(model = id, error = %e, "the prefix cache's disk tier is off for this model");
            None
        }
    }
}

/// The llama.cpp build whose state format the disk tier's payloads hold.
const LLAMA_CPP_BUILD: &str = "llama-cpp-sys-2 0.1.161";

/// Loads `path` to draft for `target`, or `None` (with a warning) when the
/// two vocabularies differ and the draft model is not `required`: a pool's
/// other models ignore a draft model named for one family.
fn load_draft(
    path: &Path,
    load: &LoadOptions,
    target: &loader::Loaded,
    required: bool,
) -> Result<Option<Box<dyn LanguageModel>>> {
    let d = loader::load(path, load)
        .map_err(|e| EngineError::Unsupported(format!("draft model {}: {e}", path.display())))?;
    if d.model.embedding().is_some() || !d.model.verifies_drafts() {
        return Err(EngineError::Unsupported(format!(
            "draft model {}: not a generation model on llama.cpp",
            path.display()
        )));
    }
    if let Some(why) = vocabulary_mismatch(
        &target.vocab,
        target.model.info().vocab_size,
        &d.vocab,
        d.model.info().vocab_size,
    ) {
        if required {
            return Err(EngineError::Unsupported(format!(
                "draft model {} cannot draft for {}: its vocabulary differs ({why})",
                path.display(),
                target.path.display()
            )));
        }
        tracing::warn!(draft = %path.display(), target = %target.path.display(), %why,
            "the draft model does not share this model's vocabulary; drafting by prompt lookup");
        return Ok(None);
    }
    info!(draft = %path.display(), weight_mb = d.model.info().weight_bytes >> 20, "draft model loaded");
    Ok(Some(d.model))
}

/// Stands in for a cache that has been handed on (or never existed).
struct NoCache;

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

/// Runs a request on the calling thread's runtime-free receiver: collects all
/// text and the final record. Convenient for the CLI and tests.
pub fn collect_blocking(mut rx: EventStream) -> Result<(String, Completion)> {
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Delta { text: t, .. } => text.push_str(&t),
            Event::Done(c) => return Ok((text, c)),
            Event::Started { .. }
            | Event::Reasoning { .. }
            | Event::ToolCallStart { .. }
            | Event::ToolCallArgs { .. } => {}
        }
    }
    Err(EngineError::Unavailable(
        "engine stopped mid-request".into(),
    ))
}

/// Returns free heap pages to the system. glibc keeps what a burst of
/// requests freed (per-thread arenas, holes in the heap), so after a busy
/// spell the process would otherwise stay at its peak size while idle.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Elsewhere (macOS, musl) the allocator is left to itself.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() {}
