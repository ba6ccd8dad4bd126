//! One generation request as the engine takes it (already tokenized), the
//! flag that cancels it, and the counters the engine keeps over requests.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::constraint::Grammar;
use crate::reasoning::ReasoningSpec;
use crate::sampler::SamplingParams;
use crate::tools::ToolSyntax;

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
    /// Constrain the output to a grammar (structured output, forced tool calls).
    pub grammar: Option<Grammar>,
    /// Parse tool calls written in this syntax out of the reply.
    pub tools: Option<ToolSyntax>,
    /// Whose cached prefixes the request may reuse: only those kept under
    /// the same salt (0: everyone's). A server with API keys salts by key.
    pub cache_salt: u64,
    /// Prefixes the client asked to have cached (Anthropic's
    /// `cache_control`): kept ahead of unmarked entries for their TTL, and
    /// counted as written in the usage.
    pub cache_breakpoints: Vec<CacheBreakpoint>,
    /// Where each image sits in `prompt` (a vision model's; see
    /// [`crate::vision`]).
    pub images: Vec<crate::vision::ImageSpan>,
}

/// One prefix a client marked for caching: its first `tokens` prompt
/// tokens, to keep for at least `ttl_secs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheBreakpoint {
    pub tokens: usize,
    pub ttl_secs: u64,
}

/// What a request's breakpoints write, given the `cached` leading prompt
/// tokens it reused: every token after `cached` up to its last breakpoint,
/// each under the TTL of the first breakpoint at or after it. Returns
/// (written, of which under a TTL of an hour or more).
pub(crate) fn breakpoint_writes(points: &[CacheBreakpoint], cached: usize) -> (usize, usize) {
    let mut points: Vec<CacheBreakpoint> = points.to_vec();
    points.sort_by_key(|p| p.tokens);
    let (mut written, mut long) = (0, 0);
    let mut from = cached;
    for p in points {
        if p.tokens > from {
            let n = p.tokens - from;
            written += n;
            if p.ttl_secs >= 3600 {
                long += n;
            }
            from = p.tokens;
        }
    }
    (written, long)
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
            grammar: None,
            tools: None,
            cache_salt: 0,
            cache_breakpoints: Vec::new(),
            images: Vec::new(),
        }
    }

    /// Prompt tokens its images take (KV cells, part of the prompt's tokens).
    pub fn image_tokens(&self) -> usize {
        self.images.iter().map(|s| s.len()).sum()
    }

    /// Prompt tokens that take no position of their own: an M-RoPE image
    /// lays its tokens out in 2-D over fewer positions than tokens. The
    /// prompt's positions are its tokens less these.
    pub fn positions_saved(&self) -> usize {
        crate::vision::positions_saved(&self.images)
    }

    /// How long the prefix this request leaves stays ahead of unmarked ones:
    /// its cache breakpoints' longest TTL.
    pub fn keep_secs(&self) -> Option<u64> {
        self.cache_breakpoints.iter().map(|b| b.ttl_secs).max()
    }
}

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
    /// The part of them read back from the disk tier.
    pub cached_disk_tokens: AtomicU64,
    /// Requests that found a prefix in RAM, and those that found none there.
    pub ram_hits: AtomicU64,
    pub ram_misses: AtomicU64,
    /// Prefix-cache entries dropped from RAM for room.
    pub ram_evictions: AtomicU64,
    /// Set to drop the prefix cache's RAM entries before the next request
    /// is admitted (`DELETE /v1/cache`).
    pub clear_prefixes: std::sync::atomic::AtomicBool,
    /// Bytes the prefix cache holds now.
    pub prefix_cache_bytes: AtomicU64,
    /// Requests waiting in the queue now.
    pub queued: AtomicU64,
    /// Requests being prefilled or decoded now.
    pub running: AtomicU64,
    /// Most sequences ever decoded in one forward pass.
    pub peak_batch: AtomicU64,
    /// Batched decode passes run, and the sequence-steps they covered
    /// (their ratio is the mean batch size). An embedding model counts its
    /// passes and the inputs they held here.
    pub decode_passes: AtomicU64,
    pub decode_steps: AtomicU64,
    /// Time spent sampling and running batched decode passes (prefill not
    /// included): `decode_steps` over this is the aggregate decode speed.
    pub decode_micros: AtomicU64,
    /// An embedding model's rounds: each takes every request waiting.
    pub embedding_rounds: AtomicU64,
    /// Speculative decoding: draft tokens checked, and those confirmed.
    pub draft_tokens: AtomicU64,
    pub draft_accepted: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::{breakpoint_writes, CacheBreakpoint};

    fn at(tokens: usize, ttl_secs: u64) -> CacheBreakpoint {
        CacheBreakpoint { tokens, ttl_secs }
    }

    #[test]
    fn breakpoints_write_what_lies_past_the_cached_part_under_each_ttl() {
        // System (1h) to 100, user turn (5m) to 140, given in any order.
        let points = [at(140, 300), at(100, 3600)];
        assert_eq!(breakpoint_writes(&points, 0), (140, 100));
        // 60 cached: 40 more under the hour, 40 under five minutes.
        assert_eq!(breakpoint_writes(&points, 60), (80, 40));
        // Past the first breakpoint: only the 5m part is new.
        assert_eq!(breakpoint_writes(&points, 120), (20, 0));
        // Everything already cached, or no breakpoint: nothing written.
        assert_eq!(breakpoint_writes(&points, 140), (0, 0));
        assert_eq!(breakpoint_writes(&[], 0), (0, 0));
    }
}
