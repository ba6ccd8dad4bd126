//! `/v1/usage`'s and `shoal usage`'s query, read from its pairs: filters, and
//! a listing, a grouping or a CSV export. No HTTP here: a bad value is a
//! [`QueryError`] naming the parameter, which each caller words its own way.
use shoal_store::UsageFilter;

use crate::dialect::{Dialect, Registry};

/// A query parameter that is unknown or has a bad value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QueryError {
    /// The parameter it is about.
    pub param: String,
    pub message: String,
}

impl QueryError {
    fn new(param: &str, message: String) -> Self {
        QueryError {
            param: param.to_string(),
            message,
        }
    }
}

/// How `/v1/usage` sums entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    Day,
    Hour,
    /// The UTC week, keyed by the Monday it starts on.
    Week,
    Model,
    Dialect,
    Finish,
    Client,
    Node,
    /// The node that ran the request (its receiver when that ran it).
    ServedBy,
}

/// `/v1/usage`'s query: filters, and a listing, a grouping or a CSV export.
#[derive(Clone, Debug, Default)]
pub struct UsageQuery {
    /// The rows it selects, in the store's terms: `since`/`until` (Unix
    /// seconds) in milliseconds, a dialect by its ledger name (`dialect`
    /// takes a short one too), `cursor` as `before`; `finish` is the
    /// engine's reason or the dialect's word, `client` the API key's name,
    /// `node` the one that received the request, `turn` a chat turn
    /// (`x-shoal-turn`). `limit` is a listing's page size.
    pub filter: UsageFilter,
    pub group_by: Option<GroupBy>,
    pub csv: bool,
    /// Every online node's ledger merged (`scope=cluster`), not this node's.
    pub cluster: bool,
}

impl UsageQuery {
    /// Reads the query string's pairs; an unknown key or a bad value is an
    /// error naming the parameter.
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        dialects: Registry,
    ) -> Result<Self, QueryError> {
        let number = |k: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| QueryError::new(k, format!("'{k}' must be a whole number, got {v:?}")))
        };
        let ms = |k: &str, v: &str| {
            instant(k, v).map(|t| i64::try_from(t).unwrap_or(i64::MAX).saturating_mul(1000))
        };
        let mut q = UsageQuery::default();
        let f = &mut q.filter;
        for (k, v) in pairs {
            match k {
                "limit" => f.limit = Some(number(k, v)? as usize),
                "model" => f.model = Some(v.to_string()),
                "dialect" => {
                    f.dialect = Some(
                        dialects
                            .parse(v)
                            .ok_or_else(|| {
                                let names: Vec<_> =
                                    dialects.all().map(Dialect::ledger_name).collect();
                                QueryError::new(
                                    k,
                                    format!(
                                        "'dialect' must be one of {}, got {v:?}",
                                        names.join(", ")
                                    ),
                                )
                            })?
                            .ledger_name()
                            .to_string(),
                    )
                }
                "endpoint" => f.endpoint = Some(v.to_string()),
                "finish" => f.finish = Some(v.to_string()),
                "client" => f.client = Some(v.to_string()),
                "node" => f.node = Some(v.to_string()),
                "turn" => f.turn = Some(v.to_string()),
                "cursor" => f.before = Some(number(k, v)?.min(i64::MAX as u64) as i64),
                "since" => f.since_ms = Some(ms(k, v)?),
                "until" => f.until_ms = Some(ms(k, v)?),
                "group_by" => {
                    q.group_by = Some(one_of(
                        k,
                        v,
                        &[
                            ("day", GroupBy::Day),
                            ("hour", GroupBy::Hour),
                            ("week", GroupBy::Week),
                            ("model", GroupBy::Model),
                            ("client", GroupBy::Client),
                            ("dialect", GroupBy::Dialect),
                            ("node", GroupBy::Node),
                            ("served_by", GroupBy::ServedBy),
                            ("finish", GroupBy::Finish),
                        ],
                    )?)
                }
                "scope" => q.cluster = one_of(k, v, &[("node", false), ("cluster", true)])?,
                "format" => q.csv = one_of(k, v, &[("json", false), ("csv", true)])?,
                other => {
                    return Err(QueryError::new(
                        other,
                        format!("unknown parameter '{other}'"),
                    ))
                }
            }
        }
        Ok(q)
    }
}

/// The value named `v` among a parameter's `choices`, or a 400 listing them.
fn one_of<T: Copy>(param: &str, v: &str, choices: &[(&str, T)]) -> Result<T, QueryError> {
    if let Some((_, t)) = choices.iter().find(|(name, _)| *name == v) {
        return Ok(*t);
    }
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let listed = match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(QueryError::new(
        param,
        format!("'{param}' must be {listed}, got {v:?}"),
    ))
}

/// A moment as `since` and `until` take it, in Unix seconds: a number of
/// seconds, `now`, `today` or `yesterday` (UTC midnight), a span ago
/// (`90m`, `24h`, `7d`), a UTC date (`2026-12-01`) or an RFC 3339 time.
pub fn instant(param: &str, v: &str) -> Result<u64, QueryError> {
    let now = chrono::Utc::now().timestamp().max(0) as u64;
    let midnight = now - now % 86_400;
    let bad = || {
        QueryError::new(
            param,
            format!(
                "'{param}' must be Unix seconds, now, today, yesterday, a span ago (90m, 24h, \
                 7d), a date (2026-12-01) or an RFC 3339 time, got {v:?}"
            ),
        )
    };
    if let Ok(secs) = v.parse::<u64>() {
        return Ok(secs);
    }
    match v {
        "now" => return Ok(now),
        "today" => return Ok(midnight),
        "yesterday" => return Ok(midnight.saturating_sub(86_400)),
        _ => {}
    }
    if let Some(unit) = v.chars().last().and_then(|c| match c {
        'm' => Some(60),
        'h' => Some(3600),
        'd' => Some(86_400),
        _ => None,
    }) {
        if let Ok(n) = v[..v.len() - 1].parse::<u64>() {
            return Ok(now.saturating_sub(n.saturating_mul(unit)));
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        let secs = d.and_time(chrono::NaiveTime::MIN).and_utc().timestamp();
        return u64::try_from(secs).map_err(|_| bad());
    }
    chrono::DateTime::parse_from_rfc3339(v)
        .ok()
        .and_then(|t| u64::try_from(t.timestamp()).ok())
        .ok_or_else(bad)
}
