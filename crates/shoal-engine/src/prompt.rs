//! The one chat-prompt decision, for the server's dialects and the CLI
//! alike: the model's template renders the conversation, the reply's
//! reasoning is arranged (a template's own thinking switch, or the section
//! opened after the generation prompt), and offered tools reach the prompt
//! (the template's own `tools` list, or instructions in a system message),
//! with the grammar a required call needs.
use serde_json::{json, Value};

use crate::error::Result;
use crate::harmony::Markers;
use crate::loader::Vocabulary;
use crate::reasoning::ReasoningSpec;
use crate::template::{ChatMessage, ToolSyntax};
use crate::tools::{tool_instructions, ToolDef};
use crate::vision::{encode_with_images, ImageSpan, PreparedImage, MARKER};
use crate::Grammar;
use std::sync::Arc;

/// Whether and which tool the model must call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Tools are not offered this turn.
    None,
    /// The model decides.
    Auto,
    /// The model must call one of the tools (decoding is constrained).
    Required,
    /// The model must call this tool (decoding is constrained).
    Named(String),
}

/// Tools a turn offers (already validated by the caller).
#[derive(Clone, Copy, Debug)]
pub struct ToolOffer<'a> {
    pub defs: &'a [ToolDef],
    pub choice: &'a ToolChoice,
}

/// A rendered chat prompt and what the engine must know about its reply.
#[derive(Debug)]
pub struct ChatPrompt {
    pub tokens: Vec<u32>,
    pub reasoning: Option<ReasoningSpec>,
    /// Parse tool calls in this syntax.
    pub tools: Option<ToolSyntax>,
    /// A tool call is required: the grammar that forces it.
    pub grammar: Option<Grammar>,
    /// Where each image sits in `tokens`.
    pub images: Vec<ImageSpan>,
}

/// Renders and tokenizes `messages` for a reply. `reasoning` is `None` when
/// the turn does not ask for reasoning, else its token budget (`None` inside
/// = unlimited); it is ignored for a model that cannot reason
/// ([`crate::Capabilities::reasoning`]).
pub fn chat_prompt(
    vocab: &Vocabulary,
    messages: &[ChatMessage],
    reasoning: Option<Option<usize>>,
    tools: Option<ToolOffer<'_>>,
) -> Result<ChatPrompt> {
    chat_prompt_with_images(vocab, messages, reasoning, tools, &[])
}

/// [`chat_prompt`] for messages whose content holds [`MARKER`] once per
/// image of `images`, in order (see [`crate::vision`]).
pub fn chat_prompt_with_images(
    vocab: &Vocabulary,
    messages: &[ChatMessage],
    reasoning: Option<Option<usize>>,
    tools: Option<ToolOffer<'_>>,
    images: &[Arc<PreparedImage>],
) -> Result<ChatPrompt> {
    let caps = vocab.capabilities();
    let mut messages = messages.to_vec();
    // A conversation that ends with the assistant's own words: the reply
    // carries them on (Anthropic's prefill; a trailing assistant message in
    // Ollama's and llama-server's chat; a reply continued after its token
    // limit). They go after the generation prompt, with no reasoning section
    // opened: the answer has begun. Harmony's channels leave no such place.
    let prefill = match messages.last() {
        Some(m) if m.role == "assistant" && !m.content.is_empty() && !caps.harmony => {
            messages.pop().map(|m| m.content)
        }
        _ => None,
    };
    let reasoning = reasoning.filter(|_| prefill.is_none());
    let (extra, syntax, grammar) = offer_tools(vocab, &mut messages, reasoning.is_some(), tools);
    let mut text = vocab.render_chat(&messages, true, &extra)?;
    // Harmony models always reason in their analysis channel; asked to, the
    // server opens it, so the budget counts from the first token.
    let harmony = caps
        .harmony
        .then(|| Markers::find(&vocab.special_tokens()))
        .flatten();
    let spec = match (reasoning, caps.thinking) {
        _ if harmony.is_some() => harmony.map(|m| {
            if reasoning.is_some() {
                text.push_str(crate::harmony::OPEN_ANALYSIS);
            }
            ReasoningSpec::harmony(m, reasoning.is_some(), reasoning.flatten())
        }),
        (Some(budget), true) => Some(ReasoningSpec::think(false, budget)),
        // A model with a `</think>` token but no switch: the section is opened.
        (Some(budget), false) if caps.reasoning => {
            text.push_str("<think>\n");
            Some(ReasoningSpec::think(true, budget))
        }
        // A model that cannot reason answers as it would without the ask:
        // no section is opened, so none of its answer counts as reasoning.
        (Some(_), false) => None,
        // A thinking model may still open the section on its own, unless
        // its answer has begun.
        (None, true) if prefill.is_none() => Some(ReasoningSpec::think(false, None)),
        (None, _) => None,
    };
    if let Some(p) = &prefill {
        text.push_str(p);
    }
    let (tokens, images) = encode(vocab, &text, images)?;
    Ok(ChatPrompt {
        tokens,
        reasoning: spec,
        tools: syntax,
        grammar,
        images,
    })
}

/// The template's extra variables (the thinking switch, a tools list) and
/// `messages` with the tool instructions in the system turn for a template
/// without tools; the call syntax and a forced call's grammar.
fn offer_tools(
    vocab: &Vocabulary,
    messages: &mut Vec<ChatMessage>,
    reasoning: bool,
    tools: Option<ToolOffer<'_>>,
) -> (
    serde_json::Map<String, Value>,
    Option<ToolSyntax>,
    Option<Grammar>,
) {
    let caps = vocab.capabilities();
    let mut extra = serde_json::Map::new();
    if caps.thinking {
        extra.insert("enable_thinking".into(), json!(reasoning));
    }
    let (syntax, grammar) = match tools
        .filter(|t| !t.defs.is_empty() && *t.choice != ToolChoice::None)
    {
        Some(offer) => {
            let syntax = caps.tool_syntax;
            if caps.tools {
                let list: Vec<Value> = offer
                    .defs
                    .iter()
                    .map(|d| {
                        json!({"type": "function", "function": {
                            "name": d.name, "description": d.description, "parameters": d.parameters}})
                    })
                    .collect();
                extra.insert("tools".into(), Value::Array(list));
            } else {
                let text = tool_instructions(offer.defs);
                match messages.first_mut() {
                    Some(m) if m.role == "system" => {
                        m.content = format!("{}\n\n{text}", m.content);
                    }
                    _ => messages.insert(0, ChatMessage::new("system", text)),
                }
            }
            let grammar = match offer.choice {
                ToolChoice::Required => Some(syntax.forced_call(offer.defs)),
                ToolChoice::Named(n) => {
                    let one: Vec<ToolDef> = offer
                        .defs
                        .iter()
                        .filter(|d| &d.name == n)
                        .cloned()
                        .collect();
                    Some(syntax.forced_call(&one))
                }
                ToolChoice::Auto | ToolChoice::None => None,
            };
            (Some(syntax), grammar)
        }
        None => (None, None),
    };
    (extra, syntax, grammar)
}

/// The tokens of `messages` as whole turns, with no generation prompt after
/// them (and tools offered as [`chat_prompt`] offers them): where a prefix
/// of a conversation ends inside the prompt of the whole, for a client's
/// cache breakpoint after one of its messages.
pub fn turns_prompt(
    vocab: &Vocabulary,
    messages: &[ChatMessage],
    reasoning: bool,
    tools: Option<ToolOffer<'_>>,
) -> Result<Vec<u32>> {
    turns_prompt_with_images(vocab, messages, reasoning, tools, &[])
}

/// [`turns_prompt`] for messages that hold images: those turns hold the
/// first of `images` (as many as their markers).
pub fn turns_prompt_with_images(
    vocab: &Vocabulary,
    messages: &[ChatMessage],
    reasoning: bool,
    tools: Option<ToolOffer<'_>>,
    images: &[Arc<PreparedImage>],
) -> Result<Vec<u32>> {
    let mut messages = messages.to_vec();
    let (extra, _, _) = offer_tools(vocab, &mut messages, reasoning, tools);
    let text = vocab.render_chat(&messages, false, &extra)?;
    let held = text.matches(MARKER).count().min(images.len());
    Ok(encode(vocab, &text, &images[..held])?.0)
}

/// A rendered prompt's tokens, each image's marker replaced by its
/// placeholders (also a raw prompt's, which the caller formatted).
pub fn encode(
    vocab: &Vocabulary,
    text: &str,
    images: &[Arc<PreparedImage>],
) -> Result<(Vec<u32>, Vec<ImageSpan>)> {
    if images.is_empty() && !text.contains(MARKER) {
        return Ok((vocab.encode(text)?, Vec::new()));
    }
    encode_with_images(text, images, |piece, first| {
        if first {
            vocab.encode(piece)
        } else {
            vocab.encode_plain(piece)
        }
    })
}
