//! The ledger itself: SQLite through one connection, written before a
//! request's final event goes out, pruned by its retention, read by page.
use std::sync::{Arc, Mutex, OnceLock};

use crate::dialect::Registry;
use shoal_store::{UsageFilter, UsageLog, UsageRow};

use super::entry::*;
use super::query::UsageQuery;
use crate::error::ApiError;

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
