//! `/v1/usage`: the last requests, kept as the engine's own records of each
//! choice; each dialect's words and usage object are rendered from them when
//! read ([`crate::wire`]), so what the ledger shows is what the client was sent.
use std::collections::VecDeque;
use std::sync::Mutex;

use serde_json::{json, Value};
use shoal_client::Dialect;
use shoal_engine::{Completion, FinishReason, Timings, Usage};

use crate::wire;

/// One served request.
#[derive(Clone, Debug)]
pub struct LedgerEntry {
    pub id: String,
    pub dialect: Dialect,
    pub model: String,
    pub created: u64,
    pub stream: bool,
    /// Consecutive choices that share a prompt (the request's `n`).
    pub per_prompt: usize,
    /// The engine's record of each choice that ended, in choice order.
    pub completions: Vec<Completion>,
}

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
            "model": self.model,
            "created": self.created,
            "stream": self.stream,
            "finish_reasons": self.finish_reasons(),
            "engine_finish_reasons": self.completions.iter().map(|c| c.finish.as_str()).collect::<Vec<_>>(),
            "stop_sequences": self.completions.iter().map(|c| match &c.finish {
                FinishReason::StopSequence(s) => Some(s.as_str()),
                _ => None,
            }).collect::<Vec<_>>(),
            "usage": wire::usage_json(self.dialect, &self.usage()),
            "ttft_ms": t.ttft_ms,
            "decode_tokens_per_s": t.decode_tokens_per_s,
            "prefill_tokens_per_s": t.prefill_tokens_per_s,
        })
    }
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
