//! Output content filter: literal phrases and regular expressions checked on
//! the decoded text as it streams.
//!
//! Literal phrases are held back while they might still be forming, so a
//! blocked phrase is never sent. A regex cannot say how long its match may be,
//! so its text is checked as it arrives: on a hit nothing from the match on is
//! sent unless an earlier piece already carried its start.
use regex::Regex;

use crate::error::{EngineError, Result};
use crate::stop::{StopMatcher, StopStep};

/// The server's filter configuration; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ContentPolicy {
    phrases: Vec<String>,
    patterns: Vec<Regex>,
}

impl ContentPolicy {
    /// Fails with a clear message on an invalid regular expression.
    pub fn new(phrases: Vec<String>, patterns: &[String]) -> Result<Self> {
        let patterns = patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| {
                    EngineError::InvalidRequest(format!("content filter pattern {p:?}: {e}"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ContentPolicy {
            phrases: phrases.into_iter().filter(|p| !p.is_empty()).collect(),
            patterns,
        })
    }

    /// A screen for one generation.
    pub fn screen(&self) -> Screen {
        Screen {
            literal: StopMatcher::new(self.phrases.clone()),
            patterns: self.patterns.clone(),
            seen: String::new(),
        }
    }
}

/// Per-generation filter state.
pub struct Screen {
    literal: StopMatcher,
    patterns: Vec<Regex>,
    /// Text already let through (regexes may match across pieces).
    seen: String,
}

impl Screen {
    /// Text in; what may be sent, and `matched` set when the filter fired.
    pub fn push(&mut self, text: &str) -> StopStep {
        let step = self.literal.push(text);
        self.check(step)
    }

    /// End of generation: release held-back text (still screened by the regexes).
    pub fn flush(&mut self) -> StopStep {
        let rest = self.literal.flush();
        self.check(rest)
    }

    fn check(&mut self, step: StopStep) -> StopStep {
        if self.patterns.is_empty() {
            self.seen.push_str(&step.emit);
            return step;
        }
        let before = self.seen.len();
        let mut candidate = std::mem::take(&mut self.seen);
        candidate.push_str(&step.emit);
        let first_hit = self
            .patterns
            .iter()
            .filter_map(|re| re.find(&candidate).map(|m| m.start()))
            .min();
        match first_hit {
            None => {
                self.seen = candidate;
                step
            }
            Some(start) => {
                let cut = start.max(before);
                let emit = candidate[before..cut].to_string();
                candidate.truncate(cut);
                self.seen = candidate;
                StopStep {
                    emit,
                    matched: Some(0),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: &ContentPolicy, pieces: &[&str]) -> (String, bool) {
        let mut s = policy.screen();
        let mut out = String::new();
        for p in pieces {
            let st = s.push(p);
            out.push_str(&st.emit);
            if st.matched.is_some() {
                return (out, true);
            }
        }
        let st = s.flush();
        out.push_str(&st.emit);
        (out, st.matched.is_some())
    }

    #[test]
    fn literal_phrase_is_never_sent_even_across_pieces() {
        let p = ContentPolicy::new(vec!["secret code".into()], &[]).unwrap();
        assert_eq!(
            run(&p, &["the sec", "ret co", "de is 42"]),
            ("the ".into(), true)
        );
        assert_eq!(run(&p, &["the sec", "tion"]), ("the section".into(), false));
    }

    #[test]
    fn regex_hit_cuts_at_the_match_within_the_piece() {
        let p = ContentPolicy::new(vec![], &[r"\b\d{3}-\d{4}\b".into()]).unwrap();
        assert_eq!(run(&p, &["call ", "555-1234 now"]), ("call ".into(), true));
        // A match whose start was already sent stops at the piece boundary.
        assert_eq!(
            run(&p, &["call 555-", "1234 now"]),
            ("call 555-".into(), true)
        );
        assert_eq!(
            run(&p, &["no numbers here"]),
            ("no numbers here".into(), false)
        );
    }

    #[test]
    fn invalid_pattern_is_a_clear_error() {
        let e = ContentPolicy::new(vec![], &["(unclosed".into()]).unwrap_err();
        assert!(e.to_string().contains("(unclosed"));
    }
}
