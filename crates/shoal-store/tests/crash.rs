//! The store survives `kill -9` during writes: a child process writes
//! messages as fast as it can and reports each commit; it is killed at
//! random moments, several times; afterwards every reported message is
//! intact and the database passes `PRAGMA integrity_check`.
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::json;
use shoal_store::{Metadata, Piece, PieceKind, Store};

const DB_ENV: &str = "SHOAL_CRASH_TEST_DB";

fn piece(i: u64) -> Piece {
    let mut m = Metadata::new();
    m.insert("finish_reason".into(), json!("stop"));
    m.insert("token_usage_completion_tokens".into(), json!(i));
    m.insert("seq".into(), json!(i));
    Piece {
        kind: PieceKind::Text,
        // Large enough that a kill often lands inside a write.
        text: format!("reply {i} ") + &"x".repeat(4096),
        tool_calls: vec![],
        metadata: m,
        ..Piece::default()
    }
}

/// In a child (env set): write until killed, printing each committed id.
/// Otherwise: the same writes, bounded, read back.
#[test]
fn writer_process() {
    let child_db = std::env::var_os(DB_ENV);
    let path = match &child_db {
        Some(p) => std::path::PathBuf::from(p),
        None => std::env::temp_dir().join(format!("shoal-writer-{}.sqlite", std::process::id())),
    };
    let mut store = Store::open(&path).expect("open");
    let conv = store.create_conversation("crash").expect("conv");
    let limit = if child_db.is_some() { u64::MAX } else { 20 };
    let mut ids = Vec::new();
    for i in 0..limit {
        let id = store
            .add_message(
                conv,
                "assistant",
                Some("chat"),
                Some("m"),
                &[piece(i), piece(i + 1)],
            )
            .expect("write");
        if child_db.is_some() {
            println!("committed {id} {i}");
        }
        ids.push((id, i));
    }
    for (id, i) in ids {
        let m = store.message(id).expect("read").expect("present");
        assert_eq!(m.pieces, vec![piece(i), piece(i + 1)]);
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn committed_messages_survive_kill_9() {
    let dir = std::env::temp_dir().join(format!("shoal-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("store.sqlite");
    let exe = std::env::current_exe().expect("test binary");
    let mut committed: Vec<(i64, u64)> = Vec::new();
    for round in 0..5u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "writer_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(DB_ENV, &db)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn writer");
        let out = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(out).lines();
        // Kill after a varying number of commits, mid-stream.
        let target = 15 + round * 7;
        let mut seen = 0;
        while let Some(Ok(line)) = lines.next() {
            if let Some(rest) = line.strip_prefix("committed ") {
                let mut it = rest.split_whitespace();
                let id: i64 = it.next().and_then(|s| s.parse().ok()).expect("id");
                let i: u64 = it.next().and_then(|s| s.parse().ok()).expect("i");
                committed.push((id, i));
                seen += 1;
                if seen == target {
                    child.kill().expect("kill -9");
                    break;
                }
            }
        }
        let _ = child.wait();
    }
    assert!(
        committed.len() >= 5 * 15,
        "writers committed {}",
        committed.len()
    );
    let store = Store::open(&db).expect("reopen after kills");
    assert_eq!(store.integrity_check().expect("check"), "ok");
    for (id, i) in &committed {
        let m = store
            .message(*id)
            .expect("read")
            .unwrap_or_else(|| panic!("committed message {id} lost"));
        assert_eq!(m.pieces, vec![piece(*i), piece(*i + 1)], "message {id}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
