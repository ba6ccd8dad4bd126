//! The usage ledger: one record per request the server answers, written to
//! SQLite (the conversation store's file, or memory without one) before the
//! request's final event goes out. A record keeps the engine's own
//! `Completion`s plus the request's facts; each dialect's words and usage
//! object are rendered from them when read ([`crate::wire`]), so what the
//! ledger shows is what the client was sent. `/v1/usage` (`crate::usage`)
//! and `shoal usage` query it.
use std::sync::{Arc, Mutex, OnceLock};

use crate::dialect::{Dialect, Registry};
use serde_json::{json, Value};
use shoal_client::metadata::{Cost, Price};
use shoal_engine::{Completion, FinishReason, Timings, Usage};
use shoal_store::{ChoiceRow, UsageFilter, UsageLog, UsageRow};

use crate::error::ApiError;
use crate::wire;

/// One answered request.
#[derive(Clone, Debug)]
pub struct LedgerEntry {
    pub id: String,
    pub dialect: Dialect,
    pub model: String,
    /// Unix seconds.
    pub created: u64,
    pub stream: bool,
    /// Consecutive choices that share a prompt (the request's `n`).
    pub per_prompt: usize,
    /// The engine's record of each choice that ended, in choice order
    /// (none for a request refused before generating).
    pub completions: Vec<Completion>,
    /// Who asked and how, and who answered.
    pub facts: Facts,
    /// The engine that ran it (`mlx`, `llama.cpp`; empty if none did).
    pub backend: String,
    /// The HTTP status the response went out with.
    pub status: u16,
    /// Why a request ended in an error response, in the words sent.
    pub error: Option<String>,
}

/// Per-million-token prices by model, under the name the ledger records
/// (the one clients ask for): the server's `[prices.MODEL]`, for what the
/// same traffic would have cost there.
pub type Prices = std::collections::BTreeMap<String, Price>;

/// A request's facts, known before any handler runs.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub endpoint: String,
    /// The API key's name (never the key itself).
    pub client: Option<String>,
    pub user_agent: Option<String>,
    pub origin: Option<String>,
    /// The node that received the request.
    pub node: Option<String>,
    /// The node that ran it, when another node received it.
    pub ran_on: Option<String>,
}

/// Response header naming the ledger id a generation was recorded under, so
/// a node that forwarded the request can record it under the same id.
pub const REQUEST_ID_HEADER: &str = "x-shoal-request-id";
/// Headers a node adds to a request it forwards (trusted only on a request
/// whose cluster signature checks out): who received it and from whom.
pub const RECEIVED_BY_HEADER: &str = "x-shoal-received-by";
pub const CLIENT_HEADER: &str = "x-shoal-client";
pub const ORIGIN_HEADER: &str = "x-shoal-origin";

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

    /// The engine's reason for the first choice; `error` for a request
    /// refused before generating.
    fn finish_name(&self) -> &'static str {
        self.finish().map_or("error", FinishReason::as_str)
    }

    /// What this request would have cost at `prices`; `None` when its
    /// model has no price.
    pub fn cost(&self, prices: &Prices) -> Option<Cost> {
        let p = prices.get(&self.model)?;
        let u = self.usage();
        Some(p.cost(
            u.prompt_tokens as u64,
            u.cached_tokens as u64,
            u.completion_tokens as u64,
        ))
    }

    /// The entry as `/v1/usage` lists it, with its `cost` when prices are
    /// set (`null` for a model without one).
    pub fn to_json_priced(&self, prices: &Prices) -> Value {
        let mut v = self.to_json();
        if !prices.is_empty() {
            v["cost"] = self.cost(prices).map_or(Value::Null, |c| c.to_json());
        }
        v
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
            "endpoint": self.facts.endpoint,
            "model": self.model,
            "backend": self.backend,
            "created": self.created,
            "stream": self.stream,
            "status": self.status,
            "finish_reasons": self.finish_reasons(),
            "engine_finish_reasons": self.completions.iter().map(|c| c.finish.as_str()).collect::<Vec<_>>(),
            "stop_sequences": self.completions.iter().map(|c| match &c.finish {
                FinishReason::StopSequence(s) => Some(s.as_str()),
                _ => None,
            }).collect::<Vec<_>>(),
            "error": self.error,
            "usage": wire::usage_json(self.dialect, &self.usage()),
            // The same counts in no dialect's words, for readers of every dialect.
            "tokens": {
                "prompt": self.usage().prompt_tokens,
                "cached": self.usage().cached_tokens,
                // Of `cached`, what came from the prefix cache's disk tier.
                "cached_disk": self.usage().cached_disk_tokens,
                // Written at the client's cache breakpoints (Anthropic's cache_control).
                "cache_write": self.usage().cache_write_tokens,
                "cache_write_1h": self.usage().cache_write_1h_tokens,
                "completion": self.usage().completion_tokens,
                "reasoning": self.usage().reasoning_tokens,
                "total": self.usage().total_tokens(),
            },
            "queue_ms": t.queue_ms,
            "ttft_ms": t.ttft_ms,
            "decode_tokens_per_s": t.decode_tokens_per_s,
            "prefill_tokens_per_s": t.prefill_tokens_per_s,
            // Speculative decoding: drafts checked and kept (0 and 0 without).
            "draft_tokens": self.completions.iter().map(|c| c.timings.draft_tokens).sum::<usize>(),
            "draft_accepted": self.completions.iter().map(|c| c.timings.draft_accepted).sum::<usize>(),
            "client": self.facts.client,
            "user_agent": self.facts.user_agent,
            "origin": self.facts.origin,
            "node": self.facts.node,
            "ran_on": self.facts.ran_on,
        })
    }

    fn to_row(&self) -> UsageRow {
        let u = self.usage();
        let mut finishes: Vec<String> = self
            .completions
            .iter()
            .flat_map(|c| {
                let words = self.dialect.finish_terms(&c.finish).terms();
                std::iter::once(c.finish.as_str().to_string()).chain(words)
            })
            .collect();
        if self.completions.is_empty() {
            finishes.push("error".into());
        }
        finishes.sort();
        finishes.dedup();
        UsageRow {
            seq: 0,
            id: self.id.clone(),
            created_ms: i64::try_from(self.created)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000),
            dialect: self.dialect.ledger_name().into(),
            endpoint: self.facts.endpoint.clone(),
            model: self.model.clone(),
            backend: self.backend.clone(),
            stream: self.stream,
            status: self.status,
            finishes,
            client: self.facts.client.clone(),
            user_agent: self.facts.user_agent.clone(),
            origin: self.facts.origin.clone(),
            node: self.facts.node.clone(),
            ran_on: self.facts.ran_on.clone(),
            prompt_tokens: u.prompt_tokens as u64,
            cached_tokens: u.cached_tokens as u64,
            completion_tokens: u.completion_tokens as u64,
            reasoning_tokens: u.reasoning_tokens as u64,
            per_prompt: u32::try_from(self.per_prompt).unwrap_or(u32::MAX),
            error: self.error.clone(),
            choices: self.completions.iter().map(choice_row).collect(),
        }
    }

    fn from_row(r: UsageRow, dialects: Registry) -> Option<LedgerEntry> {
        let dialect = dialects.parse(&r.dialect)?;
        let completions = r
            .choices
            .into_iter()
            .map(|c| completion(&r.id, c))
            .collect::<Option<Vec<_>>>()?;
        Some(LedgerEntry {
            id: r.id,
            dialect,
            model: r.model,
            created: u64::try_from(r.created_ms / 1000).unwrap_or(0),
            stream: r.stream,
            per_prompt: r.per_prompt.max(1) as usize,
            completions,
            facts: Facts {
                endpoint: r.endpoint,
                client: r.client,
                user_agent: r.user_agent,
                origin: r.origin,
                node: r.node,
                ran_on: r.ran_on,
            },
            backend: r.backend,
            status: r.status,
            error: r.error,
        })
    }
}

/// One choice's engine record as the store keeps it.
fn choice_row(c: &Completion) -> ChoiceRow {
    let n = |v: usize| v as u64;
    ChoiceRow {
        finish: c.finish.as_str().into(),
        finish_detail: c.finish.detail(),
        prompt_tokens: n(c.usage.prompt_tokens),
        cached_tokens: n(c.usage.cached_tokens),
        cached_disk_tokens: n(c.usage.cached_disk_tokens),
        cache_write_tokens: n(c.usage.cache_write_tokens),
        cache_write_1h_tokens: n(c.usage.cache_write_1h_tokens),
        completion_tokens: n(c.usage.completion_tokens),
        reasoning_tokens: n(c.usage.reasoning_tokens),
        queue_ms: c.timings.queue_ms,
        ttft_ms: c.timings.ttft_ms,
        prefill_tokens_per_s: c.timings.prefill_tokens_per_s,
        decode_tokens_per_s: c.timings.decode_tokens_per_s,
        total_ms: c.timings.total_ms,
        draft_tokens: n(c.timings.draft_tokens),
        draft_accepted: n(c.timings.draft_accepted),
    }
}

/// The engine record back from its row; `None` (and a warning) for a
/// finish this program does not know (a newer node's).
fn completion(id: &str, c: ChoiceRow) -> Option<Completion> {
    let Some(finish) = FinishReason::from_parts(&c.finish, c.finish_detail.as_deref()) else {
        tracing::warn!(id, finish = %c.finish, "ledger row with an unknown finish skipped");
        return None;
    };
    let n = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Some(Completion {
        finish,
        usage: Usage {
            prompt_tokens: n(c.prompt_tokens),
            cached_tokens: n(c.cached_tokens),
            cached_disk_tokens: n(c.cached_disk_tokens),
            cache_write_tokens: n(c.cache_write_tokens),
            cache_write_1h_tokens: n(c.cache_write_1h_tokens),
            completion_tokens: n(c.completion_tokens),
            reasoning_tokens: n(c.reasoning_tokens),
        },
        timings: Timings {
            queue_ms: c.queue_ms,
            ttft_ms: c.ttft_ms,
            prefill_tokens_per_s: c.prefill_tokens_per_s,
            decode_tokens_per_s: c.decode_tokens_per_s,
            total_ms: c.total_ms,
            draft_tokens: n(c.draft_tokens),
            draft_accepted: n(c.draft_accepted),
        },
    })
}

/// How long the ledger keeps its records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Records older than this many days go (0 = no age limit).
    pub days: u64,
    /// Past this many records the oldest go (0 = no cap).
    pub rows: usize,
}

/// The ledger: SQLite through one connection.
pub struct Ledger {
    log: Mutex<UsageLog>,
    retention: Retention,
    /// The dialects its rows may name (a row of one no longer served is
    /// skipped when read).
    dialects: Registry,
    /// Ids of requests generating now, each to be recorded when it ends.
    pending: Mutex<std::collections::HashSet<String>>,
    /// Woken whenever a row is written or a pending request ends.
    written: tokio::sync::Notify,
}

/// A request the ledger expects a row for ([`Ledger::expect`]); dropping it
/// says the request has ended, recorded or not.
pub struct Pending {
    ledger: Arc<Ledger>,
    id: String,
}

impl Drop for Pending {
    fn drop(&mut self) {
        lock(&self.ledger.pending).remove(&self.id);
        self.ledger.written.notify_waiters();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ledger {
    /// A ledger in memory (a server run without a store), holding at most
    /// `rows` records.
    pub fn in_memory(rows: usize, dialects: Registry) -> Self {
        let log = UsageLog::in_memory().expect("an in-memory SQLite database opens");
        Ledger {
            log: Mutex::new(log),
            retention: Retention { days: 0, rows },
            dialects,
            pending: Mutex::default(),
            written: tokio::sync::Notify::new(),
        }
    }

    /// The ledger in the database at `path`, kept for `retention`.
    pub fn open(
        path: &std::path::Path,
        retention: Retention,
        dialects: Registry,
    ) -> Result<Self, shoal_store::StoreError> {
        Ok(Ledger {
            log: Mutex::new(UsageLog::open(path)?),
            retention,
            dialects,
            pending: Mutex::default(),
            written: tokio::sync::Notify::new(),
        })
    }

    /// The dialects its rows may name.
    pub fn dialects(&self) -> Registry {
        self.dialects
    }

    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, UsageLog> {
        lock(&self.log)
    }

    /// Marks request `id` as generating: until the guard drops, a reader
    /// waiting for its row ([`Ledger::wait_for`]) waits rather than giving up.
    pub fn expect(self: &Arc<Self>, id: &str) -> Pending {
        lock(&self.pending).insert(id.to_string());
        Pending {
            ledger: self.clone(),
            id: id.to_string(),
        }
    }

    /// Writes `e`; it is on disk when this returns. A failed write is logged
    /// (the reply itself still goes out).
    pub fn record(&self, e: &LedgerEntry) {
        if let Err(error) = self.log().insert(&e.to_row()) {
            tracing::error!(id = %e.id, %error, "usage ledger write failed");
        }
        self.written.notify_waiters();
    }

    /// Writes a row as another node recorded it (a request this node
    /// forwarded there), unless this node already has that id.
    pub fn record_row(&self, row: &UsageRow) {
        let log = self.log();
        let written = match log.has(&row.id) {
            Ok(true) => Ok(0),
            Ok(false) => log.insert(row),
            Err(e) => Err(e),
        };
        if let Err(error) = written {
            tracing::error!(id = %row.id, %error, "usage ledger write failed");
        }
        drop(log);
        self.written.notify_waiters();
    }

    /// Sets the HTTP status of request `id` once its response is built.
    pub fn set_status(&self, id: &str, status: u16) {
        if let Err(error) = self.log().set_status(id, status) {
            tracing::error!(%id, %error, "usage ledger write failed");
        }
    }

    /// Prompt plus completion tokens `client` used in this UTC day, and the
    /// seconds until the day ends.
    pub fn tokens_today(&self, client: &str) -> Result<(u64, u64), ApiError> {
        let now = crate::ids::now_secs();
        let midnight = now - now % 86_400;
        Ok((
            self.tokens_since(client, midnight)?,
            midnight + 86_400 - now,
        ))
    }

    /// The entry for a response id.
    pub fn get(&self, id: &str) -> Option<LedgerEntry> {
        match self.log().get(id) {
            Ok(row) => row.and_then(|r| LedgerEntry::from_row(r, self.dialects)),
            Err(error) => {
                tracing::error!(%id, %error, "usage ledger read failed");
                None
            }
        }
    }

    /// Like [`Ledger::get`], but a request still generating (a client that
    /// hung up is recorded once the engine has stopped it) is waited for
    /// until its row is written or it ends unrecorded. `hang_guard` only
    /// bounds a wait that would otherwise never end; an id that is neither
    /// recorded nor generating is `None` at once.
    pub async fn wait_for(&self, id: &str, hang_guard: std::time::Duration) -> Option<LedgerEntry> {
        let deadline = tokio::time::Instant::now() + hang_guard;
        loop {
            // Registered before the checks, so a write between them wakes it.
            let woken = self.written.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Some(e) = self.get(id) {
                return Some(e);
            }
            if !lock(&self.pending).contains(id) {
                // Ended since the look above: its row may have landed.
                return self.get(id);
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return None;
            }
        }
    }

    /// Prompt plus completion tokens `client` used since `since` (Unix seconds).
    pub fn tokens_since(&self, client: &str, since: u64) -> Result<u64, ApiError> {
        let since_ms = i64::try_from(since)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000);
        self.log()
            .client_tokens_since(client, since_ms)
            .map_err(|e| ApiError::internal(format!("the usage ledger could not be read: {e}")))
    }

    /// Drops what the retention settings no longer keep.
    pub fn prune(&self) {
        let Retention { days, rows } = self.retention;
        let cutoff = (days > 0).then(|| {
            let now_ms = crate::ids::now_secs().saturating_mul(1000);
            i64::try_from(now_ms.saturating_sub(days.saturating_mul(86_400_000))).unwrap_or(0)
        });
        match self.log().prune(cutoff, rows) {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "usage ledger pruned"),
            Err(error) => tracing::error!(%error, "usage ledger prune failed"),
        }
    }

    /// Prunes now and then hourly, for as long as the ledger is in use.
    pub fn start_pruning(ledger: &Arc<Ledger>) {
        let weak = Arc::downgrade(ledger);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                every.tick().await;
                let Some(ledger) = weak.upgrade() else { return };
                // Pruning a long history may take a while: off the async threads.
                let _ = tokio::task::spawn_blocking(move || ledger.prune()).await;
            }
        });
    }

    /// The rows `q` selects, newest first (`q.filter.limit` applies to listings);
    /// and whether a listing stopped short of them all.
    pub fn rows(&self, q: &UsageQuery) -> Result<(Vec<UsageRow>, bool), ApiError> {
        let listing = q.group_by.is_none();
        let limit = q.filter.limit.filter(|_| listing);
        let filter = UsageFilter {
            // One more than asked, to know whether there is a next page.
            limit: limit.map(|n| n + 1),
            ..q.filter.clone()
        };
        let mut rows = self.log().select(&filter).map_err(|e| {
            tracing::error!(error = %e, "usage ledger read failed");
            ApiError::internal(format!("the usage ledger could not be read: {e}"))
        })?;
        let has_more = limit.is_some_and(|n| rows.len() > n);
        if let Some(n) = limit {
            rows.truncate(n);
        }
        Ok((rows, has_more))
    }

    /// The entries `q` selects, newest first, each with its cursor; and
    /// whether a listing stopped short of them all.
    pub fn query(&self, q: &UsageQuery) -> Result<Page, ApiError> {
        let (rows, has_more) = self.rows(q)?;
        Ok(Page::of(rows, has_more, self.dialects))
    }
}

/// One page of a query.
pub struct Page {
    /// Newest first, each with its cursor.
    pub entries: Vec<(i64, LedgerEntry)>,
    pub has_more: bool,
}

impl Page {
    pub(crate) fn of(rows: Vec<UsageRow>, has_more: bool, dialects: Registry) -> Page {
        let entries = rows
            .into_iter()
            .filter_map(|r| {
                let seq = r.seq;
                LedgerEntry::from_row(r, dialects).map(|e| (seq, e))
            })
            .collect();
        Page { entries, has_more }
    }

    pub fn entries(&self) -> Vec<LedgerEntry> {
        self.entries.iter().map(|(_, e)| e.clone()).collect()
    }

    /// The cursor that continues after this page.
    pub fn next_cursor(&self) -> Option<i64> {
        self.has_more
            .then(|| self.entries.last().map(|(seq, _)| *seq))
            .flatten()
    }
}

/// Set on a request's extensions by `usage::track`: the facts, the client name
/// the access check finds, and the id a generation is recorded under.
#[derive(Clone, Debug, Default)]
pub struct Tracked {
    pub facts: Facts,
    pub client: Arc<OnceLock<String>>,
    pub recorded: Arc<OnceLock<String>>,
}

impl Tracked {
    /// The facts with the client the access check found.
    pub fn facts(&self) -> Facts {
        Facts {
            client: self.client.get().cloned(),
            ..self.facts.clone()
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
    Client,
    Node,
    /// The node that ran the request (its receiver when that ran it).
    ServedBy,
}

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

/// `/v1/usage`'s query: filters, and a listing, a grouping or a CSV export.
#[derive(Clone, Debug, Default)]
pub struct UsageQuery {
    /// The rows it selects, in the store's terms: `since`/`until` (Unix
    /// seconds) in milliseconds, a dialect by its ledger name (`dialect`
    /// takes a short one too), `cursor` as `before`; `finish` is the
    /// engine's reason or the dialect's word, `client` the API key's name,
    /// `node` the one that received the request. `limit` is a listing's
    /// page size.
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
    ) -> Result<Self, crate::error::ApiError> {
        let number = |k: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| ApiError::param(k, format!("'{k}' must be a whole number, got {v:?}")))
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
                                ApiError::param(
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
                    return Err(ApiError::param(
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
fn one_of<T: Copy>(param: &str, v: &str, choices: &[(&str, T)]) -> Result<T, ApiError> {
    if let Some((_, t)) = choices.iter().find(|(name, _)| *name == v) {
        return Ok(*t);
    }
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let listed = match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(ApiError::param(
        param,
        format!("'{param}' must be {listed}, got {v:?}"),
    ))
}

/// A moment as `since` and `until` take it, in Unix seconds: a number of
/// seconds, `now`, `today` or `yesterday` (UTC midnight), a span ago
/// (`90m`, `24h`, `7d`), a UTC date (`2026-12-01`) or an RFC 3339 time.
pub fn instant(param: &str, v: &str) -> Result<u64, ApiError> {
    let now = chrono::Utc::now().timestamp().max(0) as u64;
    let midnight = now - now % 86_400;
    let bad = || {
        ApiError::param(
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

/// `YYYY-MM-DD` (and `THH` with `hour`) of Unix seconds, in UTC.
fn utc_key(secs: u64, hour: bool) -> String {
    let format = if hour { "%Y-%m-%dT%H" } else { "%Y-%m-%d" };
    shoal_engine::template::strftime_utc(format, i64::try_from(secs).unwrap_or(i64::MAX))
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

/// The entries as CSV, one row each with the engine's reason and usage.
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
        "client",
        "node",
    ];
    // Writing to memory cannot fail.
    let _ = w.write_record(header);
    for e in entries {
        let u = e.usage();
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
            e.facts.client.clone().unwrap_or_default(),
            e.facts.node.clone().unwrap_or_default(),
        ]);
    }
    let bytes = w.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

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
            (e.param.unwrap_or_default(), e.message)
        };
        assert_eq!(
            refused("group_by", "week"),
            (
                "group_by".to_string(),
                "'group_by' must be day, hour, model, client, dialect, node, served_by or \
                 finish, got \"week\""
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
            assert_eq!(e.param.as_deref(), Some("since"), "{bad}");
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
}
