//! The usage ledger: one record per request the server answers, written to
//! SQLite (the conversation store's file, or memory without one) before the
//! request's final event goes out. A record keeps the engine's own
//! `Completion`s plus the request's facts; each dialect's words and usage
//! object are rendered from them when read ([`crate::wire`]), so what the
//! ledger shows is what the client was sent. `/v1/usage` and `shoal usage`
//! query it.
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use shoal_client::Dialect;
use shoal_engine::{Completion, FinishReason, Timings, Usage};
use shoal_store::{UsageFilter, UsageLog, UsageRow};

use crate::error::{ApiError, ErrorShape};
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
            "queue_ms": t.queue_ms,
            "ttft_ms": t.ttft_ms,
            "decode_tokens_per_s": t.decode_tokens_per_s,
            "prefill_tokens_per_s": t.prefill_tokens_per_s,
            "client": self.facts.client,
            "user_agent": self.facts.user_agent,
            "origin": self.facts.origin,
            "node": self.facts.node,
            "ran_on": self.facts.ran_on,
        })
    }

    fn to_row(&self) -> Result<UsageRow, serde_json::Error> {
        let u = self.usage();
        let mut finishes: Vec<String> = self
            .completions
            .iter()
            .map(|c| c.finish.as_str().to_string())
            .chain(self.finish_reasons())
            .flat_map(|w| {
                // `incomplete:max_output_tokens` is found by either half too.
                let halves: Vec<String> = w.split(':').map(str::to_owned).collect();
                std::iter::once(w).chain(halves)
            })
            .collect();
        if self.completions.is_empty() {
            finishes.push("error".into());
        }
        finishes.sort();
        finishes.dedup();
        let record = json!({
            "per_prompt": self.per_prompt,
            "completions": self.completions,
            "error": self.error,
        });
        Ok(UsageRow {
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
            record: serde_json::to_string(&record)?,
        })
    }

    fn from_row(r: UsageRow) -> Option<LedgerEntry> {
        #[derive(serde::Deserialize)]
        struct Record {
            per_prompt: usize,
            completions: Vec<Completion>,
            error: Option<String>,
        }
        let dialect = Dialect::ALL
            .into_iter()
            .find(|d| d.ledger_name() == r.dialect)?;
        let record: Record = match serde_json::from_str(&r.record) {
            Ok(rec) => rec,
            Err(e) => {
                tracing::warn!(id = %r.id, error = %e, "unreadable ledger record skipped");
                return None;
            }
        };
        Some(LedgerEntry {
            id: r.id,
            dialect,
            model: r.model,
            created: u64::try_from(r.created_ms / 1000).unwrap_or(0),
            stream: r.stream,
            per_prompt: record.per_prompt,
            completions: record.completions,
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
            error: record.error,
        })
    }
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
}

impl Ledger {
    /// A ledger in memory (a server run without a store), holding at most
    /// `rows` records.
    pub fn in_memory(rows: usize) -> Self {
        let log = UsageLog::in_memory().expect("an in-memory SQLite database opens");
        Ledger {
            log: Mutex::new(log),
            retention: Retention { days: 0, rows },
        }
    }

    /// The ledger in the database at `path`, kept for `retention`.
    pub fn open(
        path: &std::path::Path,
        retention: Retention,
    ) -> Result<Self, shoal_store::StoreError> {
        Ok(Ledger {
            log: Mutex::new(UsageLog::open(path)?),
            retention,
        })
    }

    fn log(&self) -> std::sync::MutexGuard<'_, UsageLog> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `e`; it is on disk when this returns. A failed write is logged
    /// (the reply itself still goes out).
    pub fn record(&self, e: &LedgerEntry) {
        let written = e
            .to_row()
            .map_err(|err| err.to_string())
            .and_then(|row| self.log().insert(&row).map_err(|err| err.to_string()));
        if let Err(error) = written {
            tracing::error!(id = %e.id, %error, "usage ledger write failed");
        }
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
    }

    /// The entry for a response id.
    pub fn get(&self, id: &str) -> Option<LedgerEntry> {
        match self.log().get(id) {
            Ok(row) => row.and_then(LedgerEntry::from_row),
            Err(error) => {
                tracing::error!(%id, %error, "usage ledger read failed");
                None
            }
        }
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
            let now_ms = crate::run::now_secs().saturating_mul(1000);
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

    /// The rows `q` selects, newest first (`q.limit` applies to listings);
    /// and whether a listing stopped short of them all.
    pub fn rows(&self, q: &UsageQuery) -> Result<(Vec<UsageRow>, bool), ApiError> {
        let listing = q.group_by.is_none();
        let limit = q.limit.filter(|_| listing);
        let ms = |t: u64| i64::try_from(t).unwrap_or(i64::MAX).saturating_mul(1000);
        let filter = UsageFilter {
            since_ms: q.since.map(ms),
            until_ms: q.until.map(ms),
            model: q.model.clone(),
            dialect: q.dialect.map(|d| d.ledger_name().to_string()),
            finish: q.finish.clone(),
            client: q.client.clone(),
            node: q.node.clone(),
            before: q.cursor,
            // One more than asked, to know whether there is a next page.
            limit: limit.map(|n| n + 1),
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
        Ok(Page::of(rows, has_more))
    }
}

/// One page of a query.
pub struct Page {
    /// Newest first, each with its cursor.
    pub entries: Vec<(i64, LedgerEntry)>,
    pub has_more: bool,
}

impl Page {
    fn of(rows: Vec<UsageRow>, has_more: bool) -> Page {
        let entries = rows
            .into_iter()
            .filter_map(|r| {
                let seq = r.seq;
                LedgerEntry::from_row(r).map(|e| (seq, e))
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

/// Set on a request's extensions by [`track`]: the facts, the client name
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

/// The generation endpoints, whose every answer is in the ledger.
fn generation_endpoint(path: &str) -> bool {
    matches!(
        path,
        "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/v1/messages"
    )
}

/// Middleware around the generation endpoints: notes the request's facts
/// for the handler, then records what the handler could not — the status of
/// an error response after generation began, or a request refused before it
/// (bad body, unknown model, missing key, full queue …) as an error record.
/// A request another node forwarded here carries that node's facts (who
/// received it, the key's name, the origin), taken only when its cluster
/// signature checks out.
pub async fn track(State(s): State<crate::AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let Some(dialect) = Dialect::for_path(&path).filter(|_| generation_endpoint(&path)) else {
        return next.run(req).await;
    };
    let own = s.node.identity().id.clone();
    let (mut req, forwarded) = match forwarded_facts(&s, req).await {
        Ok(pair) => pair,
        Err(resp) => return resp,
    };
    // (The request's body is not `Sync`, so no borrow of it may live
    // across the awaits below.)
    let (user_agent, origin) = {
        let header = |name: axum::http::HeaderName| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (
            header(axum::http::header::USER_AGENT),
            header(axum::http::header::ORIGIN),
        )
    };
    let tracked = Tracked {
        facts: match forwarded {
            Some(f) => Facts {
                endpoint: path,
                user_agent: f.user_agent.or(user_agent),
                ran_on: Some(own),
                ..f
            },
            None => Facts {
                endpoint: path,
                client: None,
                user_agent,
                origin,
                node: Some(own),
                ran_on: None,
            },
        },
        ..Tracked::default()
    };
    if let Some(client) = &tracked.facts.client {
        let _ = tracked.client.set(client.clone());
    }
    req.extensions_mut().insert(tracked.clone());
    let mut response = next.run(req).await;
    let status = response.status().as_u16();
    let ledger = s.ledger.clone();
    match tracked.recorded.get() {
        Some(id) => {
            if status != 200 {
                if let Err(error) = ledger.log().set_status(id, status) {
                    tracing::error!(%id, %error, "usage ledger write failed");
                }
            }
            if let Ok(v) = axum::http::HeaderValue::from_str(id) {
                response.headers_mut().insert(REQUEST_ID_HEADER, v);
            }
            response
        }
        None if status < 400 => response,
        None => {
            let (mut parts, body) = response.into_parts();
            let bytes = axum::body::to_bytes(body, 1 << 20)
                .await
                .unwrap_or_default();
            let message = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| {
                    v.pointer("/error/message")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            // A peer's refusal passed on keeps the peer's id.
            let id = parts
                .headers
                .get(REQUEST_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .map_or_else(|| crate::run::new_id("err"), str::to_owned);
            let entry = LedgerEntry {
                id,
                dialect,
                model: String::new(),
                created: crate::run::now_secs(),
                stream: false,
                per_prompt: 1,
                completions: Vec::new(),
                facts: tracked.facts(),
                backend: String::new(),
                status,
                error: Some(message),
            };
            ledger.record(&entry);
            if let Ok(v) = axum::http::HeaderValue::from_str(&entry.id) {
                parts.headers.insert(REQUEST_ID_HEADER, v);
            }
            Response::from_parts(parts, axum::body::Body::from(bytes))
        }
    }
}

/// The receiving node's facts on a request forwarded here, if its
/// signature checks out (the body is read for that and put back).
async fn forwarded_facts(
    s: &crate::AppState,
    req: Request,
) -> Result<(Request, Option<Facts>), Response> {
    if !req.headers().contains_key(crate::cluster::FORWARDED_HEADER) || s.cluster().is_none() {
        return Ok((req, None));
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, s.access.max_body_bytes).await else {
        return Err(crate::body::too_large(Some(s.access.max_body_bytes))
            .in_dialect(ErrorShape::for_path(parts.uri.path()))
            .into_response());
    };
    let verified = s
        .verify_peer(&parts.method, &parts.uri, &parts.headers, &bytes)
        .is_ok();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let facts = verified.then(|| Facts {
        endpoint: String::new(),
        client: header(CLIENT_HEADER),
        user_agent: header(axum::http::header::USER_AGENT.as_str()),
        origin: header(ORIGIN_HEADER),
        node: header(RECEIVED_BY_HEADER),
        ran_on: None,
    });
    Ok((
        Request::from_parts(parts, axum::body::Body::from(bytes)),
        facts,
    ))
}

/// What a peer asks of this node's ledger: one request's row, or the rows a
/// `/v1/usage` query selects (for `scope=cluster`).
#[derive(serde::Deserialize)]
pub struct PeerUsage {
    pub id: Option<String>,
    #[serde(default)]
    pub query: Vec<(String, String)>,
}

/// The control route behind attribution and `scope=cluster`.
pub const PEER_USAGE_PATH: &str = "/v1/cluster/usage";

/// `POST /v1/cluster/usage`: this node's rows for a peer (signed), or, on a
/// node in no cluster and open without a key (a pipeline's local stage),
/// for its parent node.
pub async fn peer_usage(State(s): State<crate::AppState>, req: Request) -> Response {
    let ask: PeerUsage = if s.cluster().is_some() || s.access.requires_key() {
        match <crate::cluster::Peer<PeerUsage> as axum::extract::FromRequest<_>>::from_request(
            req, &s,
        )
        .await
        {
            Ok(crate::cluster::Peer(ask)) => ask,
            Err(e) => return e.into_response(),
        }
    } else {
        let bytes = axum::body::to_bytes(req.into_body(), s.access.max_body_bytes)
            .await
            .unwrap_or_default();
        match serde_json::from_slice(&bytes) {
            Ok(ask) => ask,
            Err(e) => {
                return ApiError::invalid(e.to_string())
                    .in_dialect(ErrorShape::OpenAi)
                    .into_response()
            }
        }
    };
    let rows = match &ask.id {
        Some(id) => s
            .ledger
            .log()
            .get(id)
            .map(|r| r.into_iter().collect())
            .map_err(|e| ApiError::internal(format!("the usage ledger could not be read: {e}"))),
        None => UsageQuery::parse(ask.query.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .and_then(|q| s.ledger.rows(&q).map(|(rows, _)| rows)),
    };
    match rows {
        Ok(rows) => axum::Json(json!({ "data": rows })).into_response(),
        Err(e) => e.in_dialect(ErrorShape::OpenAi).into_response(),
    }
}

/// Copies the record of a request this node forwarded from the node that
/// ran it (signed, through `cluster`) or from a local pipeline stage
/// (`cluster` none), once its answer has ended, so both ledgers hold it
/// under one id; `facts`, when given, replace the copy's request facts.
pub async fn copy_from_peer(
    ledger: Arc<Ledger>,
    cluster: Option<Arc<shoal_cluster::Cluster>>,
    addr: String,
    id: String,
    facts: Option<Facts>,
) {
    // The peer writes its record when the generation has stopped, which for
    // a client that hung up is a moment after the answer ended here.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let body = json!({ "id": id }).to_string().into_bytes();
        let fetched = async {
            let req = match &cluster {
                Some(c) => c.signed(reqwest::Method::POST, &addr, PEER_USAGE_PATH, body),
                None => reqwest::Client::new()
                    .post(format!("http://{addr}{PEER_USAGE_PATH}"))
                    .body(body),
            };
            let resp = req
                .header("content-type", "application/json")
                .send()
                .await?
                .error_for_status()?;
            resp.json::<Value>().await
        };
        match fetched.await {
            Ok(v) => {
                let mut rows: Vec<UsageRow> =
                    serde_json::from_value(v["data"].clone()).unwrap_or_default();
                for row in &mut rows {
                    if let Some(f) = &facts {
                        row.client = f.client.clone();
                        row.user_agent = f.user_agent.clone();
                        row.origin = f.origin.clone();
                        row.node = f.node.clone();
                        row.ran_on = f.ran_on.clone();
                    }
                    ledger.record_row(row);
                }
                if !rows.is_empty() {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(%id, %addr, %error, "could not copy a forwarded request's record");
                return;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(%id, %addr, "the node that ran a forwarded request has no record of it");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
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
    /// The API key's name.
    pub client: Option<String>,
    /// The node that received the request.
    pub node: Option<String>,
    /// Continue a listing after this cursor (a previous page's `next_cursor`).
    pub cursor: Option<i64>,
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
    ) -> Result<Self, crate::error::ApiError> {
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
                "client" => q.client = Some(v.to_string()),
                "node" => q.node = Some(v.to_string()),
                "cursor" => q.cursor = Some(number(k, v)?.min(i64::MAX as u64) as i64),
                "since" => q.since = Some(instant(k, v)?),
                "until" => q.until = Some(instant(k, v)?),
                "group_by" => {
                    q.group_by = Some(match v {
                        "day" => GroupBy::Day,
                        "hour" => GroupBy::Hour,
                        "model" => GroupBy::Model,
                        "dialect" => GroupBy::Dialect,
                        "finish" => GroupBy::Finish,
                        "client" => GroupBy::Client,
                        "node" => GroupBy::Node,
                        "served_by" => GroupBy::ServedBy,
                        _ => {
                            return Err(ApiError::param(
                                k,
                                format!(
                                    "'group_by' must be day, hour, model, client, dialect, node, \
                                     served_by or finish, got {v:?}"
                                ),
                            ))
                        }
                    })
                }
                "scope" => match v {
                    "node" => q.cluster = false,
                    "cluster" => q.cluster = true,
                    _ => {
                        return Err(ApiError::param(
                            k,
                            format!("'scope' must be node or cluster, got {v:?}"),
                        ))
                    }
                },
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
/// them (each prompt once per request).
pub fn grouped(entries: &[LedgerEntry], by: GroupBy) -> Vec<Value> {
    let mut groups: std::collections::BTreeMap<String, (u64, Usage)> = Default::default();
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

/// `/v1/usage`: the ledger's entries newest first (`limit`, default 100;
/// `cursor` continues a listing), filtered by `model`, `dialect`, `finish`,
/// `client`, `node`, `since` and `until`; summed with `group_by`; or
/// exported with `format=csv` (every entry the filter selects unless
/// `limit` is given). Bad parameters get a 400.
pub async fn handle(
    State(s): State<crate::AppState>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Response {
    let answer = async {
        let mut q = UsageQuery::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        if q.limit.is_none() && !q.csv {
            q.limit = Some(100);
        }
        let (page, missing) = if q.cluster {
            cluster_page(&s, &q, &pairs).await?
        } else {
            (s.ledger.query(&q)?, Vec::new())
        };
        if let Some(by) = q.group_by {
            let data = grouped(&page.entries(), by);
            return Ok::<_, ApiError>(
                axum::Json(json!({"object": "list", "data": data, "missing_nodes": missing}))
                    .into_response(),
            );
        }
        if q.csv {
            return Ok((
                [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
                csv(&page.entries()),
            )
                .into_response());
        }
        let data: Vec<Value> = page
            .entries
            .iter()
            .map(|(seq, e)| {
                let mut v = e.to_json();
                // A cursor pages one node's ledger.
                if !q.cluster {
                    v["cursor"] = json!(seq);
                }
                v
            })
            .collect();
        Ok(axum::Json(json!({
            "object": "list",
            "data": data,
            "has_more": page.has_more,
            "next_cursor": if q.cluster { None } else { page.next_cursor() },
            "missing_nodes": missing,
        }))
        .into_response())
    };
    answer
        .await
        .unwrap_or_else(|e| e.in_dialect(ErrorShape::OpenAi).into_response())
}

/// Every online node's rows for `q`, merged newest first; a request that
/// two nodes hold (received by one, run by the other) counts once. Returns
/// the page and the nodes that could not be asked.
async fn cluster_page(
    s: &crate::AppState,
    q: &UsageQuery,
    pairs: &[(String, String)],
) -> Result<(Page, Vec<String>), ApiError> {
    if q.cursor.is_some() {
        return Err(ApiError::param(
            "cursor",
            "a cursor pages one node's ledger; it does not go with scope=cluster",
        ));
    }
    let (mut rows, mut has_more) = s.ledger.rows(q)?;
    let mut missing = Vec::new();
    if let Some(cluster) = s.cluster() {
        let ask: Vec<(String, String)> = pairs
            .iter()
            .filter(|(k, _)| k != "scope" && k != "format")
            .cloned()
            .collect();
        let body = json!({ "query": ask }).to_string().into_bytes();
        let peers: Vec<_> = cluster
            .peers()
            .into_iter()
            .filter(|p| p.status == "online")
            .collect();
        let asks = peers.iter().map(|p| {
            let cluster = cluster.clone();
            let body = body.clone();
            let id = p.id.clone();
            async move {
                let addr = cluster.address_of(&id)?;
                let resp = cluster
                    .signed(reqwest::Method::POST, &addr, PEER_USAGE_PATH, body)
                    .header("content-type", "application/json")
                    .timeout(std::time::Duration::from_secs(30))
                    .send()
                    .await
                    .ok()?
                    .error_for_status()
                    .ok()?;
                let v: Value = resp.json().await.ok()?;
                serde_json::from_value::<Vec<UsageRow>>(v["data"].clone()).ok()
            }
        });
        for (peer, got) in peers.iter().zip(futures::future::join_all(asks).await) {
            match got {
                Some(r) => rows.extend(r),
                None => missing.push(peer.id.clone()),
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    rows.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.seq.cmp(&a.seq)));
    rows.retain(|r| seen.insert(r.id.clone()));
    if let Some(n) = q.limit.filter(|_| q.group_by.is_none()) {
        has_more |= rows.len() > n;
        rows.truncate(n);
    }
    Ok((Page::of(rows, has_more), missing))
}

/// `/v1/usage/keys`: each API key's use against its limits (names only).
pub async fn keys(State(s): State<crate::AppState>) -> Response {
    let now = crate::run::now_secs();
    let midnight = now - now % 86_400;
    let listed: Result<Vec<Value>, ApiError> = s
        .access
        .keys()
        .iter()
        .map(|k| {
            let used = s.ledger.tokens_since(&k.name, midnight)?;
            Ok(json!({
                "name": k.name,
                "tokens_today": used,
                "tokens_per_day": k.tokens_per_day,
                "requests_last_minute": s.limits.last_minute(&k.name),
                "requests_per_minute": k.requests_per_minute,
            }))
        })
        .collect();
    match listed {
        Ok(data) => axum::Json(json!({"object": "list", "data": data})).into_response(),
        Err(e) => e.in_dialect(ErrorShape::OpenAi).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::utc_key;

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
