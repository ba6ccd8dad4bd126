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

use crate::backend::{KvCache, LanguageModel, ModelInfo};
use crate::error::Result;
use crate::loader::Vocabulary;
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
}

/// What callers may know about a target's draft model.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DraftInfo {
    pub path: PathBuf,
    #[serde(flatten)]
    pub info: ModelInfo,
}

impl DraftModel {
    pub fn new(model: Box<dyn LanguageModel>, prefix_bytes: usize) -> DraftModel {
        DraftModel {
            model,
            prefixes: PrefixCache::new(prefix_bytes),
        }
    }

    pub fn info(&self, path: &Path) -> DraftInfo {
        DraftInfo {
            path: path.to_path_buf(),
            info: self.model.info().clone(),
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
        Ok(match dm.prefixes.lookup(context) {
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
    /// past that are dropped), then extends greedily while confident.
    pub fn propose(&mut self, dm: &DraftModel, context: &[u32], want: usize) -> Result<Vec<u32>> {
        if context.is_empty() || want == 0 {
            return Ok(Vec::new());
        }
        // At least the last token runs: its logits give the first draft.
        let keep = common_prefix(&self.held, context).min(context.len() - 1);
        self.cache.truncate(keep);
        self.held.truncate(keep);
        let mut logits = dm.model.forward(&context[keep..], self.cache.as_mut())?;
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
        Ok(out)
    }

    /// Hands the cache to the draft model's prefix cache.
    pub fn finish(self, dm: &mut DraftModel) {
        dm.prefixes.insert(&self.held, self.cache);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_likely_token_comes_with_its_softmax_probability() {
        let (t, p) = most_likely(&[0.0, 2.0f32.ln(), 0.0]).expect("some");
        assert_eq!(t, 1);
        assert!((p - 0.5).abs() < 1e-6, "{p}");
        assert!(most_likely(&[]).is_none());
        assert!(most_likely(&[f32::NEG_INFINITY; 3]).is_none());
    }
}
