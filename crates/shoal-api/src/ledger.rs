//! `/v1/usage`: the last requests with exactly what was reported to the client.
use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// One served request.
#[derive(Clone, Debug, Serialize)]
pub struct LedgerEntry {
    pub id: String,
    pub dialect: &'static str,
    pub model: String,
    pub created: u64,
    pub stream: bool,
    /// Finish/stop reason per choice, in the dialect's words ("cancelled" when
    /// the client left before the end and nothing was sent).
    pub finish_reasons: Vec<String>,
    /// The engine's own reason per choice, finer than some dialects
    /// (`stop_sequence`, `context_window`, `cancelled` …).
    pub engine_finish_reasons: Vec<&'static str>,
    /// The stop sequence that matched, per choice (null where none did).
    pub stop_sequences: Vec<Option<String>>,
    /// The usage object exactly as sent (or as it would have been sent).
    pub usage: serde_json::Value,
    pub ttft_ms: f64,
    pub decode_tokens_per_s: f64,
    pub prefill_tokens_per_s: f64,
}

/// A bounded in-memory ring of recent entries.
pub struct Ledger {
    cap: usize,
    entries: Mutex<VecDeque<LedgerEntry>>,
}

impl Ledger {
    pub fn new(cap: usize) -> Self {
        Ledger {
            cap: cap.max(1),
            entries: Mutex::new(VecDeque::new()),
        }
    }

    pub fn record(&self, e: LedgerEntry) {
        let mut q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == self.cap {
            q.pop_front();
        }
        q.push_back(e);
    }

    /// The entry for a response id, if it is still in the ring.
    pub fn get(&self, id: &str) -> Option<LedgerEntry> {
        let q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        q.iter().rev().find(|e| e.id == id).cloned()
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

    /// Newest first.
    pub fn recent(&self, limit: usize) -> Vec<LedgerEntry> {
        let q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        q.iter().rev().take(limit).cloned().collect()
    }
}
