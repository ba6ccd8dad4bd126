//! Speculative decoding's drafts: tokens guessed cheaply, fed after the
//! token just sampled so one forward pass both runs that token and checks
//! the guesses. The sequence then samples each position from the model's own
//! logits as plain decoding would and keeps a draft only where the sampled
//! token equals it, so the output is the one plain decoding gives.
//!
//! Drafts come from the text itself (prompt lookup): the longest recent
//! n-gram ending the context that occurred before, and what followed it
//! then. Agents rewriting files and chats quoting are mostly such repeats.
//! Or, when the engine has one, from a draft model ([`crate::draft_model`]),
//! whose greedy drafts are checked by the same rule.
//! A draft is deterministic (one token per position, probability 1), so the
//! standard rejection rule, accept `d` with probability `min(1, p(d)/q(d))`
//! and otherwise sample from `max(0, p - q)` renormalised, becomes: accept
//! with probability `p(d)`, otherwise sample from `p` without `d`. Sampling
//! `t ~ p` and keeping the draft iff `t == d` is exactly that rule, and draws
//! the same random numbers as plain decoding: a seeded reply is the same
//! with drafting on or off.

use std::time::{Duration, Instant};

use crate::draft_model::{DraftModel, Mode, ModelDraft};

/// Where drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DraftKind {
    /// No drafting: one token a step.
    Off,
    /// From the prompt and the reply so far (n-gram lookup).
    #[default]
    PromptLookup,
}

impl std::str::FromStr for DraftKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "off" | "none" => Ok(DraftKind::Off),
            "prompt-lookup" | "lookup" | "ngram" => Ok(DraftKind::PromptLookup),
            other => Err(format!(
                "unknown draft source {other:?} (choose prompt-lookup or off)"
            )),
        }
    }
}

impl std::fmt::Display for DraftKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DraftKind::Off => "off",
            DraftKind::PromptLookup => "prompt-lookup",
        })
    }
}

/// Drafting settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftOptions {
    /// Draft from the prompt and reply so far (n-gram lookup).
    pub prompt_lookup: bool,
    /// Most draft tokens checked in one step.
    pub max_tokens: usize,
    /// Draft with the draft model only while its steps emit tokens faster
    /// than plain steps (measured); off: whenever prompt lookup has none.
    pub measured: bool,
}

impl Default for DraftOptions {
    fn default() -> Self {
        DraftOptions {
            prompt_lookup: true,
            max_tokens: MAX_LENGTH,
            measured: true,
        }
    }
}

impl DraftOptions {
    /// From the settings: where drafts come from and their longest length.
    pub fn new(kind: DraftKind, max_tokens: usize) -> Self {
        DraftOptions {
            prompt_lookup: kind == DraftKind::PromptLookup,
            max_tokens: max_tokens.min(MAX_LENGTH),
            measured: true,
        }
    }

    /// Drafting off.
    pub fn off() -> Self {
        DraftOptions {
            prompt_lookup: false,
            max_tokens: 0,
            measured: true,
        }
    }

    pub fn enabled(&self) -> bool {
        self.prompt_lookup && self.max_tokens > 0
    }
}

/// The longest draft: a step then has under 64 rows a sequence, below
/// which ggml's CPU attention keeps one kernel (batch-invariant mode relies
/// on it), and a miss costs at most this many rows.
pub const MAX_LENGTH: usize = 32;
/// Longest n-gram tried first, then shorter ones down to [`MIN_NGRAM`].
const MAX_NGRAM: usize = 12;
/// A single repeated token predicts too little to be worth a check.
const MIN_NGRAM: usize = 2;
/// The draft length a sequence starts with.
const FIRST_LENGTH: usize = 4;
/// Steps without drafts after a draft of which nothing was kept, at most.
const MAX_PAUSE: usize = 64;

/// One sequence's drafter: where to look, how long a draft to try, and when
/// to stop trying for a while. A draft nobody keeps costs a wider step, so
/// the length follows what was kept and a miss pauses drafting for a number
/// of steps that doubles with each miss in a row: open chat, where repeats
/// are rare, decodes almost as if drafting were off.
pub struct Drafter {
    opts: DraftOptions,
    length: usize,
    misses: u32,
    pause: usize,
    /// Its cache in the engine's draft model, once it has drafted there.
    model: Option<ModelDraft>,
    /// The draft model failed for this sequence (out of KV room, say):
    /// the reply goes on without drafts.
    model_failed: bool,
    /// When the last step was planned, how, and the tokens it emitted; the
    /// draft model's prefill in it, not counted as the step's time.
    last: Option<(Instant, Mode)>,
    emitted: usize,
    prefill: Duration,
}

impl Drafter {
    pub fn new(opts: DraftOptions) -> Option<Drafter> {
        opts.enabled().then(|| Drafter {
            opts: DraftOptions {
                max_tokens: opts.max_tokens.min(MAX_LENGTH),
                ..opts
            },
            length: FIRST_LENGTH.min(opts.max_tokens),
            misses: 0,
            pause: 0,
            model: None,
            model_failed: false,
            last: None,
            emitted: 1,
            prefill: Duration::ZERO,
        })
    }

    /// A draft to check after `context` (whose last token is the one about
    /// to run), at most `room` tokens long: by prompt lookup, else from
    /// `model` when the engine has a draft model and its steps pay.
    pub fn propose(
        &mut self,
        context: &[u32],
        room: usize,
        mut model: Option<&mut DraftModel>,
    ) -> Vec<u32> {
        let now = Instant::now();
        // The step just checked, timed from its plan to this one's.
        if let (Some((at, mode)), Some(dm)) = (self.last.take(), model.as_deref_mut()) {
            dm.pace
                .record(mode, (now - at).saturating_sub(self.prefill), self.emitted);
        }
        self.emitted = 1;
        self.prefill = Duration::ZERO;
        let (draft, mode) = self.plan(context, room, model);
        self.last = Some((now, mode));
        draft
    }

    fn plan(
        &mut self,
        context: &[u32],
        room: usize,
        model: Option<&mut DraftModel>,
    ) -> (Vec<u32>, Mode) {
        if self.pause > 0 {
            self.pause -= 1;
        } else {
            let d = lookup(context, self.length.min(room));
            if !d.is_empty() {
                return (d.to_vec(), Mode::Lookup);
            }
        }
        let Some(dm) = model else {
            return (Vec::new(), Mode::Plain);
        };
        let want = room.min(self.opts.max_tokens);
        let pays = !self.opts.measured
            || match self.model {
                Some(_) => dm.pace.model_pays(),
                None => dm
                    .pace
                    .worth_starting(context.len() - dm.prefixes.held_prefix(context), room),
            };
        if self.model_failed || want == 0 || !pays {
            return (Vec::new(), Mode::Plain);
        }
        (self.draft_by_model(context, want, dm), Mode::Model)
    }

    fn draft_by_model(&mut self, context: &[u32], want: usize, dm: &mut DraftModel) -> Vec<u32> {
        let drafted = match self.model.take() {
            Some(state) => Ok(state),
            None => ModelDraft::start(dm, context),
        }
        .and_then(|mut state| {
            let (d, prefill) = state.propose(dm, context, want)?;
            let (took, tokens) = prefill;
            if tokens >= 16 {
                dm.pace.record_prefill(took, tokens);
            }
            if tokens > 1 + want.max(MAX_LENGTH) {
                self.prefill = took;
            }
            self.model = Some(state);
            Ok(d)
        });
        drafted.unwrap_or_else(|e| {
            // Its cache may hold a half-run step: dropped with the state.
            tracing::debug!(error = %e, "the draft model failed; this reply goes on without drafts");
            self.model_failed = true;
            Vec::new()
        })
    }

    /// Hands this sequence's draft-model cache back for later turns.
    pub fn finish(&mut self, model: Option<&mut DraftModel>) {
        if let (Some(state), Some(dm)) = (self.model.take(), model) {
            state.finish(dm);
        }
    }

    /// What the model kept of a draft of `proposed` tokens.
    pub fn kept(&mut self, proposed: usize, kept: usize) {
        self.emitted = kept + 1;
        // Only prompt lookup's misses pause it and shorten its drafts; the
        // draft model stops at its own uncertainty.
        if proposed == 0 || !matches!(self.last, Some((_, Mode::Lookup))) {
            return;
        }
        if kept == 0 {
            self.misses = self.misses.saturating_add(1);
            self.pause = (1usize << self.misses.min(6)).min(MAX_PAUSE);
            self.length = (self.length / 2).max(1);
        } else {
            self.misses = 0;
            // A draft cut short is usually a copy that resumes after a
            // changed word: the length stays.
            if kept == proposed {
                self.length = (self.length * 2).min(self.opts.max_tokens);
            }
        }
    }
}

/// The tokens that followed the most recent earlier occurrence of the
/// longest n-gram (MAX_NGRAM down to MIN_NGRAM tokens) that ends `context`,
/// at most `want` of them.
pub fn lookup(context: &[u32], want: usize) -> &[u32] {
    let len = context.len();
    for n in (MIN_NGRAM..=MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let key = &context[len - n..];
        // Starts before the key's own; newest first.
        for start in (0..len - n).rev() {
            if context[start] == key[0] && context[start..start + n] == *key {
                let from = start + n;
                let to = (from + want).min(len);
                if from < to {
                    return &context[from..to];
                }
            }
        }
    }
    &[]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_earlier_occurrence_of_the_longest_ngram() {
        // "1 2 3" occurred twice before; the newest one was followed by 9 8.
        let ctx = [1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 8, 7, 1, 2, 3];
        assert_eq!(lookup(&ctx, 2), &[9, 8]);
        assert_eq!(lookup(&ctx, 10), &[9, 8, 7, 1, 2, 3]);
        // Only a 2-gram repeats.
        assert_eq!(lookup(&[5, 6, 7, 0, 6, 7], 3), &[0, 6, 7]);
        // Nothing repeats, or a lone token does.
        assert!(lookup(&[1, 2, 3, 4], 4).is_empty());
        assert!(lookup(&[1, 2, 1], 4).is_empty());
        assert!(lookup(&[], 4).is_empty());
    }

    /// A prompt-lookup draft is one token with probability 1 under the
    /// draft "model", so the standard rejection rule keeps it with
    /// probability p(d) and otherwise draws from p with d removed. Drafts
    /// are checked by sampling the position as plain decoding would and
    /// keeping the draft when the draw equals it; this checks that the two
    /// rules agree, on the sampler's own filtered, tempered distribution.
    #[test]
    fn keeping_a_draft_when_the_draw_equals_it_is_the_rejection_rule() {
        use crate::sampler::{Sampler, SamplingParams};
        let logits = [1.0f32, 2.0, 0.5, 1.5, -3.0];
        let temperature = 0.8f32;
        let draft = 3u32;
        // The target distribution: softmax of logits / T over the top 4.
        let kept: Vec<f64> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                if i == 4 {
                    0.0
                } else {
                    f64::from(l / temperature).exp()
                }
            })
            .collect();
        let z: f64 = kept.iter().sum();
        let p: Vec<f64> = kept.iter().map(|w| w / z).collect();
        let n = 20_000usize;
        let (mut accepted, mut rejected) = (0usize, vec![0usize; logits.len()]);
        for seed in 0..n as u64 {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                top_k: 4,
                seed: Some(seed),
                ..SamplingParams::default()
            });
            let t = s.sample(&logits, &[], &[]).token;
            if t == draft {
                accepted += 1;
            } else {
                rejected[t as usize] += 1;
            }
        }
        // Kept with probability p(d), within five standard deviations.
        let pd = p[draft as usize];
        let sd = (pd * (1.0 - pd) / n as f64).sqrt();
        let rate = accepted as f64 / n as f64;
        assert!((rate - pd).abs() < 5.0 * sd, "kept {rate}, p(d) {pd}");
        // On rejection, the residual: p without d, renormalised.
        let misses = (n - accepted) as f64;
        for (i, &count) in rejected.iter().enumerate() {
            let want = if i == draft as usize {
                0.0
            } else {
                p[i] / (1.0 - pd)
            };
            let got = count as f64 / misses;
            let sd = (want * (1.0 - want) / misses).sqrt();
            assert!(
                (got - want).abs() <= 5.0 * sd,
                "token {i}: {got} against {want}"
            );
        }
    }

    #[test]
    fn misses_pause_drafting_longer_each_time_and_hits_lengthen_drafts() {
        let mut d = Drafter::new(DraftOptions {
            max_tokens: 8,
            ..DraftOptions::default()
        })
        .expect("on");
        let ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        assert_eq!(d.propose(&ctx, 100, None), vec![3, 4, 5, 6]);
        d.kept(4, 4);
        assert_eq!(d.propose(&ctx, 100, None).len(), 8);
        d.kept(8, 0);
        // Paused two steps, then drafts again, shorter.
        assert!(d.propose(&ctx, 100, None).is_empty());
        assert!(d.propose(&ctx, 100, None).is_empty());
        assert_eq!(d.propose(&ctx, 100, None).len(), 4);
        d.kept(4, 0);
        let paused = (0..10)
            .take_while(|_| d.propose(&ctx, 100, None).is_empty())
            .count();
        assert_eq!(paused, 4);
        // Two misses halved the length to 2; a draft cut short keeps it.
        d.kept(2, 1);
        assert_eq!(d.propose(&ctx, 100, None).len(), 2);
        // Room caps a draft.
        assert_eq!(d.propose(&ctx, 1, None).len(), 1);
        assert!(Drafter::new(DraftOptions::off()).is_none());
    }
}
