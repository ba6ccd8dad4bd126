//! One module per dialect behind one trait, [`Wire`]: how a request body is
//! written, how the key and the dialect's headers are sent, how usage, a
//! whole response and each stream event are read. The sending, the stream
//! reading and the metadata merge that every dialect shares are in
//! `target.rs`.
use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::metadata::ProviderMeta;
use crate::request::Request;
pub(crate) use crate::sse::Framing;

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod messages;
pub(crate) mod ollama;
pub(crate) mod openai;
pub(crate) mod responses;

/// A dialect as the recorder speaks it (its names and path are the
/// dialect's identity, kept on [`crate::dialect::Dialect`]).
pub(crate) trait Wire: Sync {
    /// Whether a request may ask for several choices (`n`).
    fn has_choices(&self) -> bool {
        false
    }
    /// How its stream is framed.
    fn framing(&self) -> Framing {
        Framing::Sse
    }
    /// The request body's fields beside `model` (and the caller's extras,
    /// which are written after these).
    fn body(&self, req: &Request, stream: bool, b: &mut Map<String, Value>);
    /// The API key, as its SDKs send it (Bearer unless it says otherwise).
    fn auth(&self, rb: reqwest::RequestBuilder, key: &str) -> reqwest::RequestBuilder {
        rb.bearer_auth(key)
    }
    /// Headers its requests carry beside the key.
    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// Usage in its field names, onto the typed capture.
    fn read_usage(&self, u: &Value, m: &mut ProviderMeta);
    /// Where a body's usage is (an error body's too).
    fn usage_in<'a>(&self, v: &'a Value) -> Option<&'a Value> {
        v.get("usage").filter(|u| u.is_object())
    }
    /// Marks a content-filter refusal (a 400) in its finish words.
    fn mark_filtered(&self, m: &mut ProviderMeta);
    /// A whole (non-streamed) response; `shared` holds its usage.
    fn parse_body(&self, v: &Value, shared: ProviderMeta) -> Vec<Choice>;
    /// One stream event (`kind`: the SSE event name, else the JSON `type`);
    /// true once the stream has said its last word.
    fn on_event(&self, kind: &str, v: &Value, s: &mut StreamState) -> bool;
}

/// What a parse found before metadata is merged, per choice.
#[derive(Default, Debug)]
pub(crate) struct Choice {
    pub text: String,
    /// By index: id, name and arguments JSON text.
    pub tool_calls: BTreeMap<usize, (String, String, String)>,
    pub meta: ProviderMeta,
    pub error: Option<String>,
}

/// What a stream has told so far, and who hears its text as it comes (so
/// that a dialect's event reader needs only the state, not a listener too).
pub(crate) struct StreamState<'a> {
    pub choices: BTreeMap<usize, Choice>,
    /// Usage, shared by all choices.
    pub shared: ProviderMeta,
    /// A dialect that ends its stream with the whole response (Responses).
    pub final_response: Option<Choice>,
    /// Told each piece of text with its choice's index.
    on_text: &'a mut dyn FnMut(usize, &str),
}

impl<'a> StreamState<'a> {
    pub fn new(on_text: &'a mut dyn FnMut(usize, &str)) -> Self {
        StreamState {
            choices: BTreeMap::new(),
            shared: ProviderMeta::default(),
            final_response: None,
            on_text,
        }
    }
    /// What the stream told: its choices, their shared usage, and the final
    /// response object where the dialect sends one.
    pub fn into_parts(self) -> (BTreeMap<usize, Choice>, ProviderMeta, Option<Choice>) {
        (self.choices, self.shared, self.final_response)
    }
    /// The first (or only) choice.
    pub fn first(&mut self) -> &mut Choice {
        self.choices.entry(0).or_default()
    }
    /// Text of choice `index` arrived.
    pub fn text(&mut self, index: usize, t: &str) {
        self.choices.entry(index).or_default().text.push_str(t);
        (self.on_text)(index, t);
    }
}

/// The request's limit, temperature and stops under the dialect's names
/// for the limit and the stops, each only where the request sets it.
pub(crate) fn limits(req: &Request, b: &mut Map<String, Value>, max_tokens: &str, stop: &str) {
    if let Some(n) = req.max_tokens {
        b.insert(max_tokens.into(), serde_json::json!(n));
    }
    if let Some(t) = req.temperature {
        b.insert("temperature".into(), serde_json::json!(t));
    }
    if !req.stop.is_empty() {
        b.insert(stop.into(), serde_json::json!(req.stop));
    }
}

/// The elements of an array field; none where it is missing or not an array.
pub(crate) fn items(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

/// How a dialect writes a turn's images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImageForm {
    /// Chat: `image_url` parts after a `text` part.
    ChatParts,
    /// Responses: `input_image` parts after an `input_text` part.
    ResponsesParts,
    /// Anthropic: `image` blocks (base64 source) before a `text` block.
    AnthropicBlocks,
    /// Ollama: an `images` list of base64 strings beside the text.
    OllamaList,
}

/// Messages as `{"role", "content"}` objects, system turns left out when
/// asked; a turn with images gets them in the dialect's `form`.
pub(crate) fn messages(req: &Request, skip_system: bool, form: ImageForm) -> Vec<Value> {
    use serde_json::json;
    req.messages
        .iter()
        .filter(|m| !(skip_system && m.role == "system"))
        .map(|m| {
            if m.images.is_empty() {
                return json!({"role": m.role, "content": m.content});
            }
            let images = m.images.iter();
            match form {
                ImageForm::ChatParts => {
                    let mut parts = vec![json!({"type": "text", "text": m.content})];
                    parts.extend(
                        images.map(
                            |i| json!({"type": "image_url", "image_url": {"url": i.data_url()}}),
                        ),
                    );
                    json!({"role": m.role, "content": parts})
                }
                ImageForm::ResponsesParts => {
                    let mut parts = vec![json!({"type": "input_text", "text": m.content})];
                    parts.extend(
                        images.map(|i| json!({"type": "input_image", "image_url": i.data_url()})),
                    );
                    json!({"role": m.role, "content": parts})
                }
                ImageForm::AnthropicBlocks => {
                    let mut blocks: Vec<Value> = images
                        .map(|i| {
                            json!({"type": "image", "source": {
                                "type": "base64", "media_type": i.media_type, "data": i.data}})
                        })
                        .collect();
                    blocks.push(json!({"type": "text", "text": m.content}));
                    json!({"role": m.role, "content": blocks})
                }
                ImageForm::OllamaList => json!({
                    "role": m.role, "content": m.content,
                    "images": images.map(|i| i.data.clone()).collect::<Vec<_>>(),
                }),
            }
        })
        .collect()
}
