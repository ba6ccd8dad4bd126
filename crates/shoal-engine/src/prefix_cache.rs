//! Reuse of KV state across requests that share a token prefix (multi-turn
//! chats, shared system prompts, agents re-sending their context).
//!
//! Entries are keyed by the exact token sequence whose keys and values they
//! hold (one model per engine, so the model is implied). MLX arrays are
//! immutable, so handing out a clone of an entry's cache is safe: the new
//! request's writes produce new arrays and the entry stays intact.
use std::time::Instant;

use crate::backend::KvCache;

struct Entry {
    tokens: Vec<u32>,
    /// Whose prefix it is: an entry is reused only by requests of the same
    /// salt (one API key's, when keys do not share), so one client cannot
    /// time another's prompts by its cache hits.
    salt: u64,
    cache: Box<dyn KvCache>,
    last_used: u64,
    /// Kept ahead of unmarked entries until then: it holds a prefix a
    /// client marked for caching (Anthropic's `cache_control` TTL).
    keep_until: Option<Instant>,
}

impl Entry {
    fn pinned(&self, now: Instant) -> bool {
        self.keep_until.is_some_and(|t| t > now)
    }
}

/// A bounded, least-recently-used store of KV caches.
pub struct PrefixCache {
    entries: Vec<Entry>,
    budget_bytes: usize,
    clock: u64,
    /// A hit is a multiple of this many tokens (see [`reusable`]).
    align: usize,
    /// Entries dropped for room since the cache was made.
    pub evictions: u64,
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

/// How many of a stored prefix's `shared` tokens a prompt of `prompt_len`
/// reuses: one prompt token is always left to compute (the next token's
/// logits come from running the last prompt position), and the rest is cut
/// to a multiple of `align` (whole micro-batches where a reply must equal
/// its cold run to the bit, see [`crate::backend::LanguageModel::exact_prefix_unit`]).
pub(crate) fn reusable(shared: usize, prompt_len: usize, align: usize) -> usize {
    let n = shared.min(prompt_len.saturating_sub(1));
    n - n % align.max(1)
}

impl PrefixCache {
    pub fn new(budget_bytes: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            budget_bytes,
            clock: 0,
            align: 1,
            evictions: 0,
        }
    }

    /// Hits cut to a multiple of `unit` tokens (see [`reusable`]).
    pub fn aligned(mut self, unit: usize) -> Self {
        self.align = unit.max(1);
        self
    }

    /// The multiple a hit is cut to (1: any length).
    pub fn alignment(&self) -> usize {
        self.align
    }

    /// The cache sharing the longest prefix with `prompt`, truncated to it.
    /// At least one prompt token is always left to compute, because the next
    /// token's logits come from running the last prompt position.
    pub fn lookup(&mut self, prompt: &[u32], salt: u64) -> Option<Hit> {
        if self.budget_bytes == 0 || prompt.len() < 2 {
            return None;
        }
        self.clock += 1;
        let (idx, len) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.salt == salt)
            .map(|(i, e)| {
                let shared = common_prefix(&e.tokens, prompt).min(e.cache.len());
                (i, reusable(shared, prompt.len(), self.align))
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
    pub fn insert(&mut self, tokens: &[u32], cache: Box<dyn KvCache>, salt: u64) {
        self.insert_kept(tokens, cache, salt, None);
    }

    /// [`PrefixCache::insert`], kept ahead of unmarked entries until
    /// `keep_until` (an entry that extends it inherits the later time).
    pub fn insert_kept(
        &mut self,
        tokens: &[u32],
        mut cache: Box<dyn KvCache>,
        salt: u64,
        keep_until: Option<Instant>,
    ) {
        if self.budget_bytes == 0 || cache.is_empty() || cache.nbytes() > self.budget_bytes {
            return;
        }
        self.clock += 1;
        let held = &tokens[..cache.len().min(tokens.len())];
        let later = |a: Option<Instant>, b: Option<Instant>| a.max(b);
        // An entry that is a prefix of the new one adds nothing (its pin
        // goes to the new one).
        let mut keep_until = keep_until;
        self.entries.retain(|e| {
            let superseded =
                e.salt == salt && e.tokens.len() <= held.len() && held.starts_with(&e.tokens);
            if superseded {
                keep_until = later(keep_until, e.keep_until);
            }
            !superseded
        });
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.salt == salt && e.tokens.starts_with(held))
        {
            e.keep_until = later(e.keep_until, keep_until);
            return;
        }
        cache.park();
        self.entries.push(Entry {
            tokens: held.to_vec(),
            salt,
            cache,
            last_used: self.clock,
            keep_until,
        });
        while self.bytes() > self.budget_bytes && self.evict_oldest() {}
    }

    /// Drops the least recently used entry, freeing its KV state for a
    /// backend that ran out of room; false when there was none. Entries a
    /// client marked go last, the one whose time ends first before others.
    pub fn evict_oldest(&mut self) -> bool {
        let now = Instant::now();
        let Some(oldest) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| {
                let pinned = e.pinned(now);
                (
                    pinned,
                    if pinned { e.keep_until } else { None },
                    e.last_used,
                )
            })
            .map(|(i, _)| i)
        else {
            return false;
        };
        self.entries.swap_remove(oldest);
        self.evictions += 1;
        true
    }

    /// Whether it keeps anything (a budget above 0).
    pub fn enabled(&self) -> bool {
        self.budget_bytes > 0
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
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
        pc.insert(&[1, 2, 3, 4, 5], Box::new(Fake(5)), 0);
        pc.insert(&[1, 2, 9], Box::new(Fake(3)), 0);
        let hit = pc.lookup(&[1, 2, 3, 4, 7, 8], 0).expect("hit");
        assert_eq!(hit.tokens, 4);
        assert_eq!(hit.cache.len(), 4);
        // Identical prompt: everything but the last token.
        assert_eq!(pc.lookup(&[1, 2, 3, 4, 5], 0).map(|h| h.tokens), Some(4));
        assert!(pc.lookup(&[7, 1, 2], 0).is_none());
    }

    #[test]
    fn an_aligned_cache_reuses_whole_units_only() {
        let mut pc = PrefixCache::new(10_000).aligned(4);
        pc.insert(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], Box::new(Fake(10)), 0);
        // Nine shared, one left to compute: eight reused, two whole units.
        let hit = pc.lookup(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0).expect("hit");
        assert_eq!((hit.tokens, hit.cache.len()), (8, 8));
        assert_eq!(
            pc.lookup(&[1, 2, 3, 4, 5, 6, 0], 0).map(|h| h.tokens),
            Some(4)
        );
        // Less than a unit shared: nothing.
        assert!(pc.lookup(&[1, 2, 3, 0], 0).is_none());
        assert_eq!(reusable(9, 100, 1), 9);
        assert_eq!(reusable(9, 5, 1), 4);
    }

    #[test]
    fn positions_beyond_the_cache_are_not_claimed() {
        let mut pc = PrefixCache::new(10_000);
        // The last generated token was never fed, so the cache holds one fewer.
        pc.insert(&[1, 2, 3, 4], Box::new(Fake(3)), 0);
        assert_eq!(pc.lookup(&[1, 2, 3, 4, 5, 6], 0).map(|h| h.tokens), Some(3));
    }

    #[test]
    fn lru_eviction_keeps_within_budget_and_prefixes_are_superseded() {
        let mut pc = PrefixCache::new(100);
        pc.insert(&[1, 2, 3], Box::new(Fake(3)), 0);
        pc.insert(&[1, 2, 3, 4, 5], Box::new(Fake(5)), 0);
        assert_eq!(pc.len(), 1, "the shorter prefix entry is superseded");
        pc.insert(&[9, 9, 9, 9], Box::new(Fake(4)), 0);
        assert_eq!(pc.bytes(), 90);
        pc.lookup(&[1, 2, 3, 4, 5, 6], 0); // touch the first entry
        pc.insert(&[7, 7, 7], Box::new(Fake(3)), 0);
        assert!(pc.bytes() <= 100);
        assert!(
            pc.lookup(&[9, 9, 9, 9, 1], 0).is_none(),
            "least recently used went first"
        );
        assert!(pc.lookup(&[1, 2, 3, 4, 5, 6], 0).is_some());
        let mut off = PrefixCache::new(0);
        off.insert(&[1, 2], Box::new(Fake(2)), 0);
        assert!(off.lookup(&[1, 2, 3], 0).is_none());
    }

    #[test]
    fn a_marked_entry_outlives_newer_unmarked_ones_until_its_time() {
        let mut pc = PrefixCache::new(100);
        let later = Instant::now() + std::time::Duration::from_secs(300);
        pc.insert_kept(&[1, 1, 1, 1], Box::new(Fake(4)), 0, Some(later));
        pc.insert(&[2, 2, 2, 2], Box::new(Fake(4)), 0);
        pc.lookup(&[2, 2, 2, 2, 9], 0);
        // Room for one more only by evicting: the unmarked one goes.
        pc.insert(&[3, 3, 3], Box::new(Fake(3)), 0);
        assert!(pc.lookup(&[1, 1, 1, 1, 9], 0).is_some(), "marked kept");
        assert!(pc.lookup(&[2, 2, 2, 2, 9], 0).is_none(), "unmarked evicted");
        // An entry that extends it carries its time on.
        pc.insert(&[1, 1, 1, 1, 5, 5], Box::new(Fake(6)), 0);
        assert_eq!(pc.len(), 2, "the extension superseded the entry it extends");
        let ext = pc
            .entries
            .iter()
            .find(|e| e.tokens.len() == 6)
            .expect("kept");
        assert!(ext.keep_until == Some(later));
        // Once the time has passed it is an ordinary entry.
        let past = Instant::now() - std::time::Duration::from_secs(1);
        let mut pc = PrefixCache::new(100);
        pc.insert_kept(&[1, 1, 1, 1], Box::new(Fake(4)), 0, Some(past));
        pc.insert(&[2, 2, 2, 2], Box::new(Fake(4)), 0);
        pc.insert(&[3, 3, 3], Box::new(Fake(3)), 0);
        assert!(
            pc.lookup(&[1, 1, 1, 1, 9], 0).is_none(),
            "expired: oldest out"
        );
    }

    #[test]
    fn a_salted_entry_is_reused_only_under_its_salt() {
        let mut pc = PrefixCache::new(10_000);
        pc.insert(&[1, 2, 3, 4], Box::new(Fake(4)), 7);
        assert!(pc.lookup(&[1, 2, 3, 4, 5], 0).is_none());
        assert!(pc.lookup(&[1, 2, 3, 4, 5], 8).is_none());
        assert_eq!(pc.lookup(&[1, 2, 3, 4, 5], 7).map(|h| h.tokens), Some(4));
        // Another salt's copy of the same prefix is an entry of its own.
        pc.insert(&[1, 2, 3, 4], Box::new(Fake(4)), 8);
        assert_eq!(pc.len(), 2);
    }
}
