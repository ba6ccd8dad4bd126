//! `shoal usage`: the server's usage ledger from the terminal, read straight
//! from its database (no server needed), with `/v1/usage`'s filters: a
//! listing, sums per group, or each API key against its quota; with the
//! config's `[prices.MODEL]`, what the traffic would have cost.
use std::path::PathBuf;

use anyhow::{Context, Result};
use shoal_api::ledger::{self, Ledger, LedgerEntry, UsageQuery};

use crate::config;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML config file (for the store's location, the API keys and `[prices.MODEL]`).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The server's store (default: the config's server.db, else the platform
    /// data directory) [env: SHOAL_DB].
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// From this moment: Unix seconds, now, today, yesterday (UTC), a span
    /// ago (90m, 24h, 7d), a date (2026-12-01) or an RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// Up to (not including) this moment, in the same forms as --since.
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    /// A dialect's short name (chat, messages, ollama …) or ledger name (openai.chat …).
    #[arg(long)]
    pub dialect: Option<String>,
    /// The engine's reason (stop, length, timeout …) or the dialect's word.
    #[arg(long)]
    pub finish: Option<String>,
    /// The API key's name.
    #[arg(long)]
    pub client: Option<String>,
    /// The node that received the request.
    #[arg(long)]
    pub node: Option<String>,
    /// One chat turn's requests (the `x-shoal-turn` its client sent).
    #[arg(long)]
    pub turn: Option<String>,
    /// Sum per hour, day, week, model, client, dialect, node or finish.
    #[arg(long, value_name = "BY")]
    pub group_by: Option<String>,
    /// Most requests listed (default 50).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Continue a listing after this cursor.
    #[arg(long)]
    pub cursor: Option<i64>,
    /// Each API key's tokens today against its daily quota.
    #[arg(long, conflicts_with = "group_by")]
    pub keys: bool,
    /// Print JSON, as /v1/usage does.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV (every request the filters select unless --limit is given).
    #[arg(long)]
    pub csv: bool,
}

pub fn run(a: Args) -> Result<()> {
    let mut flags = config::Flags::default();
    flags.config = a.config.clone();
    if let Some(db) = &a.db {
        flags.set("server.db", &db.to_string_lossy())?;
    }
    let cfg = config::resolve(&flags)?.config;
    let db = cfg.db_path()?;
    anyhow::ensure!(
        db.exists(),
        "no usage ledger at {} (the server has not run with this store yet)",
        db.display()
    );
    let ledger = Ledger::open(&db, cfg.retention(), shoal_api::dialects::registry())
        .with_context(|| format!("opening the usage ledger in {}", db.display()))?;
    if a.keys {
        return print_keys(&ledger, &cfg, a.json);
    }
    let mut pairs: Vec<(&str, String)> = Vec::new();
    for (k, v) in [
        ("since", &a.since),
        ("until", &a.until),
        ("model", &a.model),
        ("dialect", &a.dialect),
        ("finish", &a.finish),
        ("client", &a.client),
        ("node", &a.node),
        ("turn", &a.turn),
        ("group_by", &a.group_by),
    ] {
        if let Some(v) = v {
            pairs.push((k, v.clone()));
        }
    }
    if let Some(c) = a.cursor {
        pairs.push(("cursor", c.to_string()));
    }
    match (a.limit, a.csv) {
        (Some(n), _) => pairs.push(("limit", n.to_string())),
        (None, false) => pairs.push(("limit", "50".into())),
        (None, true) => {}
    }
    let q = UsageQuery::parse(
        pairs.iter().map(|(k, v)| (*k, v.as_str())),
        ledger.dialects(),
    )
    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let page = ledger
        .query(&q)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let entries = page.entries();
    let prices = &cfg.prices;
    if let Some(by) = q.group_by {
        let groups = ledger::grouped(&entries, by, prices);
        if a.json {
            println!("{}", serde_json::to_string_pretty(&groups)?);
        } else if a.csv {
            print!("{}", ledger::grouped_csv(&groups, !prices.is_empty()));
        } else {
            print!("{}", groups_table(&groups, !prices.is_empty()));
            print!("{}", cost_line(&entries, prices));
        }
        return Ok(());
    }
    if a.csv {
        print!("{}", ledger::csv(&entries));
    } else if a.json {
        let data: Vec<_> = page
            .entries
            .iter()
            .map(|(seq, e)| {
                let mut v = e.to_json_priced(prices);
                v["cursor"] = (*seq).into();
                v
            })
            .collect();
        let out = serde_json::json!({"data": data, "has_more": page.has_more,
                                     "next_cursor": page.next_cursor()});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", entries_table(&entries, prices));
        print!("{}", cost_line(&entries, prices));
        if let Some(c) = page.next_cursor() {
            println!("(more: --cursor {c})");
        }
    }
    Ok(())
}

/// A cost as the tables show it: the prices' own unit, to a millionth
/// (a local request often costs less than a cent).
fn money(x: f64) -> String {
    format!("{x:.6}")
}

/// With prices set, the listed requests' cost and the models it leaves out.
fn cost_line(entries: &[LedgerEntry], prices: &ledger::Prices) -> String {
    if prices.is_empty() {
        return String::new();
    }
    let (cost, unpriced) = ledger::total_cost(entries, prices);
    let mut line = format!(
        "cost at the configured prices: {} (input {}, cached input {}, output {})",
        money(cost.total()),
        money(cost.input),
        money(cost.cached_input),
        money(cost.output)
    );
    if !unpriced.is_empty() {
        line.push_str(&format!("; no price for {}", unpriced.join(", ")));
    }
    line.push('\n');
    line
}

/// Left-aligned text columns, then right-aligned numbers, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>], text_columns: usize) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i < text_columns {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

fn entries_table(entries: &[LedgerEntry], prices: &ledger::Prices) -> String {
    let mut header = vec![
        "time (UTC)",
        "dialect",
        "model",
        "client",
        "status",
        "finish",
        "prompt",
        "cached",
        "completion",
        "reasoning",
    ];
    let priced = !prices.is_empty();
    if priced {
        header.push("cost");
    }
    let mut total = shoal_engine::Usage::default();
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let u = e.usage();
            total += u;
            let cost = priced.then(|| e.cost(prices).map_or("-".into(), |c| money(c.total())));
            let mut row = vec![
                shoal_engine::template::strftime_utc(
                    "%Y-%m-%d %H:%M:%S",
                    i64::try_from(e.created).unwrap_or(i64::MAX),
                ),
                e.dialect.ledger_name().to_string(),
                e.model.clone(),
                e.facts.client.clone().unwrap_or_else(|| "-".into()),
                e.status.to_string(),
                e.finish().map_or("error", |f| f.as_str()).to_string(),
                u.prompt_tokens.to_string(),
                u.cached_tokens.to_string(),
                u.completion_tokens.to_string(),
                u.reasoning_tokens.to_string(),
            ];
            row.extend(cost);
            row
        })
        .collect();
    let mut out = table(&header, &rows, 6);
    out.push_str(&format!(
        "{} requests: {} prompt tokens ({} cached, {}), {} completion tokens ({} reasoning)\n",
        entries.len(),
        total.prompt_tokens,
        total.cached_tokens,
        percent(total.cached_tokens as u64, total.prompt_tokens as u64),
        total.completion_tokens,
        total.reasoning_tokens,
    ));
    out
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn groups_table(groups: &[serde_json::Value], priced: bool) -> String {
    let n = |g: &serde_json::Value, k: &str| g[k].as_u64().unwrap_or(0);
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            let mut row = vec![g["key"].as_str().unwrap_or("-").to_string()];
            row.extend(ledger::GROUP_FIELDS.iter().map(|k| n(g, k).to_string()));
            row.insert(4, percent(n(g, "cached_tokens"), n(g, "prompt_tokens")));
            if priced {
                row.push(money(g["cost"]["total"].as_f64().unwrap_or(0.0)));
            }
            row
        })
        .collect();
    let mut header = vec![
        "group",
        "requests",
        "prompt",
        "cached",
        "cache hit",
        "completion",
        "reasoning",
        "total",
    ];
    if priced {
        header.push("cost");
    }
    table(&header, &rows, 1)
}

fn print_keys(ledger: &Ledger, cfg: &config::Config, json: bool) -> Result<()> {
    let access = cfg.access()?;
    let mut listed = Vec::new();
    for k in access.keys() {
        let (used, _) = ledger
            .tokens_today(&k.name)
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        listed.push((k, used));
    }
    if json {
        let data: Vec<_> = listed
            .iter()
            .map(|(k, used)| {
                serde_json::json!({"name": k.name, "tokens_today": used,
                    "tokens_per_day": k.tokens_per_day,
                    "requests_per_minute": k.requests_per_minute})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&data)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|(k, used)| {
            let quota = k.tokens_per_day.map_or("-".into(), |q| q.to_string());
            let share = k.tokens_per_day.map_or("-".into(), |q| percent(*used, q));
            let rpm = k.requests_per_minute.map_or("-".into(), |r| r.to_string());
            vec![k.name.clone(), used.to_string(), quota, share, rpm]
        })
        .collect();
    print!(
        "{}",
        table(
            &["key", "tokens today", "daily quota", "used", "requests/min"],
            &rows,
            1
        )
    );
    Ok(())
}
