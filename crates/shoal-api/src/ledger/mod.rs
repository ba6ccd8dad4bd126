//! The usage ledger: one record per request the server answers, written to
//! SQLite (the conversation store's file, or memory without one) before the
//! request's final event goes out. A record keeps the engine's own
//! `Completion`s plus the request's facts; each dialect's words and usage
//! object are rendered from them when read ([`crate::wire`]), so what the
//! ledger shows is what the client was sent. `/v1/usage` (`crate::usage`)
//! and `shoal usage` query it.

mod entry;
mod query;
mod report;
mod store;

pub use entry::*;
pub use query::*;
pub use report::*;
pub use store::*;

#[cfg(test)]
mod tests {
    use super::utc_key;

    /// A request to `model` with one choice that used `u`.
    fn entry(model: &str, u: shoal_engine::Usage) -> super::LedgerEntry {
        super::LedgerEntry {
            id: format!("id-{model}"),
            dialect: crate::dialects::openai_chat::DIALECT,
            model: model.into(),
            created: 0,
            stream: false,
            per_prompt: 1,
            completions: vec![shoal_engine::Completion {
                finish: shoal_engine::FinishReason::Stop,
                usage: u,
                timings: Default::default(),
            }],
            facts: Default::default(),
            backend: String::new(),
            status: 200,
            error: None,
        }
    }

    /// Groups and totals price cached prompt tokens at the cached price,
    /// the rest of the prompt at the input price and every completion token
    /// (reasoning among them) at the output price; a model without a price
    /// adds nothing and is named.
    #[test]
    fn costs_follow_the_prices_of_each_rows_model() {
        use super::{grouped, total_cost, GroupBy, Prices};
        use shoal_client::metadata::Price;
        use shoal_engine::Usage;
        let mut prices = Prices::new();
        prices.insert(
            "a".into(),
            Price {
                input_per_mtok: 2.0,
                output_per_mtok: 10.0,
                cached_input_per_mtok: Some(0.5),
            },
        );
        let u = |prompt, cached, completion, reasoning| Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            reasoning_tokens: reasoning,
            ..Usage::default()
        };
        let mut refused = entry("", Usage::default());
        refused.completions.clear();
        let entries = [
            entry("a", u(1_000_000, 400_000, 100_000, 60_000)),
            entry("a", u(500_000, 0, 0, 0)),
            entry("b", u(7, 0, 7, 0)),
            refused,
        ];
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let (total, unpriced) = total_cost(&entries, &prices);
        // 1.1M uncached × 2 + 0.4M cached × 0.5 + 0.1M output × 10, per million.
        assert!(close(total.input, 2.2), "{total:?}");
        assert!(close(total.cached_input, 0.2), "{total:?}");
        assert!(close(total.output, 1.0), "{total:?}");
        assert_eq!(unpriced, ["b"]);
        let groups = grouped(&entries, GroupBy::Model, &prices);
        let cost = |key: &str| {
            groups
                .iter()
                .find(|g| g["key"] == key)
                .map(|g| g["cost"].clone())
                .unwrap_or_else(|| panic!("no group {key}: {groups:?}"))
        };
        let of = |key: &str, part: &str| cost(key)[part].as_f64().unwrap_or(f64::NAN);
        assert!(close(of("a", "total"), 3.4), "{groups:?}");
        assert!(close(of("a", "cached_input"), 0.2), "{groups:?}");
        assert_eq!(of("b", "total"), 0.0, "no price adds nothing");
        // Without prices nothing speaks of cost.
        let bare = grouped(&entries, GroupBy::Model, &Prices::new());
        assert!(bare.iter().all(|g| g.get("cost").is_none()), "{bare:?}");
        assert_eq!(
            super::grouped_csv(&bare, false).lines().next(),
            Some("key,requests,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,total_tokens")
        );
        let csv = super::grouped_csv(&groups, true);
        assert!(
            csv.lines()
                .next()
                .is_some_and(|h| h.ends_with(",total_tokens,cost")),
            "{csv}"
        );
        let a = csv
            .lines()
            .find(|l| l.starts_with("a,2,"))
            .unwrap_or_default();
        let last = a.rsplit(',').next().and_then(|c| c.parse::<f64>().ok());
        assert!(last.is_some_and(|c| close(c, 3.4)), "{csv}");
    }

    #[test]
    fn a_value_outside_its_choices_is_refused_with_the_choices() {
        let refused = |k: &str, v: &str| {
            let e = super::UsageQuery::parse([(k, v)], crate::dialects::registry()).expect_err(k);
            (e.param, e.message)
        };
        assert_eq!(
            refused("group_by", "month"),
            (
                "group_by".to_string(),
                "'group_by' must be day, hour, week, model, client, dialect, node, served_by or \
                 finish, got \"month\""
                    .to_string()
            )
        );
        assert_eq!(
            refused("scope", "all").1,
            "'scope' must be node or cluster, got \"all\""
        );
        assert_eq!(
            refused("format", "xml").1,
            "'format' must be json or csv, got \"xml\""
        );
        let q = super::UsageQuery::parse(
            [
                ("group_by", "served_by"),
                ("scope", "cluster"),
                ("format", "csv"),
            ],
            crate::dialects::registry(),
        )
        .expect("valid");
        assert_eq!(q.group_by, Some(super::GroupBy::ServedBy));
        assert!(q.cluster && q.csv);
    }

    #[test]
    fn instants_in_every_accepted_form() {
        use super::instant;
        assert_eq!(instant("since", "1700000000").unwrap(), 1_700_000_000);
        assert_eq!(instant("since", "2026-12-02").unwrap(), 1_796_169_600);
        assert_eq!(
            instant("since", "2026-12-02T01:00:00+01:00").unwrap(),
            1_796_169_600
        );
        let today = instant("since", "today").unwrap();
        assert_eq!(today % 86_400, 0);
        assert_eq!(instant("since", "yesterday").unwrap(), today - 86_400);
        let now = instant("until", "now").unwrap();
        let day_ago = instant("since", "24h").unwrap();
        // `now` is read twice; a second may pass between.
        assert!((now - day_ago).abs_diff(86_400) <= 1);
        for bad in ["soon", "-5", "12x", "2026-13-01", ""] {
            let e = instant("since", bad).expect_err(bad);
            assert_eq!(e.param, "since", "{bad}");
        }
    }

    #[test]
    fn utc_keys_are_calendar_dates() {
        assert_eq!(utc_key(0, false), "1970-01-01");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc_key(1_709_210_096, true), "2024-02-29T12");
        // 2026-12-02 00:00:00 UTC.
        assert_eq!(utc_key(1_796_169_600, false), "2026-12-02");
    }

    #[test]
    fn a_week_is_keyed_by_its_monday() {
        use super::week_key;
        // 1970-01-01 was a Thursday; its partial week is keyed by the epoch.
        assert_eq!(week_key(0), "1970-01-01");
        // Wednesday 2026-12-02 and Sunday 2026-12-06 are in the week of Monday 2026-11-30;
        // Monday 2026-12-07 starts the next.
        assert_eq!(week_key(1_796_169_600), "2026-11-30");
        assert_eq!(week_key(1_796_169_600 + 4 * 86_400 + 86_399), "2026-11-30");
        assert_eq!(week_key(1_796_169_600 + 5 * 86_400), "2026-12-07");
        // 2024-02-29 (a Thursday) is in the week of Monday 2024-02-26.
        assert_eq!(week_key(1_709_210_096), "2024-02-26");
    }
}
