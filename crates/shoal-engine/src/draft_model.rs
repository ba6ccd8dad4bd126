//! Drafts from a smaller model that shares the target's vocabulary: it runs
//! the same context as the target and proposes its own greedy continuation
//! while it is confident of it. The target checks these drafts exactly as it
//! checks prompt-lookup drafts (see [`crate::draft`]): a greedy draft is one
//! token with probability 1 under the drafter, so keeping it when the
//! target's own draw equals it is the standard rejection rule, and the
//! reply is the one plain decoding gives.
//!
//! A sequence keeps its own cache in the draft model, as in the target, so
//! each step feeds only what the target accepted since the last one; a
//! finished reply's draft cache goes to a prefix cache of the draft model's
//! own, so the next turn of a conversation does not prefill it again.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::{KvCache, LanguageModel, ModelInfo};
use crate::error::{EngineError, Result};
use crate::loader::{self, LoadOptions, Vocabulary};
use crate::prefix_cache::{common_prefix, PrefixCache};

/// A draft token needs at least this probability under the draft model;
/// drafting stops at the first token below it (llama.cpp's `p_min` rule):
/// a draft past an uncertain token is seldom kept, and each costs a step of
/// the draft model.
pub const MIN_CONFIDENCE: f32 = 0.75;

/// The draft model loaded beside a target on its engine thread.
pub struct DraftModel {
    pub(crate) model: Box<dyn LanguageModel>,
    /// Draft caches of finished replies, for the next turn to reuse.
    pub(crate) prefixes: PrefixCache,
    /// How fast steps drafted by it emit tokens, against plain steps.
    pub(crate) pace: Pace,
    /// The pace's figures as calibrated, kept apart: the pace moves on with
    /// every step.
    timed_at_load: Option<DraftTiming>,
}

/// How a sequence's step was planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No draft.
    Plain,
    /// Drafted by prompt lookup.
    Lookup,
    /// Drafted by the draft model.
    Model,
}

/// A draft model pays only where its steps emit tokens faster than plain
/// ones: on a CPU a draft model of three quarters the target's size, kept
/// 99 times in 100, still made Qwen-Coder's replies slower (0.7x), since
/// its own steps cost nearly the target's and a checking step of many rows
/// costs several one-row steps. So the time per emitted token of each kind
/// of step is measured (a moving average over every sequence's steps, timed
/// from one plan to the next), and the draft model drafts only while its
/// steps are the faster; one step in [`Pace::PROBE`] tries the other kind so
/// a change (a reply that turns predictable) is seen. A draft model's
/// prefill of a prompt is not a step: it is left out of the times, and a
/// sequence starts the draft model (paying that prefill) only while the
/// model's steps are the faster, never to probe.
///
/// Before the first reply, [`calibrate`] gives each figure a first value,
/// and `best` bounds what the model's steps could ever reach: with no
/// measured step yet, the model is tried only where that bound beats a
/// plain step. Otherwise a warm-up reply's couple of steps decide, and once
/// started the draft model on a 600-token prompt for Qwen-Coder's Q8_0 copy:
/// 3 s of its prefill, for steps that could not pay.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    plain: Option<f64>,
    model: Option<f64>,
    /// Seconds per token of the draft model's prefill.
    prefill: Option<f64>,
    /// The least time per emitted token a draft-model step could take (every
    /// draft kept), measured at load; `None` when not calibrated.
    best: Option<f64>,
    decisions: u64,
}

impl Pace {
    const PROBE: u64 = 32;
    const HORIZON: usize = 256;
    const WEIGHT: f64 = 0.1;

    /// A draft model's prefill of `tokens` tokens that took `took`.
    pub fn record_prefill(&mut self, took: Duration, tokens: usize) {
        let per_token = took.as_secs_f64() / tokens.max(1) as f64;
        self.prefill = Some(match self.prefill {
            Some(avg) => avg + Self::WEIGHT * (per_token - avg),
            None => per_token,
        });
    }

    pub fn record(&mut self, mode: Mode, took: Duration, emitted: usize) {
        let per_token = took.as_secs_f64() / emitted.max(1) as f64;
        let slot = match mode {
            Mode::Plain => &mut self.plain,
            Mode::Model => &mut self.model,
            Mode::Lookup => return,
        };
        *slot = Some(match *slot {
            Some(avg) => avg + Self::WEIGHT * (per_token - avg),
            None => per_token,
        });
    }

    /// Whether the next step without a lookup draft should use the model.
    pub fn model_pays(&mut self) -> bool {
        self.decisions += 1;
        let probe = self.decisions.is_multiple_of(Self::PROBE);
        match (self.plain, self.model) {
            // Measure each kind once first, the model only if it could pay.
            (None, _) => false,
            (Some(plain), None) => self.could_pay(plain),
            (Some(plain), Some(model)) => (model < plain) != probe,
        }
    }

    /// The calibrated figures, while they are still the first ones (for
    /// the log and [`DraftInfo`]).
    fn timing(&self) -> Option<DraftTiming> {
        match (self.plain, self.best) {
            (Some(plain), Some(best)) => Some(DraftTiming {
                plain_ms_per_token: plain * 1e3,
                best_drafted_ms_per_token: best * 1e3,
            }),
            _ => None,
        }
    }

    /// Whether the model's best case beats `plain` (true when not calibrated).
    fn could_pay(&self, plain: f64) -> bool {
        self.best.is_none_or(|best| best < plain)
    }

    /// Whether a sequence without a draft cache should start one, paying a
    /// prefill of `catch_up` tokens, with up to `left` tokens to go: while
    /// the model is unmeasured, or when what its faster steps would save
    /// over the rest of the reply (counted as at most [`Pace::HORIZON`]
    /// tokens, a long reply's length being a guess) beats that prefill.
    pub fn worth_starting(&self, catch_up: usize, left: usize) -> bool {
        match (self.plain, self.model.or(self.best)) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(plain), Some(model)) => {
                let saved = (plain - model) * left.min(Self::HORIZON) as f64;
                saved > self.prefill.unwrap_or(0.0) * catch_up as f64
            }
        }
    }
}

/// Draft lengths [`calibrate`] times a checking step for.
const CALIBRATION_DRAFTS: [usize; 3] = [3, 7, 15];

/// [`Pace`]'s first figures, timed on the two models before any request: a
/// plain step (one row of the target), the draft model's step and prefill
/// per token, and a checking step of `k + 1` rows for each `k` in
/// [`CALIBRATION_DRAFTS`]. The best case of a draft-model step is `k`
/// draft steps and one checking step for `k + 1` emitted tokens, at the
/// best `k`. Each time is the least of two tries: a shared host only ever
/// adds time. About 30 steps in all (well under a second for a 0.5B model).
pub(crate) fn calibrate(target: &dyn LanguageModel, draft: &dyn LanguageModel) -> Result<Pace> {
    let vocab = target.info().vocab_size.min(draft.info().vocab_size).max(1);
    // Ids spread over the vocabulary, as llama-bench times with.
    let tokens: Vec<u32> = (0..64u32)
        .map(|i| (i.wrapping_mul(7919).wrapping_add(13)) % vocab as u32)
        .collect();
    let least = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let t = Instant::now();
            f()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };

    let mut cache = draft.new_cache()?;
    let prefill = least(&mut || {
        cache.truncate(0);
        draft.forward(&tokens, cache.as_mut()).map(drop)
    })? / tokens.len() as f64;
    let step = least(&mut || draft.forward(&tokens[..1], cache.as_mut()).map(drop))?;
    drop(cache);

    let mut batch = target.new_batch()?;
    let mut cache = target.new_cache()?;
    target.forward(&tokens[..16], cache.as_mut())?;
    batch.join(cache)?;
    let mut check = |rows: usize| -> Result<f64> {
        least(&mut || {
            let spans = [tokens[16..16 + rows].to_vec()];
            target.forward_spans(&spans, batch.as_mut())?;
            batch.drop_last(0, rows)
        })
    };
    let plain = check(1)?;
    let best = CALIBRATION_DRAFTS
        .iter()
        .map(|&k| Ok((k as f64 * step + check(k + 1)?) / (k + 1) as f64))
        .collect::<Result<Vec<f64>>>()?
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    batch.leave(0)?;
    Ok(Pace {
        plain: Some(plain),
        model: None,
        prefill: Some(prefill),
        best: Some(best),
        decisions: 0,
    })
}

/// What callers may know about a target's draft model.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DraftInfo {
    pub path: PathBuf,
    #[serde(flatten)]
    pub info: ModelInfo,
    /// The load-time timing that decides whether the model is tried at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timed_at_load: Option<DraftTiming>,
}

/// Milliseconds per emitted token of a plain step and of a draft-model step
/// at best (every draft kept), timed at load: the model is tried only where
/// the second is the smaller.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct DraftTiming {
    pub plain_ms_per_token: f64,
    pub best_drafted_ms_per_token: f64,
}

impl DraftModel {
    pub fn new(model: Box<dyn LanguageModel>, prefix_bytes: usize) -> DraftModel {
        DraftModel {
            model,
            prefixes: PrefixCache::new(prefix_bytes),
            pace: Pace::default(),
            timed_at_load: None,
        }
    }

    /// Gives the pace its first figures (see [`calibrate`]); on failure it
    /// keeps learning from the first replies alone.
    pub fn calibrate(&mut self, target: &dyn LanguageModel) {
        match calibrate(target, self.model.as_ref()) {
            Ok(pace) => {
                self.timed_at_load = pace.timing();
                tracing::info!(timing = ?self.timed_at_load, "draft model timed at load");
                self.pace = pace;
            }
            Err(e) => tracing::warn!(error = %e, "could not time the draft model"),
        }
    }

    pub fn info(&self, path: &Path) -> DraftInfo {
        DraftInfo {
            path: path.to_path_buf(),
            info: self.model.info().clone(),
            timed_at_load: self.timed_at_load,
        }
    }
}

/// Why `draft` cannot draft for `target`, if it cannot: the two must give
/// every token id the same text, or a kept draft would mean another word.
/// `nt` and `nd` are the two models' vocabulary sizes.
pub fn vocabulary_mismatch(
    target: &Vocabulary,
    nt: usize,
    draft: &Vocabulary,
    nd: usize,
) -> Option<String> {
    if nt != nd {
        return Some(format!("{nt} tokens against the draft model's {nd}"));
    }
    (0..nt as u32)
        .find(|&id| target.token_bytes(id) != draft.token_bytes(id))
        .map(|id| {
            format!(
                "token {id} is {:?} here and {:?} in the draft model",
                String::from_utf8_lossy(&target.token_bytes(id)),
                String::from_utf8_lossy(&draft.token_bytes(id))
            )
        })
}

/// One sequence's state in the draft model: its cache and the tokens in it.
pub(crate) struct ModelDraft {
    cache: Box<dyn KvCache>,
    held: Vec<u32>,
}

impl ModelDraft {
    /// A sequence's draft cache, from the draft model's prefix cache when an
    /// earlier reply shares the context's start.
    pub fn start(dm: &mut DraftModel, context: &[u32]) -> Result<ModelDraft> {
        Ok(match dm.prefixes.lookup(context, 0) {
            Some(hit) => ModelDraft {
                held: context[..hit.tokens].to_vec(),
                cache: hit.cache,
            },
            None => ModelDraft {
                cache: dm.model.new_cache()?,
                held: Vec::new(),
            },
        })
    }

    /// At most `want` tokens to follow `context`: the draft model catches up
    /// on what the target accepted since the last draft (positions it holds
    /// past that are dropped), then extends greedily while confident. Also
    /// returns the catch-up's time and tokens: beyond a step's few tokens
    /// (a prompt's prefill, or the tokens of steps it sat out) it is a
    /// prefill, not a step's cost.
    pub fn propose(
        &mut self,
        dm: &DraftModel,
        context: &[u32],
        want: usize,
    ) -> Result<(Vec<u32>, (Duration, usize))> {
        if context.is_empty() || want == 0 {
            return Ok((Vec::new(), (Duration::ZERO, 0)));
        }
        // At least the last token runs: its logits give the first draft.
        let keep = common_prefix(&self.held, context).min(context.len() - 1);
        self.cache.truncate(keep);
        self.held.truncate(keep);
        let started = Instant::now();
        let mut logits = dm.model.forward(&context[keep..], self.cache.as_mut())?;
        let catch_up = (started.elapsed(), context.len() - keep);
        self.held.extend_from_slice(&context[keep..]);
        let mut out = Vec::with_capacity(want);
        while let Some((token, p)) = most_likely(&logits) {
            if p < MIN_CONFIDENCE {
                break;
            }
            out.push(token);
            if out.len() == want {
                break;
            }
            logits = dm.model.forward(&[token], self.cache.as_mut())?;
            self.held.push(token);
        }
        Ok((out, catch_up))
    }

    /// Hands the cache to the draft model's prefix cache.
    pub fn finish(self, dm: &mut DraftModel) {
        dm.prefixes.insert(&self.held, self.cache, 0);
    }
}

/// The most likely token and its probability under softmax.
fn most_likely(logits: &[f32]) -> Option<(u32, f32)> {
    let (best, &max) = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))?;
    if !max.is_finite() {
        return None;
    }
    let z: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    Some((best as u32, 1.0 / z))
}

/// Loads `path` to draft for `target`, or `None` (with a warning) when the
/// two vocabularies differ and the draft model is not `required`: a pool's
/// other models ignore a draft model named for one family.
pub(crate) fn load_draft(
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
    tracing::info!(draft = %path.display(), weight_mb = d.model.info().weight_bytes >> 20, "draft model loaded");
    Ok(Some(d.model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_model_drafts_only_while_its_steps_are_the_faster() {
        let ms = Duration::from_millis;
        let mut pace = Pace::default();
        // Plain steps are measured first, then the model's.
        assert!(!pace.model_pays());
        pace.record(Mode::Plain, ms(20), 1);
        assert!(pace.model_pays());
        // 4 tokens in 100 ms: 25 ms a token, slower than plain.
        pace.record(Mode::Model, ms(100), 4);
        pace.record(Mode::Lookup, ms(1), 30);
        let used = (0..64).filter(|_| pace.model_pays()).count();
        assert_eq!(used, 2, "only the probes use the model");
        // A sequence not drafting yet does not start the model to probe.
        assert!(!pace.worth_starting(0, 100));
        // Faster steps bring it back: 8 tokens in 60 ms, many times.
        for _ in 0..40 {
            pace.record(Mode::Model, ms(60), 8);
        }
        let used = (0..64).filter(|_| pace.model_pays()).count();
        assert_eq!(used, 62, "all but the probes use the model");
        assert!(pace.worth_starting(0, 100));
        // Unless its prefill costs more than its steps would save: about
        // 12.5 ms a token saved over 100 tokens, against 2 ms a token of
        // prefill over 1000 prompt tokens.
        pace.record_prefill(Duration::from_millis(200), 100);
        assert!(pace.worth_starting(100, 100));
        assert!(!pace.worth_starting(1000, 100));
        // The rest of a long reply counts as 256 tokens at most.
        assert!(!pace.worth_starting(2000, 100_000));
    }

    #[test]
    fn a_calibrated_draft_model_is_tried_only_where_its_best_case_beats_a_plain_step() {
        let calibrated = |best_ms: f64| Pace {
            plain: Some(0.030),
            prefill: Some(0.005),
            best: Some(best_ms / 1e3),
            ..Pace::default()
        };
        // Best case 33 ms a token against 30 ms plain: never started, never
        // tried, whatever the first reply's own steps say.
        let mut slow = calibrated(33.0);
        assert!(!slow.worth_starting(600, 256));
        assert!(!slow.worth_starting(1, 256));
        assert!((0..64).all(|_| !slow.model_pays()));
        // Best case 10 ms: a sequence with a short catch-up starts it (20 ms
        // saved a token over 256 tokens beats 5 ms a token of prefill over
        // 600), a long prompt does not, and it is tried until measured.
        let mut fast = calibrated(10.0);
        assert!(fast.worth_starting(600, 256));
        assert!(!fast.worth_starting(2000, 256));
        assert!(fast.model_pays());
        // Then its measured steps decide: 40 ms a token, slower than plain.
        fast.record(Mode::Model, Duration::from_millis(80), 2);
        assert!(!fast.worth_starting(1, 256));
        assert_eq!((0..64).filter(|_| fast.model_pays()).count(), 2);
    }

    #[test]
    fn the_most_likely_token_comes_with_its_softmax_probability() {
        let (t, p) = most_likely(&[0.0, 2.0f32.ln(), 0.0]).expect("some");
        assert_eq!(t, 1);
        assert!((p - 0.5).abs() < 1e-6, "{p}");
        assert!(most_likely(&[]).is_none());
        assert!(most_likely(&[f32::NEG_INFINITY; 3]).is_none());
    }
}
