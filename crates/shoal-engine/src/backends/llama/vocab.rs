//! Text ↔ tokens through llama.cpp's own tokenizer, so a GGUF run on
//! llama.cpp is tokenized exactly as llama.cpp tokenizes it, for every
//! vocabulary type it knows (BPE, SentencePiece, WordPiece…).
use std::path::Path;
use std::sync::Arc;

use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use crate::error::{EngineError, Result};

/// The ends a GGUF names in its metadata: EOS, end of turn, end of message.
pub fn named_ends(header: &shoal_gguf::Header) -> Vec<u32> {
    [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ]
    .iter()
    .filter_map(|k| header.uint(k).and_then(|id| u32::try_from(id).ok()))
    .collect()
}

/// The tokens that end a reply on the GGUF at `path`, as its llama.cpp run
/// ends them ([`LlamaVocab::end_tokens`]), from a load of its vocabulary
/// alone: the MLX path ends replies on the same file at the same tokens.
pub fn end_tokens_of(path: &Path, header: &shoal_gguf::Header) -> Result<Vec<u32>> {
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model =
        LlamaModel::load_from_file(super::init::runtime()?, path, &params).map_err(|e| {
            EngineError::InvalidModel(format!("llama.cpp could not read the vocabulary: {e}"))
        })?;
    let vocab = LlamaVocab::of(Arc::new(model));
    Ok(vocab.end_tokens(
        &named_ends(header),
        header.ints("tokenizer.ggml.token_type"),
    ))
}

/// A llama.cpp model's vocabulary: immutable, and safe to share between
/// threads (llama.cpp's tokenizer only reads it).
pub struct LlamaVocab {
    model: Arc<LlamaModel>,
    n_tokens: u32,
}

impl LlamaVocab {
    /// The vocabulary of a model already loaded: a second, vocabulary-only
    /// load of the file would hold another copy (~40 MB for Gemma 3's 262k
    /// tokens).
    pub fn of(model: Arc<LlamaModel>) -> Self {
        let n_tokens = model.vocab().n_tokens().max(0) as u32;
        LlamaVocab { model, n_tokens }
    }

    pub fn n_tokens(&self) -> u32 {
        self.n_tokens
    }

    /// Tokens of `text`, special tokens written out as text recognised, no
    /// BOS added.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenize(text, false)
    }

    /// Tokens of `text` with the special tokens the model adds around an
    /// input (its `add_bos` / `add_eos` / `add_sep` settings).
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        self.tokenize(text, true)
    }

    fn tokenize(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), add_special, true)
            .into_iter()
            .map(|t| t.0 as u32)
            .collect()
    }

    /// The bytes token `id` stands for; control tokens give their text when
    /// `special` is set and nothing otherwise.
    pub fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        if id >= self.n_tokens {
            return Vec::new();
        }
        self.model
            .vocab()
            .token_to_piece(LlamaToken(id as i32), special, None)
    }

    /// The tokens' bytes in order, without the leading-space stripping that
    /// llama.cpp's whole-sequence detokenizer applies (the incremental
    /// decoder relies on a window's text being a prefix of the next one's).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend(self.piece(id, !skip_special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn bos(&self) -> Option<u32> {
        let b = self.model.vocab().bos().0;
        (b >= 0 && (b as u32) < self.n_tokens).then_some(b as u32)
    }

    pub fn eos(&self) -> Option<u32> {
        let e = self.model.vocab().eos().0;
        (e >= 0 && (e as u32) < self.n_tokens).then_some(e as u32)
    }

    pub fn add_bos(&self) -> bool {
        self.model.vocab().should_add_bos()
    }

    /// The tokens that end a reply: llama.cpp's end-of-generation set (EOS,
    /// end of turn, end of message, fill-in-the-middle ends) where the file
    /// names the token an end (`named`, or llama.cpp's EOS) or types it a
    /// control token (`file_types`, its `tokenizer.ggml.token_type`).
    /// llama.cpp matches some spellings whatever their type and retypes them
    /// as control, e.g. `</s>`, which Gemma's vocabulary holds as
    /// user-defined text; a reply that writes it has not ended. The MLX path
    /// takes the same set through [`end_tokens_of`].
    pub fn end_tokens(&self, named: &[u32], file_types: Option<&[i64]>) -> Vec<u32> {
        let v = self.model.vocab();
        let eos = self.eos();
        let control = |id: u32| match file_types {
            Some(types) => {
                types.get(id as usize) == Some(&i64::from(crate::tokenizer::TOKEN_TYPE_CONTROL))
            }
            None => v.is_control(LlamaToken(id as i32)),
        };
        (0..self.n_tokens)
            .filter(|&id| {
                v.is_eog(LlamaToken(id as i32))
                    && (named.contains(&id) || Some(id) == eos || control(id))
            })
            .collect()
    }

    /// Control tokens (never produced by plain text) with their text.
    pub fn control_tokens(&self) -> Vec<(u32, String)> {
        let v = self.model.vocab();
        (0..self.n_tokens)
            .filter(|&id| v.is_control(LlamaToken(id as i32)))
            .map(|id| {
                (
                    id,
                    String::from_utf8_lossy(&self.piece(id, true)).into_owned(),
                )
            })
            .collect()
    }
}
