//! One request in flight: its KV cache, and the text-side state that turns
//! sampled tokens into events — grammar, detokenizer, reasoning split,
//! content filter, stop sequences — with exact usage on every exit. The
//! scheduler in [`crate::engine`] advances many of these together, one
//! batched forward pass per step; a sequence never runs the model itself
//! except to prefill its own prompt.
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::backend::{KvCache, LanguageModel, Window};
use crate::completion::{Completion, Event, FinishReason, Timings, TokenLogprob, Usage};
use crate::constraint::Constraint;
use crate::content_filter::{ContentPolicy, Screen};
use crate::detok::IncrementalDecoder;
use crate::draft::{DraftOptions, Drafter};
use crate::draft_model::DraftModel;
use crate::error::EngineError;
use crate::loader::Vocabulary;
use crate::reasoning::{Phase, ReasoningSplitter};
use crate::request::GenerateRequest;
use crate::sampler::Sampler;
use crate::stop::StopMatcher;
use crate::tools::{ToolOut, ToolParser};

/// A queued request as the engine thread receives it.
pub(crate) struct Job {
    pub req: GenerateRequest,
    pub constraint: Option<Constraint>,
    pub events: UnboundedSender<Event>,
    pub submitted: Instant,
}

impl Job {
    /// The caller hung up or asked to stop.
    pub fn gone(&self) -> bool {
        self.events.is_closed() || self.req.cancel.is_cancelled()
    }
}

/// Milliseconds to the microsecond: the figures a ledger stores and a client
/// reads, without the float noise of 15 significant digits.
pub(crate) fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Tokens per second to the hundredth, for the same reason as [`ms`].
fn rate(tokens: usize, secs: f64) -> f64 {
    (tokens as f64 / secs * 100.0).round() / 100.0
}

/// What a sequence needs after one step.
pub(crate) enum Next {
    /// Run this token (the one just sampled, or one the engine forces) and
    /// hand back the logits.
    Feed(u32),
    /// The generation is over.
    Finished(FinishReason),
}

/// Why a prefill step did not go on.
pub(crate) enum Stall {
    /// The generation is over.
    Finish(FinishReason),
    /// The backend has no KV room left; the chunk can be tried again once
    /// room is freed.
    KvCacheFull,
}

/// Decoding state, created when prefill ends.
struct Decode {
    sampler: Sampler,
    detok: IncrementalDecoder,
    stops: StopMatcher,
    filter: Screen,
    splitter: Option<ReasoningSplitter>,
    context: Vec<u32>,
    generated: Vec<u32>,
    pending_logprobs: Vec<TokenLogprob>,
    /// Tokens sampled before it is known whether the reply opens a thinking section.
    pending_reasoning: usize,
    /// Tokens the engine inserts (a closing reasoning marker), fed one per
    /// step before sampling resumes.
    forced: std::collections::VecDeque<u32>,
    tools: Option<ToolParser>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

pub(crate) struct Sequence {
    pub job: Job,
    pub cache: Box<dyn KvCache>,
    started: Instant,
    usage: Usage,
    timings: Timings,
    logits: Vec<f32>,
    decode: Option<Decode>,
    constraint: Option<Constraint>,
    /// Speculative decoding: drafts fed after the last token run, each with
    /// the logits the model gave after it, not yet checked.
    pending: std::collections::VecDeque<(u32, Vec<f32>)>,
    drafter: Option<Drafter>,
    /// Drafts of the step being checked, and how many of them were kept.
    checking: (usize, usize),
}

impl Sequence {
    /// Of its cached prompt tokens, `n` came from the disk tier; `stores`
    /// says whether its prefix will be kept (a prefix cache is on), so its
    /// breakpoints write what they cover beyond the cached part.
    pub fn with_cache_facts(mut self, n: usize, stores: bool) -> Self {
        self.usage.cached_disk_tokens = n.min(self.usage.cached_tokens);
        if stores {
            let (w, long) = crate::request::breakpoint_writes(
                &self.job.req.cache_breakpoints,
                self.usage.cached_tokens,
            );
            let room = self.usage.prompt_tokens - self.usage.cached_tokens;
            self.usage.cache_write_tokens = w.min(room);
            self.usage.cache_write_1h_tokens = long.min(room);
        }
        self
    }

    pub fn new(mut job: Job, mut cache: Box<dyn KvCache>) -> Self {
        let constraint = job.constraint.take();
        let started = Instant::now();
        // A reused prefix ends before an image it would cut: an image is
        // encoded whole or not at all.
        let whole = crate::vision::whole_images(&job.req.images, cache.len());
        if whole < cache.len() {
            cache.truncate(whole);
        }
        let usage = Usage {
            prompt_tokens: job.req.prompt.len(),
            cached_tokens: cache.len(),
            image_tokens: job.req.image_tokens(),
            images: job.req.images.len(),
            ..Usage::default()
        };
        let timings = Timings {
            queue_ms: ms(started - job.submitted),
            ..Timings::default()
        };
        Sequence {
            job,
            cache,
            started,
            usage,
            timings,
            logits: Vec::new(),
            decode: None,
            constraint,
            pending: Default::default(),
            drafter: None,
            checking: (0, 0),
        }
    }

    /// Prompt tokens this request computes itself (those no cache held).
    pub fn computed_prompt_tokens(&self) -> usize {
        self.usage.prompt_tokens - self.usage.cached_tokens
    }

    /// Drafts tokens for speculative decoding (see [`crate::draft`]).
    pub fn drafting(mut self, opts: DraftOptions) -> Self {
        self.drafter = Drafter::new(opts);
        self
    }

    /// [`Sequence::step`] through the checked drafts: while the token a step
    /// gives equals the draft the cache already holds at that position, its
    /// logits are the next step's and nothing runs. Returns what to run and
    /// how many positions at the end of the cache to drop (drafts not kept).
    pub fn advance(&mut self, vocab: &Vocabulary, window: Window) -> (Next, usize) {
        loop {
            let next = self.step(vocab, window);
            let drop = match next {
                Next::Feed(t) => match self.pending.pop_front() {
                    Some((draft, logits)) if draft == t => {
                        self.logits = logits;
                        self.checking.1 += 1;
                        self.timings.draft_accepted += 1;
                        continue;
                    }
                    Some(_) => 1 + self.pending.len(),
                    None => 0,
                },
                Next::Finished(_) => self.pending.len(),
            };
            self.pending.clear();
            let (proposed, kept) = std::mem::take(&mut self.checking);
            if proposed > 0 {
                tracing::trace!(proposed, kept, "draft checked");
            }
            if let Some(d) = self.drafter.as_mut() {
                d.kept(proposed, kept);
            }
            return (next, drop);
        }
    }

    /// Drafts to run after `token` (the token [`Sequence::advance`] said to
    /// run), within the reply's token limit and the context window.
    pub fn propose(&mut self, window: Window, model: Option<&mut DraftModel>) -> Vec<u32> {
        let (Some(drafter), Some(d)) = (self.drafter.as_mut(), self.decode.as_ref()) else {
            return Vec::new();
        };
        if !d.forced.is_empty() {
            return Vec::new();
        }
        let max_tokens = self.job.req.max_tokens.unwrap_or(usize::MAX);
        // The token about to run is the last of `generated`; a draft past the
        // limit could never be kept.
        let room = max_tokens
            .saturating_sub(d.generated.len())
            .min(window.room(d.context.len() + 1, self.job.req.positions_saved()));
        drafter.propose(&d.context, room, model)
    }

    /// Hands the sequence's draft-model cache back for later turns.
    pub fn finish_drafting(&mut self, model: Option<&mut DraftModel>) {
        if let Some(d) = self.drafter.as_mut() {
            d.finish(model);
        }
    }

    /// Logits from a step that ran `span` (a token, then drafts): those after
    /// the token are the next step's, the rest wait to be checked.
    pub fn set_checked(&mut self, span: &[u32], mut logits: Vec<Vec<f32>>) {
        let rest = logits.split_off(1.min(logits.len()));
        self.logits = logits.pop().unwrap_or_default();
        self.pending = span.iter().skip(1).copied().zip(rest).collect();
        self.checking = (self.pending.len(), 0);
        self.timings.draft_tokens += self.pending.len();
    }

    /// Computes the next `chunk` prompt tokens. Returns `Ok(true)` once the
    /// whole prompt is in the cache and the first token can be sampled.
    pub fn prefill(
        &mut self,
        model: &dyn LanguageModel,
        chunk: usize,
        blocked: &ContentPolicy,
    ) -> Result<bool, Stall> {
        if self.job.gone() {
            return Err(Stall::Finish(FinishReason::Cancelled));
        }
        let prompt = &self.job.req.prompt;
        let done = self.cache.len();
        let mut end = (done + chunk).min(prompt.len());
        // An image in this chunk: the text before it first, then the image
        // whole in a step of its own.
        if let Some(span) = self
            .job
            .req
            .images
            .iter()
            .find(|s| s.end() > done && s.start < end)
        {
            if span.start > done {
                end = span.start;
            } else if span.start == done {
                return match model.forward_image(&span.image, self.cache.as_mut()) {
                    Ok(()) => Ok(false),
                    Err(EngineError::KvCacheFull) => Err(Stall::KvCacheFull),
                    Err(e) => Err(Stall::Finish(FinishReason::Error(e.to_string()))),
                };
            } else {
                return Err(Stall::Finish(FinishReason::Error(
                    "the cached prefix ends inside an image".into(),
                )));
            }
        }
        self.logits = match model.forward(&prompt[done..end], self.cache.as_mut()) {
            Ok(l) => l,
            Err(EngineError::KvCacheFull) => return Err(Stall::KvCacheFull),
            Err(e) => return Err(Stall::Finish(FinishReason::Error(e.to_string()))),
        };
        if end < prompt.len() {
            return Ok(false);
        }
        let now = Instant::now();
        let computed = self.usage.prompt_tokens - self.usage.cached_tokens;
        self.timings.prefill_tokens_per_s =
            rate(computed, (now - self.started).as_secs_f64().max(1e-9));
        let _ = self.job.events.send(Event::Started {
            prompt_tokens: self.usage.prompt_tokens,
            cached_tokens: self.usage.cached_tokens,
            cache_write_tokens: self.usage.cache_write_tokens,
            cache_write_1h_tokens: self.usage.cache_write_1h_tokens,
        });
        let req = &self.job.req;
        self.decode = Some(Decode {
            sampler: Sampler::new(req.sampling.clone()),
            detok: IncrementalDecoder::new(true),
            stops: StopMatcher::new(req.stop.clone()),
            // The filter sees text before the stop matcher, so a blocked phrase
            // is withheld even when a stop sequence would have matched later.
            filter: blocked.screen(),
            splitter: req.reasoning.as_ref().map(ReasoningSplitter::new),
            context: req.prompt.clone(),
            generated: Vec::new(),
            pending_logprobs: Vec::new(),
            pending_reasoning: 0,
            forced: Default::default(),
            tools: req.tools.map(ToolParser::new),
            first_token_at: None,
            last_token_at: None,
        });
        Ok(true)
    }

    /// Samples one token and turns it into events; says what to run next.
    pub fn step(&mut self, vocab: &Vocabulary, window: Window) -> Next {
        let Some(d) = self.decode.as_mut() else {
            return Next::Finished(FinishReason::Error("sampled before prefill".into()));
        };
        let job = &self.job;
        let req = &job.req;
        let usage = &mut self.usage;
        // Prompt tokens with no position of their own (an M-RoPE image's).
        let saved = req.positions_saved();
        let max_tokens = req.max_tokens.unwrap_or(usize::MAX);
        if let Some(t) = d.forced.pop_front() {
            return Next::Feed(t);
        }
        let send_text =
            |text: String, lp: &mut Vec<TokenLogprob>, tools: &mut Option<ToolParser>| {
                emit(&job.events, text, lp, tools, false);
            };
        let send_reasoning = |text: String| {
            if !text.is_empty() {
                let _ = job.events.send(Event::Reasoning { text });
            }
        };

        let s = match self.constraint.as_mut() {
            None => d.sampler.sample(&self.logits, &d.context, &d.generated),
            Some(c) => {
                let mut masked = std::mem::take(&mut self.logits);
                if let Err(e) = c.mask(&mut masked) {
                    return Next::Finished(FinishReason::Error(e.to_string()));
                }
                d.sampler.sample(&masked, &d.context, &d.generated)
            }
        };
        let now = Instant::now();
        if d.first_token_at.is_none() {
            d.first_token_at = Some(now);
            self.timings.ttft_ms = ms(now - job.submitted);
        }
        d.last_token_at = Some(now);
        d.generated.push(s.token);
        d.context.push(s.token);
        usage.completion_tokens += 1;
        let phase_before = d.splitter.as_ref().map(ReasoningSplitter::phase);
        match phase_before {
            Some(Phase::Thinking) => usage.reasoning_tokens += 1,
            Some(Phase::Pending) => d.pending_reasoning += 1,
            _ => {}
        }
        if !req.ignore_eos && vocab.eos.contains(&s.token) {
            return Next::Finished(FinishReason::Stop);
        }
        if let Some(c) = self.constraint.as_mut() {
            if let Err(e) = c.commit(s.token) {
                return Next::Finished(FinishReason::Error(e.to_string()));
            }
        }
        if let Some(logprob) = s.logprob {
            d.pending_logprobs
                .push(token_logprob(vocab, s.token, logprob, &s.top));
        }
        let piece = match d.detok.push(vocab, s.token) {
            Ok(p) => p,
            Err(e) => return Next::Finished(FinishReason::Error(e.to_string())),
        };
        // A harmony marker ends a section: what the filter held back could no
        // longer complete a blocked phrase there, and belongs to that section.
        if let Some(sp) = d.splitter.as_mut().filter(|sp| sp.is_boundary(s.token)) {
            let held = d.filter.flush();
            let split = sp.push(&held.emit);
            send_reasoning(split.reasoning);
            let stepped = d.stops.push(&split.content);
            send_text(stepped.emit, &mut d.pending_logprobs, &mut d.tools);
            send_calls(&job.events, split.calls);
            if let Some(i) = stepped.matched {
                return Next::Finished(FinishReason::StopSequence(d.stops.stops()[i].clone()));
            }
            if held.matched.is_some() {
                return Next::Finished(FinishReason::ContentFilter);
            }
        }
        let screened = d.filter.push(&piece);
        let mut calls = Vec::new();
        let content = match d.splitter.as_mut() {
            Some(sp) => {
                let split = sp.token(s.token, &screened.emit);
                calls = split.calls;
                if phase_before == Some(Phase::Pending) && sp.phase() != Phase::Pending {
                    if split.reasoning.is_empty() && sp.phase() == Phase::Answer {
                        d.pending_reasoning = 0;
                    }
                    usage.reasoning_tokens += d.pending_reasoning;
                    d.pending_reasoning = 0;
                }
                send_reasoning(split.reasoning);
                split.content
            }
            None => screened.emit,
        };
        let stepped = d.stops.push(&content);
        send_text(stepped.emit, &mut d.pending_logprobs, &mut d.tools);
        send_calls(&job.events, calls);
        if let Some(i) = stepped.matched {
            return Next::Finished(FinishReason::StopSequence(d.stops.stops()[i].clone()));
        }
        if screened.matched.is_some() {
            return Next::Finished(FinishReason::ContentFilter);
        }
        // Budget spent: close the section ourselves and let the answer follow.
        let budget = req.reasoning.as_ref().and_then(|r| r.budget);
        if let (Some(sp), Some(b)) = (d.splitter.as_mut(), budget) {
            if sp.phase() == Phase::Thinking
                && usage.reasoning_tokens >= b
                && d.generated.len() < max_tokens
            {
                send_reasoning(sp.close_now());
                let close = req
                    .reasoning
                    .as_ref()
                    .map(|r| r.forced_close())
                    .unwrap_or_default();
                let forced = match vocab.encode_plain(close.as_str()) {
                    Ok(ids) => ids,
                    Err(e) => return Next::Finished(FinishReason::Error(e.to_string())),
                };
                for &t in &forced {
                    let _ = d.detok.push(vocab, t);
                }
                // The forced marker is output the model's cache holds: it counts
                // as completion, not as reasoning.
                usage.completion_tokens += forced.len();
                d.generated.extend_from_slice(&forced);
                d.context.extend_from_slice(&forced);
                // The model sees the sampled token, then the marker.
                d.forced.extend(forced);
                if window.full(d.context.len(), saved) {
                    return Next::Finished(FinishReason::ContextWindow);
                }
                if d.generated.len() >= max_tokens {
                    return Next::Finished(FinishReason::Length);
                }
                return Next::Feed(s.token);
            }
        }
        if d.generated.len() >= max_tokens {
            return Next::Finished(FinishReason::Length);
        }
        if window.full(d.context.len(), saved) {
            return Next::Finished(FinishReason::ContextWindow);
        }
        if job.gone() {
            return Next::Finished(FinishReason::Cancelled);
        }
        Next::Feed(s.token)
    }

    /// Ends the generation: releases text held back for a possible stop
    /// sequence, blocked phrase or incomplete character, and builds the final
    /// record. Also returns the tokens whose KV state the cache holds, for
    /// the prefix cache (none after an error).
    pub fn finish(&mut self, reason: FinishReason, vocab: &Vocabulary) -> (Completion, Vec<u32>) {
        let mut reason = reason;
        let job = &self.job;
        if let Some(d) = self.decode.as_mut() {
            if !matches!(
                reason,
                FinishReason::StopSequence(_)
                    | FinishReason::Cancelled
                    | FinishReason::ContentFilter
                    | FinishReason::Error(_)
            ) {
                let mut tail = d.detok.flush(vocab).unwrap_or_default();
                if let Some(sp) = d.splitter.as_mut() {
                    let mut split = sp.push(&tail);
                    let last = sp.flush();
                    split.reasoning.push_str(&last.reasoning);
                    split.content.push_str(&last.content);
                    if !split.reasoning.is_empty() {
                        let _ = job.events.send(Event::Reasoning {
                            text: split.reasoning,
                        });
                    }
                    send_calls(&job.events, split.calls);
                    tail = split.content;
                }
                let screened = d.filter.push(&tail);
                let mut text = screened.emit;
                if screened.matched.is_some() {
                    reason = FinishReason::ContentFilter;
                } else {
                    let last = d.filter.flush();
                    text.push_str(&last.emit);
                    if last.matched.is_some() {
                        reason = FinishReason::ContentFilter;
                    }
                }
                let stepped = d.stops.push(&text);
                let mut rest = stepped.emit;
                let matched = match stepped.matched {
                    Some(i) => Some(i),
                    None => {
                        // Held text may complete a stop only now that nothing follows.
                        let last = d.stops.flush();
                        rest.push_str(&last.emit);
                        last.matched
                    }
                };
                if let Some(i) = matched {
                    reason = FinishReason::StopSequence(d.stops.stops()[i].clone());
                }
                emit(
                    &job.events,
                    rest,
                    &mut d.pending_logprobs,
                    &mut d.tools,
                    true,
                );
            } else if let Some(tp) = d.tools.as_mut() {
                // Cut short: a call in progress still gets its end.
                for o in tp.finish() {
                    if let ToolOut::Args { index, delta } = o {
                        let _ = job.events.send(Event::ToolCallArgs { index, delta });
                    }
                }
            }
            let calls = d.tools.as_ref().map_or(0, ToolParser::calls)
                + d.splitter.as_ref().map_or(0, ReasoningSplitter::calls);
            if reason == FinishReason::Stop && calls > 0 {
                reason = FinishReason::ToolCalls;
            }
            if let (Some(first), Some(last)) = (d.first_token_at, d.last_token_at) {
                let n = self.usage.completion_tokens.saturating_sub(1);
                let secs = (last - first).as_secs_f64();
                self.timings.decode_tokens_per_s = if n > 0 && secs > 0.0 {
                    rate(n, secs)
                } else {
                    0.0
                };
            }
        }
        let context = match (&reason, self.decode.as_ref()) {
            (FinishReason::Error(_), _) => Vec::new(),
            (_, Some(d)) => d.context.clone(),
            (_, None) => job.req.prompt.clone(),
        };
        let kept = context[..self.cache.len().min(context.len())].to_vec();
        self.timings.total_ms = ms(job.submitted.elapsed());
        (
            Completion {
                finish: reason,
                usage: self.usage,
                timings: self.timings,
            },
            kept,
        )
    }
}

/// Sends reply text, through the tool-call parser when there is one.
fn emit(
    events: &UnboundedSender<Event>,
    text: String,
    logprobs: &mut Vec<TokenLogprob>,
    tools: &mut Option<ToolParser>,
    at_end: bool,
) {
    let send = |ev: Event| {
        let _ = events.send(ev);
    };
    let Some(tp) = tools.as_mut() else {
        if !text.is_empty() {
            send(Event::Delta {
                text,
                logprobs: std::mem::take(logprobs),
            });
        }
        return;
    };
    let mut outs = tp.push(&text);
    if at_end {
        outs.extend(tp.finish());
    }
    for o in outs {
        match o {
            ToolOut::Text(text) => send(Event::Delta {
                text,
                logprobs: std::mem::take(logprobs),
            }),
            ToolOut::Start { index, name } => send(Event::ToolCallStart { index, name }),
            ToolOut::Args { index, delta } => send(Event::ToolCallArgs { index, delta }),
        }
    }
}

/// Sends tool-call events a reasoning format produced itself (harmony).
fn send_calls(events: &UnboundedSender<Event>, calls: Vec<ToolOut>) {
    for c in calls {
        let ev = match c {
            ToolOut::Start { index, name } => Event::ToolCallStart { index, name },
            ToolOut::Args { index, delta } => Event::ToolCallArgs { index, delta },
            ToolOut::Text(text) => Event::Delta {
                text,
                logprobs: Vec::new(),
            },
        };
        let _ = events.send(ev);
    }
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

/// Counts a finished generation in the engine's statistics.
pub(crate) fn record(stats: &crate::request::EngineStats, c: &Completion) {
    // Plain counters, read on their own: no ordering between them is needed.
    let add = |counter: &std::sync::atomic::AtomicU64, n: usize| {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    };
    let u = c.usage;
    add(&stats.cached_tokens, u.cached_tokens);
    add(&stats.cached_disk_tokens, u.cached_disk_tokens);
    add(&stats.prompt_tokens, u.prompt_tokens);
    add(&stats.completion_tokens, u.completion_tokens);
    add(&stats.draft_tokens, c.timings.draft_tokens);
    add(&stats.draft_accepted, c.timings.draft_accepted);
    match c.finish {
        FinishReason::Cancelled => {
            tracing::info!(
                completion_tokens = u.completion_tokens,
                "generation cancelled by the caller"
            );
            stats
                .last_cancelled_tokens
                .store(u.completion_tokens as u64, Ordering::Relaxed);
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        FinishReason::Error(ref e) => {
            tracing::warn!(error = %e, "generation failed");
            stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            stats.completed.fetch_add(1, Ordering::Relaxed);
        }
    }
    tracing::debug!(
        finish = c.finish.as_str(),
        prompt = u.prompt_tokens,
        completion = u.completion_tokens,
        "generation done"
    );
}

#[cfg(test)]
mod timing_tests {
    use std::time::Duration;

    #[test]
    fn timings_read_as_figures_not_float_noise() {
        // As a ledger stores them and a client reads them (JSON text).
        let text = |v: f64| serde_json::json!(v).to_string();
        assert_eq!(
            text(super::ms(Duration::from_nanos(123_456_789))),
            "123.457"
        );
        assert_eq!(
            text(super::ms(Duration::from_nanos(2_000_000_400))),
            "2000.0"
        );
        assert_eq!(text(super::rate(10, 3.0)), "3.33");
        assert_eq!(text(super::rate(7, 0.1)), "70.0");
    }
}
