//! Incremental detokenization for streaming.
//!
//! Byte-level BPE tokens can end in the middle of a UTF-8 character, and some decoders change a
//! token's text depending on its neighbours (e.g. dropping a leading space at the start). Each
//! step therefore decodes a small window that starts a little before the new tokens and emits
//! only the text past what that window's prefix already produced, holding everything back while
//! the window ends in an incomplete character.
use tokenizers::Tokenizer;

use crate::error::{EngineError, Result};

/// Turns token ids back into text; the model's vocabulary, whichever tokenizer it has.
pub trait Decode {
    fn decode_ids(&self, ids: &[u32], skip_special: bool) -> Result<String>;
}

impl Decode for Tokenizer {
    fn decode_ids(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.decode(ids, skip_special)
            .map_err(|e| EngineError::Tokenizer(format!("decoding {ids:?}: {e}")))
    }
}

/// How an incomplete UTF-8 tail shows up after lossy decoding.
const REPLACEMENT: char = '\u{FFFD}';

/// Turns a stream of token ids into text deltas that are always valid, complete characters.
#[derive(Clone, Debug, Default)]
pub struct IncrementalDecoder {
    skip_special: bool,
    /// The decode window: the tokens emitted by the last successful step (context for the
    /// decoder), followed by tokens whose text has not been emitted yet.
    window: Vec<u32>,
    /// Index in `window` of the first token whose text has not been emitted.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// `skip_special` drops special tokens (e.g. `<|im_end|>`) from the text.
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            ..Self::default()
        }
    }

    /// Adds one token and returns the text it completes; empty while a character is still
    /// incomplete or the token has no text.
    pub fn push(&mut self, tok: &impl Decode, id: u32) -> Result<String> {
        self.window.push(id);
        let (prefix, full) = self.decode_window(tok)?;
        if full.len() <= prefix.len() || full.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        let delta = text_after(&full, prefix.len()).to_owned();
        self.advance();
        Ok(delta)
    }

    /// Returns whatever is still held back (including a genuinely broken character, rendered as
    /// U+FFFD just like a full decode would).
    pub fn flush(&mut self, tok: &impl Decode) -> Result<String> {
        let (prefix, full) = self.decode_window(tok)?;
        let delta = text_after(&full, prefix.len()).to_owned();
        self.advance();
        Ok(delta)
    }

    /// Decodes the already-emitted part of the window and the whole window.
    fn decode_window(&self, tok: &impl Decode) -> Result<(String, String)> {
        let decode = |ids: &[u32]| tok.decode_ids(ids, self.skip_special);
        let prefix = decode(&self.window[..self.read_offset])?;
        let full = decode(&self.window)?;
        Ok((prefix, full))
    }

    /// Marks the window as emitted; its newest tokens become the next step's context.
    fn advance(&mut self) {
        self.window.drain(..self.read_offset);
        self.read_offset = self.window.len();
    }
}

/// `full` past its first `len` bytes, moved forward to a char boundary should a decoder have
/// rewritten the shared prefix.
fn text_after(full: &str, len: usize) -> &str {
    (len..=full.len())
        .find(|&i| full.is_char_boundary(i))
        .map_or("", |i| &full[i..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::testdata::gguf_tokenizer;

    /// The chunks returned by each push, and what flush returned.
    fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> (Vec<String>, String) {
        let mut decoder = IncrementalDecoder::new(skip_special);
        let chunks = ids
            .iter()
            .map(|&id| decoder.push(tok, id).expect("push"))
            .collect();
        (chunks, decoder.flush(tok).expect("flush"))
    }

    fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false).expect("encode").get_ids().to_vec()
    }

    #[test]
    fn multibyte_text_streams_without_replacement_chars() {
        let tok = gguf_tokenizer();
        for text in [
            "Emoji: 👋🏽 🎉🚀 👨‍👩‍👧 done",
            "日本語のテキストと中文文本，还有한국어",
            "mixed ünïcödé — “quotes” and 3.14159",
        ] {
            let ids = encode(&tok, text);
            let (chunks, rest) = stream(&tok, &ids, false);
            for chunk in chunks.iter().chain([&rest]) {
                assert!(!chunk.contains(REPLACEMENT), "{chunk:?} in {chunks:?}");
            }
            assert!(
                chunks.iter().any(String::is_empty),
                "{text:?}: some token should end inside a character and be held: {chunks:?}"
            );
            assert_eq!(rest, "", "complete text leaves nothing to flush");
            assert_eq!(chunks.concat(), text);
        }
    }

    #[test]
    fn leading_spaces_are_kept() {
        let tok = gguf_tokenizer();
        let text = "  Hello world,  two  spaces";
        let ids = encode(&tok, text);
        let (chunks, rest) = stream(&tok, &ids, false);
        assert!(chunks[0].starts_with(' '), "{chunks:?}");
        assert!(
            chunks.iter().any(|c| c == " world"),
            "word-level chunks keep their leading space: {chunks:?}"
        );
        assert_eq!(chunks.concat() + &rest, text);
    }

    #[test]
    fn special_tokens_follow_skip_flag() {
        let tok = gguf_tokenizer();
        let text = "<|im_start|>assistant\nHi!<|im_end|>";
        let ids = encode(&tok, text);
        assert_eq!(ids.first(), Some(&1));
        let (kept, rest) = stream(&tok, &ids, false);
        assert_eq!(kept.concat() + &rest, text);
        assert_eq!(kept[0], "<|im_start|>");
        let (skipped, rest) = stream(&tok, &ids, true);
        assert_eq!(skipped[0], "");
        assert_eq!(skipped.concat() + &rest, "assistant\nHi!");
        assert_eq!(skipped.concat() + &rest, tok.decode(&ids, true).unwrap());
    }

    #[test]
    fn broken_tail_is_released_on_flush() {
        let tok = gguf_tokenizer();
        let ids = encode(&tok, "ok 🎉");
        // Drop the last token so the emoji stays incomplete.
        let truncated = &ids[..ids.len() - 1];
        let mut decoder = IncrementalDecoder::new(false);
        let mut pushed = String::new();
        for &id in truncated {
            pushed.push_str(&decoder.push(&tok, id).unwrap());
        }
        assert!(!pushed.contains(REPLACEMENT));
        let tail = decoder.flush(&tok).unwrap();
        assert!(tail.ends_with(REPLACEMENT), "{tail:?}");
        assert_eq!(pushed + &tail, tok.decode(truncated, false).unwrap());
    }
}
