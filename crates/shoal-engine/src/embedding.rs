//! Embeddings: an embedding model's engine thread and what callers send it.
//!
//! Every request waiting when the thread turns to its queue joins one round:
//! their inputs are packed into backend passes up to the model's batch
//! limits ([`EmbeddingInfo`]), so many inputs in one request and many
//! requests at once share passes instead of running one input a call. A
//! vector does not depend on what shares its pass (each input is its own
//! sequence); it is scaled to unit length here, above the seam, when the
//! model's metadata says so.
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::backend::{EmbeddingInfo, LanguageModel};
use crate::engine::{Engine, ModelHandle};
use crate::error::{EngineError, Result};
use crate::request::EngineStats;
use crate::sequence::ms;

/// One request's inputs as the engine thread receives them.
pub struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    reply: oneshot::Sender<Result<Embedded>>,
    submitted: Instant,
    /// Who has the job: still queued, taken into a round, or withdrawn by
    /// its caller. One atomic step decides between the last two, so a
    /// caller that leaves knows exactly whether its tokens were computed.
    claim: Arc<AtomicU8>,
}

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// A queued embedding request: its vectors when they come, or, for a
/// caller that gives up, whether the engine had already taken it.
pub struct EmbedTicket {
    wait: oneshot::Receiver<Result<Embedded>>,
    claim: Arc<AtomicU8>,
}

impl EmbedTicket {
    /// The vectors and their cost. Cancel-safe: it may be awaited again
    /// after another branch of a `select!` won.
    pub async fn result(&mut self) -> Result<Embedded> {
        (&mut self.wait)
            .await
            .map_err(|_| EngineError::Unavailable("engine has stopped".into()))?
    }

    /// Withdraws the request if no round has taken it yet: true means
    /// nothing of it was or will be computed; false means a round has it
    /// (its result still comes, and its tokens were spent).
    pub fn withdraw(&self) -> bool {
        self.claim
            .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// One request's vectors, in input order, with what they cost.
#[derive(Clone, Debug)]
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    /// Tokens embedded per input (after any truncation).
    pub tokens: Vec<usize>,
    /// Waiting for the engine thread, then computing (the passes that held
    /// this request's inputs, from the first one's start to the last one's end).
    pub queue_ms: f64,
    pub compute_ms: f64,
}

impl Embedded {
    /// Every token embedded: the usage of an embedding request.
    pub fn prompt_tokens(&self) -> usize {
        self.tokens.iter().sum()
    }
}

impl ModelHandle {
    /// What this model offers as an embedding model; `None` for a model that
    /// generates text.
    pub fn embedding(&self) -> Option<&EmbeddingInfo> {
        self.embedding.as_ref()
    }

    /// One text input's tokens as the model embeds it, special tokens
    /// included. Longer than the model's window: an error, or with
    /// `truncate` the first tokens and the end-of-input specials the
    /// tokenizer adds (BERT's `[SEP]`), cut to fit.
    pub fn embedding_tokens(&self, text: &str, truncate: bool) -> Result<Vec<u32>> {
        let mut tokens = self.vocab.encode_input(text)?;
        let window = self.embedding_window()?;
        if tokens.len() > window && truncate {
            let tail = self.end_specials().min(window);
            let end = tokens.split_off(tokens.len() - tail);
            tokens.truncate(window - tail);
            tokens.extend(end);
        }
        Ok(tokens)
    }

    fn embedding_window(&self) -> Result<usize> {
        self.embedding
            .as_ref()
            .map(|e| e.max_input_tokens)
            .ok_or_else(not_embedding)
    }

    /// How many special tokens the tokenizer puts after an input's text.
    fn end_specials(&self) -> usize {
        let empty = self.vocab.encode_input("").unwrap_or_default();
        let lead = usize::from(self.vocab.add_bos && empty.first() == self.vocab.bos.as_ref());
        empty.len().saturating_sub(lead)
    }
}

fn not_embedding() -> EngineError {
    EngineError::WrongKind("this model generates text; it is not an embedding model".into())
}

impl Engine {
    /// Queues `inputs` (token ids, each non-empty and within the window;
    /// see [`ModelHandle::embedding_tokens`]) and waits for their vectors.
    pub async fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Embedded> {
        self.submit_embedding(inputs)?.result().await
    }

    /// Queues `inputs` as [`Engine::embed`] does, returning at once with a
    /// ticket for the vectors (a caller that must account for a request
    /// its client left uses it to tell queued from computed).
    pub fn submit_embedding(&self, inputs: Vec<Vec<u32>>) -> Result<EmbedTicket> {
        let info = self.model.embedding.as_ref().ok_or_else(not_embedding)?;
        let vocab = self.model.info.vocab_size;
        for (i, tokens) in inputs.iter().enumerate() {
            if tokens.is_empty() {
                return Err(EngineError::InvalidRequest(format!(
                    "input {i} has no tokens"
                )));
            }
            if tokens.len() > info.max_input_tokens {
                return Err(EngineError::ContextOverflow {
                    prompt_tokens: tokens.len(),
                    context: info.max_input_tokens,
                });
            }
            if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(EngineError::InvalidRequest(format!(
                    "input {i}: token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
        }
        let (reply, wait) = oneshot::channel();
        let claim = Arc::new(AtomicU8::new(QUEUED));
        let job = EmbedJob {
            inputs,
            reply,
            submitted: Instant::now(),
            claim: claim.clone(),
        };
        self.queue_embedding(job)?;
        Ok(EmbedTicket { wait, claim })
    }
}

/// The embedding engine thread: a round per wake-up, every waiting request
/// in it, until every handle is gone.
pub(crate) fn run_embeddings(
    model: Box<dyn LanguageModel>,
    jobs: Receiver<EmbedJob>,
    stats: Arc<EngineStats>,
) {
    let Some(info) = model.embedding().cloned() else {
        return;
    };
    while let Ok(first) = jobs.recv() {
        let mut round = vec![first];
        round.extend(jobs.try_iter());
        stats
            .queued
            .fetch_sub(round.len() as u64, Ordering::Relaxed);
        // A request whose caller left or withdrew it is not computed; the
        // rest are claimed for this round.
        round.retain(|j| {
            !j.reply.is_closed()
                && j.claim
                    .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        });
        stats.running.store(round.len() as u64, Ordering::Relaxed);
        stats.embedding_rounds.fetch_add(1, Ordering::Relaxed);
        run_round(model.as_ref(), &info, round, &stats);
        stats.running.store(0, Ordering::Relaxed);
        crate::process::release_free_memory();
    }
}

/// Where one input's vector goes: its request and its place there.
struct Slot {
    job: usize,
    input: usize,
}

fn run_round(
    model: &dyn LanguageModel,
    info: &EmbeddingInfo,
    round: Vec<EmbedJob>,
    stats: &EngineStats,
) {
    let mut vectors: Vec<Vec<Vec<f32>>> = round
        .iter()
        .map(|j| vec![Vec::new(); j.inputs.len()])
        .collect();
    let mut failed: Vec<Option<String>> = vec![None; round.len()];
    let mut spans: Vec<Option<(Instant, Instant)>> = vec![None; round.len()];
    let slots: Vec<Slot> = round
        .iter()
        .enumerate()
        .flat_map(|(job, j)| (0..j.inputs.len()).map(move |input| Slot { job, input }))
        .collect();
    let mut at = 0;
    while at < slots.len() {
        // One pass: consecutive inputs up to the token and input limits
        // (an input alone is always within them: the window is checked on entry).
        let mut end = at;
        let mut tokens = 0;
        while end < slots.len() && end - at < info.batch_inputs {
            let n = round[slots[end].job].inputs[slots[end].input].len();
            if end > at && tokens + n > info.batch_tokens {
                break;
            }
            tokens += n;
            end += 1;
        }
        let pass = &slots[at..end];
        let inputs: Vec<&[u32]> = pass
            .iter()
            .map(|s| round[s.job].inputs[s.input].as_slice())
            .collect();
        let started = Instant::now();
        let out = model.embed(&inputs);
        let ended = Instant::now();
        stats.decode_passes.fetch_add(1, Ordering::Relaxed);
        stats
            .decode_steps
            .fetch_add(pass.len() as u64, Ordering::Relaxed);
        stats
            .peak_batch
            .fetch_max(pass.len() as u64, Ordering::Relaxed);
        match out {
            Ok(vs) if vs.len() == pass.len() => {
                for (s, mut v) in pass.iter().zip(vs) {
                    if info.normalize {
                        normalize(&mut v);
                    }
                    vectors[s.job][s.input] = v;
                }
            }
            Ok(vs) => {
                let why = format!("{} vectors for {} inputs", vs.len(), pass.len());
                pass.iter().for_each(|s| failed[s.job] = Some(why.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "embedding pass failed");
                pass.iter()
                    .for_each(|s| failed[s.job] = Some(e.to_string()));
            }
        }
        for s in pass {
            let span = spans[s.job].get_or_insert((started, ended));
            span.1 = ended;
        }
        at = end;
    }
    for (((job, vecs), fail), span) in round.into_iter().zip(vectors).zip(failed).zip(spans) {
        let tokens: Vec<usize> = job.inputs.iter().map(Vec::len).collect();
        let result = match fail {
            Some(why) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(EngineError::Backend(why))
            }
            None => {
                stats.completed.fetch_add(1, Ordering::Relaxed);
                stats
                    .prompt_tokens
                    .fetch_add(tokens.iter().sum::<usize>() as u64, Ordering::Relaxed);
                let (start, end) = span.unwrap_or((job.submitted, job.submitted));
                Ok(Embedded {
                    vectors: vecs,
                    tokens,
                    queue_ms: ms(start.saturating_duration_since(job.submitted)),
                    compute_ms: ms(end.saturating_duration_since(start)),
                })
            }
        };
        let _ = job.reply.send(result);
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_gives_unit_length_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, vec![0.0, 0.0]);
    }
}
