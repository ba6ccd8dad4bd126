//! Reuse of KV state across requests that share a token prefix (multi-turn
//! chats, shared system prompts, agents re-sending their context).
//!
//! Entries are keyed by the exact token sequence whose keys and values they
//! hold (one model per engine, so the model is implied). MLX arrays are
//! immutable, so handing out a clone of an entry's cache is safe: the new
//! request's writes produce new arrays and the entry stays intact.
use crate::backend::KvCache;

struct Entry {
    tokens: Vec<u32>,
    cache: Box<dyn KvCache>,
    last_used: u64,
}

/// A bounded, least-recently-used store of KV caches.
pub struct PrefixCache {
    entries: Vec<Entry>,
    budget_bytes: usize,
    clock: u64,
}

/// A reusable cache and how many leading prompt tokens it already holds.
pub struct Hit {
    pub cache: Box<dyn KvCache>,
    pub tokens: usize,
}

/// How many leading tokens `a` and `b` share.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(budget_bytes: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            budget_bytes,
            clock: 0,
        }
    }

    /// The cache sharing the longest prefix with `prompt`, truncated to it.
    /// At least one prompt token is always left to compute, because the next
    /// token's logits come from running the last prompt position.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<Hit> {
        if self.budget_bytes == 0 || prompt.len() < 2 {
            return None;
        }
        self.clock += 1;
        let limit = prompt.len() - 1;
        let (idx, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    i,
                    common_prefix(&e.tokens, prompt)
                        .min(limit)
                        .min(e.cache.len()),
                )
            })
            .max_by_key(|&(_, n)| n)?;
        if len == 0 {
            return None;
        }
        let e = &mut self.entries[idx];
        e.last_used = self.clock;
        let mut cache = e.cache.clone_box();
        cache.truncate(len);
        Some(Hit { cache, tokens: len })
    }

    /// How many of `prompt`'s first tokens the best entry holds, without
    /// taking it.
    pub fn held_prefix(&self, prompt: &[u32]) -> usize {
        self.entries
            .iter()
            .map(|e| common_prefix(&e.tokens, prompt).min(e.cache.len()))
            .max()
            .unwrap_or(0)
    }

    /// Keeps `cache`, whose positions hold `tokens[..cache.len()]`.
    pub fn insert(&mut self, tokens: &[u32], mut cache: Box<dyn KvCache>) {
        if self.budget_bytes == 0 || cache.is_empty() || cache.nbytes() > self.budget_bytes {
            return;
        }
        self.clock += 1;
        let held = &tokens[..cache.len().min(tokens.len())];
        // An entry that is a prefix of the new one adds nothing.
        self.entries
            .retain(|e| !(e.tokens.len() <= held.len() && held.starts_with(&e.tokens)));
        if self.entries.iter().any(|e| e.tokens.starts_with(held)) {
            return;
        }
        cache.park();
        self.entries.push(Entry {
            tokens: held.to_vec(),
            cache,
            last_used: self.clock,
        });
        while self.bytes() > self.budget_bytes && self.evict_oldest() {}
    }

    /// Drops the least recently used entry, freeing its KV state for a
    /// backend that ran out of room; false when there was none.
    pub fn evict_oldest(&mut self) -> bool {
        let Some(oldest) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i)
        else {
            return false;
        };
        self.entries.swap_remove(oldest);
        true
    }

    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.cache.nbytes()).sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;

    use super::*;

    /// A cache that only counts positions; 10 bytes per position.
    #[derive(Clone)]
    struct Fake(usize);
    impl KvCache for Fake {
        fn len(&self) -> usize {
            self.0
        }
        fn truncate(&mut self, len: usize) {
            self.0 = self.0.min(len);
        }
        fn nbytes(&self) -> usize {
            self.0 * 10
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
        fn clone_box(&self) -> Box<dyn KvCache> {
            Box::new(self.clone())
        }
    }

    #[test]
    fn longest_prefix_wins_and_one_token_is_left_to_compute() {
        let mut pc = PrefixCache::new(10_000);
        pc.insert(&[1, 2, 3, 4, 5], Box::new(Fake(5)));
        pc.insert(&[1, 2, 9], Box::new(Fake(3)));
        let hit = pc.lookup(&[1, 2, 3, 4, 7, 8]).expect("hit");
        assert_eq!(hit.tokens, 4);
        assert_eq!(hit.cache.len(), 4);
        // Identical prompt: everything but the last token.
        assert_eq!(pc.lookup(&[1, 2, 3, 4, 5]).map(|h| h.tokens), Some(4));
        assert!(pc.lookup(&[7, 1, 2]).is_none());
    }

    #[test]
    fn positions_beyond_the_cache_are_not_claimed() {
        let mut pc = PrefixCache::new(10_000);
        // The last generated token was never fed, so the cache holds one fewer.
        pc.insert(&[1, 2, 3, 4], Box::new(Fake(3)));
        assert_eq!(pc.lookup(&[1, 2, 3, 4, 5, 6]).map(|h| h.tokens), Some(3));
    }

    #[test]
    fn lru_eviction_keeps_within_budget_and_prefixes_are_superseded() {
        let mut pc = PrefixCache::new(100);
        pc.insert(&[1, 2, 3], Box::new(Fake(3)));
        pc.insert(&[1, 2, 3, 4, 5], Box::new(Fake(5)));
        assert_eq!(pc.len(), 1, "the shorter prefix entry is superseded");
        pc.insert(&[9, 9, 9, 9], Box::new(Fake(4)));
        assert_eq!(pc.bytes(), 90);
        pc.lookup(&[1, 2, 3, 4, 5, 6]); // touch the first entry
        pc.insert(&[7, 7, 7], Box::new(Fake(3)));
        assert!(pc.bytes() <= 100);
        assert!(
            pc.lookup(&[9, 9, 9, 9, 1]).is_none(),
            "least recently used went first"
        );
        assert!(pc.lookup(&[1, 2, 3, 4, 5, 6]).is_some());
        let mut off = PrefixCache::new(0);
        off.insert(&[1, 2], Box::new(Fake(2)));
        assert!(off.lookup(&[1, 2, 3]).is_none());
    }
}
