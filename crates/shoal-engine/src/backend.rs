//! The seam between the generation loop and a tensor library.
//!
//! The engine only needs "feed these tokens, give me next-token logits" plus a
//! per-sequence KV cache; everything backend-specific (MLX in `model/`,
//! llama.cpp in `backends/llama/`) lives behind these traits, so the engine
//! and the adapters never know which one runs.
use std::any::Any;

use crate::error::{EngineError, Result};

/// Static facts about a loaded model that the engine and adapters need.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelInfo {
    /// Architecture name as the model declares it (`llama`, `qwen2`, `qwen3`).
    pub architecture: String,
    pub vocab_size: usize,
    /// Maximum number of positions (prompt + output) one request may take:
    /// the window served. An image takes fewer positions than tokens on an
    /// M-RoPE model ([`crate::vision::PreparedImage::positions`]).
    pub context_length: usize,
    /// Most KV cells one request may hold, one per token, images' included:
    /// its share of llama.cpp's pool, which may exceed the window where the
    /// pool is larger than the trained window. Equal to `context_length`
    /// where a token is a position and the cache grows with need (MLX).
    pub max_cells: usize,
    pub num_layers: usize,
    pub hidden_size: usize,
    /// Where the weights came from (`gguf` or `safetensors`) and how they are stored.
    pub format: String,
    pub quantization: Option<String>,
    /// Compute dtype chosen for this device (e.g. `float32` on the CPU backend).
    pub dtype: String,
    /// Device the backend runs on (`cpu`, `gpu`).
    pub device: String,
    /// Bytes held by the weights after loading.
    pub weight_bytes: usize,
    /// The engine running the forward pass.
    pub backend: BackendKind,
    /// Bytes reserved up front for KV state (llama.cpp's cell pool); 0 where
    /// the cache grows with need (MLX).
    pub kv_capacity_bytes: usize,
    /// Other bytes held from the load on, beside weights and KV: llama.cpp's
    /// logits rows, a vocabulary's worth of floats for each sequence it
    /// tracks (16 MiB for Gemma 3 at 16 sequences), and its vocabulary
    /// tables ([`crate::backends::llama::vocab_table_bytes`]); 0 on MLX.
    pub buffer_bytes: usize,
}

impl ModelInfo {
    /// Memory the loaded model holds: weights plus what is reserved up front.
    pub fn resident_bytes(&self) -> usize {
        self.weight_bytes + self.kv_capacity_bytes + self.buffer_bytes
    }

    /// The two bounds one request runs within.
    pub fn window(&self) -> Window {
        Window {
            positions: self.context_length,
            cells: self.max_cells,
        }
    }
}

/// How far one request may run. The window is counted in positions, which
/// is what the model was trained on and what RoPE reads; the KV pool in
/// cells, one a token. They differ only where an image takes fewer
/// positions than tokens (M-RoPE), so a text request meets both at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The window: positions one request may take, prompt and reply.
    pub positions: usize,
    /// The KV cells one request may hold.
    pub cells: usize,
}

impl Window {
    /// Whether a context of `tokens` tokens, `saved` of which take no
    /// position of their own (an M-RoPE image's), has no room left.
    pub fn full(&self, tokens: usize, saved: usize) -> bool {
        self.room(tokens, saved) == 0
    }

    /// Tokens that may still be added to such a context.
    pub fn room(&self, tokens: usize, saved: usize) -> usize {
        let positions = tokens.saturating_sub(saved);
        self.positions
            .saturating_sub(positions)
            .min(self.cells.saturating_sub(tokens))
    }
}

/// The engine behind the seam.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// MLX (mlx-rs): Metal on a Mac, its CPU backend elsewhere.
    Mlx,
    /// llama.cpp (llama-cpp-2), for GGUF files.
    Llama,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Mlx => "mlx",
            BackendKind::Llama => "llama",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-sequence attention state. Backends downcast to their own type.
pub trait KvCache: Any + Send {
    /// Number of positions already held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Forget everything after the first `len` positions (used to reuse a prefix).
    fn truncate(&mut self, len: usize);
    /// Bytes currently reserved.
    fn nbytes(&self) -> usize;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// An independent copy (cheap where the backend's arrays are immutable).
    fn clone_box(&self) -> Box<dyn KvCache>;
    /// Called when the cache is kept for later reuse (the prefix cache) and
    /// no longer runs: a backend whose running sequences share a bounded
    /// pool moves it out of that pool here, so kept prefixes neither take
    /// room from nor slow down the sequences that run.
    fn park(&mut self) {}
    /// Whether [`KvCache::save`] can write what it holds. A llama.cpp cache
    /// holding an image laid out in 2-D positions (M-RoPE) cannot: its
    /// token-to-position map is not in the state file, so the disk tier
    /// keeps such prefixes in RAM only.
    fn persistable(&self) -> bool {
        true
    }
    /// Writes the positions it holds, whose tokens are `tokens`, to `path` in
    /// the backend's own format, for the disk tier of the prefix cache
    /// ([`LanguageModel::restore_cache`] reads it back). A backend that
    /// cannot says so, and its prefixes stay in RAM only.
    fn save(&mut self, path: &std::path::Path, tokens: &[u32]) -> Result<()> {
        let _ = (path, tokens);
        Err(EngineError::Unsupported(
            "this backend cannot write its KV state to disk".into(),
        ))
    }
}

/// The backend's own state behind a seam object (`cache.as_any_mut()`), or
/// an error naming `what` when another backend made it: a cache or batch
/// never crosses models, and a mix-up must not panic.
pub fn downcast<'a, T: Any>(state: &'a mut dyn Any, what: &str) -> Result<&'a mut T> {
    state
        .downcast_mut::<T>()
        .ok_or_else(|| EngineError::Backend(format!("a {what} from another backend")))
}

/// How an embedding model turns its last hidden states into one vector per
/// input, as the model's own metadata says (GGUF `{arch}.pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The mean over the input's tokens.
    Mean,
    /// The first token's state (BERT's `[CLS]`).
    Cls,
    /// The last token's state (decoder embedding models such as Qwen3-Embedding).
    Last,
}

impl Pooling {
    pub fn from_name(name: &str) -> Option<Pooling> {
        match name {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// What an embedding model offers, decided once at load.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EmbeddingInfo {
    /// Length of each vector.
    pub dimensions: usize,
    pub pooling: Pooling,
    /// Vectors are scaled to unit length above the seam.
    pub normalize: bool,
    /// Most tokens one input may have (the model's trained window).
    pub max_input_tokens: usize,
    /// Most tokens, and most inputs, one [`LanguageModel::embed`] call takes:
    /// the engine packs inputs from every waiting request up to these.
    pub batch_tokens: usize,
    pub batch_inputs: usize,
}

/// A hold on what a backend shares across a process while it computes
/// (MLX's streams, graph evaluation and allocator): see
/// [`LanguageModel::turn`]. `None` where nothing is shared.
pub type Turn = Option<std::sync::MutexGuard<'static, ()>>;

/// A model run by the engine: a causal language model run token by token,
/// or an embedding model ([`LanguageModel::embedding`] is `Some`) whose
/// generation calls fail and whose [`LanguageModel::embed`] works.
pub trait LanguageModel: Send {
    fn info(&self) -> &ModelInfo;
    /// Set for an embedding model.
    fn embedding(&self) -> Option<&EmbeddingInfo> {
        None
    }
    /// One pooled (not normalized) vector per input, in one backend call.
    /// The caller keeps within [`EmbeddingInfo`]'s batch limits.
    fn embed(&self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let _ = inputs;
        Err(EngineError::WrongKind(
            "this model generates text; it is not an embedding model".into(),
        ))
    }
    fn new_cache(&self) -> Result<Box<dyn KvCache>>;
    /// Whether its caches can be written to disk and read back
    /// ([`KvCache::save`], [`LanguageModel::restore_cache`]): the prefix
    /// cache's disk tier is on only for such a model.
    fn persists_cache(&self) -> bool {
        false
    }
    /// A cache holding the state [`KvCache::save`] wrote for `tokens`, from
    /// that file's bytes (read back whole, or joined from the disk tier's
    /// blocks). Anything that does not match this model (another shape,
    /// another token list) is an error, never a wrong cache.
    fn restore_cache(&self, payload: &[u8], tokens: &[u32]) -> Result<Box<dyn KvCache>> {
        let _ = (payload, tokens);
        Err(EngineError::Unsupported(
            "this backend cannot read KV state from disk".into(),
        ))
    }
    /// How its payloads ([`KvCache::save`]) are laid out by position, so the
    /// disk tier keeps them in blocks that prompts sharing a prefix share;
    /// `None` keeps every payload whole.
    fn payload_layout(&self) -> Option<crate::disk_cache::layout::LayoutFn> {
        None
    }
    /// Runs `tokens` after whatever `cache` already holds and returns the
    /// logits (length `vocab_size`, float32) for the position after the last token.
    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> Result<Vec<f32>>;

    /// Runs one image (made ready by this model's
    /// [`crate::vision::ImageReader`]) after whatever `cache` holds: it
    /// takes `image.tokens` positions. No logits: a prompt never ends with
    /// an image ([`crate::vision::encode_with_images`]). Only a vision
    /// model reads images.
    fn forward_image(
        &self,
        _image: &crate::vision::PreparedImage,
        _cache: &mut dyn KvCache,
    ) -> Result<()> {
        Err(EngineError::Unsupported(
            "this model cannot read images".into(),
        ))
    }

    /// An empty set of sequences to decode together.
    fn new_batch(&self) -> Result<Box<dyn DecodeBatch>>;

    /// Runs one token for every row of `batch` (token `i` for row `i`) in a
    /// single pass, so the weights are read once for all sequences, and
    /// returns each row's next-token logits.
    fn forward_batch(&self, tokens: &[u32], batch: &mut dyn DecodeBatch) -> Result<Vec<Vec<f32>>>;

    /// `Some(n)` where a reply must equal its cold run to the bit (llama.cpp's
    /// batch-invariant mode): a position's keys and values are then the bits
    /// a cold prefill gives only if they were computed in the same
    /// micro-batch, `n` tokens from a multiple of `n`. The engine then
    /// prefills in multiples of `n`, reuses a cached prefix only in whole
    /// micro-batches, and keeps only prompt positions (a reply's, computed a
    /// step at a time, differ from what a prefill of them gives).
    fn exact_prefix_unit(&self) -> Option<usize> {
        None
    }

    /// Held by the engine around each step of this model and while it is
    /// freed. A backend whose runtime is one per process (MLX) makes every
    /// engine thread that drives it take turns here; one engine alone
    /// never waits. Nothing by default.
    fn turn(&self) -> Turn {
        None
    }

    /// What besides the model file and [`ModelInfo`] makes this model's
    /// saved KV state valid (the backend's build and KV settings): part of
    /// the disk tier's fingerprint, so a changed setting never reads
    /// another setting's state.
    fn kv_fingerprint(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Whether [`LanguageModel::forward_spans`] takes several tokens a row:
    /// what speculative decoding needs to verify a draft in one step.
    fn verifies_drafts(&self) -> bool {
        false
    }

    /// Runs `spans[i]` (a token and the drafts after it) after row `i`'s
    /// cache in one pass and returns, for each row, the logits after each of
    /// its tokens. Without [`LanguageModel::verifies_drafts`] every span must
    /// be one token.
    fn forward_spans(
        &self,
        spans: &[Vec<u32>],
        batch: &mut dyn DecodeBatch,
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        let mut tokens = Vec::with_capacity(spans.len());
        for s in spans {
            match s.as_slice() {
                [t] => tokens.push(*t),
                _ => {
                    return Err(EngineError::Backend(
                        "this backend runs one token per row".into(),
                    ))
                }
            }
        }
        Ok(self
            .forward_batch(&tokens, batch)?
            .into_iter()
            .map(|l| vec![l])
            .collect())
    }
}

/// Sequences decoding together, one token each per step. A prefilled
/// sequence's cache joins as the last row; a finished one leaves with its
/// cache (for the prefix cache). Backends downcast to their own type.
pub trait DecodeBatch: Any + Send {
    fn rows(&self) -> usize;
    fn join(&mut self, cache: Box<dyn KvCache>) -> Result<()>;
    fn leave(&mut self, row: usize) -> Result<Box<dyn KvCache>>;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Drops the last `n` positions of row `row` (drafts the model did not
    /// confirm). Only backends that verify drafts need more than `n == 0`.
    fn drop_last(&mut self, row: usize, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        Err(EngineError::Backend(format!(
            "row {row}: this batch cannot drop positions"
        )))
    }
}

/// A batch that is just its rows' caches, for backends whose caches carry
/// everything a step needs (llama.cpp's sequence ids, a pipeline's ranks).
#[derive(Default)]
pub struct CacheRows {
    pub rows: Vec<Box<dyn KvCache>>,
}

impl CacheRows {
    /// The `CacheRows` behind `batch`, checked to hold one row per token.
    pub fn of<'a>(batch: &'a mut dyn DecodeBatch, tokens: &[u32]) -> Result<&'a mut CacheRows> {
        let rows: &mut CacheRows = downcast(batch.as_any_mut(), "decode batch")?;
        if rows.rows.len() != tokens.len() {
            return Err(EngineError::Backend(format!(
                "{} tokens for {} rows",
                tokens.len(),
                rows.rows.len()
            )));
        }
        Ok(rows)
    }
}

impl DecodeBatch for CacheRows {
    fn rows(&self) -> usize {
        self.rows.len()
    }
    fn join(&mut self, cache: Box<dyn KvCache>) -> Result<()> {
        self.rows.push(cache);
        Ok(())
    }
    fn leave(&mut self, row: usize) -> Result<Box<dyn KvCache>> {
        if row >= self.rows.len() {
            return Err(EngineError::Backend(format!("no batch row {row}")));
        }
        Ok(self.rows.remove(row))
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn drop_last(&mut self, row: usize, n: usize) -> Result<()> {
        let cache = self
            .rows
            .get_mut(row)
            .ok_or_else(|| EngineError::Backend(format!("no batch row {row}")))?;
        let len = cache.len().saturating_sub(n);
        cache.truncate(len);
        Ok(())
    }
}

#[cfg(test)]
mod window_tests {
    use super::Window;

    #[test]
    fn text_meets_both_bounds_at_once_and_images_meet_the_first_they_fill() {
        // Text: a token is a position and a cell.
        let w = Window {
            positions: 256,
            cells: 256,
        };
        assert_eq!(w.room(250, 0), 6);
        assert!(w.full(256, 0));
        // A pool larger than the window: 300 tokens of which 100 take no
        // position (M-RoPE images) are 200 positions, 56 from the window.
        let w = Window {
            positions: 256,
            cells: 1024,
        };
        assert_eq!(w.room(300, 100), 56);
        assert!(!w.full(300, 100));
        assert!(w.full(356, 100));
        // Many images: the cells run out while positions are left.
        assert_eq!(w.room(1000, 900), 24);
        assert!(w.full(1024, 900));
        // Never below zero, whatever the counts.
        assert_eq!(w.room(2000, 0), 0);
        assert_eq!(w.room(10, 50), 256);
    }
}
