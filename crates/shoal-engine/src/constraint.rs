//! Grammar-constrained decoding: before each token is sampled, every token
//! the grammar cannot accept next is masked out, so the output always parses
//! (JSON objects, JSON schemas, tool-call syntax). llguidance compiles the
//! grammar and computes the masks against the model's own token bytes.
use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::loader::Vocabulary;

/// What the output must conform to.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A JSON document valid against this JSON Schema.
    JsonSchema(Value),
    /// A Lark grammar (llguidance dialect), e.g. a tool-call envelope around `%json`.
    Lark(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(json_layout(
                serde_json::json!({"type": "object"}),
            )),
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(json_layout(s.clone())),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// Fixes the JSON layout (`{"a": 1, "b": 2}`) unless the schema sets its own:
/// with free whitespace a small model can spend its whole budget on newlines.
pub fn json_layout(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "key_separator": ": ",
                "item_separator": ", ",
                "coerce_one_of": true
            })
        });
    }
    schema
}

/// The model's vocabulary as llguidance sees it: token id → bytes, with
/// special tokens marked so grammar text can never spell them.
struct VocabEnv {
    trie: TokTrie,
    vocab: Arc<Vocabulary>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let text = String::from_utf8_lossy(s);
        match self.vocab.encode_plain(text.as_ref()) {
            Ok(ids) => ids,
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one model. Building the token trie walks the whole
/// vocabulary, so it is done once, on first use.
pub struct GrammarCompiler {
    vocab: Arc<Vocabulary>,
    vocab_size: usize,
    factory: OnceLock<std::result::Result<ParserFactory, String>>,
}

impl GrammarCompiler {
    pub fn new(vocab: Arc<Vocabulary>, vocab_size: usize) -> Self {
        GrammarCompiler {
            vocab,
            vocab_size,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory> {
        let built = self.factory.get_or_init(|| {
            let eos = self.vocab.eos.first().copied().ok_or_else(|| {
                "the model declares no end-of-sequence token to finish a grammar with".to_string()
            })?;
            let special: std::collections::HashMap<u32, String> =
                self.vocab.special_tokens().into_iter().collect();
            let words: Vec<Vec<u8>> = (0..self.vocab_size as u32)
                .map(|id| match special.get(&id) {
                    Some(text) => {
                        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                        w.extend_from_slice(text.as_bytes());
                        w
                    }
                    None => self.vocab.token_bytes(id),
                })
                .collect();
            let info = TokRxInfo::new(self.vocab_size as u32, eos);
            let env: TokEnv = Arc::new(VocabEnv {
                trie: TokTrie::from(&info, &words),
                vocab: self.vocab.clone(),
            });
            let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            f.quiet();
            Ok(f)
        });
        built
            .as_ref()
            .map_err(|e| EngineError::Backend(format!("grammar support unavailable: {e}")))
    }

    /// Compiles `grammar`; a schema or grammar it cannot handle is the caller's error.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        let parser = self
            .factory()?
            .create_parser(grammar.top_level())
            .map_err(|e| EngineError::InvalidRequest(format!("invalid grammar: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(EngineError::InvalidRequest(format!("invalid grammar: {e}")));
        }
        Ok(Constraint { matcher })
    }
}

/// One request's position in its grammar.
pub struct Constraint {
    matcher: Matcher,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

impl Constraint {
    /// Sets the logit of every token the grammar forbids next to -inf. Once
    /// the grammar is complete only end-of-sequence stays allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| EngineError::Backend(format!("grammar: {e}")))?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances the grammar past a sampled (or forced) token.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| EngineError::Backend(format!("grammar: {e}")))
    }
}
