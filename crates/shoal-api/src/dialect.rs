//! What a dialect is to the layers below the handlers: its words for the
//! engine's records ([`Words`], [`Dialect`]) and the set of dialects a
//! server speaks ([`Registry`]), with no dialect named here. The dialects
//! themselves live in `dialects/`, above the serving path; their list
//! (`dialects::REGISTRY`) is handed down as a [`Registry`] value, and the
//! router attaches each request's dialect once ([`Routed`]).
use serde_json::Value;
use shoal_client::ProviderMeta;
use shoal_engine::{FinishReason, Usage};

use crate::error::ErrorShape;
use crate::sse::Framing;

/// A dialect's own words for the engine's records, and where it lives.
pub trait Words: Send + Sync + 'static {
    /// The name the ledger, `/metrics` and the logs give the dialect
    /// (`openai.chat`, `ollama` …); stored, so never renamed.
    fn ledger_name(&self) -> &'static str;
    /// A short alias `/v1/usage?dialect=` also accepts (`chat`).
    fn short_name(&self) -> &'static str;
    /// Path prefixes of the dialect's routes: their errors take its shape.
    fn path_prefixes(&self) -> &'static [&'static str];
    /// The routes whose every answer is a ledger row.
    fn generation_paths(&self) -> &'static [&'static str];
    /// Routes whose body names a model, so a node without it forwards them.
    fn model_paths(&self) -> &'static [&'static str] {
        self.generation_paths()
    }
    /// How its error bodies look.
    fn error_shape(&self) -> ErrorShape;
    /// Prefix of the ids its replies get (`chatcmpl-`, `msg_` …): a fact of
    /// the wire format, the same for every route of the dialect.
    fn id_prefix(&self) -> &'static str;
    /// How its streams are framed.
    fn framing(&self) -> Framing {
        Framing::Sse
    }
    /// The event name of an error frame in its streams (Anthropic's SSE
    /// names it `error`); `None`: error frames are bare data.
    fn stream_error_event(&self) -> Option<&'static str> {
        None
    }
    /// Headers its SDKs send an API key in, besides `Authorization: Bearer`.
    fn key_headers(&self) -> &'static [&'static str] {
        &[]
    }
    /// Request headers its SDKs send that browsers may (CORS) and peers pass
    /// on (forwarding), besides content type, accept and authorization.
    fn request_headers(&self) -> &'static [&'static str] {
        &[]
    }
    /// One choice's finish in the dialect's words (a cancelled choice is
    /// worded by [`Dialect::finish_words`], the same in every dialect).
    fn finish_words(&self, f: &FinishReason) -> FinishWords;
    /// The usage object exactly as the dialect sends it.
    fn usage_json(&self, u: &Usage) -> Value;
    /// What a recorder client stores under its reserved keys for a reply of
    /// this dialect: the finish words and the usage fields it reports.
    fn provider_meta(&self, finish: Option<&FinishReason>, u: &Usage) -> ProviderMeta;
}

/// A finish in a dialect's words: one word (`length`, `max_tokens`), or a
/// status with its reason (Responses' `incomplete` for `max_output_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FinishWords {
    pub word: &'static str,
    pub reason: Option<&'static str>,
}

impl FinishWords {
    pub const fn one(word: &'static str) -> Self {
        FinishWords { word, reason: None }
    }
    /// Every word the ledger's `finish` filter finds it by: the word, the
    /// reason, and both as listed.
    pub fn terms(&self) -> Vec<String> {
        let mut out = vec![self.word.to_string()];
        if let Some(r) = self.reason {
            out.push(r.to_string());
            out.push(self.to_string());
        }
        out
    }
}

/// As listed: `word`, or `status:reason`.
impl std::fmt::Display for FinishWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason {
            Some(r) => write!(f, "{}:{r}", self.word),
            None => f.write_str(self.word),
        }
    }
}

/// What a dialect's SDKs do beyond the body: how a stream is framed, the
/// event name of a stream's error frame, the headers they send a key in and
/// their own request headers (see [`Words`]).
#[derive(Clone, Copy, Debug)]
pub struct Transport {
    pub framing: Framing,
    pub stream_error_event: Option<&'static str>,
    pub key_headers: &'static [&'static str],
    pub request_headers: &'static [&'static str],
}

impl Transport {
    /// SSE streams, Bearer keys, bare error frames, no headers of its own
    /// (OpenAI's way).
    pub const PLAIN: Transport = Transport {
        framing: Framing::Sse,
        stream_error_event: None,
        key_headers: &[],
        request_headers: &[],
    };
}

/// A dialect's words given as data, which is all most dialects need.
pub struct Described {
    pub ledger_name: &'static str,
    pub short_name: &'static str,
    pub path_prefixes: &'static [&'static str],
    pub generation_paths: &'static [&'static str],
    pub model_paths: &'static [&'static str],
    pub error_shape: ErrorShape,
    pub id_prefix: &'static str,
    pub transport: Transport,
    pub finish_words: fn(&FinishReason) -> FinishWords,
    pub usage_json: fn(&Usage) -> Value,
    /// What a recorder stores under its reserved keys beyond the usage
    /// every dialect reports alike ([`base_meta`], made once
    /// here): the dialect's finish words and any count it words its own way.
    pub provider_meta: fn(&mut ProviderMeta, Option<&FinishReason>, &Usage),
}

impl Words for Described {
    fn ledger_name(&self) -> &'static str {
        self.ledger_name
    }
    fn short_name(&self) -> &'static str {
        self.short_name
    }
    fn path_prefixes(&self) -> &'static [&'static str] {
        self.path_prefixes
    }
    fn generation_paths(&self) -> &'static [&'static str] {
        self.generation_paths
    }
    fn model_paths(&self) -> &'static [&'static str] {
        self.model_paths
    }
    fn error_shape(&self) -> ErrorShape {
        self.error_shape
    }
    fn id_prefix(&self) -> &'static str {
        self.id_prefix
    }
    fn framing(&self) -> Framing {
        self.transport.framing
    }
    fn stream_error_event(&self) -> Option<&'static str> {
        self.transport.stream_error_event
    }
    fn key_headers(&self) -> &'static [&'static str] {
        self.transport.key_headers
    }
    fn request_headers(&self) -> &'static [&'static str] {
        self.transport.request_headers
    }
    fn finish_words(&self, f: &FinishReason) -> FinishWords {
        (self.finish_words)(f)
    }
    fn usage_json(&self, u: &Usage) -> Value {
        (self.usage_json)(u)
    }
    fn provider_meta(&self, finish: Option<&FinishReason>, u: &Usage) -> ProviderMeta {
        let mut p = base_meta(finish, u);
        (self.provider_meta)(&mut p, finish, u);
        p
    }
}

/// A handle on a dialect's words; compared and stored by its ledger name.
#[derive(Clone, Copy)]
pub struct Dialect(pub &'static dyn Words);

/// The word for a choice whose client left before it ended: no dialect has one.
pub const CANCELLED: &str = "cancelled";

impl Dialect {
    pub fn ledger_name(self) -> &'static str {
        self.0.ledger_name()
    }
    pub fn error_shape(self) -> ErrorShape {
        self.0.error_shape()
    }
    /// A new id for one of its replies.
    pub fn new_id(self) -> String {
        crate::ids::new_id(self.0.id_prefix())
    }
    pub fn framing(self) -> Framing {
        self.0.framing()
    }
    /// One choice's finish in this dialect's words; `cancelled` for a
    /// choice whose client left, in every dialect.
    pub fn finish_words(self, f: &FinishReason) -> String {
        self.finish_terms(f).to_string()
    }
    /// The same, typed (the ledger stores its parts).
    pub fn finish_terms(self, f: &FinishReason) -> FinishWords {
        if *f == FinishReason::Cancelled {
            return FinishWords::one(CANCELLED);
        }
        self.0.finish_words(f)
    }
    pub fn usage_json(self, u: &Usage) -> Value {
        self.0.usage_json(u)
    }
    pub fn provider_meta(self, finish: Option<&FinishReason>, u: &Usage) -> ProviderMeta {
        self.0.provider_meta(finish, u)
    }
}

impl PartialEq for Dialect {
    fn eq(&self, other: &Self) -> bool {
        self.ledger_name() == other.ledger_name()
    }
}
impl Eq for Dialect {}

impl std::fmt::Debug for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.ledger_name())
    }
}

impl From<Dialect> for ErrorShape {
    fn from(d: Dialect) -> Self {
        d.error_shape()
    }
}

/// The dialects a server speaks, in the order the UI lists them: looked
/// up by name (a stored ledger row) or by path (a request).
#[derive(Clone, Copy, Debug)]
pub struct Registry(pub &'static [Dialect]);

impl Registry {
    pub fn all(self) -> impl Iterator<Item = Dialect> {
        self.0.iter().copied()
    }
    /// The dialect stored under `name` (its ledger name or short alias).
    pub fn parse(self, name: &str) -> Option<Dialect> {
        self.all()
            .find(|d| d.ledger_name() == name || d.0.short_name() == name)
    }
    /// The dialect whose routes `path` is under; `None` for Shoal's own routes.
    pub fn for_path(self, path: &str) -> Option<Dialect> {
        self.all().find(|d| {
            d.0.path_prefixes().iter().any(|p| {
                path == *p
                    || path
                        .strip_prefix(p)
                        .is_some_and(|rest| p.ends_with('/') || rest.starts_with('/'))
            })
        })
    }
    /// The dialect whose generation route `path` is (ledger rows for every answer).
    pub fn for_generation_path(self, path: &str) -> Option<Dialect> {
        self.all().find(|d| d.0.generation_paths().contains(&path))
    }
    /// Whether `path` is a route whose body names a model (forwardable).
    pub fn names_model(self, path: &str) -> bool {
        self.all().any(|d| d.0.model_paths().contains(&path))
    }
    /// Every header any dialect's SDKs send a key in (besides Bearer).
    pub fn key_headers(self) -> Vec<&'static str> {
        self.union(|d| d.0.key_headers())
    }
    /// Every dialect's own request headers (CORS and forwarding pass them).
    pub fn request_headers(self) -> Vec<&'static str> {
        self.union(|d| d.0.request_headers())
    }
    fn union(self, of: impl Fn(Dialect) -> &'static [&'static str]) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = self.all().flat_map(of).copied().collect();
        out.sort_unstable();
        out.dedup();
        out
    }
    /// What a request on `path` is, worked out once for every layer.
    pub fn route(self, path: &str) -> Routed {
        Routed {
            dialect: self.for_path(path),
            generation: self.for_generation_path(path),
            names_model: self.names_model(path),
        }
    }
}

/// A request's dialect as the router attached it (a request extension):
/// the dialect of its path (its errors take that shape), whether the path
/// is a generation route (a ledger row for every answer) and whether its
/// body names a model (a node without it forwards it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Routed {
    pub dialect: Option<Dialect>,
    pub generation: Option<Dialect>,
    pub names_model: bool,
}

impl Routed {
    /// What the router attached to a request (nothing for a request that
    /// did not come through the router, as in a handler's unit test).
    pub fn of(extensions: &axum::http::Extensions) -> Routed {
        extensions.get::<Routed>().copied().unwrap_or_default()
    }
    /// The shape errors on this request take: its dialect's, else OpenAI's
    /// (Shoal's own routes).
    pub fn error_shape(self) -> ErrorShape {
        self.dialect.map_or(ErrorShape::OPENAI, ErrorShape::from)
    }
    /// The event name of an error frame in this request's stream.
    pub fn stream_error_event(self) -> Option<&'static str> {
        self.dialect.and_then(|d| d.0.stream_error_event())
    }
}

/// The reserved metadata every dialect fills alike: the token counts (each
/// dialect then adds its finish words and drops what it does not report).
pub fn base_meta(finish: Option<&FinishReason>, u: &Usage) -> ProviderMeta {
    let n = |v: usize| Some(v as u64);
    ProviderMeta {
        token_usage_prompt_tokens: n(u.prompt_tokens),
        token_usage_completion_tokens: n(u.completion_tokens),
        token_usage_total_tokens: n(u.total_tokens()),
        token_usage_cached_tokens: n(u.cached_tokens),
        token_usage_reasoning_tokens: n(u.reasoning_tokens),
        token_usage_image_tokens: n(u.image_tokens),
        stop_sequence: match finish {
            Some(FinishReason::StopSequence(s)) => Some(s.clone()),
            _ => None,
        },
        ..ProviderMeta::default()
    }
}
