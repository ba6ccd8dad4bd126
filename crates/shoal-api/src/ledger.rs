//! `/v1/usage`: the last requests, kept as the engine's own records of each
//! choice; each dialect's words and usage object are rendered from them when
//! read ([`crate::wire`]), so what the ledger shows is what the client was sent.
use std::collections::VecDeque;
use std::sync::Mutex;

use serde_json::{json, Value};
use shoal_client::Dialect;
use shoal_engine::{Completion, FinishReason, Timings, Usage};

use crate::wire;

/// One served request.
#[derive(Clone, Debug)]
pub struct LedgerEntry {
    pub id: String,
    pub dialect: Dialect,
    pub model: String,
    pub created: u64,
    pub stream: bool,
    /// Consecutive choices that share a prompt (the request's `n`).
    pub per_prompt: usize,
    /// The engine's record of each choice that ended, in choice order.
    pub completions: Vec<Completion>,
}

impl LedgerEntry {
    /// Usage over the choices, as every dialect reports it (each prompt once).
    pub fn usage(&self) -> Usage {
        crate::wire::combined_usage(&self.completions, self.per_prompt)
    }

    /// Each choice's finish in the dialect's words.
    pub fn finish_reasons(&self) -> Vec<String> {
        self.completions
            .iter()
            .map(|c| wire::finish_words(self.dialect, &c.finish))
            .collect()
    }

    /// The first choice's finish, the one a single reply is judged by.
    pub fn finish(&self) -> Option<&FinishReason> {
        self.completions.first().map(|c| &c.finish)
    }

    /// The first choice's timings.
    pub fn timings(&self) -> Timings {
        self.completions
            .first()
            .map(|c| c.timings)
            .unwrap_or_default()
    }

    /// The entry as `/v1/usage` lists it.
    pub fn to_json(&self) -> Value {
        let t = self.timings();
        json!({
            "id": self.id,
            "dialect": self.dialect.ledger_name(),
            "model": self.model,
            "created": self.created,
            "stream": self.stream,
            "finish_reasons": self.finish_reasons(),
            "engine_finish_reasons": self.completions.iter().map(|c| c.finish.as_str()).collect::<Vec<_>>(),
            "stop_sequences": self.completions.iter().map(|c| match &c.finish {
                FinishReason::StopSequence(s) => Some(s.as_str()),
                _ => None,
            }).collect::<Vec<_>>(),
            "usage": wire::usage_json(self.dialect, &self.usage()),
            "ttft_ms": t.ttft_ms,
            "decode_tokens_per_s": t.decode_tokens_per_s,
            "prefill_tokens_per_s": t.prefill_tokens_per_s,
        })
    }
}

/// A bounded in-memory ring of recent entries.
pub struct Ledger {
    cap: usize,
    entries: Mutex<VecDeque<LedgerEntry>>,
}

impl Ledger {
    pub fn new(cap: usize) -> Self {
        Ledger {
            cap: cap.max(1),
            entries: Mutex::new(VecDeque::new()),
        }
    }

    pub fn record(&self, e: LedgerEntry) {
        let mut q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == self.cap {
            q.pop_front();
        }
        q.push_back(e);
    }

    /// The entry for a response id, if it is still in the ring.
    pub fn get(&self, id: &str) -> Option<LedgerEntry> {
        let q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        q.iter().rev().find(|e| e.id == id).cloned()
    }

    /// Like [`Ledger::get`], waiting up to `timeout` for a request that is
    /// still winding down (a client that hung up is recorded once the engine
    /// has stopped its generation).
    pub async fn wait_for(&self, id: &str, timeout: std::time::Duration) -> Option<LedgerEntry> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.get(id) {
                return Some(e);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// How `/v1/usage` sums entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    Day,
    Hour,
    Model,
    Dialect,
    Finish,
}

/// `/v1/usage`'s query: filters, and a listing, a grouping or a CSV export.
#[derive(Clone, Debug, Default)]
pub struct UsageQuery {
    pub limit: Option<usize>,
    pub model: Option<String>,
    /// A ledger name (`openai.chat`) or a short one (`chat`).
    pub dialect: Option<Dialect>,
    /// The engine's reason (`length`, `timeout`, …) or the dialect's word.
    pub finish: Option<String>,
    /// Unix seconds, inclusive.
    pub since: Option<u64>,
    /// Unix seconds, exclusive.
    pub until: Option<u64>,
    pub group_by: Option<GroupBy>,
    pub csv: bool,
}

impl UsageQuery {
    /// Reads the query string's pairs; an unknown key or a bad value is an
    /// error naming the parameter.
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, crate::error::ApiError> {
        use crate::error::ApiError;
        let number = |k: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| ApiError::param(k, format!("'{k}' must be a whole number, got {v:?}")))
        };
        let mut q = UsageQuery::default();
        for (k, v) in pairs {
            match k {
                "limit" => q.limit = Some(number(k, v)? as usize),
                "model" => q.model = Some(v.to_string()),
                "dialect" => {
                    q.dialect = Some(
                        Dialect::ALL
                            .into_iter()
                            .find(|d| d.ledger_name() == v || d.name() == v)
                            .ok_or_else(|| {
                                ApiError::param(
                                    k,
                                    format!(
                                        "'dialect' must be one of openai.chat, openai.completions, \
                                         openai.responses, anthropic.messages, got {v:?}"
                                    ),
                                )
                            })?,
                    )
                }
                "finish" => q.finish = Some(v.to_string()),
                "since" => q.since = Some(number(k, v)?),
                "until" => q.until = Some(number(k, v)?),
                "group_by" => {
                    q.group_by = Some(match v {
                        "day" => GroupBy::Day,
                        "hour" => GroupBy::Hour,
                        "model" => GroupBy::Model,
                        "dialect" => GroupBy::Dialect,
                        "finish" => GroupBy::Finish,
                        _ => {
                            return Err(ApiError::param(
                                k,
                                format!(
                                "'group_by' must be day, hour, model, dialect or finish, got {v:?}"
                            ),
                            ))
                        }
                    })
                }
                "format" => match v {
                    "csv" => q.csv = true,
                    "json" => q.csv = false,
                    _ => {
                        return Err(ApiError::param(
                            k,
                            format!("'format' must be json or csv, got {v:?}"),
                        ))
                    }
                },
                other => {
                    return Err(ApiError::param(
                        other,
                        format!("unknown parameter '{other}'"),
                    ))
                }
            }
        }
        Ok(q)
    }

    fn matches(&self, e: &LedgerEntry) -> bool {
        self.model.as_ref().is_none_or(|m| &e.model == m)
            && self.dialect.is_none_or(|d| e.dialect == d)
            && self.since.is_none_or(|t| e.created >= t)
            && self.until.is_none_or(|t| e.created < t)
            && self.finish.as_ref().is_none_or(|f| {
                e.completions.iter().any(|c| c.finish.as_str() == f)
                    || e.finish_reasons().iter().any(|w| w == f)
            })
    }
}

/// `YYYY-MM-DD` (and `THH` with `hour`) of Unix seconds, in UTC.
fn utc_key(secs: u64, hour: bool) -> String {
    let format = if hour { "%Y-%m-%dT%H" } else { "%Y-%m-%d" };
    shoal_engine::template::strftime_utc(format, i64::try_from(secs).unwrap_or(i64::MAX))
}

impl Ledger {
    /// The entries `q` selects, newest first (`q.limit` applies to listings).
    pub fn query(&self, q: &UsageQuery) -> Vec<LedgerEntry> {
        let all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().rev().filter(|e| q.matches(e)).cloned().collect()
    }
}

/// Sums per group: requests and each kind of token, as every dialect counts
/// them (each prompt once per request).
pub fn grouped(entries: &[LedgerEntry], by: GroupBy) -> Vec<Value> {
    let mut groups: std::collections::BTreeMap<String, (u64, Usage)> = Default::default();
    for e in entries {
        let key = match by {
            GroupBy::Day => utc_key(e.created, false),
            GroupBy::Hour => utc_key(e.created, true),
            GroupBy::Model => e.model.clone(),
            GroupBy::Dialect => e.dialect.ledger_name().to_string(),
            GroupBy::Finish => e.finish().map_or("none", FinishReason::as_str).to_string(),
        };
        let u = e.usage();
        let g = groups.entry(key).or_default();
        g.0 += 1;
        g.1.prompt_tokens += u.prompt_tokens;
        g.1.cached_tokens += u.cached_tokens;
        g.1.completion_tokens += u.completion_tokens;
        g.1.reasoning_tokens += u.reasoning_tokens;
    }
    groups
        .into_iter()
        .map(|(key, (requests, u))| {
            json!({"key": key, "requests": requests, "prompt_tokens": u.prompt_tokens,
                   "cached_tokens": u.cached_tokens, "completion_tokens": u.completion_tokens,
                   "reasoning_tokens": u.reasoning_tokens, "total_tokens": u.total_tokens()})
        })
        .collect()
}

/// The entries as CSV, one row each with the engine's reason and usage.
pub fn csv(entries: &[LedgerEntry]) -> String {
    let mut out = String::from(
        "id,created,dialect,model,stream,finish,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens\n",
    );
    // Fields that may hold a comma or a quote are quoted.
    let field = |s: &str| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    for e in entries {
        let u = e.usage();
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{}\n",
            field(&e.id),
            e.created,
            e.dialect.ledger_name(),
            field(&e.model),
            e.stream,
            e.finish().map_or("", FinishReason::as_str),
            u.prompt_tokens,
            u.cached_tokens,
            u.completion_tokens,
            u.reasoning_tokens
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::utc_key;

    #[test]
    fn utc_keys_are_calendar_dates() {
        assert_eq!(utc_key(0, false), "1970-01-01");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc_key(1_709_210_096, true), "2024-02-29T12");
        // 2026-12-02 00:00:00 UTC.
        assert_eq!(utc_key(1_796_169_600, false), "2026-12-02");
    }
}
