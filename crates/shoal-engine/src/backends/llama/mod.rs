//! The llama.cpp backend (through the `llama-cpp-2` crate) for GGUF files:
//! weights stay quantized in memory and run on llama.cpp's own kernels.
//!
//! Only the forward pass lives here. One llama.cpp context serves every
//! sequence of a model: its KV cache is unified (all running sequences draw
//! cells from one pool of `kv_tokens` positions) and each running
//! [`KvCache`] is a sequence id in it. A prefix the prefix cache keeps is
//! parked as a host-memory snapshot and restored into a fresh id on a hit.
//! Sampling, grammar, stop sequences, templates and accounting stay above
//! the seam, on the logits returned here.
use std::any::Any;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::DecodeError;

use crate::backend::{
    downcast, BackendKind, CacheRows, DecodeBatch, KvCache, LanguageModel, ModelInfo,
};
use crate::error::{EngineError, Result};

pub mod embed;
mod init;
mod state_file;
pub mod vision;
pub mod vocab;

pub use init::runtime;
#[cfg(test)]
mod window_tests;

/// llama.cpp's `LLAMA_MAX_SEQ`: most sequences one context can track.
const LLAMA_MAX_SEQ: usize = 256;
/// Tokens handed to one `llama_decode` call; longer prompts go in pieces.
const N_BATCH: usize = 2048;
/// Tokens llama.cpp computes in one micro-batch (its `n_ubatch`, the
/// default llama-server uses).
const N_UBATCH: usize = 512;
/// The micro-batch in batch-invariant mode: a reused prefix is cut to a
/// multiple of it there ([`LanguageModel::exact_prefix_unit`]), so a small
/// one keeps short chats' prefixes (a few percent of prefill speed, in a
/// mode that trades speed for exactness already).
const N_UBATCH_EXACT: usize = 64;

/// Settings of the llama.cpp backend.
#[derive(Clone, Debug)]
pub struct LlamaOptions {
    /// Threads for prefill and decode.
    pub threads: usize,
    /// KV positions shared by all sequences of the model (the cache's
    /// bound); 0 is `auto`: sized for each model from its trained window and
    /// `memory_budget` ([`LlamaOptions::kv_tokens_for`]).
    pub kv_tokens: usize,
    /// The memory all loaded models may take together (the pool's budget,
    /// `models.memory_budget_mb`), of which an `auto` KV pool takes at most
    /// [`AUTO_KV_SHARE`]; `None`: three quarters of the machine's RAM, as
    /// the pool's own default.
    pub memory_budget: Option<u64>,
    /// Sequences the context tracks: the running requests. llama.cpp
    /// reserves logits for each up front, so this is not simply the maximum.
    pub sequences: usize,
    /// Give each running sequence its own slice of `kv_tokens / sequences`
    /// positions (llama.cpp's per-sequence streams, as `llama-server
    /// --parallel` does) instead of one shared pool. A decode step then
    /// attends over each sequence's own positions only, not over every live
    /// one, which is faster under concurrent load; but one request can use
    /// no more than its slice.
    pub split: bool,
    /// Keep a reply equal to the bit to its lone run, whatever runs beside
    /// it ([`LlamaOptions::batch_invariant`]).
    pub batch_invariant: bool,
    /// What the KV cache stores keys and values as.
    pub kv_type: KvType,
    /// Where a vision model's projector comes from.
    pub projector: Projector,
}

/// Where a GGUF's vision projector (`mmproj-*.gguf`) comes from: a file
/// named for the model by a setting (`--mmproj` for the served model,
/// `[models] projectors` for any), else an `mmproj*.gguf` beside the model
/// file, unless projectors are off altogether.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Projector {
    /// No projector for any model: every model reads text only.
    pub off: bool,
    /// Projectors named for models: the model (its path, file name or file
    /// stem) and its projector file, or `None` for "this one reads text only".
    pub named: Vec<(String, Option<std::path::PathBuf>)>,
}

impl Projector {
    /// No model loads a projector.
    pub fn off() -> Self {
        Projector {
            off: true,
            named: Vec::new(),
        }
    }

    /// Names `file` as the projector of `model` (a path, file name or file
    /// stem; `None`: none for it). Earlier names win.
    pub fn named(mut self, model: impl Into<String>, file: Option<std::path::PathBuf>) -> Self {
        self.named.push((model.into(), file));
        self
    }

    /// What a setting says of the model at `model`, if it names it.
    fn setting_for(&self, model: &Path) -> Option<&Option<std::path::PathBuf>> {
        // The same file however the path is written (relative, through a
        // link), else by its name.
        let same_file = |key: &str| match (std::fs::canonicalize(key), std::fs::canonicalize(model))
        {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        let is = |key: &str| {
            Path::new(key) == model
                || model.file_name().is_some_and(|n| n == key)
                || model.file_stem().is_some_and(|n| n == key)
                || same_file(key)
        };
        self.named.iter().find(|(k, _)| is(k)).map(|(_, f)| f)
    }

    /// Whether a setting named the projector of the model at `model` (it
    /// must then load; one merely found beside a model may be another's).
    pub fn is_named(&self, model: &Path) -> bool {
        !self.off && matches!(self.setting_for(model), Some(Some(_)))
    }

    /// The projector file for the model at `model`, if any.
    pub fn for_model(&self, model: &Path) -> Option<std::path::PathBuf> {
        if self.off {
            return None;
        }
        match self.setting_for(model) {
            Some(named) => named.clone(),
            None => vision::projector_beside(model),
        }
    }
}

/// The element type of llama.cpp's KV cache: f16 (its default), or 8- and
/// 4-bit blocks that hold more positions in the same memory at some cost in
/// agreement with f16 (`make bench` prints both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    #[default]
    F16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    Q4_0,
}

impl KvType {
    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Bytes `elements` values take (a multiple of the 32-value block for the
    /// quantized types: 34 and 18 bytes a block).
    pub fn bytes(self, elements: u64) -> u64 {
        match self {
            KvType::F16 => elements * 2,
            KvType::Q8_0 => elements.div_ceil(32) * 34,
            KvType::Q4_0 => elements.div_ceil(32) * 18,
        }
    }

    fn llama(self) -> KvCacheType {
        match self {
            KvType::F16 => KvCacheType::F16,
            KvType::Q8_0 => KvCacheType::Q8_0,
            KvType::Q4_0 => KvCacheType::Q4_0,
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            "q4_0" | "q4" => Ok(KvType::Q4_0),
            other => Err(format!(
                "unknown KV cache type {other:?} (choose f16, q8_0 or q4_0)"
            )),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `kv_tokens` for `auto`: the pool sized from the model and the memory.
pub const AUTO_KV_TOKENS: usize = 0;
/// The fewest KV positions a model reserves (smaller settings are raised to it).
pub const MIN_KV_TOKENS: usize = 256;
/// The most KV positions a model reserves.
pub const MAX_KV_TOKENS: usize = 1 << 20;
/// `auto` never sizes a pool below this many positions (the trained window
/// when that is smaller), whatever the memory: the window an agent's
/// prompts need at the least.
pub const AUTO_KV_FLOOR: usize = 8192;
/// `auto`: one model's KV pool takes at most this share (numerator,
/// denominator: a quarter) of the memory budget, leaving the rest to weights
/// and other models.
pub const AUTO_KV_SHARE: (u64, u64) = (1, 4);
/// llama.cpp rounds a context's positions (and a split's slices) up to this.
const KV_PAD: usize = 256;

/// The `kv_cache_tokens` setting: `auto` (or 0), or a number of positions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvTokens {
    #[default]
    Auto,
    Fixed(usize),
}

impl KvTokens {
    /// As [`LlamaOptions::kv_tokens`] takes it (0 for `auto`).
    pub fn positions(self) -> usize {
        match self {
            KvTokens::Auto => AUTO_KV_TOKENS,
            KvTokens::Fixed(n) => n,
        }
    }
}

impl std::str::FromStr for KvTokens {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(KvTokens::Auto);
        }
        match s.parse::<usize>() {
            Ok(0) => Ok(KvTokens::Auto),
            Ok(n) => Ok(KvTokens::Fixed(n)),
            Err(_) => Err(format!("{s:?} is not a number of KV positions or \"auto\"")),
        }
    }
}

impl std::fmt::Display for KvTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvTokens::Auto => f.write_str("auto"),
            KvTokens::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl serde::Serialize for KvTokens {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            KvTokens::Auto => s.serialize_str("auto"),
            KvTokens::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> serde::Deserialize<'de> for KvTokens {
    /// A number (0: `auto`) or text: `auto` or a number written out (as a
    /// flag or an environment variable gives it).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(0) => Ok(KvTokens::Auto),
            Raw::Number(n) => Ok(KvTokens::Fixed(usize::try_from(n).unwrap_or(usize::MAX))),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The `auto` rule: a model's KV pool holds its trained window of
/// `trained` positions, unless that would take more than [`AUTO_KV_SHARE`]
/// of `budget` bytes at `bytes_per_position`; then as many positions as fit
/// in that share (whole 256-position blocks), but never fewer than
/// [`AUTO_KV_FLOOR`] (or `trained`, if smaller). `None`: no memory bound.
pub fn auto_kv_tokens(trained: usize, bytes_per_position: u64, budget: Option<u64>) -> usize {
    let trained = trained.clamp(1, MAX_KV_TOKENS);
    let fits = budget.map_or(usize::MAX, |b| {
        let (num, den) = AUTO_KV_SHARE;
        let share = b / den * num;
        let n = usize::try_from(share / bytes_per_position.max(1)).unwrap_or(usize::MAX);
        n / KV_PAD * KV_PAD
    });
    trained.min(fits).max(trained.min(AUTO_KV_FLOOR))
}

/// The machine's memory in bytes, where this build can read it.
fn machine_memory() -> Option<u64> {
    static TOTAL: OnceLock<Option<u64>> = OnceLock::new();
    *TOTAL.get_or_init(|| {
        if cfg!(target_os = "macos") {
            let out = std::process::Command::new("/usr/sbin/sysctl")
                .args(["-n", "hw.memsize"])
                .output()
                .ok()?;
            return String::from_utf8_lossy(&out.stdout).trim().parse().ok();
        }
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    })
}

impl LlamaOptions {
    /// From user settings: 0 threads means the physical cores.
    pub fn new(threads: usize, kv_tokens: usize) -> Self {
        LlamaOptions {
            threads: if threads == 0 {
                default_threads()
            } else {
                threads
            },
            kv_tokens: match kv_tokens {
                AUTO_KV_TOKENS => AUTO_KV_TOKENS,
                n => n.max(MIN_KV_TOKENS),
            },
            memory_budget: None,
            sequences: 16,
            split: false,
            batch_invariant: false,
            kv_type: KvType::F16,
            projector: Projector::default(),
        }
    }

    /// Where a model's vision projector comes from.
    pub fn projector(mut self, projector: Projector) -> Self {
        self.projector = projector;
        self
    }

    /// Batch-invariant kernels: weights stay as the file has them (no
    /// repacking, whose kernels change with a step's row count), each
    /// request has its own KV slice (as [`LlamaOptions::split`]), no step
    /// is a single row (a lone row gets a throwaway companion), since ggml
    /// computes 2+ rows with llamafile's GEMM and one row with its dot
    /// products, and a step with drafts runs one sequence a call. A reply is
    /// then the same to the bit alone, batched or drafted, at the cost of
    /// prefill speed (see ARCHITECTURE.md, Invariants).
    pub fn batch_invariant(mut self, on: bool) -> Self {
        self.batch_invariant = on;
        self
    }

    /// The KV cache's element type.
    pub fn kv_type(mut self, kv_type: KvType) -> Self {
        self.kv_type = kv_type;
        self
    }

    /// The memory budget an `auto` KV pool takes its share of (`None`:
    /// three quarters of the machine's RAM).
    pub fn memory_budget(mut self, bytes: Option<u64>) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// With the KV positions split evenly between the running sequences.
    pub fn split(mut self, split: bool) -> Self {
        self.split = split;
        self
    }

    /// Room for `max_batch` running requests. No more: llama.cpp keeps (and
    /// clears) a logits row per sequence it can track, a vocabulary's worth
    /// of floats each (1 MiB for Gemma 3's 262k tokens). Prefix-cache
    /// entries are parked in host memory and need no id.
    pub fn for_batch(mut self, max_batch: usize) -> Self {
        self.sequences = max_batch.clamp(1, LLAMA_MAX_SEQ);
        self
    }
}

/// The llama.cpp build whose state format the disk tier's payloads hold.
const LLAMA_CPP_BUILD: &str = "llama-cpp-sys-2 0.1.161";

impl LlamaOptions {
    /// What of these options (as set, before `auto` is resolved) makes a
    /// saved sequence state valid beside the model file: the build, and the
    /// KV cache's type, size, layout and mode.
    fn kv_fingerprint(&self) -> Vec<(&'static str, String)> {
        vec![
            ("llama.cpp", LLAMA_CPP_BUILD.to_string()),
            ("kv_type", self.kv_type.as_str().to_string()),
            ("kv_tokens", self.kv_tokens.to_string()),
            ("split", self.splits().to_string()),
            ("batch_invariant", self.batch_invariant.to_string()),
        ]
    }

    /// The sequences a context made from these options tracks (one more
    /// in batch-invariant mode: the throwaway companion of a lone row).
    pub fn context_sequences(&self) -> usize {
        let pad = usize::from(self.batch_invariant);
        (self.sequences + pad).clamp(1 + pad, LLAMA_MAX_SEQ)
    }

    /// Tokens a micro-batch computes ([`N_UBATCH`], or [`N_UBATCH_EXACT`] in
    /// batch-invariant mode).
    pub fn ubatch(&self) -> usize {
        if self.batch_invariant {
            N_UBATCH_EXACT
        } else {
            N_UBATCH
        }
    }

    /// Whether requests get a KV slice each.
    pub fn splits(&self) -> bool {
        self.split || self.batch_invariant
    }

    /// The KV positions asked of llama.cpp for a model whose header is `h`:
    /// `kv_tokens`, or for `auto` [`auto_kv_tokens`] of the model's trained
    /// window (`{arch}.context_length`, llama.cpp's `n_ctx_train`) and its
    /// KV bytes per position in this cache type, within `memory_budget`.
    fn asked_kv_tokens(&self, h: &shoal_gguf::Header) -> usize {
        if self.kv_tokens != AUTO_KV_TOKENS {
            return self.kv_tokens.clamp(MIN_KV_TOKENS, MAX_KV_TOKENS);
        }
        let budget = self
            .memory_budget
            .or_else(|| machine_memory().map(|m| m / 4 * 3));
        auto_kv_tokens(
            trained_window(h).unwrap_or(AUTO_KV_FLOOR),
            kv_bytes_per_position_as(h, self.kv_type),
            budget,
        )
        .max(MIN_KV_TOKENS)
    }

    /// The KV positions the pool of a model whose header is `h` reserves
    /// with these options, as llama.cpp rounds them (to 256, and with a
    /// split to 256 a slice): what the load reserves and the pool's memory
    /// estimate counts, one rule for both.
    pub fn kv_tokens_for(&self, h: &shoal_gguf::Header) -> usize {
        let n = self.asked_kv_tokens(h).next_multiple_of(KV_PAD);
        if !self.splits() {
            return n;
        }
        let seqs = self.context_sequences();
        (n / seqs).max(1).next_multiple_of(KV_PAD) * seqs
    }

    /// The window one request gets on the model whose header is `h`: its
    /// trained window within its share of the pool (a slice when split), as
    /// the loaded model's `ModelInfo::context_length` will say; for an
    /// embedding model, its longest input.
    pub fn window_for(&self, h: &shoal_gguf::Header) -> usize {
        if embed::pooling_of(h).is_some() {
            return embed::window_of(h);
        }
        let pool = self.kv_tokens_for(h);
        let per_sequence = if self.splits() {
            pool / self.context_sequences()
        } else {
            pool
        };
        trained_window(h).map_or(per_sequence, |t| t.min(per_sequence))
    }

    /// These options for the model whose header is `h`: `auto` resolved to
    /// the positions [`LlamaOptions::kv_tokens_for`] counts.
    pub fn for_model(&self, h: &shoal_gguf::Header) -> LlamaOptions {
        LlamaOptions {
            kv_tokens: self.asked_kv_tokens(h),
            ..self.clone()
        }
    }

    /// The llama.cpp context these options make: what a model loads with,
    /// and what `examples/llama_reference.rs --resident` measures.
    /// `auto` ([`LlamaOptions::for_model`] resolves it) reserves
    /// [`AUTO_KV_FLOOR`] here.
    pub fn context_params(&self) -> LlamaContextParams {
        // Asked as llama.cpp will round it: it caps a step's tokens
        // (`n_batch`) at the positions asked, before rounding, so a prompt
        // that fits the rounded window must fit a step too.
        let kv_tokens = match self.kv_tokens {
            AUTO_KV_TOKENS => AUTO_KV_FLOOR,
            n => n.clamp(MIN_KV_TOKENS, MAX_KV_TOKENS),
        }
        .next_multiple_of(KV_PAD);
        let threads = i32::try_from(self.threads.max(1)).unwrap_or(1);
        LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(kv_tokens as u32))
            .with_n_batch(N_BATCH as u32)
            .with_n_ubatch(self.ubatch() as u32)
            .with_n_seq_max(self.context_sequences() as u32)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            .with_kv_unified(!self.splits())
            // Sliding-window layers keep every position, so a sequence can be
            // cut back to any prefix (the prefix cache relies on it).
            .with_swa_full(true)
            .with_no_perf(true)
            .with_type_k(self.kv_type.llama())
            .with_type_v(self.kv_type.llama())
            // A quantized V cache needs flash attention (llama.cpp refuses it
            // otherwise); f16 leaves llama.cpp's own choice.
            .with_flash_attention_policy(if self.kv_type == KvType::F16 {
                llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_AUTO
            } else {
                llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED
            })
    }

    /// The weights' load settings: in batch-invariant mode every tensor stays
    /// in the plain CPU buffer, so none is repacked.
    fn model_params(&self) -> std::pin::Pin<Box<LlamaModelParams>> {
        let mut params = Box::pin(LlamaModelParams::default());
        if self.batch_invariant {
            params.as_mut().add_cpu_buft_override(c".*");
        }
        params
    }
}

impl Default for LlamaOptions {
    fn default() -> Self {
        LlamaOptions::new(0, AUTO_KV_TOKENS)
    }
}

/// The window a model was trained on, from its header.
fn trained_window(h: &shoal_gguf::Header) -> Option<usize> {
    h.arch_uint("context_length")
        .filter(|&n| n > 0)
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Physical cores: llama.cpp's kernels gain nothing from SMT siblings.
pub fn default_threads() -> usize {
    num_cpus::get_physical().max(1)
}

self_cell::self_cell!(
    /// The model's context, borrowing the model it was made from.
    struct ContextCell {
        owner: Arc<LlamaModel>,
        #[covariant]
        dependent: LlamaContext,
    }
);

/// The context and the sequence ids not in use. Everything that touches the
/// context goes through one mutex: llama.cpp contexts are not thread-safe.
struct Shared {
    ctx: ContextCell,
    /// Lowest first: with split KV, one step's sequences must have
    /// consecutive ids to run as one llama.cpp micro-batch.
    free: std::collections::BTreeSet<i32>,
}

type SharedRef = Arc<Mutex<Shared>>;

fn lock(s: &SharedRef) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn take_id(&mut self) -> Option<i32> {
        self.free.pop_first()
    }

    /// Drops positions `from..` of sequence `seq`.
    fn remove(&mut self, seq: i32, from: usize) -> bool {
        let from = u32::try_from(from).ok();
        self.ctx.with_dependent_mut(|_, ctx| {
            ctx.clear_kv_cache_seq(u32::try_from(seq).ok(), from, None)
                .unwrap_or(false)
        })
    }

    fn decode(&mut self, batch: &mut LlamaBatch) -> Result<()> {
        self.ctx
            .with_dependent_mut(|_, ctx| ctx.decode(batch))
            .map_err(|e| match e {
                DecodeError::NoKvCacheSlot => EngineError::KvCacheFull,
                other => EngineError::Backend(format!("llama.cpp decode: {other}")),
            })
    }

    /// [`Shared::decode`], with a lone row given `pad`'s throwaway row
    /// (batch-invariant mode) so the step runs the kernels of 2+ rows. The
    /// companion goes after the real rows, so their output indices stand.
    fn decode_padded(&mut self, batch: &mut LlamaBatch, pad: Option<i32>) -> Result<()> {
        let Some(pad) = pad.filter(|_| batch.n_tokens() == 1) else {
            return self.decode(batch);
        };
        batch
            .add(LlamaToken(0), 0, &[pad], true)
            .map_err(|e| EngineError::Backend(e.to_string()))?;
        let out = self.decode(batch);
        self.remove(pad, 0);
        out
    }

    fn logits(&self, i: i32, n: usize) -> Vec<f32> {
        self.ctx.with_dependent(|_, ctx| {
            let l = ctx.get_logits_ith(i);
            l[..n.min(l.len())].to_vec()
        })
    }
}

/// Bytes of KV state one position takes across all layers, from the header:
/// f16 keys and values (llama.cpp's default cache type) for every KV head.
pub fn kv_bytes_per_position(h: &shoal_gguf::Header) -> u64 {
    kv_bytes_per_position_as(h, KvType::F16)
}

/// [`kv_bytes_per_position`] for a cache of `kv_type`: llama.cpp stores
/// each layer's keys and values as rows of one head each.
pub fn kv_bytes_per_position_as(h: &shoal_gguf::Header, kv_type: KvType) -> u64 {
    let layers = h.arch_uint("block_count").unwrap_or(0);
    let n_head = h.arch_uint("attention.head_count").unwrap_or(1).max(1);
    let n_head_kv = h.arch_uint("attention.head_count_kv").unwrap_or(n_head);
    let n_embd = h.arch_uint("embedding_length").unwrap_or(0);
    let key_len = h
        .arch_uint("attention.key_length")
        .unwrap_or(n_embd / n_head);
    let value_len = h
        .arch_uint("attention.value_length")
        .unwrap_or(n_embd / n_head);
    layers * n_head_kv * (kv_type.bytes(key_len) + kv_type.bytes(value_len))
}

/// Bytes of the logits row llama.cpp reserves (and clears) for each
/// sequence a context tracks: one float32 per vocabulary entry, from the
/// header's token list.
pub fn logits_bytes_per_sequence(h: &shoal_gguf::Header) -> u64 {
    h.array_len("tokenizer.ggml.tokens").saturating_mul(4)
}

/// Bytes llama.cpp's vocabulary tables take once a model is loaded: each
/// token's text, its id lookup and its cached piece (about 168 bytes a
/// token), and the BPE merge ranks (about 176 bytes a merge). They are heap
/// memory beside the mapped weights, 17 MiB for SmolLM2's 49k tokens and
/// 47 MiB for Qwen 2.5's 152k tokens and merges; the figures are llama.cpp's
/// resident growth while loading, measured on SmolLM2, Qwen 2.5 and Gemma 3
/// (within 7% of each).
pub fn vocab_table_bytes(h: &shoal_gguf::Header) -> u64 {
    h.array_len("tokenizer.ggml.tokens")
        .saturating_mul(168)
        .saturating_add(h.array_len("tokenizer.ggml.merges").saturating_mul(176))
}

/// A GGUF model on llama.cpp.
pub struct LlamaCppModel {
    /// The weights (the context in `shared` borrows them too); its vocabulary
    /// is the tokenizer's.
    model: Arc<LlamaModel>,
    shared: SharedRef,
    info: ModelInfo,
    /// Bytes of KV state one position takes across all layers.
    bytes_per_position: usize,
    /// Batch-invariant mode's companion sequence for a lone row.
    pad: Option<i32>,
    /// Tokens of a micro-batch ([`LlamaOptions::ubatch`]).
    ubatch: usize,
    /// See [`LanguageModel::kv_fingerprint`].
    kv_fingerprint: Vec<(&'static str, String)>,
    /// The projector, for a vision model.
    vision: Option<Arc<vision::LlamaVision>>,
    /// Why a projector found for it did not load.
    vision_error: Option<String>,
}

/// The weights of `path` (already checked by [`super::check_gguf`]) and a
/// context on them made with `cparams`: what every llama.cpp model holds.
fn load_with_context(
    path: &Path,
    mparams: &LlamaModelParams,
    cparams: LlamaContextParams,
) -> Result<(Arc<LlamaModel>, ContextCell)> {
    let backend = runtime()?;
    let model = LlamaModel::load_from_file(backend, path, mparams).map_err(|e| {
        EngineError::InvalidModel(format!("llama.cpp could not load {}: {e}", path.display()))
    })?;
    let model = Arc::new(model);
    let ctx = ContextCell::try_new(model.clone(), |m| {
        m.new_context(backend, cparams)
            .map_err(|e| EngineError::Backend(format!("llama.cpp context: {e}")))
    })?;
    Ok((model, ctx))
}

/// A llama.cpp model's facts: its own, the header's, and what it reserved
/// beside the weights.
fn model_info(
    model: &LlamaModel,
    header: &shoal_gguf::Header,
    (context_length, max_cells): (usize, usize),
    kv_capacity_bytes: usize,
    buffer_bytes: usize,
) -> ModelInfo {
    ModelInfo {
        architecture: header.architecture().unwrap_or("unknown").to_string(),
        vocab_size: model.n_vocab().max(0) as usize,
        context_length,
        max_cells,
        num_layers: model.n_layer() as usize,
        hidden_size: model.n_embd().max(0) as usize,
        format: "gguf".into(),
        quantization: header.file_type(),
        dtype: "ggml".into(),
        device: if cfg!(target_os = "macos") {
            "gpu"
        } else {
            "cpu"
        }
        .into(),
        weight_bytes: model.size() as usize,
        backend: BackendKind::Llama,
        kv_capacity_bytes,
        buffer_bytes,
    }
}

impl LlamaCppModel {
    /// Loads `path` (already checked by [`super::check_gguf`]).
    pub fn load(path: &Path, header: &shoal_gguf::Header, opts: &LlamaOptions) -> Result<Self> {
        let mut kv_fingerprint = opts.kv_fingerprint();
        let projector = opts.projector.for_model(path);
        let opts = &opts.for_model(header);
        let (model, ctx) = load_with_context(path, &opts.model_params(), opts.context_params())?;
        let n_ctx_train = model.n_ctx_train().max(1) as usize;
        let sequences = opts.context_sequences();
        // The positions llama.cpp reserved (it rounds a split's slices up to
        // 256 each) and what one sequence may use of them.
        let reserved = ctx.borrow_dependent().n_ctx() as usize;
        let per_sequence = if opts.splits() {
            reserved / sequences
        } else {
            reserved
        };
        let bytes_per_position = kv_bytes_per_position_as(header, opts.kv_type) as usize;
        // The last id is the companion's; requests never get it.
        let pad = opts.batch_invariant.then_some(sequences as i32 - 1);
        let usable = sequences as i32 - i32::from(pad.is_some());
        // The window is counted in positions, bounded by the trained window;
        // the pool in cells (an M-RoPE image takes more cells than positions).
        let info = model_info(
            &model,
            header,
            (n_ctx_train.min(per_sequence), per_sequence),
            reserved * bytes_per_position,
            sequences * logits_bytes_per_sequence(header) as usize
                + vocab_table_bytes(header) as usize,
        );
        tracing::info!(
            kv_tokens = reserved,
            trained_window = n_ctx_train,
            window = info.context_length,
            kv_mb = (reserved * bytes_per_position) >> 20,
            "llama.cpp KV pool"
        );
        // A projector named by a setting must load; one merely found beside
        // the model may belong to another: the model then reads text only,
        // and an image sent to it is refused with the reason.
        let (vision, vision_error) = match &projector {
            None => (None, None),
            Some(p) => match vision::LlamaVision::load(p, model.clone(), opts.threads) {
                Ok(v) => {
                    let bytes = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
                    kv_fingerprint.push(("projector", format!("{} {bytes}", p.display())));
                    tracing::info!(projector = %p.display(), "vision projector loaded");
                    (Some(Arc::new(v)), None)
                }
                Err(e) if !opts.projector.is_named(path) => {
                    tracing::warn!(projector = %p.display(), error = %e, "projector not loaded; the model reads text only");
                    (None, Some(e.to_string()))
                }
                Err(e) => return Err(e),
            },
        };
        Ok(LlamaCppModel {
            model,
            vision,
            vision_error,
            shared: Arc::new(Mutex::new(Shared {
                ctx,
                free: (0..usable).collect(),
            })),
            info,
            bytes_per_position,
            pad,
            ubatch: opts.ubatch(),
            kv_fingerprint,
        })
    }

    /// The tokenizer of this model, sharing its vocabulary.
    pub fn vocab(&self) -> vocab::LlamaVocab {
        vocab::LlamaVocab::of(self.model.clone())
    }

    fn kv<'a>(&self, cache: &'a mut dyn KvCache) -> Result<&'a mut LlamaKv> {
        downcast(cache.as_any_mut(), "KV cache")
    }

    /// The projector, for a vision model; else why a projector found beside
    /// it did not load, if one was.
    pub fn vision(&self) -> std::result::Result<Arc<vision::LlamaVision>, Option<String>> {
        self.vision.clone().ok_or_else(|| self.vision_error.clone())
    }
}

impl LanguageModel for LlamaCppModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self) -> Result<Box<dyn KvCache>> {
        // Its sequence id is taken when it first runs: running out of ids is
        // then the same stall as running out of cells.
        Ok(Box::new(LlamaKv {
            seq: None,
            parked: None,
            len: 0,
            shifts: Vec::new(),
            bytes_per_position: self.bytes_per_position,
            shared: self.shared.clone(),
        }))
    }

    fn kv_fingerprint(&self) -> Vec<(&'static str, String)> {
        self.kv_fingerprint.clone()
    }

    fn persists_cache(&self) -> bool {
        true
    }

    fn payload_layout(&self) -> Option<crate::disk_cache::layout::LayoutFn> {
        Some(state_file::layout)
    }

    fn exact_prefix_unit(&self) -> Option<usize> {
        self.pad.map(|_| self.ubatch)
    }

    fn restore_cache(&self, payload: &[u8], tokens: &[u32]) -> Result<Box<dyn KvCache>> {
        let state = state_file::sequence_state(payload, tokens).map_err(EngineError::Backend)?;
        let mut s = lock(&self.shared);
        let seq = s.take_id().ok_or(EngineError::KvCacheFull)?;
        // SAFETY: `state` is the state part of a file llama.cpp wrote for a
        // model of this fingerprint (the tier checked its CRCs), behind the
        // header llama.cpp's own setter expects; that setter checks every
        // size it reads against the buffer and fails rather than reading on.
        let restored = s.ctx.with_dependent_mut(|_, ctx| unsafe {
            ctx.state_seq_set_data_ext(&state, seq, LlamaStateSeqFlags::empty())
        });
        if !restored {
            s.remove(seq, 0);
            s.free.insert(seq);
            // The file's tokens were checked above and its bytes by the
            // tier's CRCs under this model's fingerprint: what fails here is
            // room in the pool for its cells, no fault of the entry, which
            // stays for a later request.
            return Err(EngineError::KvCacheFull);
        }
        Ok(Box::new(LlamaKv {
            seq: Some(seq),
            parked: None,
            len: tokens.len(),
            shifts: Vec::new(),
            bytes_per_position: self.bytes_per_position,
            shared: self.shared.clone(),
        }))
    }

    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> Result<Vec<f32>> {
        let n_vocab = self.info.vocab_size;
        let kv = self.kv(cache)?;
        let mut s = lock(&self.shared);
        let seq = kv.seq_id(&mut s)?;
        let mut logits = Vec::new();
        for piece in tokens.chunks(N_BATCH) {
            let mut batch = LlamaBatch::new(piece.len() + 1, 1);
            for (i, &t) in piece.iter().enumerate() {
                let pos = i32::try_from(kv.next_pos() + i)
                    .map_err(|_| EngineError::Backend("position out of range".into()))?;
                batch
                    .add(LlamaToken(t as i32), pos, &[seq], i + 1 == piece.len())
                    .map_err(|e| EngineError::Backend(e.to_string()))?;
            }
            if let Err(e) = s.decode_padded(&mut batch, self.pad) {
                // Leave the sequence as it was before this call.
                s.remove(seq, kv.next_pos());
                return Err(e);
            }
            kv.len += piece.len();
            logits = s.logits(piece.len() as i32 - 1, n_vocab);
        }
        Ok(logits)
    }

    fn forward_image(
        &self,
        image: &crate::vision::PreparedImage,
        cache: &mut dyn KvCache,
    ) -> Result<()> {
        let Some(vision) = &self.vision else {
            return Err(EngineError::Unsupported(
                "this model cannot read images".into(),
            ));
        };
        let kv = self.kv(cache)?;
        let mut s = lock(&self.shared);
        let seq = kv.seq_id(&mut s)?;
        let at = kv.next_pos();
        let out = s
            .ctx
            .with_dependent_mut(|_, ctx| vision.eval(image, ctx, at, seq, N_BATCH));
        match out {
            Ok(end) if end == at + image.positions => {
                kv.len += image.tokens;
                if image.positions != image.tokens {
                    kv.shifts.push((kv.len, end));
                }
                Ok(())
            }
            other => {
                // Leave the sequence as it was before this call.
                s.remove(seq, at);
                Err(match other {
                    Ok(end) => EngineError::Backend(format!(
                        "the image took {} positions, not the {} it was prepared for",
                        end.saturating_sub(at),
                        image.positions
                    )),
                    Err(e) => e,
                })
            }
        }
    }

    fn new_batch(&self) -> Result<Box<dyn DecodeBatch>> {
        Ok(Box::new(CacheRows::default()))
    }

    fn forward_batch(&self, tokens: &[u32], batch: &mut dyn DecodeBatch) -> Result<Vec<Vec<f32>>> {
        let rows = CacheRows::of(batch, tokens)?;
        let n_vocab = self.info.vocab_size;
        let mut s = lock(&self.shared);
        let mut rows_by_seq = Vec::with_capacity(tokens.len());
        for (row, (cache, &t)) in rows.rows.iter_mut().zip(tokens).enumerate() {
            let kv = self.kv(cache.as_mut())?;
            let seq = kv.seq_id(&mut s)?;
            rows_by_seq.push((seq, kv.next_pos(), t, row));
        }
        // In sequence-id order: with split KV, llama.cpp runs consecutive ids
        // as one micro-batch, so any other order would read the weights again.
        rows_by_seq.sort_unstable_by_key(|r| r.0);
        let mut lb = LlamaBatch::new(tokens.len() + 1, 1);
        for &(seq, len, t, _) in &rows_by_seq {
            let pos = i32::try_from(len)
                .map_err(|_| EngineError::Backend("position out of range".into()))?;
            lb.add(LlamaToken(t as i32), pos, &[seq], true)
                .map_err(|e| EngineError::Backend(e.to_string()))?;
        }
        if let Err(e) = s.decode_padded(&mut lb, self.pad) {
            for &(seq, len, _, _) in &rows_by_seq {
                s.remove(seq, len);
            }
            return Err(e);
        }
        let mut out = vec![Vec::new(); tokens.len()];
        for (i, &(_, _, _, row)) in rows_by_seq.iter().enumerate() {
            out[row] = s.logits(i as i32, n_vocab);
            self.kv(rows.rows[row].as_mut())?.len += 1;
        }
        Ok(out)
    }

    fn verifies_drafts(&self) -> bool {
        true
    }

    fn forward_spans(
        &self,
        spans: &[Vec<u32>],
        batch: &mut dyn DecodeBatch,
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        let rows: &mut CacheRows = downcast(batch.as_any_mut(), "decode batch")?;
        if rows.rows.len() != spans.len() {
            return Err(EngineError::Backend(format!(
                "{} spans for {} rows",
                spans.len(),
                rows.rows.len()
            )));
        }
        let n_vocab = self.info.vocab_size;
        let mut s = lock(&self.shared);
        let mut order = Vec::with_capacity(spans.len());
        for (row, cache) in rows.rows.iter_mut().enumerate() {
            let kv = self.kv(cache.as_mut())?;
            order.push((kv.seq_id(&mut s)?, kv.next_pos(), row));
        }
        // In sequence-id order, as in `forward_batch`.
        order.sort_unstable_by_key(|r| r.0);
        // Batch-invariant mode runs a step with drafts one sequence a call:
        // llama.cpp would cut rows of unequal spans into micro-batches whose
        // sizes (and so kernels) depend on the neighbours.
        let groups: Vec<&[(i32, usize, usize)]> =
            if self.pad.is_some() && spans.iter().any(|s| s.len() > 1) {
                order.chunks(1).collect()
            } else {
                vec![&order[..]]
            };
        let mut out = vec![Vec::new(); spans.len()];
        for group in groups {
            let n_group: usize = group.iter().map(|&(_, _, row)| spans[row].len()).sum();
            let mut lb = LlamaBatch::new(n_group.max(1) + 1, 1);
            for &(seq, len, row) in group {
                for (i, &t) in spans[row].iter().enumerate() {
                    let pos = i32::try_from(len + i)
                        .map_err(|_| EngineError::Backend("position out of range".into()))?;
                    lb.add(LlamaToken(t as i32), pos, &[seq], true)
                        .map_err(|e| EngineError::Backend(e.to_string()))?;
                }
            }
            let started = std::time::Instant::now();
            if let Err(e) = s.decode_padded(&mut lb, self.pad) {
                // Rows already run keep their step; this group's are undone.
                for &(seq, len, _) in group {
                    s.remove(seq, len);
                }
                for &(_, _, row) in &order {
                    if !out[row].is_empty() {
                        let n = spans[row].len();
                        let kv = self.kv(rows.rows[row].as_mut())?;
                        kv.len -= n;
                        let (seq, from) = (kv.seq, kv.next_pos());
                        if let Some(seq) = seq {
                            s.remove(seq, from);
                        }
                    }
                }
                return Err(e);
            }
            let mut at = 0i32;
            for &(_, _, row) in group {
                let n = spans[row].len();
                out[row] = (0..n as i32).map(|i| s.logits(at + i, n_vocab)).collect();
                at += n as i32;
                self.kv(rows.rows[row].as_mut())?.len += n;
            }
            tracing::trace!(
                rows = n_group,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "step with drafts"
            );
        }
        Ok(out)
    }
}

/// One sequence's KV state: live cells under a sequence id while it runs,
/// or, once kept by the prefix cache, a snapshot in host memory. A kept
/// prefix so holds no cells: every decode step attends over the context's
/// live cells, so prefixes left in it would slow every running sequence.
struct LlamaKv {
    /// `None` until it first runs (or while parked).
    seq: Option<i32>,
    /// The state to restore into a sequence id when it next runs.
    parked: Option<Arc<SeqState>>,
    /// Tokens it holds (its cells).
    len: usize,
    /// Where an image laid out in 2-D (M-RoPE: the Qwen2-VL family) took
    /// fewer positions than tokens: the token count and the position after
    /// it. Text after such an image goes on from that position.
    shifts: Vec<(usize, usize)>,
    bytes_per_position: usize,
    shared: SharedRef,
}

/// The position of the token at index `at` (the first `at` tokens held
/// before it), given where M-RoPE images ended (`(tokens, position)` after
/// each, in order): the index itself unless such an image came before, else
/// the position after the last one before it plus the tokens since.
fn position_of(shifts: &[(usize, usize)], at: usize) -> usize {
    match shifts.iter().rev().find(|&&(t, _)| t <= at) {
        Some(&(t, p)) => p + (at - t),
        None => at,
    }
}

impl LlamaKv {
    /// The position of the token at index `at` (see [`position_of`]).
    fn pos_of(&self, at: usize) -> usize {
        position_of(&self.shifts, at)
    }

    /// The position its next token takes.
    fn next_pos(&self) -> usize {
        self.pos_of(self.len)
    }

    /// Its sequence id, taking one now if it has none yet (and restoring a
    /// parked state into it). Out of ids or cells is the same stall.
    fn seq_id(&mut self, s: &mut Shared) -> Result<i32> {
        if let Some(seq) = self.seq {
            return Ok(seq);
        }
        let seq = s.take_id().ok_or(EngineError::KvCacheFull)?;
        if let Some(state) = &self.parked {
            let restored = s
                .ctx
                .with_dependent_mut(|_, ctx| ctx.state_seq_set(state, seq));
            if restored.is_err() {
                // No room for it now: clear what a partial restore left.
                s.remove(seq, 0);
                s.free.insert(seq);
                return Err(EngineError::KvCacheFull);
            }
            // The snapshot may hold more than this copy was cut back to.
            if !s.remove(seq, self.next_pos()) {
                s.remove(seq, 0);
                self.len = 0;
                self.shifts.clear();
            }
            self.parked = None;
        }
        self.seq = Some(seq);
        Ok(seq)
    }

    /// A snapshot of the positions it holds, if any.
    fn snapshot(&self) -> Option<Arc<SeqState>> {
        match (&self.parked, self.seq) {
            (Some(state), _) => Some(state.clone()),
            (None, Some(seq)) if self.len > 0 => lock(&self.shared)
                .ctx
                .with_dependent(|_, ctx| ctx.state_seq_get(seq, LlamaStateSeqFlags::empty()))
                .ok()
                .map(Arc::new),
            _ => None,
        }
    }
}

impl KvCache for LlamaKv {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if let Some(seq) = self.seq {
            let mut s = lock(&self.shared);
            if !s.remove(seq, self.pos_of(len)) {
                // The cache could not cut this sequence back: start it over.
                s.remove(seq, 0);
                self.len = 0;
                self.shifts.clear();
                return;
            }
        }
        // A parked state is cut back when it is restored.
        self.len = len;
        self.shifts.retain(|&(t, _)| t <= len);
    }

    fn nbytes(&self) -> usize {
        match &self.parked {
            Some(state) => state.byte_len(),
            None => self.len * self.bytes_per_position,
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn clone_box(&self) -> Box<dyn KvCache> {
        let parked = self.snapshot();
        let held = parked.is_some();
        Box::new(LlamaKv {
            seq: None,
            len: if held { self.len } else { 0 },
            shifts: if held {
                self.shifts.clone()
            } else {
                Vec::new()
            },
            parked,
            bytes_per_position: self.bytes_per_position,
            shared: self.shared.clone(),
        })
    }

    fn persistable(&self) -> bool {
        self.shifts.is_empty()
    }

    fn save(&mut self, path: &Path, tokens: &[u32]) -> Result<()> {
        if !self.shifts.is_empty() {
            return Err(EngineError::Unsupported(
                "a cache holding an image laid out in 2-D positions is not written to disk".into(),
            ));
        }
        if tokens.len() != self.len || self.len == 0 {
            return Err(EngineError::Backend(format!(
                "{} tokens for a cache of {} positions",
                tokens.len(),
                self.len
            )));
        }
        let mut s = lock(&self.shared);
        // A parked state goes through a sequence id of its own for the
        // write (llama.cpp writes a sequence from its cells), cut to its length.
        let (seq, borrowed) = match (self.seq, &self.parked) {
            (Some(seq), _) => (seq, false),
            (None, Some(state)) => {
                let seq = s.take_id().ok_or(EngineError::KvCacheFull)?;
                let set = s
                    .ctx
                    .with_dependent_mut(|_, ctx| ctx.state_seq_set(state, seq));
                if set.is_err() || !s.remove(seq, self.next_pos()) {
                    s.remove(seq, 0);
                    s.free.insert(seq);
                    return Err(EngineError::KvCacheFull);
                }
                (seq, true)
            }
            (None, None) => return Err(EngineError::Backend("an empty cache".into())),
        };
        let ids: Vec<LlamaToken> = tokens.iter().map(|&t| LlamaToken(t as i32)).collect();
        let written = s
            .ctx
            .with_dependent(|_, ctx| ctx.state_seq_save_file(path, seq, &ids));
        if borrowed {
            s.remove(seq, 0);
            s.free.insert(seq);
        }
        written
            .map(|_| ())
            .map_err(|e| EngineError::Backend(format!("llama.cpp could not write the state: {e}")))
    }

    fn park(&mut self) {
        if self.parked.is_some() {
            return;
        }
        let Some(state) = self.snapshot() else {
            return;
        };
        if let Some(seq) = self.seq.take() {
            let mut s = lock(&self.shared);
            s.remove(seq, 0);
            s.free.insert(seq);
        }
        self.parked = Some(state);
    }
}

impl Drop for LlamaKv {
    fn drop(&mut self) {
        if let Some(seq) = self.seq.take() {
            let mut s = lock(&self.shared);
            s.remove(seq, 0);
            s.free.insert(seq);
        }
    }
}

#[cfg(test)]
mod position_tests {
    use super::position_of;

    #[test]
    fn text_after_an_m_rope_image_goes_on_from_the_image_s_last_position() {
        // 5 text tokens, an image of 8 tokens over 4 positions (a 2x4 grid),
        // 3 text tokens, another of 6 tokens over 3 positions.
        let shifts = [(13, 9), (22, 15)];
        assert_eq!(position_of(&[], 7), 7, "no image: the index");
        assert_eq!(position_of(&shifts, 5), 5, "before the first image");
        assert_eq!(position_of(&shifts, 13), 9, "right after it");
        assert_eq!(position_of(&shifts, 16), 12, "text after it");
        assert_eq!(position_of(&shifts, 22), 15, "after the second");
        assert_eq!(position_of(&shifts, 30), 23);
    }
}

#[cfg(test)]
mod projector_tests {
    use super::Projector;

    #[test]
    fn a_projector_is_named_by_path_name_or_stem_else_found_beside_the_model() {
        let dir = tempfile::tempdir().expect("tmp");
        let model = dir.path().join("m.gguf");
        let other = dir.path().join("other.gguf");
        let beside = dir.path().join("mmproj-m-f16.gguf");
        for f in [&model, &other, &beside] {
            std::fs::write(f, b"x").expect("write");
        }
        let named = std::path::PathBuf::from("/elsewhere/mmproj.gguf");
        // Nothing named: the one beside the model.
        assert_eq!(Projector::default().for_model(&model), Some(beside.clone()));
        // Named by file name, by stem, by path, and by a path written another way.
        let dotted = dir.path().join(".").join("m.gguf");
        for key in [
            "m.gguf".to_string(),
            "m".to_string(),
            model.display().to_string(),
            dotted.display().to_string(),
        ] {
            let p = Projector::default().named(key.clone(), Some(named.clone()));
            assert_eq!(p.for_model(&model), Some(named.clone()), "{key}");
            assert!(p.is_named(&model), "{key}");
            // Another model keeps the one beside it.
            assert_eq!(p.for_model(&other), Some(beside.clone()), "{key}");
            assert!(!p.is_named(&other), "{key}");
        }
        // Off for one model, or for all.
        let blind = Projector::default().named("m", None);
        assert_eq!(blind.for_model(&model), None);
        assert!(!blind.is_named(&model));
        assert_eq!(blind.for_model(&other), Some(beside.clone()));
        let off = Projector::off().named("m", Some(named));
        assert_eq!(off.for_model(&model), None);
        assert_eq!(off.for_model(&other), None);
        // The earlier name wins.
        let first = Projector::default()
            .named("m", Some("/a.gguf".into()))
            .named("m.gguf", Some("/b.gguf".into()));
        assert_eq!(first.for_model(&model), Some("/a.gguf".into()));
    }
}
