//! The usage ledger's table: one row per request the server answered, in the
//! same database file as the conversations (its own connection, so a long
//! history read never waits behind a ledger write). Each row keeps the
//! server's typed record as JSON (`record`) beside the columns that queries
//! filter and sum on.
use std::path::Path;

use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

use crate::{Result, StoreError};

pub(crate) const MIGRATION: &str = "CREATE TABLE usage (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        dialect TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        model TEXT NOT NULL,
        backend TEXT NOT NULL,
        stream INTEGER NOT NULL,
        status INTEGER NOT NULL,
        finishes TEXT NOT NULL,
        client TEXT,
        user_agent TEXT,
        origin TEXT,
        node TEXT,
        ran_on TEXT,
        prompt_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX usage_created ON usage (created_ms);
    CREATE INDEX usage_id ON usage (id);
    CREATE INDEX usage_client ON usage (client, created_ms);";

/// One request as stored (and as nodes pass it to each other).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UsageRow {
    /// Insertion order; the cursor of a paginated listing (assigned on insert).
    pub seq: i64,
    pub id: String,
    pub created_ms: i64,
    pub dialect: String,
    pub endpoint: String,
    pub model: String,
    pub backend: String,
    pub stream: bool,
    pub status: u16,
    /// Every word the request's finishes go by (engine reasons and the
    /// dialect's own), for the `finish` filter.
    pub finishes: Vec<String>,
    /// The API key's name (never the key).
    pub client: Option<String>,
    pub user_agent: Option<String>,
    pub origin: Option<String>,
    /// The node that received the request.
    pub node: Option<String>,
    /// The node that ran it, when another node received it.
    pub ran_on: Option<String>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub reasoning_tokens: u64,
    /// The server's full record (JSON).
    pub record: String,
}

/// Which rows a query selects; every field narrows it.
#[derive(Clone, Debug, Default)]
pub struct UsageFilter {
    /// Milliseconds since the epoch, inclusive.
    pub since_ms: Option<i64>,
    /// Milliseconds since the epoch, exclusive.
    pub until_ms: Option<i64>,
    pub model: Option<String>,
    pub dialect: Option<String>,
    pub finish: Option<String>,
    pub client: Option<String>,
    pub node: Option<String>,
    /// Only rows older than this cursor (`seq`).
    pub before: Option<i64>,
    /// At most this many rows, newest first.
    pub limit: Option<usize>,
}

/// The ledger's connection.
pub struct UsageLog {
    conn: Connection,
}

const COLUMNS: &str = "seq, id, created_ms, dialect, endpoint, model, backend, stream, status, \
     finishes, client, user_agent, origin, node, ran_on, prompt_tokens, cached_tokens, \
     completion_tokens, reasoning_tokens, record";

impl UsageLog {
    /// Opens (creating and migrating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(UsageLog {
            conn: crate::connect(path)?,
        })
    }

    /// A ledger that lives in memory only (a server run without a store).
    pub fn in_memory() -> Result<Self> {
        let mut conn = Connection::open_in_memory()?;
        crate::migrate(&mut conn)?;
        Ok(UsageLog { conn })
    }

    /// Writes one row; it is on disk when this returns. Returns its `seq`.
    pub fn insert(&self, r: &UsageRow) -> Result<i64> {
        // Bounded by a space on each side, so `instr` matches whole words.
        let finishes = format!(" {} ", r.finishes.join(" "));
        self.conn.execute(
            "INSERT INTO usage (id, created_ms, dialect, endpoint, model, backend, stream, status,
                 finishes, client, user_agent, origin, node, ran_on, prompt_tokens, cached_tokens,
                 completion_tokens, reasoning_tokens, record)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                 ?18, ?19)",
            params![
                r.id,
                r.created_ms,
                r.dialect,
                r.endpoint,
                r.model,
                r.backend,
                r.stream,
                r.status,
                finishes,
                r.client,
                r.user_agent,
                r.origin,
                r.node,
                r.ran_on,
                to_sql(r.prompt_tokens)?,
                to_sql(r.cached_tokens)?,
                to_sql(r.completion_tokens)?,
                to_sql(r.reasoning_tokens)?,
                r.record,
            ],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Sets the HTTP status of request `id` (known only once its response is built).
    pub fn set_status(&self, id: &str, status: u16) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE usage SET status = ?2 WHERE id = ?1",
            params![id, status],
        )?;
        Ok(n > 0)
    }

    /// Whether a row for request `id` is here.
    pub fn has(&self, id: &str) -> Result<bool> {
        Ok(self.get(id)?.is_some())
    }

    /// The newest row for request `id`.
    pub fn get(&self, id: &str) -> Result<Option<UsageRow>> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM usage WHERE id = ?1 ORDER BY seq DESC LIMIT 1"),
                params![id],
                read_row,
            )
            .optional()
            .map_err(StoreError::from)
    }

    /// The rows `f` selects, newest first.
    pub fn select(&self, f: &UsageFilter) -> Result<Vec<UsageRow>> {
        let mut clauses = Vec::new();
        let mut args: Vec<SqlValue> = Vec::new();
        let mut add = |clause: &str, v: SqlValue| {
            args.push(v);
            clauses.push(clause.replace('?', &format!("?{}", args.len())));
        };
        if let Some(t) = f.since_ms {
            add("created_ms >= ?", t.into());
        }
        if let Some(t) = f.until_ms {
            add("created_ms < ?", t.into());
        }
        if let Some(s) = &f.before {
            add("seq < ?", (*s).into());
        }
        for (column, v) in [
            ("model", &f.model),
            ("dialect", &f.dialect),
            ("client", &f.client),
            ("node", &f.node),
        ] {
            if let Some(v) = v {
                add(&format!("{column} = ?"), v.clone().into());
            }
        }
        if let Some(w) = &f.finish {
            add("instr(finishes, ?) > 0", format!(" {w} ").into());
        }
        let mut sql = format!("SELECT {COLUMNS} FROM usage");
        if !clauses.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&clauses.join(" AND "));
        }
        sql.push_str(" ORDER BY seq DESC");
        if let Some(n) = f.limit {
            sql.push_str(&format!(" LIMIT {n}"));
        }
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map(params_from_iter(args), read_row)?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(StoreError::from)
    }

    /// Prompt plus completion tokens of `client`'s requests since `since_ms`.
    pub fn client_tokens_since(&self, client: &str, since_ms: i64) -> Result<u64> {
        let n: i64 = self.conn.query_row(
            "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage
             WHERE client = ?1 AND created_ms >= ?2",
            params![client, since_ms],
            |r| r.get(0),
        )?;
        Ok(n.max(0) as u64)
    }

    /// Deletes rows created before `older_than_ms` and, past `keep_rows`
    /// (0 = no cap), the oldest ones. Returns how many went.
    pub fn prune(&self, older_than_ms: Option<i64>, keep_rows: usize) -> Result<usize> {
        let mut gone = 0;
        if let Some(t) = older_than_ms {
            gone += self
                .conn
                .execute("DELETE FROM usage WHERE created_ms < ?1", params![t])?;
        }
        if keep_rows > 0 {
            gone += self.conn.execute(
                "DELETE FROM usage WHERE seq <= (SELECT seq FROM usage ORDER BY seq DESC
                     LIMIT 1 OFFSET ?1)",
                params![to_sql(keep_rows as u64)?],
            )?;
        }
        Ok(gone)
    }
}

fn to_sql(n: u64) -> Result<i64> {
    i64::try_from(n).map_err(|_| StoreError::Data(format!("{n} does not fit the ledger")))
}

fn read_row(r: &rusqlite::Row) -> rusqlite::Result<UsageRow> {
    let count = |i: usize| r.get::<_, i64>(i).map(|n| n.max(0) as u64);
    let finishes: String = r.get(9)?;
    Ok(UsageRow {
        seq: r.get(0)?,
        id: r.get(1)?,
        created_ms: r.get(2)?,
        dialect: r.get(3)?,
        endpoint: r.get(4)?,
        model: r.get(5)?,
        backend: r.get(6)?,
        stream: r.get(7)?,
        status: r.get(8)?,
        finishes: finishes.split_whitespace().map(str::to_owned).collect(),
        client: r.get(10)?,
        user_agent: r.get(11)?,
        origin: r.get(12)?,
        node: r.get(13)?,
        ran_on: r.get(14)?,
        prompt_tokens: count(15)?,
        cached_tokens: count(16)?,
        completion_tokens: count(17)?,
        reasoning_tokens: count(18)?,
        record: r.get(19)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, created_ms: i64, model: &str, finishes: &[&str]) -> UsageRow {
        UsageRow {
            id: id.into(),
            created_ms,
            dialect: "openai.chat".into(),
            endpoint: "/v1/chat/completions".into(),
            model: model.into(),
            backend: "mlx".into(),
            status: 200,
            finishes: finishes.iter().map(|s| s.to_string()).collect(),
            client: Some("opencode".into()),
            prompt_tokens: 10,
            completion_tokens: 3,
            record: "{}".into(),
            ..UsageRow::default()
        }
    }

    #[test]
    fn filters_pages_and_prunes() {
        let log = UsageLog::in_memory().expect("ledger");
        for i in 0..5 {
            let model = if i % 2 == 0 { "a" } else { "b" };
            log.insert(&row(
                &format!("r{i}"),
                1000 * i,
                model,
                &["stop", "end_turn"],
            ))
            .expect("insert");
        }
        log.insert(&row("r5", 5000, "a", &["stop_sequence"]))
            .expect("insert");
        let ids = |f: &UsageFilter| -> Vec<String> {
            log.select(f)
                .expect("select")
                .into_iter()
                .map(|r| r.id)
                .collect()
        };
        let model_a = UsageFilter {
            model: Some("a".into()),
            ..Default::default()
        };
        assert_eq!(ids(&model_a), ["r5", "r4", "r2", "r0"]);
        let stop = UsageFilter {
            finish: Some("stop".into()),
            ..Default::default()
        };
        assert_eq!(
            ids(&stop).len(),
            5,
            "whole words only: stop_sequence is not stop"
        );
        // Pages follow the cursor.
        let first = log
            .select(&UsageFilter {
                limit: Some(2),
                ..Default::default()
            })
            .expect("page");
        assert_eq!(first.len(), 2);
        let next = UsageFilter {
            before: Some(first[1].seq),
            limit: Some(10),
            ..Default::default()
        };
        assert_eq!(ids(&next), ["r3", "r2", "r1", "r0"]);
        let window = UsageFilter {
            since_ms: Some(1000),
            until_ms: Some(3000),
            ..Default::default()
        };
        assert_eq!(ids(&window), ["r2", "r1"]);
        assert!(log.set_status("r3", 504).expect("status"));
        assert_eq!(log.get("r3").expect("get").map(|r| r.status), Some(504));
        // Age first, then the row cap.
        assert_eq!(log.prune(Some(2000), 0).expect("prune"), 2);
        assert_eq!(log.prune(None, 3).expect("prune"), 1);
        assert_eq!(ids(&UsageFilter::default()), ["r5", "r4", "r3"]);
    }
}
