//! Next-token selection on the CPU from one position's logits.
//!
//! Filters follow the Hugging Face order (penalties, temperature, top-k, top-p, min-p) so a given
//! set of parameters behaves as users of other OpenAI-compatible servers expect.
use std::cmp::Ordering;
use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// OpenAI caps `top_logprobs` at 20; larger requests are almost always mistakes.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Per-request sampling settings. Every field has an "off" value, which is the default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 selects the most likely token (greedy).
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 disables it.
    pub min_p: f32,
    /// Fixes the random stream so a request can be reproduced.
    pub seed: Option<u64>,
    /// HF-style multiplicative penalty on tokens seen in the last `repetition_context` tokens of
    /// prompt + output; 1 disables it.
    pub repetition_penalty: f32,
    /// How many trailing context tokens `repetition_penalty` looks at (0 = none).
    pub repetition_context: usize,
    /// OpenAI-style additive penalty on any token already generated.
    pub presence_penalty: f32,
    /// OpenAI-style additive penalty proportional to how often a token was generated.
    pub frequency_penalty: f32,
    /// `Some(n)`: also report the `n` most likely tokens with their logprobs.
    pub top_logprobs: Option<usize>,
    /// OpenAI-style additive bias per token id, in [-100, 100]; -100 in effect bans a token.
    /// Logprobs stay those of the unmodified model.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            repetition_context: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            top_logprobs: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0) with everything else at defaults.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Rejects values that would make sampling meaningless, with messages fit for API clients.
    pub fn validate(&self) -> Result<()> {
        let invalid = |msg: String| Err(EngineError::InvalidRequest(msg));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return invalid(format!(
                "temperature must be a non-negative number, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid(format!(
                "top_p must be greater than 0 and at most 1, got {}",
                self.top_p
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid(format!("min_p must be between 0 and 1, got {}", self.min_p));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return invalid(format!(
                "repetition_penalty must be a positive number, got {}",
                self.repetition_penalty
            ));
        }
        for (name, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return invalid(format!("{name} must be between -2 and 2, got {value}"));
            }
        }
        if let Some((id, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return invalid(format!(
                "logit_bias for token {id} must be between -100 and 100, got {bias}"
            ));
        }
        if let Some(n) = self.top_logprobs {
            if n > MAX_TOP_LOGPROBS {
                return invalid(format!(
                    "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {n}"
                ));
            }
        }
        Ok(())
    }

    fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// The chosen token with its log-probability under the unmodified model distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Only when `top_logprobs` was requested: normalising over the whole
    /// vocabulary is most of a greedy step's sampling time.
    pub logprob: Option<f32>,
    /// The most likely tokens, best first, when `top_logprobs` was requested.
    pub top: Vec<(u32, f32)>,
}

/// Stateful sampler for one request; reuses its buffers across steps.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    work: Vec<f32>,
    order: Vec<u32>,
    seen: Vec<u32>,
    counts: HashMap<u32, u32>,
}

impl Sampler {
    /// Seeds from `params.seed`, or from the OS when there is none.
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::from_os_rng(),
        };
        Self {
            params,
            rng,
            work: Vec::new(),
            order: Vec::new(),
            seen: Vec::new(),
            counts: HashMap::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token. `context` is prompt + generated so far (for the repetition
    /// penalty), `generated` only the output (for presence/frequency penalties). Ids outside
    /// the vocabulary are ignored. An empty `logits` slice yields token 0 with logprob -inf.
    pub fn sample(&mut self, logits: &[f32], context: &[u32], generated: &[u32]) -> Sampled {
        if logits.is_empty() {
            return Sampled {
                token: 0,
                logprob: self.params.top_logprobs.map(|_| f32::NEG_INFINITY),
                top: Vec::new(),
            };
        }

        let token = match self.unpenalised_greedy(logits) {
            Some(token) => token,
            None => {
                self.work.clear();
                self.work.extend(logits.iter().map(|&x| clean(x)));
                self.apply_penalties(context, generated);
                if self.params.is_greedy() {
                    argmax(&self.work)
                } else {
                    self.draw()
                }
            }
        };
        let (logprob, top) = match self.params.top_logprobs {
            None => (None, Vec::new()),
            Some(n) => {
                let log_norm = log_sum_exp(logits);
                let top = if n > 0 {
                    top_n(logits, n, &mut self.order);
                    self.order
                        .iter()
                        .map(|&id| (id, raw_logprob(logits, id, log_norm)))
                        .collect()
                } else {
                    Vec::new()
                };
                (Some(raw_logprob(logits, token, log_norm)), top)
            }
        };
        Sampled {
            token,
            logprob,
            top,
        }
    }

    /// The greedy choice without copying the logits, where no penalty
    /// applies: a step then reads a large vocabulary (Gemma 3's 262k) once
    /// instead of writing and reading a biased copy of it. `None` where the
    /// full path is needed: sampling, a penalty, or a biased token that is
    /// the raw maximum. It picks what `argmax` over the biased copy would.
    fn unpenalised_greedy(&mut self, logits: &[f32]) -> Option<u32> {
        let p = &self.params;
        let penalised = (p.repetition_penalty != 1.0 && p.repetition_context > 0)
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0;
        if !p.is_greedy() || penalised {
            return None;
        }
        let raw = argmax(logits);
        if p.logit_bias.is_empty() {
            return Some(raw);
        }
        // Each biased id's value as the copy would hold it: the clean logit
        // plus its biases, added in the order given.
        let mut biased: Vec<(u32, f32)> = p
            .logit_bias
            .iter()
            .filter(|(id, _)| (*id as usize) < logits.len())
            .copied()
            .collect();
        biased.sort_by_key(|&(id, _)| id);
        let mut values: Vec<(u32, f32)> = Vec::with_capacity(biased.len());
        for (id, b) in biased {
            match values.last_mut() {
                Some((last, v)) if *last == id => *v += b,
                _ => values.push((id, clean(logits[id as usize]) + b)),
            }
        }
        if values.binary_search_by_key(&raw, |&(id, _)| id).is_ok() {
            return None;
        }
        // The best unbiased token, then every biased one: the highest
        // value wins, the lower id on a tie, as `argmax` decides.
        let mut best = (raw, clean(logits[raw as usize]));
        for (id, v) in values {
            if clean(v) > best.1 || (clean(v) == best.1 && id < best.0) {
                best = (id, clean(v));
            }
        }
        Some(best.0)
    }

    fn apply_penalties(&mut self, context: &[u32], generated: &[u32]) {
        let p = &self.params;
        let vocab = self.work.len();
        if p.repetition_penalty != 1.0 && p.repetition_context > 0 {
            let window = &context[context.len().saturating_sub(p.repetition_context)..];
            self.seen.clear();
            self.seen.extend_from_slice(window);
            self.seen.sort_unstable();
            self.seen.dedup();
            for &id in &self.seen {
                if let Some(l) = self.work.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            self.counts.clear();
            for &id in generated.iter().filter(|&&id| (id as usize) < vocab) {
                *self.counts.entry(id).or_insert(0) += 1;
            }
            for (&id, &count) in &self.counts {
                self.work[id as usize] -= p.presence_penalty + p.frequency_penalty * count as f32;
            }
        }
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = self.work.get_mut(id as usize) {
                *l += bias;
            }
        }
    }

    /// Samples from the penalised logits in `work` after temperature and truncation.
    fn draw(&mut self) -> u32 {
        let p = &self.params;
        let inv_temp = 1.0 / p.temperature;
        if !inv_temp.is_finite() {
            return argmax(&self.work);
        }
        for l in &mut self.work {
            *l *= inv_temp;
        }
        let max = self.work.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            // All -inf, or a logit overflowed to +inf: nothing sensible to sample from.
            return argmax(&self.work);
        }
        let r: f64 = self.rng.random();

        let truncated =
            (p.top_k > 0 && p.top_k < self.work.len()) || p.top_p < 1.0 || p.min_p > 0.0;
        if !truncated {
            let total: f64 = self.work.iter().map(|&l| weight(l, max)).sum();
            let target = r * total;
            let mut acc = 0.0;
            let mut last = 0;
            for (id, &l) in self.work.iter().enumerate() {
                let w = weight(l, max);
                if w > 0.0 {
                    acc += w;
                    last = id;
                    if acc > target {
                        return id as u32;
                    }
                }
            }
            return last as u32;
        }

        let kept = filter_candidates(&self.work, p.top_k, p.top_p, p.min_p, &mut self.order);
        let candidates = &self.order[..kept];
        let total: f64 = candidates
            .iter()
            .map(|&id| weight(self.work[id as usize], max))
            .sum();
        let target = r * total;
        let mut acc = 0.0;
        for &id in candidates {
            acc += weight(self.work[id as usize], max);
            if acc > target {
                return id;
            }
        }
        candidates
            .last()
            .copied()
            .unwrap_or_else(|| argmax(&self.work))
    }
}

/// NaN logits would poison every comparison; treat them as impossible tokens.
fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

fn weight(logit: f32, max: f32) -> f64 {
    f64::from(logit - max).exp()
}

/// Higher logit first, then lower id, so every selection is deterministic.
fn by_logit_desc(logits: &[f32]) -> impl Fn(&u32, &u32) -> Ordering + '_ {
    move |&a, &b| {
        clean(logits[b as usize])
            .total_cmp(&clean(logits[a as usize]))
            .then(a.cmp(&b))
    }
}

/// Index of the largest value; ties go to the lowest id, NaN counts as
/// -inf, and with nothing above -inf it is 0. Two passes that vectorise (the
/// maximum, then its first place) instead of one compare-and-branch per
/// entry: a greedy step over a 262k vocabulary takes a fraction of the time.
fn argmax(values: &[f32]) -> u32 {
    const LANES: usize = 16;
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            // A NaN compares false and is passed over.
            *l = if v > *l { v } else { *l };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::NEG_INFINITY {
        return 0;
    }
    let first_chunk = values
        .chunks(LANES)
        .position(|c| c.iter().fold(false, |hit, &v| hit | (v == max)))
        .unwrap_or(0);
    let start = first_chunk * LANES;
    values[start..]
        .iter()
        .position(|&v| v == max)
        .map_or(0, |i| start + i) as u32
}

fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits
        .iter()
        .map(|&x| clean(x))
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return f64::from(max);
    }
    let sum: f64 = logits.iter().map(|&x| weight(clean(x), max)).sum();
    f64::from(max) + sum.ln()
}

fn raw_logprob(logits: &[f32], id: u32, log_norm: f64) -> f32 {
    let lp = f64::from(clean(logits[id as usize])) - log_norm;
    if lp.is_nan() {
        f32::NEG_INFINITY
    } else {
        lp as f32
    }
}

/// Leaves the `n` most likely ids, best first, in `order` using partial selection.
fn top_n(logits: &[f32], n: usize, order: &mut Vec<u32>) {
    order.clear();
    order.extend(0..logits.len() as u32);
    let cmp = by_logit_desc(logits);
    if n < order.len() {
        order.select_nth_unstable_by(n - 1, &cmp);
        order.truncate(n);
    }
    order.sort_unstable_by(&cmp);
}

/// Puts the ids that survive top-k, then top-p (over the top-k set), then min-p at the front
/// of `order` and returns how many there are (at least one). Only as much of the vocabulary as
/// the nucleus needs is ever sorted.
fn filter_candidates(
    logits: &[f32],
    top_k: usize,
    top_p: f32,
    min_p: f32,
    order: &mut Vec<u32>,
) -> usize {
    order.clear();
    order.extend(0..logits.len() as u32);
    let cmp = by_logit_desc(logits);
    let mut n = order.len();
    if top_k > 0 && top_k < n {
        order.select_nth_unstable_by(top_k - 1, &cmp);
        n = top_k;
    }
    let max = order[..n]
        .iter()
        .map(|&id| logits[id as usize])
        .fold(f32::NEG_INFINITY, f32::max);

    if top_p < 1.0 {
        let total: f64 = order[..n]
            .iter()
            .map(|&id| weight(logits[id as usize], max))
            .sum();
        let target = f64::from(top_p) * total;
        // The nucleus is a prefix of the candidates in descending order. The
        // ones within `delta` of the best are such a prefix too (ties at the
        // edge included), so gather them, sort only them and walk; widen
        // `delta` only if they do not reach the target.
        let mut delta = 4.0f32;
        let cut = loop {
            let floor = if delta > 64.0 {
                f32::NEG_INFINITY
            } else {
                max - delta
            };
            let mut k = 0;
            for i in 0..n {
                if clean(logits[order[i] as usize]) >= floor {
                    order.swap(k, i);
                    k += 1;
                }
            }
            order[..k].sort_unstable_by(&cmp);
            let mut cumulative = 0.0;
            let mut cut = None;
            for (i, &id) in order[..k].iter().enumerate() {
                if cumulative >= target {
                    cut = Some(i);
                    break;
                }
                cumulative += weight(logits[id as usize], max);
            }
            match cut {
                Some(c) => break c,
                // The next one in order would be cut.
                None if cumulative >= target || k == n => break k,
                None => delta *= 2.0,
            }
        };
        n = cut.max(1);
    }

    if min_p > 0.0 {
        let threshold = max + min_p.ln();
        let mut kept = 0;
        for i in 0..n {
            let id = order[i];
            if logits[id as usize] >= threshold {
                order.swap(kept, i);
                kept += 1;
            }
        }
        n = kept.max(1);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            seed: Some(7),
            ..SamplingParams::default()
        };
        f(&mut p);
        p
    }

    /// Deterministic pseudo-random logits with distinct values.
    fn noisy_logits(len: usize, salt: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(salt);
        (0..len).map(|_| rng.random_range(-8.0f32..8.0)).collect()
    }

    fn draws(p: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p);
        (0..n).map(|_| s.sample(logits, &[], &[]).token).collect()
    }

    fn ln_probs(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    /// `len` values that make comparisons hard: whole numbers in -4..4
    /// (many ties), with NaN, -inf and +inf among them.
    fn rough_values(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
        (0..len)
            .map(|_| match rng.random_range(0..20) {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => f32::INFINITY,
                _ => rng.random_range(-4i32..4) as f32,
            })
            .collect()
    }

    #[test]
    fn greedy_without_a_copy_picks_what_the_biased_copy_would() {
        // Coarse values (many ties), NaN and ±inf entries, biases on random
        // ids (some repeated, some outside the vocabulary, some on the
        // maximum): the shortcut and the full path agree every time.
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut shortcuts = 0;
        for trial in 0..2000 {
            let len = rng.random_range(1..300usize);
            let logits = rough_values(&mut rng, len);
            let mut bias = Vec::new();
            for _ in 0..rng.random_range(0..6) {
                let id = match rng.random_range(0..4) {
                    0 => argmax(&logits),
                    1 => len as u32 + rng.random_range(0..3u32),
                    _ => rng.random_range(0..len as u32),
                };
                bias.push((id, rng.random_range(-3i32..4) as f32));
            }
            let p = SamplingParams {
                logit_bias: bias.clone(),
                ..SamplingParams::greedy()
            };
            let mut s = Sampler::new(p);
            let fast = s.unpenalised_greedy(&logits);
            let mut work: Vec<f32> = logits.iter().map(|&x| clean(x)).collect();
            for &(id, b) in &bias {
                if let Some(l) = work.get_mut(id as usize) {
                    *l += b;
                }
            }
            let want = argmax(&work);
            if let Some(got) = fast {
                shortcuts += 1;
                assert_eq!(got, want, "trial {trial}: {logits:?} {bias:?}");
            }
            assert_eq!(s.sample(&logits, &[], &[]).token, want, "trial {trial}");
        }
        // Most trials take the shortcut; the rest the full path.
        assert!((1000..2000).contains(&shortcuts), "{shortcuts} shortcuts");
    }

    #[test]
    fn argmax_matches_the_plain_loop() {
        // The first index of the largest clean value, 0 when none is above -inf.
        fn plain(values: &[f32]) -> u32 {
            let mut best = 0;
            for (i, &v) in values.iter().enumerate() {
                if clean(v) > clean(values[best]) {
                    best = i;
                }
            }
            best as u32
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for trial in 0..3000 {
            let len = rng.random_range(0..100usize);
            let values = rough_values(&mut rng, len);
            assert_eq!(argmax(&values), plain(&values), "trial {trial}: {values:?}");
        }
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY, f32::NAN]), 0);
    }

    #[test]
    fn greedy_picks_argmax_with_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[], &[]).token, 1);
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 2.0], &[], &[]).token, 1);
        assert_eq!(s.sample(&[f32::NAN, 0.5, 0.2], &[], &[]).token, 1);
    }

    #[test]
    fn near_zero_temperature_equals_greedy() {
        for salt in 0..20 {
            let mut logits = noisy_logits(5000, salt);
            let greedy = argmax(&logits);
            // A clear winner, so the expected behaviour does not hinge on float resolution.
            logits[greedy as usize] += 0.01;
            let cold = draws(params(|p| p.temperature = 1e-5), &logits, 20);
            assert_eq!(cold, [greedy; 20], "salt {salt}");
            let warm = draws(params(|p| p.temperature = 1.0), &logits, 20);
            assert_ne!(
                warm, [greedy; 20],
                "salt {salt}: temperature 1 should explore"
            );
        }
    }

    #[test]
    fn top_k_one_and_tiny_top_p_equal_greedy() {
        for salt in 0..20 {
            let logits = noisy_logits(49152, salt);
            let greedy = argmax(&logits);
            assert_eq!(draws(params(|p| p.top_k = 1), &logits, 3), [greedy; 3]);
            assert_eq!(draws(params(|p| p.top_p = 1e-6), &logits, 3), [greedy; 3]);
        }
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
        let picked = draws(params(|p| p.top_k = 2), &logits, 400);
        assert!(picked.iter().all(|&t| t < 2));
        assert!(picked.contains(&0) && picked.contains(&1));

        let picked = draws(params(|p| p.top_p = 0.75), &logits, 400);
        assert!(picked.iter().all(|&t| t < 2), "{picked:?}");
        assert!(picked.contains(&1));

        let picked = draws(params(|p| p.top_p = 0.85), &logits, 400);
        assert!(picked.iter().all(|&t| t < 3));
        assert!(picked.contains(&2));
    }

    #[test]
    fn min_p_filters_relative_to_best() {
        let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
        let picked = draws(params(|p| p.min_p = 0.35), &logits, 400);
        assert!(picked.iter().all(|&t| t < 2), "{picked:?}");
        assert!(picked.contains(&0) && picked.contains(&1));
        assert_eq!(draws(params(|p| p.min_p = 0.7), &logits, 50), [0; 50]);
    }

    #[test]
    fn filters_match_brute_force_on_large_vocab() {
        // Coarse logits (whole numbers) put thousands of ties at every edge,
        // the top-p window's included; a wide spread makes the window grow.
        for (salt, top_k, top_p, min_p, scale, coarse) in [
            (1, 0, 0.9, 0.0, 0.5, false),
            (2, 0, 0.5, 0.0, 0.5, false),
            (3, 100, 0.95, 0.0, 0.5, false),
            (4, 0, 1.0, 0.05, 0.5, false),
            (5, 3000, 0.99, 0.01, 0.5, false),
            (6, 0, 0.9, 0.0, 1.0, true),
            (7, 0, 0.999, 0.0, 0.5, true),
            (8, 0, 0.99, 0.0, 6.0, false),
        ] {
            let logits: Vec<f32> = noisy_logits(49152, salt)
                .iter()
                .map(|l| {
                    if coarse {
                        (l * scale).round()
                    } else {
                        l * scale
                    }
                })
                .collect();
            let mut order = Vec::new();
            let n = filter_candidates(&logits, top_k, top_p, min_p, &mut order);
            let mut got: Vec<u32> = order[..n].to_vec();
            got.sort_unstable();

            let mut sorted: Vec<u32> = (0..logits.len() as u32).collect();
            sorted.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
            if top_k > 0 {
                sorted.truncate(top_k);
            }
            let max = logits[sorted[0] as usize];
            let probs: Vec<f64> = sorted
                .iter()
                .map(|&i| weight(logits[i as usize], max))
                .collect();
            let total: f64 = probs.iter().sum();
            let mut cumulative = 0.0;
            let mut expected = Vec::new();
            for (&id, p) in sorted.iter().zip(&probs) {
                if cumulative >= f64::from(top_p) * total {
                    break;
                }
                cumulative += p;
                if logits[id as usize] >= max + min_p.ln() {
                    expected.push(id);
                }
            }
            expected.sort_unstable();
            assert!(!expected.is_empty());
            assert_eq!(got, expected, "salt {salt}");
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let logits = ln_probs(&[0.25, 0.75]);
        let picked = draws(params(|_| {}), &logits, 4000);
        let ones = picked.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.04, "frequency {ones}");

        let hot = draws(params(|p| p.temperature = 100.0), &logits, 4000);
        let ones = hot.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!(
            (ones - 0.5).abs() < 0.04,
            "high temperature flattens: {ones}"
        );
    }

    #[test]
    fn seeds_are_reproducible_and_distinct() {
        let logits = vec![0.0f32; 1000];
        let a = draws(params(|p| p.seed = Some(1)), &logits, 32);
        let b = draws(params(|p| p.seed = Some(1)), &logits, 32);
        let c = draws(params(|p| p.seed = Some(2)), &logits, 32);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let unique: std::collections::HashSet<_> = a.iter().collect();
        assert!(
            unique.len() > 20,
            "uniform draws should rarely repeat: {a:?}"
        );

        let filtered = |seed| {
            draws(
                params(|p| {
                    p.seed = Some(seed);
                    p.top_p = 0.9;
                    p.top_k = 500
                }),
                &logits,
                32,
            )
        };
        assert_eq!(filtered(3), filtered(3));
        assert_ne!(filtered(3), filtered(4));
    }

    #[test]
    fn repetition_penalty_uses_recent_context_only() {
        let logits = [2.0, 1.9, 0.5, -1.0];
        let greedy = |f: fn(&mut SamplingParams), context: &[u32]| {
            let mut p = SamplingParams::greedy();
            f(&mut p);
            Sampler::new(p).sample(&logits, context, &[]).token
        };
        let penalise = |p: &mut SamplingParams| p.repetition_penalty = 1.2;
        assert_eq!(greedy(|_| {}, &[0]), 0);
        assert_eq!(greedy(penalise, &[0]), 1);
        assert_eq!(
            greedy(
                |p| {
                    p.repetition_penalty = 1.2;
                    p.repetition_context = 2
                },
                &[0, 3, 3]
            ),
            0,
            "token 0 is outside the window"
        );

        // Negative logits are multiplied, pushing them further down.
        let mut s = Sampler::new(params(|p| p.repetition_penalty = 2.0));
        s.work = vec![1.0, -1.0];
        s.apply_penalties(&[0, 1, 1], &[]);
        assert_eq!(s.work, [0.5, -2.0]);
    }

    #[test]
    fn presence_and_frequency_penalties() {
        let logits = [2.0, 1.9, 0.5];
        let pick = |presence: f32, frequency: f32, generated: &[u32]| {
            let p = SamplingParams {
                presence_penalty: presence,
                frequency_penalty: frequency,
                ..SamplingParams::greedy()
            };
            Sampler::new(p).sample(&logits, generated, generated).token
        };
        assert_eq!(pick(0.2, 0.0, &[0]), 1);
        assert_eq!(pick(0.0, 0.06, &[0]), 0, "one occurrence is not enough");
        assert_eq!(pick(0.0, 0.06, &[0, 0]), 1);
        assert_eq!(pick(0.2, 0.0, &[0, 1]), 0);
        assert_eq!(
            pick(0.5, 0.0, &[99]),
            0,
            "out-of-vocabulary ids are ignored"
        );
    }

    #[test]
    fn logit_bias_moves_greedy_and_sampled_choices() {
        let logits = [2.0, 1.9, 0.5];
        let biased = |bias: Vec<(u32, f32)>| SamplingParams {
            logit_bias: bias,
            ..SamplingParams::greedy()
        };
        let pick = |p: SamplingParams| Sampler::new(p).sample(&logits, &[], &[]).token;
        assert_eq!(pick(biased(vec![])), 0);
        assert_eq!(pick(biased(vec![(0, -0.2)])), 1);
        assert_eq!(pick(biased(vec![(2, 1.6)])), 2);
        // Id 4 of 3 logits: ignored, not wrapped onto token 1 nor clamped
        // onto token 2 (either would win with +100).
        assert_eq!(
            pick(biased(vec![(4, 100.0)])),
            0,
            "ids past the logits are ignored"
        );
        // A ban holds under sampling too: token 0 never comes out.
        let banned = SamplingParams {
            temperature: 1.0,
            seed: Some(3),
            logit_bias: vec![(0, -100.0)],
            ..SamplingParams::default()
        };
        assert!(!draws(banned, &logits, 500).contains(&0));
        // Logprobs stay the model's own.
        let mut s = Sampler::new(SamplingParams {
            top_logprobs: Some(1),
            ..biased(vec![(2, 50.0)])
        });
        let out = s.sample(&logits, &[], &[]);
        assert_eq!(out.token, 2);
        assert_eq!(out.top[0].0, 0);
    }

    #[test]
    fn logprobs_are_raw_log_softmax() {
        let logits = [1.0f32, 2.0, 3.0];
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        let mut s = Sampler::new(SamplingParams {
            top_logprobs: Some(3),
            repetition_penalty: 5.0,
            ..SamplingParams::greedy()
        });
        let out = s.sample(&logits, &[2], &[]);
        assert_eq!(out.token, 1, "penalty moved the choice");
        let lp = out.logprob.expect("requested");
        assert!((f64::from(lp) - (2.0 - lse)).abs() < 1e-6, "{lp}");
        let ids: Vec<u32> = out.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [2, 1, 0]);
        for (id, lp) in &out.top {
            let expected = f64::from(logits[*id as usize]) - lse;
            assert!((f64::from(*lp) - expected).abs() < 1e-6);
        }
        let mass: f64 = out.top.iter().map(|t| f64::from(t.1).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-6, "{mass}");

        let big = noisy_logits(49152, 9);
        let mut s = Sampler::new(params(|p| p.top_logprobs = Some(5)));
        let out = s.sample(&big, &[], &[]);
        assert_eq!(out.top.len(), 5);
        assert!(out.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let mut sorted = big.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(big[out.top[0].0 as usize], sorted[0]);
        assert_eq!(big[out.top[4].0 as usize], sorted[4]);
        let lse = log_sum_exp(&big);
        let total: f64 = big.iter().map(|&l| (f64::from(l) - lse).exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(out.logprob.expect("requested") <= 0.0);
        let plain = Sampler::new(SamplingParams::greedy()).sample(&big, &[], &[]);
        assert!(plain.top.is_empty());
        assert_eq!(plain.logprob, None, "not computed unless requested");
    }

    #[test]
    fn validate_rejects_bad_values() {
        assert!(SamplingParams::default().validate().is_ok());
        assert!(SamplingParams::greedy().validate().is_ok());
        let bad = [
            (params(|p| p.temperature = -0.5), "temperature"),
            (params(|p| p.temperature = f32::NAN), "temperature"),
            (params(|p| p.top_p = 0.0), "top_p"),
            (params(|p| p.top_p = 1.5), "top_p"),
            (params(|p| p.min_p = -0.1), "min_p"),
            (params(|p| p.repetition_penalty = 0.0), "repetition_penalty"),
            (params(|p| p.presence_penalty = 2.5), "presence_penalty"),
            (params(|p| p.frequency_penalty = -3.0), "frequency_penalty"),
            (params(|p| p.logit_bias = vec![(5, -101.0)]), "logit_bias"),
            (params(|p| p.logit_bias = vec![(5, f32::NAN)]), "logit_bias"),
            (params(|p| p.top_logprobs = Some(21)), "top_logprobs"),
        ];
        for (p, field) in bad {
            match p.validate() {
                Err(EngineError::InvalidRequest(msg)) => {
                    assert!(msg.starts_with(field), "{msg:?} should name {field}")
                }
                other => panic!("{field}: expected InvalidRequest, got {other:?}"),
            }
        }
    }

    #[test]
    fn empty_logits_do_not_panic() {
        let out = Sampler::new(SamplingParams::default()).sample(&[], &[1, 2], &[2]);
        assert_eq!(out.token, 0);
        assert_eq!(out.logprob, None);
        let out = Sampler::new(params(|p| p.top_logprobs = Some(2))).sample(&[], &[1, 2], &[2]);
        assert_eq!(out.logprob, Some(f32::NEG_INFINITY));
    }
}
