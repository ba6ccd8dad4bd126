//! The conversation store (the recorder client's, shared by the CLI, the
//! desktop app and the server's `/v1/conversations`): SQLite in WAL mode, one transaction per message,
//! so a process killed mid-write loses at most the message being written.
//! Schema changes are numbered migrations tracked in `PRAGMA user_version`.
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use serde_json::Value;

use serde::Deserialize;
use serde_json::Map;

pub mod usage;
pub use usage::{ChoiceRow, UsageFilter, UsageLog, UsageRow};

/// Metadata of a stored piece: string keys, JSON values.
pub type Metadata = Map<String, Value>;

/// What a stored piece holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PieceKind {
    #[default]
    Text,
    Error,
}

/// One response piece: one per choice, and for a reply that was regenerated or
/// continued, one per version and step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    pub kind: PieceKind,
    pub text: String,
    /// Tool calls as `{"id", "name", "arguments"}` objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
    pub metadata: Metadata,
    /// Which version of the reply this belongs to: a regenerated reply keeps its
    /// earlier versions (0 first) beside the new one, each with its own usage.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u32,
    /// Which step of its version: a reply continued after its token limit is one
    /// reply whose steps (0 first) each carry the usage of their own request.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub step: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The metadata key under which a reply's pieces keep the user's words they
/// answered, once that message was edited (so an older version still says what
/// it was an answer to).
pub const ANSWERED_KEY: &str = "answered";

/// What can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("conversation store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("conversation store: {0}")]
    Data(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Migrations in order; `user_version` is how many have run.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created_ms INTEGER NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        target TEXT,
        model TEXT,
        created_ms INTEGER NOT NULL,
        UNIQUE (conversation_id, seq)
    );
    CREATE TABLE pieces (
        id INTEGER PRIMARY KEY,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        kind TEXT NOT NULL,
        content TEXT NOT NULL,
        tool_calls TEXT,
        UNIQUE (message_id, idx)
    );
    CREATE TABLE metadata (
        piece_id INTEGER NOT NULL REFERENCES pieces(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (piece_id, key)
    );",
    // 2: per-conversation settings (the UI's model, prompt, sampling) and last activity.
    "ALTER TABLE conversations ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE conversations ADD COLUMN updated_ms INTEGER NOT NULL DEFAULT 0;
    UPDATE conversations SET updated_ms = created_ms;",
    // 3: the server's usage ledger (see `usage.rs`).
    usage::MIGRATION,
    // 4: the ledger's records as typed columns, not JSON text.
    usage::TYPED_MIGRATION,
    // 5: the server's own settings changed at run time (the Ollama port
    // switch), remembered across starts.
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    // 6: speculative decoding's draft counts on each ledger choice.
    usage::DRAFT_MIGRATION,
    // 7: the part of each choice's cached tokens read from the disk tier.
    usage::DISK_CACHE_MIGRATION,
    // 8: a reply's versions (regenerated) and steps (continued) as pieces of one message.
    "ALTER TABLE pieces ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE pieces ADD COLUMN step INTEGER NOT NULL DEFAULT 0;",
    // 9: the images in each ledger choice's prompt.
    usage::IMAGE_MIGRATION,
    // 10: the chat turn each ledger request served.
    usage::TURN_MIGRATION,
];

/// A stored message with its pieces.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredMessage {
    pub id: i64,
    pub conversation_id: i64,
    pub seq: i64,
    pub role: String,
    pub target: Option<String>,
    pub model: Option<String>,
    /// When it was written, in milliseconds since the epoch.
    pub created_ms: i64,
    pub pieces: Vec<Piece>,
}

/// A conversation with its messages.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Conversation {
    pub id: i64,
    pub title: String,
    pub created_ms: i64,
    /// Time of the last change (message added, title or settings edited).
    pub updated_ms: i64,
    /// Free-form settings of the front end that owns the chat (a JSON object).
    pub settings: Value,
    pub messages: Vec<StoredMessage>,
}

pub struct Store {
    conn: Connection,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A message's place and role, if it is in `conversation_id`.
fn message_in(
    tx: &Connection,
    conversation_id: i64,
    message_id: i64,
) -> Result<Option<(i64, String)>> {
    Ok(tx
        .query_row(
            "SELECT seq, role FROM messages WHERE id = ?1 AND conversation_id = ?2",
            params![message_id, conversation_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
}

/// Marks a conversation changed now (the chat list's order).
fn touch(tx: &rusqlite::Transaction, conversation_id: i64) -> Result<()> {
    tx.execute(
        "UPDATE conversations SET updated_ms = ?2 WHERE id = ?1",
        params![conversation_id, now_ms()],
    )?;
    Ok(())
}

/// Writes one piece and its metadata at `idx` of `message_id`.
fn insert_piece(tx: &rusqlite::Transaction, message_id: i64, idx: i64, p: &Piece) -> Result<()> {
    let kind = match p.kind {
        PieceKind::Text => "text",
        PieceKind::Error => "error",
    };
    let calls = (!p.tool_calls.is_empty())
        .then(|| serde_json::to_string(&p.tool_calls))
        .transpose()
        .map_err(|e| StoreError::Data(e.to_string()))?;
    tx.execute(
        "INSERT INTO pieces (message_id, idx, kind, content, tool_calls, version, step)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![message_id, idx, kind, p.text, calls, p.version, p.step],
    )?;
    let piece_id = tx.last_insert_rowid();
    for (k, v) in &p.metadata {
        tx.execute(
            "INSERT INTO metadata (piece_id, key, value) VALUES (?1, ?2, ?3)",
            params![piece_id, k, v.to_string()],
        )?;
    }
    Ok(())
}

/// Opens (creating if needed) and migrates the database at `path`, in WAL
/// mode with every commit on disk before it returns.
fn connect(path: &Path) -> Result<Connection> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Data(format!("{}: {e}", dir.display())))?;
    }
    let mut conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // A commit is on disk before it returns: a killed process loses nothing committed.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// Runs the migrations this database has not had yet, each in a transaction
/// that takes the write lock first, so two connections opening at once do
/// not both run one.
fn migrate(conn: &mut Connection) -> Result<()> {
    loop {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version as usize > MIGRATIONS.len() {
            return Err(StoreError::Data(format!(
                "the store is schema version {version}, newer than this program ({})",
                MIGRATIONS.len()
            )));
        }
        let Some(sql) = MIGRATIONS.get(version as usize) else {
            return Ok(());
        };
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
}

impl Store {
    /// A server setting remembered from an earlier run.
    pub fn setting(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::from)
    }

    /// Remembers a server setting (on disk when this returns).
    pub fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }

    /// Opens (creating if needed) and migrates the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Store {
            conn: connect(path)?,
        })
    }

    pub fn schema_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))?)
    }

    pub fn create_conversation(&self, title: &str) -> Result<i64> {
        self.create_conversation_with(title, &Value::Object(Default::default()))
    }

    /// A new conversation with the given settings object.
    pub fn create_conversation_with(&self, title: &str, settings: &Value) -> Result<i64> {
        let now = now_ms();
        self.conn.execute(
            "INSERT INTO conversations (title, created_ms, updated_ms, settings) VALUES (?1, ?2, ?2, ?3)",
            params![title, now, settings.to_string()],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Whether conversation `id` exists (without reading its messages).
    pub fn has_conversation(&self, id: i64) -> Result<bool> {
        Ok(self
            .conn
            .query_row(
                "SELECT 1 FROM conversations WHERE id = ?1",
                params![id],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// Changes the title and/or settings; false if there is no such conversation.
    pub fn update_conversation(
        &self,
        id: i64,
        title: Option<&str>,
        settings: Option<&Value>,
    ) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE conversations SET title = COALESCE(?2, title),
                 settings = COALESCE(?3, settings), updated_ms = ?4 WHERE id = ?1",
            params![id, title, settings.map(Value::to_string), now_ms()],
        )?;
        Ok(n > 0)
    }

    /// Deletes a conversation with its messages; false if there was none.
    pub fn delete_conversation(&self, id: i64) -> Result<bool> {
        Ok(self
            .conn
            .execute("DELETE FROM conversations WHERE id = ?1", params![id])?
            > 0)
    }

    /// Deletes `message_id` and every later message of its conversation (a
    /// retried turn); returns how many went. Zero if the message is not in
    /// `conversation_id`.
    pub fn truncate_from(&mut self, conversation_id: i64, message_id: i64) -> Result<usize> {
        let tx = self.conn.transaction()?;
        let Some((seq, _)) = message_in(&tx, conversation_id, message_id)? else {
            return Ok(0);
        };
        let n = tx.execute(
            "DELETE FROM messages WHERE conversation_id = ?1 AND seq >= ?2",
            params![conversation_id, seq],
        )?;
        touch(&tx, conversation_id)?;
        tx.commit()?;
        Ok(n)
    }

    /// Appends a message and its pieces in one transaction; returns its id.
    pub fn add_message(
        &mut self,
        conversation_id: i64,
        role: &str,
        target: Option<&str>,
        model: Option<&str>,
        pieces: &[Piece],
    ) -> Result<i64> {
        let tx = self.conn.transaction()?;
        let seq: i64 = tx.query_row(
            "SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE conversation_id = ?1",
            params![conversation_id],
            |r| r.get(0),
        )?;
        tx.execute(
            "INSERT INTO messages (conversation_id, seq, role, target, model, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![conversation_id, seq, role, target, model, now_ms()],
        )?;
        let message_id = tx.last_insert_rowid();
        touch(&tx, conversation_id)?;
        for (idx, p) in pieces.iter().enumerate() {
            insert_piece(&tx, message_id, idx as i64, p)?;
        }
        tx.commit()?;
        Ok(message_id)
    }

    /// A message's role, if it is in `conversation_id`.
    pub fn role_of(&self, conversation_id: i64, message_id: i64) -> Result<Option<String>> {
        Ok(message_in(&self.conn, conversation_id, message_id)?.map(|(_, role)| role))
    }

    /// Adds a piece to a stored reply: the next step of a continued reply or
    /// the first of a new version. False when the message is not a reply in
    /// `conversation_id`.
    pub fn add_piece(
        &mut self,
        conversation_id: i64,
        message_id: i64,
        piece: &Piece,
    ) -> Result<bool> {
        let tx = self.conn.transaction()?;
        let found = message_in(&tx, conversation_id, message_id)?;
        if found.is_none_or(|(_, role)| role != "assistant") {
            return Ok(false);
        }
        let idx: i64 = tx.query_row(
            "SELECT COALESCE(MAX(idx), -1) + 1 FROM pieces WHERE message_id = ?1",
            params![message_id],
            |r| r.get(0),
        )?;
        insert_piece(&tx, message_id, idx, piece)?;
        touch(&tx, conversation_id)?;
        tx.commit()?;
        Ok(true)
    }

    /// Replaces a user message's text (an edit before it is sent again). The
    /// reply that follows it keeps, on each of its pieces that does not say so
    /// yet, the words it answered ([`ANSWERED_KEY`]), since its versions stay.
    /// False when the message is not a user message of `conversation_id`.
    pub fn edit_text(&mut self, conversation_id: i64, message_id: i64, text: &str) -> Result<bool> {
        let tx = self.conn.transaction()?;
        let found = message_in(&tx, conversation_id, message_id)?;
        let Some((seq, _)) = found.filter(|(_, role)| role == "user") else {
            return Ok(false);
        };
        let old: Option<String> = tx
            .query_row(
                "SELECT content FROM pieces WHERE message_id = ?1 ORDER BY idx LIMIT 1",
                params![message_id],
                |r| r.get(0),
            )
            .optional()?;
        match &old {
            Some(_) => tx.execute(
                "UPDATE pieces SET content = ?2 WHERE message_id = ?1
                 AND idx = (SELECT MIN(idx) FROM pieces WHERE message_id = ?1)",
                params![message_id, text],
            )?,
            None => tx.execute(
                "INSERT INTO pieces (message_id, idx, kind, content) VALUES (?1, 0, 'text', ?2)",
                params![message_id, text],
            )?,
        };
        if let Some(old) = old.filter(|o| o != text) {
            tx.execute(
                "INSERT INTO metadata (piece_id, key, value)
                 SELECT p.id, ?3, ?4 FROM pieces p JOIN messages m ON p.message_id = m.id
                 WHERE m.conversation_id = ?1 AND m.seq = ?2 + 1 AND m.role = 'assistant'
                 AND NOT EXISTS (SELECT 1 FROM metadata d WHERE d.piece_id = p.id AND d.key = ?3)",
                params![
                    conversation_id,
                    seq,
                    ANSWERED_KEY,
                    Value::from(old).to_string()
                ],
            )?;
        }
        touch(&tx, conversation_id)?;
        tx.commit()?;
        Ok(true)
    }

    /// One message with its pieces and their metadata, as stored.
    pub fn message(&self, id: i64) -> Result<Option<StoredMessage>> {
        let row = self
            .conn
            .query_row(
                "SELECT id, conversation_id, seq, role, target, model, created_ms FROM messages
                 WHERE id = ?1",
                params![id],
                |r| {
                    Ok(StoredMessage {
                        id: r.get(0)?,
                        conversation_id: r.get(1)?,
                        seq: r.get(2)?,
                        role: r.get(3)?,
                        target: r.get(4)?,
                        model: r.get(5)?,
                        created_ms: r.get(6)?,
                        pieces: Vec::new(),
                    })
                },
            )
            .optional()?;
        let Some(mut m) = row else { return Ok(None) };
        let mut stmt = self.conn.prepare(
            "SELECT id, kind, content, tool_calls, version, step FROM pieces WHERE message_id = ?1
             ORDER BY version, step, idx",
        )?;
        type Row = (i64, String, String, Option<String>, u32, u32);
        let pieces: Vec<Row> = stmt
            .query_map(params![id], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?
            .collect::<std::result::Result<_, _>>()?;
        let mut meta_stmt = self
            .conn
            .prepare("SELECT key, value FROM metadata WHERE piece_id = ?1 ORDER BY rowid")?;
        for (pid, kind, content, calls, version, step) in pieces {
            let mut metadata = Metadata::new();
            let rows: Vec<(String, String)> = meta_stmt
                .query_map(params![pid], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<std::result::Result<_, _>>()?;
            for (k, v) in rows {
                let value: Value = serde_json::from_str(&v)
                    .map_err(|e| StoreError::Data(format!("metadata {k}: {e}")))?;
                metadata.insert(k, value);
            }
            let tool_calls = match calls {
                Some(c) => serde_json::from_str(&c).map_err(|e| StoreError::Data(e.to_string()))?,
                None => Vec::new(),
            };
            m.pieces.push(Piece {
                kind: if kind == "error" {
                    PieceKind::Error
                } else {
                    PieceKind::Text
                },
                text: content,
                tool_calls,
                metadata,
                version,
                step,
            });
        }
        Ok(Some(m))
    }

    /// Every conversation with its messages, oldest first.
    pub fn conversations(&self) -> Result<Vec<Conversation>> {
        let ids: Vec<i64> = self
            .conn
            .prepare("SELECT id FROM conversations ORDER BY id")?
            .query_map([], |r| r.get(0))?
            .collect::<std::result::Result<_, _>>()?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(c) = self.conversation(id)? {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// One conversation with its messages in order.
    pub fn conversation(&self, id: i64) -> Result<Option<Conversation>> {
        let head = self
            .conn
            .query_row(
                "SELECT title, created_ms, updated_ms, settings FROM conversations WHERE id = ?1",
                params![id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                    ))
                },
            )
            .optional()?;
        let Some((title, created_ms, updated_ms, settings)) = head else {
            return Ok(None);
        };
        let settings: Value = serde_json::from_str(&settings)
            .map_err(|e| StoreError::Data(format!("conversation {id} settings: {e}")))?;
        let ids: Vec<i64> = self
            .conn
            .prepare("SELECT id FROM messages WHERE conversation_id = ?1 ORDER BY seq")?
            .query_map(params![id], |r| r.get(0))?
            .collect::<std::result::Result<_, _>>()?;
        let mut messages = Vec::with_capacity(ids.len());
        for mid in ids {
            if let Some(m) = self.message(mid)? {
                messages.push(m);
            }
        }
        Ok(Some(Conversation {
            id,
            title,
            created_ms,
            updated_ms,
            settings,
            messages,
        }))
    }

    /// `PRAGMA integrity_check`: `ok` when the file is sound.
    pub fn integrity_check(&self) -> Result<String> {
        Ok(self
            .conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn temp_db(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("shoal-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d.join("store.sqlite")
    }

    #[test]
    fn a_reply_round_trips_with_its_metadata_exactly() {
        let path = temp_db("roundtrip");
        let mut s = Store::open(&path).expect("open");
        assert_eq!(
            s.schema_version().expect("version"),
            MIGRATIONS.len() as i64
        );
        let c = s.create_conversation("t").expect("conv");
        let mut meta = Metadata::new();
        meta.insert("finish_reason".into(), json!("length"));
        meta.insert("token_usage_prompt_tokens".into(), json!(37));
        meta.insert("response_cost_usd".into(), json!(0.000123));
        meta.insert("nested".into(), json!({"a": [1, "x", null]}));
        meta.insert("unicode".into(), json!("héllo ✓"));
        let pieces = vec![
            Piece {
                kind: PieceKind::Text,
                text: "The capital".into(),
                tool_calls: vec![json!({"id": "c1", "name": "f", "arguments": "{}"})],
                metadata: meta.clone(),
                ..Piece::default()
            },
            Piece {
                kind: PieceKind::Error,
                text: String::new(),
                tool_calls: vec![],
                metadata: Metadata::new(),
                ..Piece::default()
            },
        ];
        let id = s
            .add_message(c, "assistant", Some("chat"), Some("m"), &pieces)
            .expect("add");
        drop(s);
        let s = Store::open(&path).expect("reopen");
        let m = s.message(id).expect("read").expect("present");
        assert_eq!(m.pieces, pieces);
        assert_eq!(m.role, "assistant");
        assert_eq!(m.target.as_deref(), Some("chat"));
        assert_eq!(s.integrity_check().expect("check"), "ok");
        let all = s.conversations().expect("list");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].messages.len(), 1);
    }

    #[test]
    fn a_version_1_store_migrates_keeping_its_data() {
        let path = temp_db("migrate");
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        {
            let conn = Connection::open(&path).expect("open v1");
            conn.execute_batch(MIGRATIONS[0]).expect("v1 schema");
            conn.pragma_update(None, "user_version", 1)
                .expect("version");
            conn.execute(
                "INSERT INTO conversations (title, created_ms) VALUES ('old', 1234)",
                [],
            )
            .expect("row");
        }
        let s = Store::open(&path).expect("migrate");
        assert_eq!(
            s.schema_version().expect("version"),
            MIGRATIONS.len() as i64
        );
        let all = s.conversations().expect("list");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].title, "old");
        assert_eq!(all[0].updated_ms, 1234, "last activity starts at creation");
        assert_eq!(all[0].settings, json!({}));
    }

    #[test]
    fn conversations_are_edited_truncated_and_deleted() {
        let path = temp_db("edit");
        let mut s = Store::open(&path).expect("open");
        let c = s
            .create_conversation_with("New chat", &json!({"model": "m", "stop": ["END"]}))
            .expect("create");
        let other = s.create_conversation("other").expect("create");
        let text = |t: &str| Piece {
            kind: PieceKind::Text,
            text: t.into(),
            tool_calls: vec![],
            metadata: Metadata::new(),
            ..Piece::default()
        };
        let m1 = s
            .add_message(c, "user", None, None, &[text("a")])
            .expect("m1");
        let m2 = s
            .add_message(c, "assistant", None, None, &[text("b")])
            .expect("m2");
        s.add_message(c, "user", None, None, &[text("c")])
            .expect("m3");
        assert!(s
            .update_conversation(c, Some("Renamed"), None)
            .expect("rename"));
        assert!(!s
            .update_conversation(9999, Some("x"), None)
            .expect("missing"));
        let got = s.conversation(c).expect("read").expect("present");
        assert_eq!(got.title, "Renamed");
        assert_eq!(
            got.settings,
            json!({"model": "m", "stop": ["END"]}),
            "settings kept"
        );
        assert_eq!(got.messages.len(), 3);
        assert_eq!(s.truncate_from(other, m2).expect("wrong conv"), 0);
        assert_eq!(s.truncate_from(c, m2).expect("truncate"), 2);
        let got = s.conversation(c).expect("read").expect("present");
        assert_eq!(
            got.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
            vec![m1]
        );
        assert!(s.has_conversation(c).expect("has"));
        assert!(s.delete_conversation(c).expect("delete"));
        assert!(!s.has_conversation(c).expect("has"));
        assert!(s.conversation(c).expect("read").is_none());
        assert!(
            s.message(m1).expect("read").is_none(),
            "messages go with it"
        );
        assert!(!s.delete_conversation(c).expect("again"));
        assert_eq!(s.conversations().expect("list").len(), 1);
    }

    #[test]
    fn a_reply_keeps_its_versions_and_steps_and_what_each_answered() {
        let path = temp_db("versions");
        let mut s = Store::open(&path).expect("open");
        let c = s.create_conversation("t").expect("conv");
        let other = s.create_conversation("other").expect("conv");
        let piece = |t: &str, version: u32, step: u32| Piece {
            text: t.into(),
            version,
            step,
            ..Piece::default()
        };
        let user = s
            .add_message(c, "user", None, None, &[piece("Name a colour", 0, 0)])
            .expect("user");
        let reply = s
            .add_message(c, "assistant", None, None, &[piece("Red and", 0, 0)])
            .expect("reply");
        assert!(s.add_piece(c, reply, &piece(" blue.", 0, 1)).expect("step"));
        assert!(s
            .add_piece(c, reply, &piece("Green.", 1, 0))
            .expect("version"));
        // Not in that conversation, or not a reply: refused, nothing written.
        assert!(!s
            .add_piece(other, reply, &piece("x", 2, 0))
            .expect("refused"));
        assert!(!s.add_piece(c, user, &piece("x", 0, 1)).expect("refused"));
        assert_eq!(
            s.role_of(c, reply).expect("role").as_deref(),
            Some("assistant")
        );
        assert_eq!(s.role_of(other, reply).expect("role"), None);
        assert!(!s
            .edit_text(c, reply, "not a user message")
            .expect("refused"));

        assert!(s.edit_text(c, user, "Name a fruit").expect("edit"));
        // Editing again keeps the words the older versions answered.
        assert!(s.edit_text(c, user, "Name a vegetable").expect("edit"));
        assert!(s
            .add_piece(c, reply, &piece("Leek.", 2, 0))
            .expect("version"));

        let m = s.message(reply).expect("read").expect("message");
        let got: Vec<(&str, u32, u32, Option<&Value>)> = m
            .pieces
            .iter()
            .map(|p| {
                (
                    p.text.as_str(),
                    p.version,
                    p.step,
                    p.metadata.get(ANSWERED_KEY),
                )
            })
            .collect();
        let colour = json!("Name a colour");
        assert_eq!(
            got,
            vec![
                ("Red and", 0, 0, Some(&colour)),
                (" blue.", 0, 1, Some(&colour)),
                ("Green.", 1, 0, Some(&colour)),
                ("Leek.", 2, 0, None),
            ]
        );
        let u = s.message(user).expect("read").expect("message");
        assert_eq!(u.pieces[0].text, "Name a vegetable");
        // Serialized, a plain piece says nothing of versions; a later one does.
        let v = serde_json::to_value(&m.pieces).expect("json");
        assert!(
            v[0].get("version").is_none() && v[0].get("step").is_none(),
            "{v}"
        );
        assert_eq!(
            (v[1]["step"].clone(), v[3]["version"].clone()),
            (json!(1), json!(2))
        );
        drop(s);
        // Reopened, all of it is still there, in order.
        let s = Store::open(&path).expect("reopen");
        assert_eq!(s.message(reply).expect("read").expect("message"), m);
    }
}
