//! A ledger entry: one answered request as the engine recorded it, with the
//! request's facts, and its row in the store.

use crate::dialect::{Dialect, Registry};
use serde_json::{json, Value};
use shoal_client::metadata::{Cost, Price};
use shoal_engine::{Completion, FinishReason, Timings, Usage};
use shoal_store::{ChoiceRow, UsageRow};

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
    /// The chat turn the client says the request served (`x-shoal-turn`):
    /// a tool loop's model turns and a continued reply's steps share one.
    pub turn: Option<String>,
}

/// Response header naming the ledger id a generation was recorded under, so
/// a node that forwarded the request can record it under the same id.
pub const REQUEST_ID_HEADER: &str = "x-shoal-request-id";
/// Headers a node adds to a request it forwards (trusted only on a request
/// whose cluster signature checks out): who received it and from whom.
pub const RECEIVED_BY_HEADER: &str = "x-shoal-received-by";
pub const CLIENT_HEADER: &str = "x-shoal-client";
pub const ORIGIN_HEADER: &str = "x-shoal-origin";
/// Request header a client sets to tie its requests to one turn of its chat
/// (any text up to [`MAX_TURN_LEN`] bytes; the ledger keeps and filters by it).
pub const TURN_HEADER: &str = "x-shoal-turn";
/// Longest turn id kept; a longer one is cut at a character boundary.
pub const MAX_TURN_LEN: usize = 128;

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
    pub(super) fn finish_name(&self) -> &'static str {
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
                // Of `prompt`, the positions images took, and the images.
                "image": self.usage().image_tokens,
                "images": self.usage().images,
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
            "turn": self.facts.turn,
        })
    }

    pub(super) fn to_row(&self) -> UsageRow {
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
            turn: self.facts.turn.clone(),
            choices: self.completions.iter().map(choice_row).collect(),
        }
    }

    pub(super) fn from_row(r: UsageRow, dialects: Registry) -> Option<LedgerEntry> {
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
                turn: r.turn,
            },
            backend: r.backend,
            status: r.status,
            error: r.error,
        })
    }
}

/// One choice's engine record as the store keeps it. The row's figures are
/// named as the fields of `Usage` and `Timings`, so they are carried by name
/// (a figure the row lacks fails `every_figure_survives_the_store`).
fn choice_row(c: &Completion) -> ChoiceRow {
    let mut fields = serde_json::Map::new();
    for part in [json!(c.usage), json!(c.timings)] {
        if let Value::Object(m) = part {
            fields.extend(m);
        }
    }
    fields.insert("finish".into(), json!(c.finish.as_str()));
    fields.insert("finish_detail".into(), json!(c.finish.detail()));
    serde_json::from_value(Value::Object(fields)).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a choice's figures do not fit the ledger's row");
        ChoiceRow {
            finish: c.finish.as_str().into(),
            finish_detail: c.finish.detail(),
            ..ChoiceRow::default()
        }
    })
}

/// The engine record back from its row; `None` (and a warning) for a
/// finish this program does not know (a newer node's) or figures that do
/// not read back.
fn completion(id: &str, c: ChoiceRow) -> Option<Completion> {
    let Some(finish) = FinishReason::from_parts(&c.finish, c.finish_detail.as_deref()) else {
        tracing::warn!(id, finish = %c.finish, "ledger row with an unknown finish skipped");
        return None;
    };
    let figures = json!(c);
    let read = || -> serde_json::Result<(Usage, Timings)> {
        Ok((
            serde_json::from_value(figures.clone())?,
            serde_json::from_value(figures.clone())?,
        ))
    };
    match read() {
        Ok((usage, timings)) => Some(Completion {
            finish,
            usage,
            timings,
        }),
        Err(e) => {
            tracing::warn!(id, error = %e, "ledger row whose figures do not read skipped");
            None
        }
    }
}

#[cfg(test)]
mod figure_tests {
    use super::*;

    /// `T` with every field set to a distinct non-zero number.
    fn all_set<T: serde::Serialize + serde::de::DeserializeOwned + Default>(start: u64) -> T {
        let Value::Object(fields) = json!(T::default()) else {
            panic!("not a struct")
        };
        let set: serde_json::Map<String, Value> = fields
            .keys()
            .zip(start..)
            .map(|(k, n)| (k.clone(), json!(n)))
            .collect();
        serde_json::from_value(Value::Object(set)).expect("numbers")
    }

    #[test]
    fn every_figure_survives_the_store() {
        let c = Completion {
            finish: FinishReason::StopSequence("END".into()),
            usage: all_set(1),
            timings: all_set(100),
        };
        let row = choice_row(&c);
        assert_eq!(row.finish, "stop_sequence");
        assert_eq!(completion("x", row), Some(c));
    }
}
