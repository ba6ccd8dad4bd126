//! The usage ledger's table: one row per request the server answered, in the
//! same database file as the conversations (its own connection, so a long
//! history read never waits behind a ledger write). Every fact is a typed
//! column: the request's in `usage`, each choice's finish, counts and
//! timings in `usage_choices`, and the words its finishes go by (for the
//! `finish` filter) in `usage_finishes`.
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

/// Migration 4: the record that was JSON text becomes typed rows (existing
/// rows are carried over from their JSON once, here).
pub(crate) const TYPED_MIGRATION: &str =
    "ALTER TABLE usage ADD COLUMN per_prompt INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE usage ADD COLUMN error TEXT;
    CREATE TABLE usage_choices (
        usage_seq INTEGER NOT NULL REFERENCES usage(seq) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        finish TEXT NOT NULL,
        finish_detail TEXT,
        prompt_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL,
        queue_ms REAL NOT NULL,
        ttft_ms REAL NOT NULL,
        prefill_tokens_per_s REAL NOT NULL,
        decode_tokens_per_s REAL NOT NULL,
        total_ms REAL NOT NULL,
        PRIMARY KEY (usage_seq, idx)
    );
    CREATE TABLE usage_finishes (
        usage_seq INTEGER NOT NULL REFERENCES usage(seq) ON DELETE CASCADE,
        word TEXT NOT NULL,
        PRIMARY KEY (usage_seq, word)
    );
    CREATE INDEX usage_finishes_word ON usage_finishes (word, usage_seq);
    UPDATE usage SET per_prompt = COALESCE(json_extract(record, '$.per_prompt'), 1),
        error = json_extract(record, '$.error')
        WHERE json_valid(record);
    INSERT INTO usage_choices
        SELECT u.seq, c.key, json_extract(c.value, '$.finish.type'),
            CASE WHEN json_extract(c.value, '$.finish.type') = 'timeout'
                THEN json_extract(c.value, '$.finish.detail.limit_secs')
                ELSE json_extract(c.value, '$.finish.detail') END,
            COALESCE(json_extract(c.value, '$.usage.prompt_tokens'), 0),
            COALESCE(json_extract(c.value, '$.usage.cached_tokens'), 0),
            COALESCE(json_extract(c.value, '$.usage.completion_tokens'), 0),
            COALESCE(json_extract(c.value, '$.usage.reasoning_tokens'), 0),
            COALESCE(json_extract(c.value, '$.timings.queue_ms'), 0),
            COALESCE(json_extract(c.value, '$.timings.ttft_ms'), 0),
            COALESCE(json_extract(c.value, '$.timings.prefill_tokens_per_s'), 0),
            COALESCE(json_extract(c.value, '$.timings.decode_tokens_per_s'), 0),
            COALESCE(json_extract(c.value, '$.timings.total_ms'), 0)
        FROM usage u, json_each(u.record, '$.completions') c
        WHERE json_valid(u.record);
    WITH RECURSIVE split(seq, rest, word) AS (
        SELECT seq, ltrim(finishes), NULL FROM usage
        UNION ALL
        SELECT seq, ltrim(substr(rest, instr(rest, ' ') + 1)),
            substr(rest, 1, instr(rest, ' ') - 1)
        FROM split WHERE rest <> '' AND instr(rest, ' ') > 0
    )
    INSERT OR IGNORE INTO usage_finishes
        SELECT seq, word FROM split WHERE word IS NOT NULL AND word <> '';
    ALTER TABLE usage DROP COLUMN finishes;
    ALTER TABLE usage DROP COLUMN record;";

/// Migration 10: the chat turn a request served, so a tool loop's or a
/// continued reply's requests are found together.
pub(crate) const TURN_MIGRATION: &str = "ALTER TABLE usage ADD COLUMN turn TEXT;
    CREATE INDEX usage_turn ON usage (turn) WHERE turn IS NOT NULL;";

/// Migration: speculative decoding's draft counts on each choice.
pub(crate) const DRAFT_MIGRATION: &str =
    "ALTER TABLE usage_choices ADD COLUMN draft_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage_choices ADD COLUMN draft_accepted INTEGER NOT NULL DEFAULT 0;";

/// Where each choice's cached prompt tokens came from (the part read back
/// from the prefix cache's disk tier; the rest came from RAM), and what its
/// cache breakpoints wrote (all, and the part kept for an hour).
pub(crate) const DISK_CACHE_MIGRATION: &str =
    "ALTER TABLE usage_choices ADD COLUMN cached_disk_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage_choices ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage_choices ADD COLUMN cache_write_1h_tokens INTEGER NOT NULL DEFAULT 0;";

/// Images in each choice's prompt: the positions they took and how many.
pub(crate) const IMAGE_MIGRATION: &str =
    "ALTER TABLE usage_choices ADD COLUMN image_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage_choices ADD COLUMN images INTEGER NOT NULL DEFAULT 0;";

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
    /// The request's totals (each prompt counted once over its choices).
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub reasoning_tokens: u64,
    /// Consecutive choices that share a prompt (the request's `n`).
    #[serde(default = "one")]
    pub per_prompt: u32,
    /// Why the request ended in an error response, in the words sent.
    #[serde(default)]
    pub error: Option<String>,
    /// The chat turn the client said the request served (`x-shoal-turn`):
    /// the model turns of one tool loop, or the steps of one continued
    /// reply, share it.
    #[serde(default)]
    pub turn: Option<String>,
    /// Each choice that ended, in order (none for a request refused
    /// before generating).
    #[serde(default)]
    pub choices: Vec<ChoiceRow>,
}

fn one() -> u32 {
    1
}

/// A figure column of `usage_choices`: a count (stored as an integer) or
/// a measure (a real).
trait Figure: Copy {
    fn to_sql(self) -> Result<SqlValue>;
    fn from_sql(row: &rusqlite::Row, i: usize) -> rusqlite::Result<Self>;
}

impl Figure for u64 {
    fn to_sql(self) -> Result<SqlValue> {
        Ok(SqlValue::Integer(to_sql(self)?))
    }
    fn from_sql(row: &rusqlite::Row, i: usize) -> rusqlite::Result<Self> {
        row.get::<_, i64>(i).map(|n| n.max(0) as u64)
    }
}

impl Figure for f64 {
    fn to_sql(self) -> Result<SqlValue> {
        Ok(SqlValue::Real(self))
    }
    fn from_sql(row: &rusqlite::Row, i: usize) -> rusqlite::Result<Self> {
        row.get(i)
    }
}

/// Declares [`ChoiceRow`]'s figures once: the struct's fields, the columns
/// its insert and select name, and their order all come from this list. A
/// figure is named as the engine's `Usage` or `Timings` field it keeps, so
/// the server converts a choice by name (a new figure is a line here, its
/// column's migration, and the engine's field).
macro_rules! choice_figures {
    ($( $(#[$doc:meta])* $name:ident: $ty:ty, )*) => {
        /// One choice's end as the engine recorded it.
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        pub struct ChoiceRow {
            /// The engine's finish reason (`stop`, `stop_sequence`, `timeout` …).
            pub finish: String,
            /// The stop sequence that matched, the error's message, or a timeout's
            /// limit in seconds.
            pub finish_detail: Option<String>,
            $( $(#[$doc])* #[serde(default)] pub $name: $ty, )*
        }

        impl ChoiceRow {
            /// The figure columns, in the order of [`Self::figures`].
            const FIGURES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// The figures as SQL values, in [`Self::FIGURES`] order.
            fn figures(&self) -> Result<Vec<SqlValue>> {
                Ok(vec![$( Figure::to_sql(self.$name)?, )*])
            }

            /// A choice from a row holding `finish`, `finish_detail` and the
            /// figures from column `at` on.
            fn read(row: &rusqlite::Row, at: usize) -> rusqlite::Result<Self> {
                let mut i = at + 1;
                let mut next = || {
                    i += 1;
                    i
                };
                Ok(ChoiceRow {
                    finish: row.get(at)?,
                    finish_detail: row.get(at + 1)?,
                    $( $name: Figure::from_sql(row, next())?, )*
                })
            }
        }
    };
}

choice_figures! {
    prompt_tokens: u64,
    cached_tokens: u64,
    /// The part of `cached_tokens` read back from the disk tier.
    cached_disk_tokens: u64,
    /// Prompt tokens written at the request's cache breakpoints, and the
    /// part of them kept for an hour.
    cache_write_tokens: u64,
    cache_write_1h_tokens: u64,
    completion_tokens: u64,
    reasoning_tokens: u64,
    queue_ms: f64,
    ttft_ms: f64,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    total_ms: f64,
    /// Speculative decoding: draft tokens checked and those kept.
    draft_tokens: u64,
    draft_accepted: u64,
    /// Of `prompt_tokens`, the positions images took, and the images.
    image_tokens: u64,
    images: u64,
}

/// `INSERT INTO usage_choices` naming every figure column.
fn insert_choice_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let n = ChoiceRow::FIGURES.len();
        format!(
            "INSERT INTO usage_choices (usage_seq, idx, finish, finish_detail, {}) VALUES ({})",
            ChoiceRow::FIGURES.join(", "),
            (1..=n + 4)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The choices of a `seq` range, each after its `usage_seq`.
fn select_choices_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "SELECT usage_seq, finish, finish_detail, {} FROM usage_choices \
             WHERE usage_seq BETWEEN ?1 AND ?2 ORDER BY usage_seq, idx",
            ChoiceRow::FIGURES.join(", ")
        )
    })
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
    /// The route, e.g. `/api/embed`.
    pub endpoint: Option<String>,
    pub finish: Option<String>,
    pub client: Option<String>,
    pub node: Option<String>,
    /// The chat turn (see [`UsageRow::turn`]).
    pub turn: Option<String>,
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
     (SELECT group_concat(word, ' ') FROM usage_finishes WHERE usage_seq = seq), client, \
     user_agent, origin, node, ran_on, prompt_tokens, cached_tokens, completion_tokens, \
     reasoning_tokens, per_prompt, error, turn";

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
        conn.pragma_update(None, "foreign_keys", "ON")?;
        crate::migrate(&mut conn)?;
        Ok(UsageLog { conn })
    }

    /// Writes one request with its choices and finish words, in one
    /// transaction; it is on disk when this returns. Returns its `seq`.
    pub fn insert(&self, r: &UsageRow) -> Result<i64> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute(
            "INSERT INTO usage (id, created_ms, dialect, endpoint, model, backend, stream, status,
                 client, user_agent, origin, node, ran_on, prompt_tokens, cached_tokens,
                 completion_tokens, reasoning_tokens, per_prompt, error, turn)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                 ?18, ?19, ?20)",
            params![
                r.id,
                r.created_ms,
                r.dialect,
                r.endpoint,
                r.model,
                r.backend,
                r.stream,
                r.status,
                r.client,
                r.user_agent,
                r.origin,
                r.node,
                r.ran_on,
                to_sql(r.prompt_tokens)?,
                to_sql(r.cached_tokens)?,
                to_sql(r.completion_tokens)?,
                to_sql(r.reasoning_tokens)?,
                r.per_prompt,
                r.error,
                r.turn,
            ],
        )?;
        let seq = tx.last_insert_rowid();
        {
            let mut choice = tx.prepare_cached(insert_choice_sql())?;
            for (i, c) in r.choices.iter().enumerate() {
                let mut values = vec![
                    SqlValue::Integer(seq),
                    SqlValue::Integer(to_sql(i as u64)?),
                    SqlValue::Text(c.finish.clone()),
                    c.finish_detail
                        .clone()
                        .map_or(SqlValue::Null, SqlValue::Text),
                ];
                values.extend(c.figures()?);
                choice.execute(params_from_iter(values))?;
            }
            let mut word = tx.prepare_cached(
                "INSERT OR IGNORE INTO usage_finishes (usage_seq, word) VALUES (?1, ?2)",
            )?;
            for w in &r.finishes {
                // One word each: the listing joins them with spaces.
                if !w.is_empty() && !w.contains(char::is_whitespace) {
                    word.execute(params![seq, w])?;
                }
            }
        }
        tx.commit()?;
        Ok(seq)
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
        let row = self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM usage WHERE id = ?1 ORDER BY seq DESC LIMIT 1"),
                params![id],
                read_row,
            )
            .optional()?;
        row.map(|r| self.with_choices(r)).transpose()
    }

    /// `r` with its choices read from `usage_choices`.
    fn with_choices(&self, r: UsageRow) -> Result<UsageRow> {
        Ok(self.with_all_choices(vec![r])?.remove(0))
    }

    /// `rows` with their choices, read in one query over their `seq` range
    /// (a listing is one read, not one per row).
    fn with_all_choices(&self, mut rows: Vec<UsageRow>) -> Result<Vec<UsageRow>> {
        let (Some(lo), Some(hi)) = (
            rows.iter().map(|r| r.seq).min(),
            rows.iter().map(|r| r.seq).max(),
        ) else {
            return Ok(rows);
        };
        let mut stmt = self.conn.prepare_cached(select_choices_sql())?;
        let mut by_seq: std::collections::HashMap<i64, Vec<ChoiceRow>> = Default::default();
        let choices = stmt.query_map(params![lo, hi], |c| {
            Ok((c.get::<_, i64>(0)?, ChoiceRow::read(c, 1)?))
        })?;
        for c in choices {
            let (seq, choice) = c?;
            by_seq.entry(seq).or_default().push(choice);
        }
        for r in &mut rows {
            r.choices = by_seq.remove(&r.seq).unwrap_or_default();
        }
        Ok(rows)
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
            ("endpoint", &f.endpoint),
            ("client", &f.client),
            ("node", &f.node),
            ("turn", &f.turn),
        ] {
            if let Some(v) = v {
                add(&format!("{column} = ?"), v.clone().into());
            }
        }
        if let Some(w) = &f.finish {
            add(
                "EXISTS (SELECT 1 FROM usage_finishes WHERE usage_seq = seq AND word = ?)",
                w.clone().into(),
            );
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
        let rows = stmt
            .query_map(params_from_iter(args), read_row)?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.with_all_choices(rows)
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
    let finishes: Option<String> = r.get(9)?;
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
        finishes: finishes
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        client: r.get(10)?,
        user_agent: r.get(11)?,
        origin: r.get(12)?,
        node: r.get(13)?,
        ran_on: r.get(14)?,
        prompt_tokens: count(15)?,
        cached_tokens: count(16)?,
        completion_tokens: count(17)?,
        reasoning_tokens: count(18)?,
        per_prompt: r.get(19)?,
        error: r.get(20)?,
        turn: r.get(21)?,
        choices: Vec::new(),
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
            per_prompt: 1,
            choices: vec![ChoiceRow {
                finish: finishes.first().map_or("stop", |f| f).to_string(),
                prompt_tokens: 10,
                completion_tokens: 3,
                total_ms: 12.5,
                ..ChoiceRow::default()
            }],
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
        log.insert(&UsageRow {
            turn: Some("chat-7:3".into()),
            ..row("r5", 5000, "a", &["stop_sequence"])
        })
        .expect("insert");
        let ids = |f: &UsageFilter| -> Vec<String> {
            log.select(f)
                .expect("select")
                .into_iter()
                .map(|r| r.id)
                .collect()
        };
        // A chat turn's requests are found by it, and read back with it.
        let turn = UsageFilter {
            turn: Some("chat-7:3".into()),
            ..Default::default()
        };
        assert_eq!(ids(&turn), ["r5"]);
        let r5 = log.get("r5").expect("get").expect("r5");
        assert_eq!(r5.turn.as_deref(), Some("chat-7:3"));
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
        // Each row's choices come back typed, and go with their row.
        let r5 = log.get("r5").expect("get").expect("r5");
        assert_eq!(r5.choices.len(), 1);
        assert_eq!(r5.choices[0].finish, "stop_sequence");
        assert_eq!(r5.choices[0].total_ms, 12.5);
        assert_eq!(r5.finishes, ["stop_sequence"]);
        let left: i64 = log
            .conn
            .query_row("SELECT COUNT(*) FROM usage_choices", [], |r| r.get(0))
            .expect("count");
        assert_eq!(left, 3, "pruned rows take their choices with them");
    }

    /// A ledger written as JSON records (schema 3) reads back the same
    /// after the typed migration.
    #[test]
    fn json_records_become_typed_rows() {
        let mut conn = Connection::open_in_memory().expect("db");
        for sql in &crate::MIGRATIONS[..3] {
            conn.execute_batch(sql).expect("old schema");
        }
        conn.pragma_update(None, "user_version", 3)
            .expect("version");
        let record = r#"{"per_prompt":2,"error":"boom","completions":[
            {"finish":{"type":"stop_sequence","detail":"END"},"usage":{"prompt_tokens":7,"cached_tokens":3,"completion_tokens":4,"reasoning_tokens":1},"timings":{"queue_ms":1.0,"ttft_ms":2.0,"prefill_tokens_per_s":3.0,"decode_tokens_per_s":4.0,"total_ms":5.0}},
            {"finish":{"type":"timeout","detail":{"limit_secs":600}},"usage":{"prompt_tokens":7,"cached_tokens":3,"completion_tokens":2,"reasoning_tokens":0},"timings":{"queue_ms":0.0,"ttft_ms":0.0,"prefill_tokens_per_s":0.0,"decode_tokens_per_s":0.0,"total_ms":9.0}}]}"#;
        conn.execute(
            "INSERT INTO usage (id, created_ms, dialect, endpoint, model, backend, stream, status,
                 finishes, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, record)
             VALUES ('old', 1, 'openai.responses', '/v1/responses', 'm', 'mlx', 0, 200,
                 ' incomplete incomplete:max_output_tokens stop_sequence ', 7, 3, 6, 1, ?1)",
            params![record],
        )
        .expect("old row");
        crate::migrate(&mut conn).expect("migrate");
        let log = UsageLog { conn };
        let r = log.get("old").expect("get").expect("row");
        assert_eq!(r.per_prompt, 2);
        assert_eq!(r.error.as_deref(), Some("boom"));
        assert_eq!(
            r.finishes,
            [
                "incomplete",
                "incomplete:max_output_tokens",
                "stop_sequence"
            ]
        );
        assert_eq!(r.choices.len(), 2);
        assert_eq!(r.choices[0].finish, "stop_sequence");
        assert_eq!(r.choices[0].finish_detail.as_deref(), Some("END"));
        assert_eq!(
            (
                r.choices[0].prompt_tokens,
                r.choices[0].cached_tokens,
                r.choices[0].completion_tokens,
                r.choices[0].reasoning_tokens
            ),
            (7, 3, 4, 1)
        );
        assert_eq!(r.choices[1].finish, "timeout");
        assert_eq!(r.choices[1].finish_detail.as_deref(), Some("600"));
        assert_eq!(r.choices[1].total_ms, 9.0);
        let found = log
            .select(&UsageFilter {
                finish: Some("stop_sequence".into()),
                ..Default::default()
            })
            .expect("select");
        assert_eq!(found.len(), 1);
    }
}
