//! What a query's entries become: sums per group (with cost, where prices
//! are set) and CSV exports.

use serde_json::{json, Value};
use shoal_client::metadata::Cost;
use shoal_engine::Usage;

use super::entry::*;
use super::query::GroupBy;

/// The fields of a `group_by` sum, in CSV column order.
pub const GROUP_FIELDS: [&str; 6] = [
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "total_tokens",
];

/// `group_by` sums as CSV: the key, then [`GROUP_FIELDS`], then — when
/// `priced` (prices are set) — the group's total `cost`.
pub fn grouped_csv(groups: &[Value], priced: bool) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    let cost_column = priced.then_some("cost");
    // Writing to memory cannot fail.
    let _ = w.write_record(
        std::iter::once("key")
            .chain(GROUP_FIELDS)
            .chain(cost_column),
    );
    for g in groups {
        let key = g["key"].as_str().unwrap_or_default().to_string();
        let values = GROUP_FIELDS.map(|k| g[k].as_u64().unwrap_or(0).to_string());
        let cost = priced.then(|| g["cost"]["total"].as_f64().unwrap_or(0.0).to_string());
        let _ = w.write_record(std::iter::once(key).chain(values).chain(cost));
    }
    String::from_utf8_lossy(&w.into_inner().unwrap_or_default()).into_owned()
}

/// What `entries` would have cost at `prices` (rows of a model without a
/// price add nothing), and those models by name, so an answer that shows
/// the cost says what it leaves out.
pub fn total_cost(entries: &[LedgerEntry], prices: &Prices) -> (Cost, Vec<String>) {
    let mut total = Cost::default();
    let mut unpriced = std::collections::BTreeSet::new();
    for e in entries {
        match e.cost(prices) {
            Some(c) => total += c,
            // A request refused before naming a model has none to price.
            None if !e.model.is_empty() => {
                unpriced.insert(e.model.clone());
            }
            None => {}
        }
    }
    (total, unpriced.into_iter().collect())
}

/// `YYYY-MM-DD` (and `THH` with `hour`) of Unix seconds, in UTC.
pub(crate) fn utc_key(secs: u64, hour: bool) -> String {
    let format = if hour { "%Y-%m-%dT%H" } else { "%Y-%m-%d" };
    shoal_engine::template::strftime_utc(format, i64::try_from(secs).unwrap_or(i64::MAX))
}

/// The UTC week of `secs`, as the date of the Monday it starts on.
pub(crate) fn week_key(secs: u64) -> String {
    const DAY: u64 = 86_400;
    let days = secs / DAY;
    // 1970-01-01 was a Thursday, three days after a Monday (that first
    // partial week is keyed by the epoch itself).
    let monday = days.saturating_sub((days + 3) % 7);
    utc_key(monday * DAY, false)
}

/// Sums per group: requests and each kind of token, as every dialect counts
/// them (each prompt once per request), and with prices set, what the
/// group's priced requests would have cost.
pub fn grouped(entries: &[LedgerEntry], by: GroupBy, prices: &Prices) -> Vec<Value> {
    let mut groups: std::collections::BTreeMap<String, (u64, Usage, Cost)> = Default::default();
    for e in entries {
        let key = match by {
            GroupBy::Day => utc_key(e.created, false),
            GroupBy::Hour => utc_key(e.created, true),
            GroupBy::Week => week_key(e.created),
            GroupBy::Model => e.model.clone(),
            GroupBy::Dialect => e.dialect.ledger_name().to_string(),
            GroupBy::Finish => e.finish_name().to_string(),
            GroupBy::Client => e.facts.client.clone().unwrap_or_default(),
            GroupBy::Node => e.facts.node.clone().unwrap_or_default(),
            GroupBy::ServedBy => e
                .facts
                .ran_on
                .clone()
                .or_else(|| e.facts.node.clone())
                .unwrap_or_default(),
        };
        let g = groups.entry(key).or_default();
        g.0 += 1;
        g.1 += e.usage();
        if let Some(c) = e.cost(prices) {
            g.2 += c;
        }
    }
    groups
        .into_iter()
        .map(|(key, (requests, u, cost))| {
            let mut g = json!({"key": key, "requests": requests, "prompt_tokens": u.prompt_tokens,
                   "cached_tokens": u.cached_tokens, "completion_tokens": u.completion_tokens,
                   "reasoning_tokens": u.reasoning_tokens, "total_tokens": u.total_tokens()});
            if !prices.is_empty() {
                g["cost"] = cost.to_json();
            }
            g
        })
        .collect()
}

/// The entries as CSV, one row each with the engine's reason, usage and
/// the first choice's timings (as the log in the UI shows them).
pub fn csv(entries: &[LedgerEntry]) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    let header = [
        "id",
        "created",
        "dialect",
        "endpoint",
        "model",
        "backend",
        "stream",
        "status",
        "finish",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "reasoning_tokens",
        "image_tokens",
        "total_tokens",
        "client",
        "node",
        "turn",
        "queue_ms",
        "ttft_ms",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "total_ms",
    ];
    // Writing to memory cannot fail.
    let _ = w.write_record(header);
    for e in entries {
        let u = e.usage();
        let t = e.timings();
        let _ = w.write_record([
            e.id.clone(),
            e.created.to_string(),
            e.dialect.ledger_name().to_string(),
            e.facts.endpoint.clone(),
            e.model.clone(),
            e.backend.clone(),
            e.stream.to_string(),
            e.status.to_string(),
            e.finish_name().to_string(),
            u.prompt_tokens.to_string(),
            u.cached_tokens.to_string(),
            u.completion_tokens.to_string(),
            u.reasoning_tokens.to_string(),
            u.image_tokens.to_string(),
            u.total_tokens().to_string(),
            e.facts.client.clone().unwrap_or_default(),
            e.facts.node.clone().unwrap_or_default(),
            e.facts.turn.clone().unwrap_or_default(),
            t.queue_ms.to_string(),
            t.ttft_ms.to_string(),
            t.prefill_tokens_per_s.to_string(),
            t.decode_tokens_per_s.to_string(),
            t.total_ms.to_string(),
        ]);
    }
    let bytes = w.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}
