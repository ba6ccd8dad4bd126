//! Stop sequences matched on generated text, which may span any number of token deltas.
//!
//! Text that might be the beginning of a stop sequence is held back until it is ruled out, so a
//! client never sees part of a stop string.

/// Streams text through and reports the first stop sequence it contains.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Held-back text: a suffix that is a proper prefix of some stop sequence.
    pending: String,
    done: bool,
}

/// What one [`StopMatcher::push`] produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text that can be sent to the client now.
    pub emit: String,
    /// Index into [`StopMatcher::stops`] of the stop sequence that ended generation.
    pub matched: Option<usize>,
}

impl StopMatcher {
    /// Empty strings are kept (so indices match the caller's list) but never match.
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            pending: String::new(),
            done: false,
        }
    }

    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// True once a stop sequence has matched; later pushes emit nothing.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Feeds the next piece of generated text.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.done {
            return StopStep::default();
        }
        self.pending.push_str(text);

        let mut hold_from = self.partial_start();
        if let Some((at, index)) = self.earliest_match() {
            // A longer stop that starts earlier may still complete (`"ab>b"` while
            // `"b"` already matched in `"ab"`): the earliest start wins, so wait.
            match self.open_start_before(at) {
                Some(open) => hold_from = open,
                None => return self.finish_at(at, index),
            }
        }
        let held = self.pending.split_off(hold_from);
        StopStep {
            emit: std::mem::replace(&mut self.pending, held),
            matched: None,
        }
    }

    /// Releases held-back text at the end of generation: up to the earliest
    /// complete stop in it, if one was waiting on a longer one that never came.
    pub fn flush(&mut self) -> StopStep {
        if self.done {
            return StopStep::default();
        }
        match self.earliest_match() {
            Some((at, index)) => self.finish_at(at, index),
            None => StopStep {
                emit: std::mem::take(&mut self.pending),
                matched: None,
            },
        }
    }

    fn finish_at(&mut self, at: usize, index: usize) -> StopStep {
        self.pending.truncate(at);
        self.done = true;
        StopStep {
            emit: std::mem::take(&mut self.pending),
            matched: Some(index),
        }
    }

    /// The first position before `before` where the held text could still
    /// grow into a stop sequence.
    fn open_start_before(&self, before: usize) -> Option<usize> {
        self.pending
            .char_indices()
            .map(|(i, _)| i)
            .take_while(|&i| i < before)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops
                    .iter()
                    .any(|stop| stop.len() > tail.len() && stop.starts_with(tail))
            })
    }

    /// The earliest complete stop in `pending` as (byte offset, stop index); at equal offsets
    /// the longest stop wins so that e.g. `"</s>"` beats `"</"`.
    fn earliest_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter(|(_, stop)| !stop.is_empty())
            .filter_map(|(i, stop)| self.pending.find(stop.as_str()).map(|at| (at, i)))
            .min_by(|a, b| {
                a.0.cmp(&b.0)
                    .then(self.stops[b.1].len().cmp(&self.stops[a.1].len()))
                    .then(a.1.cmp(&b.1))
            })
    }

    /// Start of the longest suffix of `pending` that could still grow into a stop sequence, or
    /// `pending.len()` when none can. Only char boundaries are considered.
    fn partial_start(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let earliest = self.pending.len().saturating_sub(longest.saturating_sub(1));
        self.pending
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= earliest)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops
                    .iter()
                    .any(|stop| stop.len() > tail.len() && stop.starts_with(tail))
            })
            .unwrap_or(self.pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    fn step(emit: &str, matched: Option<usize>) -> StopStep {
        StopStep {
            emit: emit.into(),
            matched,
        }
    }

    #[test]
    fn match_within_one_delta() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("hello STOP world"), step("hello ", Some(0)));
        assert!(m.is_done());
        assert_eq!(m.push("more"), step("", None));
        assert_eq!(m.flush(), step("", None));
    }

    #[test]
    fn match_across_three_deltas() {
        let mut m = matcher(&["<end>"]);
        assert_eq!(m.push("abc<e"), step("abc", None));
        assert_eq!(m.push("n"), step("", None));
        assert_eq!(m.push("d>tail"), step("", Some(0)));
    }

    #[test]
    fn false_partial_is_released_by_flush() {
        let mut m = matcher(&["###"]);
        assert_eq!(m.push("x ##"), step("x ", None));
        assert_eq!(m.flush(), step("##", None));
        assert_eq!(m.flush(), step("", None));
    }

    #[test]
    fn an_earlier_longer_stop_beats_a_shorter_one_already_complete() {
        // Found by the fuzzer: "b" is complete in "ab", but "ab>b" starts earlier.
        let mut m = matcher(&["ab>b", "b"]);
        assert_eq!(m.push("a"), step("", None));
        assert_eq!(m.push("b"), step("", None));
        assert_eq!(m.push(">b"), step("", Some(0)));
        // The longer one never completes: the shorter one ends it after all.
        let mut m = matcher(&["ab>b", "b"]);
        assert_eq!(m.push("xab"), step("x", None));
        assert_eq!(m.push(">c"), step("a", Some(1)));
        // Or generation ends while it is still open.
        let mut m = matcher(&["ab>b", "b"]);
        assert_eq!(m.push("ab>"), step("", None));
        assert_eq!(m.flush(), step("a", Some(1)));
    }

    #[test]
    fn partial_then_mismatch_is_released_promptly() {
        let mut m = matcher(&["###"]);
        assert_eq!(m.push("a#"), step("a", None));
        assert_eq!(m.push("#b"), step("##b", None));
        // A mismatch may still leave a new partial at the end.
        assert_eq!(m.push("##x#"), step("##x", None));
        assert_eq!(m.push("##"), step("", Some(0)));
    }

    #[test]
    fn earliest_then_longest_stop_wins() {
        let mut m = matcher(&["world", "lo w", "lo"]);
        assert_eq!(m.push("hello world"), step("hel", Some(1)));

        let mut m = matcher(&["b", "abc"]);
        assert_eq!(m.push("xabc"), step("x", Some(1)));

        let mut m = matcher(&["ab", "abc"]);
        assert_eq!(m.push("xabcd"), step("x", Some(1)));

        // A stop completed in an earlier delta ends generation before a longer one could.
        let mut m = matcher(&["ab", "abc"]);
        assert_eq!(m.push("xab"), step("x", Some(0)));
    }

    #[test]
    fn stop_at_very_start_and_empty_stops_ignored() {
        let mut m = matcher(&["", "\n\n"]);
        assert_eq!(m.push("\n"), step("", None));
        assert_eq!(m.push("\nrest"), step("", Some(1)));

        let mut m = matcher(&[""]);
        assert_eq!(m.push("free text"), step("free text", None));
        let mut none = matcher(&[]);
        assert_eq!(none.push("abc"), step("abc", None));
    }

    #[test]
    fn unicode_stops_never_split_chars() {
        let mut m = matcher(&["日本"]);
        assert_eq!(m.push("語日"), step("語", None));
        assert_eq!(m.push("本語"), step("", Some(0)));

        // "é" (c3 a9) shares its first byte with "ê" (c3 aa); holding must stay on boundaries.
        let mut m = matcher(&["ê!"]);
        let out = m.push("café");
        assert_eq!(out, step("café", None));
        let mut m = matcher(&["🎉🎉"]);
        assert_eq!(m.push("ok 🎉"), step("ok ", None));
        assert_eq!(m.push("!"), step("🎉!", None));
    }
}
