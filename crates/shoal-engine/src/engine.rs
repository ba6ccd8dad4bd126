//! The engine thread: owns the model, runs one generation at a time from a
//! bounded queue, and streams [`Event`]s back. Dropping the receiver cancels.
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tracing::{debug, info, warn};

use crate::backend::{KvCache, LanguageModel, ModelInfo};
use crate::completion::{Completion, Event, FinishReason, Timings, TokenLogprob, Usage};
use crate::content_filter::ContentPolicy;
use crate::detok::IncrementalDecoder;
use crate::error::{EngineError, Result};
use crate::loader::{self, Vocabulary};
use crate::prefix_cache::PrefixCache;
use crate::reasoning::{Phase, ReasoningSpec, ReasoningSplitter};
use crate::sampler::{Sampler, SamplingParams};
use crate::stop::StopMatcher;

/// One generation request, already tokenized.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    /// `None` runs until EOS or the context window.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Keep going past EOS (benchmarks).
    pub ignore_eos: bool,
    /// Set to stop the generation early; it then ends with `Cancelled` and
    /// still sends its final record (dropping the stream also cancels, but
    /// then nobody hears the record).
    pub cancel: CancelFlag,
    /// Split a thinking section off the reply (and cap it), if any.
    pub reasoning: Option<ReasoningSpec>,
}

/// A shared "please stop" flag for one request.
#[derive(Clone, Debug, Default)]
pub struct CancelFlag(Arc<std::sync::atomic::AtomicBool>);

impl CancelFlag {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl GenerateRequest {
    /// A request with default sampling, no stops and no limit.
    pub fn new(prompt: Vec<u32>) -> Self {
        GenerateRequest {
            prompt,
            max_tokens: None,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            cancel: CancelFlag::default(),
            reasoning: None,
        }
    }
}

/// Engine options.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Requests waiting beyond the running one; more are refused.
    pub queue_capacity: usize,
    /// Prompt tokens per forward pass during prefill (bounds memory).
    pub prefill_chunk: usize,
    /// Memory for KV state kept between requests to reuse shared prefixes; 0 turns it off.
    pub prefix_cache_bytes: usize,
    /// Content filter: output containing any of these phrases is cut before
    /// the phrase and ends with `ContentFilter` (the tokens spent still count).
    pub blocked_phrases: Vec<String>,
    /// Content filter: regular expressions, checked like the phrases.
    pub blocked_patterns: Vec<String>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            queue_capacity: 64,
            prefill_chunk: 2048,
            prefix_cache_bytes: 1 << 30,
            blocked_phrases: Vec::new(),
            blocked_patterns: Vec::new(),
        }
    }
}

struct Job {
    req: GenerateRequest,
    events: UnboundedSender<Event>,
    submitted: Instant,
}

impl Job {
    fn gone(&self) -> bool {
        self.events.is_closed() || self.req.cancel.is_cancelled()
    }
}

/// The stream of events for one request. Dropping it cancels the generation.
pub type EventStream = UnboundedReceiver<Event>;

/// Counters the engine keeps for observability (and for tests to see
/// cancellations that no client is left to hear about).
#[derive(Debug, Default)]
pub struct EngineStats {
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub errors: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Completion tokens of the most recent cancelled generation.
    pub last_cancelled_tokens: AtomicU64,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: AtomicU64,
    /// Bytes the prefix cache holds now.
    pub prefix_cache_bytes: AtomicU64,
}

/// A handle to a running engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    jobs: SyncSender<Job>,
    pub model: Arc<ModelHandle>,
    pub stats: Arc<EngineStats>,
}

/// What callers may know about the loaded model.
pub struct ModelHandle {
    /// The name clients use for it.
    pub id: String,
    pub path: std::path::PathBuf,
    pub info: ModelInfo,
    pub vocab: Arc<Vocabulary>,
}

impl Engine {
    /// Loads the model on a dedicated thread and starts serving requests.
    pub fn start(path: &Path, id: &str, opts: EngineOptions) -> Result<Engine> {
        let (ready_tx, ready_rx) = sync_channel::<Result<(ModelInfo, Arc<Vocabulary>)>>(1);
        let (jobs_tx, jobs_rx) = sync_channel::<Job>(opts.queue_capacity);
        let path_buf = path.to_path_buf();
        let chunk = opts.prefill_chunk.max(1);
        let prefix_bytes = opts.prefix_cache_bytes;
        let blocked = ContentPolicy::new(opts.blocked_phrases.clone(), &opts.blocked_patterns)?;
        let stats = Arc::new(EngineStats::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("shoal-engine".into())
            .spawn(move || {
                let loaded = match loader::load(&path_buf) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok((loaded.model.info().clone(), loaded.vocab.clone())));
                let prefixes = PrefixCache::new(prefix_bytes);
                run(
                    loaded.model,
                    loaded.vocab,
                    jobs_rx,
                    chunk,
                    &thread_stats,
                    prefixes,
                    &blocked,
                );
            })?;
        let (info, vocab) = ready_rx
            .recv()
            .map_err(|_| EngineError::Unavailable("engine thread exited while loading".into()))??;
        info!(model = id, arch = %info.architecture, dtype = %info.dtype, device = %info.device,
              weight_mb = info.weight_bytes / (1 << 20), "model loaded");
        Ok(Engine {
            jobs: jobs_tx,
            stats,
            model: Arc::new(ModelHandle {
                id: id.to_string(),
                path: path.to_path_buf(),
                info,
                vocab,
            }),
        })
    }

    /// Queues a request. Fails at once if the prompt cannot fit or the queue is full.
    pub fn submit(&self, req: GenerateRequest) -> Result<EventStream> {
        self.validate(&req)?;
        let (tx, rx) = unbounded_channel();
        let job = Job {
            req,
            events: tx,
            submitted: Instant::now(),
        };
        match self.jobs.try_send(job) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => {
                Err(EngineError::Unavailable("request queue is full".into()))
            }
            Err(TrySendError::Disconnected(_)) => {
                Err(EngineError::Unavailable("engine has stopped".into()))
            }
        }
    }

    fn validate(&self, req: &GenerateRequest) -> Result<()> {
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
        req.sampling.validate()
    }
}

fn run(
    model: Box<dyn LanguageModel>,
    vocab: Arc<Vocabulary>,
    jobs: Receiver<Job>,
    chunk: usize,
    stats: &EngineStats,
    mut prefixes: PrefixCache,
    blocked: &ContentPolicy,
) {
    while let Ok(job) = jobs.recv() {
        if job.gone() {
            debug!("request cancelled while queued");
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
            stats.last_cancelled_tokens.store(0, Ordering::Relaxed);
            // Whoever still listens learns it never ran.
            let _ = job.events.send(Event::Done(Completion {
                finish: FinishReason::Cancelled,
                usage: Usage {
                    prompt_tokens: job.req.prompt.len(),
                    ..Usage::default()
                },
                timings: Timings {
                    queue_ms: ms(job.submitted.elapsed()),
                    total_ms: ms(job.submitted.elapsed()),
                    ..Timings::default()
                },
            }));
            continue;
        }
        let events = job.events.clone();
        let started = Instant::now();
        let cache = match prefixes.lookup(&job.req.prompt) {
            Some(hit) => Ok(hit.cache),
            None => model.new_cache(),
        };
        let completion = match cache {
            Ok(mut cache) => {
                let (c, context) = generate(
                    model.as_ref(),
                    &vocab,
                    &job,
                    cache.as_mut(),
                    chunk,
                    started,
                    blocked,
                );
                if !matches!(c.finish, FinishReason::Error(_)) {
                    prefixes.insert(&context, cache);
                }
                c
            }
            Err(e) => failed(&job, e, started),
        };
        stats
            .prefix_cache_bytes
            .store(prefixes.bytes() as u64, Ordering::Relaxed);
        stats
            .cached_tokens
            .fetch_add(completion.usage.cached_tokens as u64, Ordering::Relaxed);
        let u = completion.usage;
        stats
            .prompt_tokens
            .fetch_add(u.prompt_tokens as u64, Ordering::Relaxed);
        stats
            .completion_tokens
            .fetch_add(u.completion_tokens as u64, Ordering::Relaxed);
        match completion.finish {
            FinishReason::Cancelled => {
                info!(
                    completion_tokens = u.completion_tokens,
                    "generation cancelled by the caller"
                );
                stats
                    .last_cancelled_tokens
                    .store(u.completion_tokens as u64, Ordering::Relaxed);
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            FinishReason::Error(_) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                stats.completed.fetch_add(1, Ordering::Relaxed);
            }
        }
        debug!(
            finish = completion.finish.as_str(),
            prompt = u.prompt_tokens,
            completion = u.completion_tokens,
            "generation done"
        );
        let _ = events.send(Event::Done(completion));
    }
}

fn failed(job: &Job, e: EngineError, started: Instant) -> Completion {
    warn!(error = %e, "generation failed");
    Completion {
        finish: FinishReason::Error(e.to_string()),
        usage: Usage {
            prompt_tokens: job.req.prompt.len(),
            ..Usage::default()
        },
        timings: Timings {
            queue_ms: ms(started - job.submitted),
            total_ms: ms(job.submitted.elapsed()),
            ..Timings::default()
        },
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs one request to completion. Every exit path reports exact usage.
/// Also returns the tokens whose KV state the cache now holds (a prefix of
/// prompt + output), for the prefix cache.
fn generate(
    model: &dyn LanguageModel,
    vocab: &Vocabulary,
    job: &Job,
    cache: &mut dyn KvCache,
    chunk: usize,
    started: Instant,
    blocked: &ContentPolicy,
) -> (Completion, Vec<u32>) {
    let req = &job.req;
    let ctx = model.info().context_length;
    let mut usage = Usage {
        prompt_tokens: req.prompt.len(),
        cached_tokens: cache.len(),
        ..Usage::default()
    };
    let mut timings = Timings {
        queue_ms: ms(started - job.submitted),
        ..Timings::default()
    };
    let finish = |finish: FinishReason, usage: Usage, mut timings: Timings| {
        timings.total_ms = ms(job.submitted.elapsed());
        Completion {
            finish,
            usage,
            timings,
        }
    };
    let held = |cache: &dyn KvCache, ctx: &[u32]| ctx[..cache.len().min(ctx.len())].to_vec();

    // Prefill in chunks so a long prompt neither blows memory nor ignores cancellation.
    let mut logits = Vec::new();
    for part in req.prompt[cache.len()..].chunks(chunk) {
        if job.gone() {
            return (
                finish(FinishReason::Cancelled, usage, timings),
                held(cache, &req.prompt),
            );
        }
        match model.forward(part, cache) {
            Ok(l) => logits = l,
            Err(e) => {
                return (
                    finish(FinishReason::Error(e.to_string()), usage, timings),
                    Vec::new(),
                )
            }
        }
    }
    let prefill_done = Instant::now();
    let computed = usage.prompt_tokens - usage.cached_tokens;
    timings.prefill_tokens_per_s =
        computed as f64 / (prefill_done - started).as_secs_f64().max(1e-9);
    let _ = job.events.send(Event::Started {
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
    });

    let mut sampler = Sampler::new(req.sampling.clone());
    let mut detok = IncrementalDecoder::new(true);
    let mut stops = StopMatcher::new(req.stop.clone());
    // The filter sees text before the stop matcher, so a blocked phrase is
    // withheld even when a stop sequence would have matched later.
    let mut filter = blocked.screen();
    let mut context = req.prompt.clone();
    let mut generated: Vec<u32> = Vec::new();
    let mut pending_logprobs: Vec<TokenLogprob> = Vec::new();
    let want_logprobs = req.sampling.top_logprobs.is_some();
    let max_tokens = req.max_tokens.unwrap_or(usize::MAX);
    let mut first_token_at = None;
    let mut last_token_at;

    let send_text = |text: String, lp: &mut Vec<TokenLogprob>| {
        if !text.is_empty() {
            let _ = job.events.send(Event::Delta {
                text,
                logprobs: std::mem::take(lp),
            });
        }
    };
    let send_reasoning = |text: String| {
        if !text.is_empty() {
            let _ = job.events.send(Event::Reasoning { text });
        }
    };
    let mut splitter = req.reasoning.as_ref().map(ReasoningSplitter::new);
    let budget = req.reasoning.as_ref().and_then(|r| r.budget);
    // Tokens sampled before we know whether the reply opens a thinking section.
    let mut pending_tokens = 0;

    let reason = loop {
        let s = sampler.sample(&logits, &context, &generated);
        let now = Instant::now();
        if first_token_at.is_none() {
            first_token_at = Some(now);
            timings.ttft_ms = ms(now - job.submitted);
        }
        last_token_at = now;
        generated.push(s.token);
        context.push(s.token);
        usage.completion_tokens += 1;
        let phase_before = splitter.as_ref().map(ReasoningSplitter::phase);
        match phase_before {
            Some(Phase::Thinking) => usage.reasoning_tokens += 1,
            Some(Phase::Pending) => pending_tokens += 1,
            _ => {}
        }

        if !req.ignore_eos && vocab.eos.contains(&s.token) {
            break FinishReason::Stop;
        }
        if want_logprobs {
            pending_logprobs.push(token_logprob(vocab, s.token, s.logprob, &s.top));
        }
        let piece = match detok.push(&vocab.tokenizer, s.token) {
            Ok(p) => p,
            Err(e) => break FinishReason::Error(e.to_string()),
        };
        let screened = filter.push(&piece);
        let content = match splitter.as_mut() {
            Some(sp) => {
                let split = sp.push(&screened.emit);
                if phase_before == Some(Phase::Pending) && sp.phase() != Phase::Pending {
                    if split.reasoning.is_empty() && sp.phase() == Phase::Answer {
                        pending_tokens = 0;
                    }
                    usage.reasoning_tokens += pending_tokens;
                    pending_tokens = 0;
                }
                send_reasoning(split.reasoning);
                split.content
            }
            None => screened.emit,
        };
        let step = stops.push(&content);
        send_text(step.emit, &mut pending_logprobs);
        if let Some(i) = step.matched {
            break FinishReason::StopSequence(stops.stops()[i].clone());
        }
        if screened.matched.is_some() {
            break FinishReason::ContentFilter;
        }
        // Budget spent: close the section ourselves and let the answer follow.
        if let (Some(sp), Some(b)) = (splitter.as_mut(), budget) {
            if sp.phase() == Phase::Thinking
                && usage.reasoning_tokens >= b
                && generated.len() < max_tokens
            {
                send_reasoning(sp.close_now());
                let close = req
                    .reasoning
                    .as_ref()
                    .map(|r| format!("{}\n\n", r.close))
                    .unwrap_or_default();
                let forced = match vocab.tokenizer.encode(close.as_str(), false) {
                    Ok(e) => e.get_ids().to_vec(),
                    Err(e) => break FinishReason::Error(e.to_string()),
                };
                for &t in &forced {
                    let _ = detok.push(&vocab.tokenizer, t);
                }
                // The forced marker is output the model's cache holds: it counts
                // as completion, not as reasoning.
                usage.completion_tokens += forced.len();
                generated.extend_from_slice(&forced);
                context.extend_from_slice(&forced);
                if context.len() >= ctx {
                    break FinishReason::ContextWindow;
                }
                match model.forward(&forced, cache) {
                    Ok(l) => logits = l,
                    Err(e) => break FinishReason::Error(e.to_string()),
                }
                if generated.len() >= max_tokens {
                    break FinishReason::Length;
                }
                continue;
            }
        }
        if generated.len() >= max_tokens {
            break FinishReason::Length;
        }
        if context.len() >= ctx {
            break FinishReason::ContextWindow;
        }
        if job.gone() {
            break FinishReason::Cancelled;
        }
        match model.forward(&[s.token], cache) {
            Ok(l) => logits = l,
            Err(e) => break FinishReason::Error(e.to_string()),
        }
    };

    // Release text held back for a possible stop sequence, a blocked phrase
    // or an incomplete character.
    let mut reason = reason;
    if !matches!(
        reason,
        FinishReason::StopSequence(_) | FinishReason::Cancelled | FinishReason::ContentFilter
    ) {
        let mut tail = detok.flush(&vocab.tokenizer).unwrap_or_default();
        if let Some(sp) = splitter.as_mut() {
            let mut split = sp.push(&tail);
            let last = sp.flush();
            split.reasoning.push_str(&last.reasoning);
            split.content.push_str(&last.content);
            send_reasoning(split.reasoning);
            tail = split.content;
        }
        let screened = filter.push(&tail);
        let mut text = screened.emit;
        if screened.matched.is_some() {
            reason = FinishReason::ContentFilter;
        } else {
            let last = filter.flush();
            text.push_str(&last.emit);
            if last.matched.is_some() {
                reason = FinishReason::ContentFilter;
            }
        }
        let step = stops.push(&text);
        let mut rest = step.emit;
        match step.matched {
            Some(i) => reason = FinishReason::StopSequence(stops.stops()[i].clone()),
            None => rest.push_str(&stops.flush()),
        }
        send_text(rest, &mut pending_logprobs);
    }
    if let Some(first) = first_token_at {
        let n = usage.completion_tokens.saturating_sub(1);
        let secs = (last_token_at - first).as_secs_f64();
        timings.decode_tokens_per_s = if n > 0 && secs > 0.0 {
            n as f64 / secs
        } else {
            0.0
        };
    }
    let kept = held(cache, &context);
    (finish(reason, usage, timings), kept)
}

fn token_logprob(vocab: &Vocabulary, token: u32, logprob: f32, top: &[(u32, f32)]) -> TokenLogprob {
    let text = |id: u32| String::from_utf8_lossy(&vocab.token_bytes(id)).into_owned();
    TokenLogprob {
        token,
        bytes: vocab.token_bytes(token),
        text: text(token),
        logprob,
        top: top.iter().map(|&(id, lp)| (id, text(id), lp)).collect(),
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
            Event::Started { .. } | Event::Reasoning { .. } => {}
        }
    }
    Err(EngineError::Unavailable(
        "engine stopped mid-request".into(),
    ))
}
