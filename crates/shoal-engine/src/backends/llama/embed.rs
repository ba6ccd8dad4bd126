//! Embedding models on llama.cpp: BERT-family encoders (all-MiniLM, bge,
//! nomic-embed-text) and decoder embedding models (Qwen3-Embedding).
//!
//! One llama.cpp context with embeddings on and the file's own pooling. Each
//! [`LanguageModel::embed`] call is one llama.cpp pass over every input the
//! engine packed into it, each input its own sequence id; an encoder
//! processes a pass in one piece (llama.cpp asserts that `n_ubatch` holds
//! it), so the pass's tokens never exceed the context's `n_ubatch`.
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Mutex;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

use super::{vocab_table_bytes, ContextCell, LlamaOptions, LLAMA_MAX_SEQ};
use crate::backend::{EmbeddingInfo, LanguageModel, ModelInfo, Pooling};
use crate::error::{EngineError, Result};

/// Tokens one pass packs when inputs are short. Non-causal attention spans
/// the whole pass (masked per sequence), so its cost grows with the square
/// of the pass; at this size the weight products still dominate.
const PACK_TOKENS: usize = 512;
/// Longest input accepted, whatever a file claims (a pass must hold it).
const MAX_INPUT_TOKENS: usize = 32_768;

/// The pooling of an embedding GGUF; `None` for a model that generates
/// text (see [`shoal_gguf::Header::embedding_pooling`]).
pub fn pooling_of(header: &shoal_gguf::Header) -> Option<Pooling> {
    header.embedding_pooling().and_then(Pooling::from_name)
}

/// An encoder (non-causal attention) keeps no KV cache between passes.
fn is_encoder(header: &shoal_gguf::Header) -> bool {
    header.arch_bool("attention.causal") == Some(false)
}

/// The longest input: the positions the model was trained on (its
/// `{arch}.context_length`, 512 if it names none), at most `MAX_INPUT_TOKENS`.
pub(super) fn window_of(header: &shoal_gguf::Header) -> usize {
    (header.arch_uint("context_length").unwrap_or(512) as usize).clamp(1, MAX_INPUT_TOKENS)
}

/// Tokens one pass holds for a model trained on `window` positions.
fn pass_tokens(window: usize) -> usize {
    window.max(PACK_TOKENS)
}

/// What an embedding model holds beside its weights, from its header alone:
/// KV bytes (a decoder's cache for one pass; 0 for an encoder) and buffer
/// bytes (each token's hidden state and each sequence's pooled vector, and
/// the vocabulary tables). The load reports the same figures, so the
/// pool's estimate and the loaded model differ only by the file's header.
pub fn reserved_bytes(header: &shoal_gguf::Header) -> Option<(u64, u64)> {
    pooling_of(header)?;
    let pass = pass_tokens(window_of(header)) as u64;
    let dims = header.arch_uint("embedding_length").unwrap_or(0);
    let kv = if is_encoder(header) {
        0
    } else {
        pass * super::kv_bytes_per_position(header)
    };
    let buffers = (pass + LLAMA_MAX_SEQ as u64) * dims * 4 + vocab_table_bytes(header);
    Some((kv, buffers))
}

/// An embedding GGUF on llama.cpp.
pub struct LlamaEmbedder {
    ctx: Mutex<ContextCell>,
    info: ModelInfo,
    embedding: EmbeddingInfo,
    /// A decoder model keeps a KV cache: cleared after every pass.
    has_memory: bool,
}

impl LlamaEmbedder {
    pub fn load(
        path: &Path,
        header: &shoal_gguf::Header,
        pooling: Pooling,
        opts: &LlamaOptions,
    ) -> Result<Self> {
        // The context is sized from the window before the weights load.
        let window = window_of(header);
        let pass = pass_tokens(window);
        let threads = i32::try_from(opts.threads.max(1)).unwrap_or(1);
        let kind = match pooling {
            Pooling::Mean => LlamaPoolingType::Mean,
            Pooling::Cls => LlamaPoolingType::Cls,
            Pooling::Last => LlamaPoolingType::Last,
        };
        let cparams = LlamaContextParams::default()
            .with_embeddings(true)
            .with_pooling_type(kind)
            .with_n_ctx(NonZeroU32::new(pass as u32))
            .with_n_batch(pass as u32)
            .with_n_ubatch(pass as u32)
            .with_n_seq_max(LLAMA_MAX_SEQ as u32)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            .with_no_perf(true);
        let (model, ctx) = super::load_with_context(path, &LlamaModelParams::default(), cparams)?;
        let (kv, buffers) = reserved_bytes(header).unwrap_or((0, 0));
        let dimensions = model.n_embd_out().max(0) as usize;
        let info = super::model_info(
            &model,
            header,
            (window, window),
            kv as usize,
            buffers as usize,
        );
        Ok(LlamaEmbedder {
            ctx: Mutex::new(ctx),
            embedding: EmbeddingInfo {
                dimensions,
                pooling,
                normalize: true,
                max_input_tokens: window,
                batch_tokens: pass,
                batch_inputs: LLAMA_MAX_SEQ,
            },
            info,
            has_memory: !is_encoder(header),
        })
    }

    /// The tokenizer of this model.
    pub fn vocab(&self) -> super::vocab::LlamaVocab {
        let ctx = self.ctx.lock().unwrap_or_else(|p| p.into_inner());
        super::vocab::LlamaVocab::of(ctx.borrow_owner().clone())
    }
}

impl LanguageModel for LlamaEmbedder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn embedding(&self) -> Option<&EmbeddingInfo> {
        Some(&self.embedding)
    }

    fn embed(&self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let total: usize = inputs.iter().map(|i| i.len()).sum();
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        if total > self.embedding.batch_tokens
            || inputs.len() > self.embedding.batch_inputs
            || inputs.iter().any(|i| i.is_empty())
        {
            return Err(EngineError::Backend(format!(
                "an embedding pass of {} inputs and {total} tokens is outside its bounds",
                inputs.len()
            )));
        }
        let mut batch = LlamaBatch::new(total, inputs.len() as i32);
        for (seq, tokens) in inputs.iter().enumerate() {
            for (pos, &t) in tokens.iter().enumerate() {
                batch
                    .add(LlamaToken(t as i32), pos as i32, &[seq as i32], true)
                    .map_err(|e| EngineError::Backend(format!("llama.cpp batch: {e}")))?;
            }
        }
        let mut cell = self.ctx.lock().unwrap_or_else(|p| p.into_inner());
        let has_memory = self.has_memory;
        cell.with_dependent_mut(|_, ctx| {
            let ran = ctx.decode(&mut batch);
            let out = ran
                .map_err(|e| EngineError::Backend(format!("llama.cpp embedding pass: {e}")))
                .and_then(|()| {
                    (0..inputs.len())
                        .map(|seq| {
                            ctx.embeddings_seq_ith(seq as i32)
                                .map(<[f32]>::to_vec)
                                .map_err(|e| {
                                    EngineError::Backend(format!(
                                        "llama.cpp gave no embedding for input {seq}: {e}"
                                    ))
                                })
                        })
                        .collect()
                });
            if has_memory {
                ctx.clear_kv_cache();
            }
            out
        })
    }

    fn new_cache(&self) -> Result<Box<dyn crate::backend::KvCache>> {
        Err(not_generative())
    }

    fn forward(&self, _: &[u32], _: &mut dyn crate::backend::KvCache) -> Result<Vec<f32>> {
        Err(not_generative())
    }

    fn new_batch(&self) -> Result<Box<dyn crate::backend::DecodeBatch>> {
        Err(not_generative())
    }

    fn forward_batch(
        &self,
        _: &[u32],
        _: &mut dyn crate::backend::DecodeBatch,
    ) -> Result<Vec<Vec<f32>>> {
        Err(not_generative())
    }
}

fn not_generative() -> EngineError {
    EngineError::WrongKind("this is an embedding model; it cannot generate text".into())
}
