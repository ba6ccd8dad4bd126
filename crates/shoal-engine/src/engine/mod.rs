//! The engine: a handle ([`Engine`]) to a thread that owns the model,
//! batches the requests of a bounded queue (continuous batching, in
//! [`scheduler`]) and streams [`Event`]s back; dropping the receiver
//! cancels. The KV state kept between requests is [`kept`]. Nothing here
//! names a backend: what differs by backend is behind [`LanguageModel`].
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tracing::info;

use crate::backend::{EmbeddingInfo, ModelInfo};
use crate::backends::llama::LlamaOptions;
use crate::backends::BackendChoice;
use crate::completion::{Completion, Event};
use crate::constraint::GrammarCompiler;
use crate::content_filter::ContentPolicy;
use crate::defaults::SamplingDefaults;
use crate::disk_cache::DiskCache;
use crate::draft::DraftOptions;
use crate::draft_model::{load_draft, DraftInfo, DraftModel};
use crate::embedding::{run_embeddings, EmbedJob};
use crate::error::{EngineError, Result};
use crate::loader::{self, LoadOptions, Vocabulary};
use crate::prefix_cache::PrefixCache;
pub use crate::request::{CacheBreakpoint, CancelFlag, EngineStats, GenerateRequest};
use crate::sequence::Job;

mod kept;
mod scheduler;

use kept::model_disk;
use scheduler::{run, RunConfig};

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
        let load = LoadOptions::for_engine(opts.backend, &opts.llama, opts.max_batch);
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
            let load = LoadOptions::for_drafter(&opts.llama, opts.max_batch);
            (p, load, opts.draft_model_required)
        });
        let blocked = ContentPolicy::new(opts.blocked_phrases.clone(), &opts.blocked_patterns)?;
        let disk_cache = opts.disk_cache.clone();
        let model_id = id.to_string();
        let stats = Arc::new(EngineStats::default());
        let thread_stats = stats.clone();
        let stopped = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let thread_stopped = stopped.clone();
        std::thread::Builder::new()
            .name("shoal-engine".into())
            .spawn(move || {
                let loaded = load(&path_buf);
                let loaded = match loaded {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
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
                    .and_then(|c| model_disk(c, &path_buf, &model_id, loaded.model.as_ref()))
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
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        let window = self.model.info.window();
        // The window counts positions, the pool cells (see `Window`).
        let (tokens, saved) = (req.prompt.len(), req.positions_saved());
        let positions = tokens.saturating_sub(saved);
        if positions >= window.positions {
            return Err(if saved == 0 {
                EngineError::ContextOverflow {
                    prompt_tokens: tokens,
                    context: window.positions,
                }
            } else {
                EngineError::PositionOverflow {
                    positions,
                    prompt_tokens: tokens,
                    context: window.positions,
                }
            });
        }
        if tokens >= window.cells {
            return Err(EngineError::CellOverflow {
                prompt_tokens: tokens,
                cells: window.cells,
            });
        }
        if req.max_tokens == Some(0) {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        let vocab = self.model.info.vocab_size;
        if !req.images.is_empty() {
            if let Some(e) = self.model.vocab.vision.refusal(&self.model.id) {
                return Err(e.into());
            }
        }
        // Every position is a vocabulary id, or part of an image where the
        // request says one sits (in order, inside the prompt).
        let mut spans = req.images.iter().peekable();
        let mut after = 0;
        for s in &req.images {
            if s.start < after || s.end() > req.prompt.len() {
                return Err(EngineError::InvalidRequest(
                    "the prompt's images overlap or lie outside it".into(),
                ));
            }
            after = s.end();
        }
        for (i, &t) in req.prompt.iter().enumerate() {
            while spans.peek().is_some_and(|s| s.end() <= i) {
                spans.next();
            }
            let in_image = spans.peek().is_some_and(|s| s.start <= i);
            if !in_image && t as usize >= vocab {
                return Err(EngineError::InvalidRequest(format!(
                    "token id {t} is outside the vocabulary of {vocab}"
                )));
            }
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
