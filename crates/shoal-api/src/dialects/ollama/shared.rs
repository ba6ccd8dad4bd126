//! What Ollama's routes share: its words for the engine's records, model
//! names and tags, keep-alive, the request options, the closing fields of a
//! reply and its errors.
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{Completion, FinishReason, SamplingParams, Usage};

use crate::error::{ApiError, ErrorShape};
use crate::state::AppState;

/// The Ollama version `/api/version` reports: the API this module follows
/// (clients gate features on it; Codex's `--oss` mode wants 0.13.4 or
/// newer, for `/v1/responses`). Where it differs is in the README.
pub const OLLAMA_VERSION: &str = "0.13.5";

/// Ollama's words for the engine's records, and its routes.
pub struct Words;

impl crate::dialect::Words for Words {
    fn ledger_name(&self) -> &'static str {
        "ollama"
    }
    fn short_name(&self) -> &'static str {
        "ollama"
    }
    fn path_prefixes(&self) -> &'static [&'static str] {
        &["/api"]
    }
    fn generation_paths(&self) -> &'static [&'static str] {
        &[
            "/api/chat",
            "/api/generate",
            "/api/embed",
            "/api/embeddings",
        ]
    }
    fn error_shape(&self) -> ErrorShape {
        ErrorShape::PLAIN
    }
    fn id_prefix(&self) -> &'static str {
        "ollama-"
    }
    fn framing(&self) -> crate::sse::Framing {
        crate::sse::Framing::Ndjson
    }
    fn finish_words(&self, f: &FinishReason) -> crate::dialect::FinishWords {
        crate::dialect::FinishWords::one(done_reason(f))
    }
    fn usage_json(&self, u: &Usage) -> Value {
        json!({
            "prompt_eval_count": u.prompt_tokens,
            "prompt_eval_cached_count": u.cached_tokens,
            // Of `prompt_eval_count`, the positions images took.
            "prompt_eval_image_count": u.image_tokens,
            "eval_count": u.completion_tokens,
            "eval_thinking_count": u.reasoning_tokens,
        })
    }
    fn provider_meta(
        &self,
        finish: Option<&FinishReason>,
        u: &Usage,
    ) -> shoal_client::ProviderMeta {
        crate::wire::finish_reason_meta(DIALECT, finish, u)
    }
}

/// Ollama as the server registers it.
pub const DIALECT: crate::dialect::Dialect = crate::dialect::Dialect(&Words);

/// What `GET /` answers on Ollama's port (and to a non-browser on the main
/// one): Ollama's liveness text.
pub const ROOT_TEXT: &str = "Ollama is running";

/// `done_reason` for a finish. Ollama ends a tool call with `stop`; it has
/// no words for a filtered or failed reply, which get OpenAI's
/// (`content_filter`, `error`) rather than pass for a normal stop.
pub fn done_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop
        | FinishReason::StopSequence(_)
        | FinishReason::ToolCalls
        | FinishReason::Cancelled => "stop",
        FinishReason::Length | FinishReason::ContextWindow => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Error(_) | FinishReason::Timeout { .. } => "error",
    }
}

/// Shoal's id for an Ollama model name: `id:latest` is `id`.
pub fn model_id(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

/// The Ollama name of a Shoal id.
pub fn tag_name(id: &str) -> String {
    format!("{id}:latest")
}

/// Ollama's 404 for a model nobody can serve.
pub fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("model \"{name}\" not found, try pulling it first"))
}

/// The pool's "no such model" in Ollama's words; other errors as they are.
pub fn ollama_error(e: ApiError, name: &str) -> ApiError {
    if e.code == Some("model_not_found") {
        not_found(name)
    } else {
        e
    }
}

/// An RFC 3339 timestamp with nanoseconds, as Ollama writes `created_at`.
pub fn timestamp(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

pub fn now() -> String {
    timestamp(chrono::Utc::now())
}

/// `keep_alive`: a Go duration (`"5m"`, `"1h30m"`), a number of seconds,
/// negative for ever, zero to unload now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeepAlive {
    Forever,
    For(Duration),
}

impl KeepAlive {
    pub fn parse(v: &Value) -> Result<Option<KeepAlive>, ApiError> {
        let bad = || {
            ApiError::param(
                "keep_alive",
                format!(
                    "'keep_alive' must be a duration such as \"5m\" or a number of seconds, got {v}"
                ),
            )
        };
        let secs = match v {
            Value::Null => return Ok(None),
            Value::Number(n) => n.as_f64().ok_or_else(bad)?,
            Value::String(s) => match s.trim().parse::<f64>() {
                Ok(n) => n,
                Err(_) => go_duration(s.trim()).ok_or_else(bad)?,
            },
            _ => return Err(bad()),
        };
        Ok(Some(if secs < 0.0 {
            KeepAlive::Forever
        } else {
            KeepAlive::For(Duration::try_from_secs_f64(secs).map_err(|_| bad())?)
        }))
    }

    pub fn unloads_now(self) -> bool {
        self == KeepAlive::For(Duration::ZERO)
    }
}

/// Seconds in a Go duration string (`"1h30m"`, `"-1m"`, `"250ms"`).
fn go_duration(s: &str) -> Option<f64> {
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    Some(sign * total)
}

/// Applies a request's `keep_alive` to its model once it has been served.
pub fn apply_keep_alive(state: &AppState, id: &str, keep: Option<KeepAlive>) {
    match keep {
        None => {}
        Some(k) if k.unloads_now() => {
            // Requests already running on it finish; the pool lets go.
            state.pool.unload(id);
        }
        Some(KeepAlive::Forever) => state.pool.keep_alive(id, None),
        Some(KeepAlive::For(d)) => state.pool.keep_alive(id, Some(d)),
    }
}

/// A load request (no messages, no prompt): loads the model and answers
/// `done_reason: "load"`, or with `keep_alive: 0` unloads it (`"unload"`).
pub(super) async fn load_request(
    state: &AppState,
    name: &str,
    keep: Option<KeepAlive>,
    body: impl Fn(&str) -> Value,
) -> Result<axum::response::Response, crate::error::DialectError> {
    use axum::response::IntoResponse;
    let id = model_id(name);
    let err = |e: ApiError| ollama_error(e, name).in_dialect(DIALECT);
    if keep.is_some_and(KeepAlive::unloads_now) {
        state.pool.path_of(id).map_err(err)?;
        state.pool.unload(id);
        return Ok(axum::Json(body("unload")).into_response());
    }
    state.serve(id).await.map_err(err)?;
    apply_keep_alive(state, id, keep);
    Ok(axum::Json(body("load")).into_response())
}

/// A generation in Ollama's words: the one serving path, the pool's
/// errors named as Ollama names them, then the request's keep-alive.
pub(super) async fn generation<A: crate::run::Adapter>(
    state: &AppState,
    tracked: Option<axum::Extension<crate::ledger::Tracked>>,
    req: A::Request,
    name: &str,
    keep: Option<KeepAlive>,
) -> Result<axum::response::Response, crate::error::DialectError> {
    let id = model_id(name).to_string();
    let resp = crate::run::serve_request::<A>(state, tracked.map(|t| t.0), req)
        .await
        .map_err(|e| ollama_error(e.error, name).in_dialect(DIALECT))?;
    apply_keep_alive(state, &id, keep);
    Ok(resp)
}

/// `options`: the model parameters Ollama's clients send. Unknown options
/// are ignored, as Ollama does.
#[derive(Debug, Default, Deserialize)]
pub struct Options {
    pub num_predict: Option<i64>,
    pub num_ctx: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Vec<String>>,
}

/// Most stop strings one request may give.
const MAX_STOPS: usize = 16;

impl Options {
    /// The engine's sampling: each option given, the model's defaults for the rest.
    pub fn sampling(&self, defaults: &SamplingParams) -> Result<SamplingParams, ApiError> {
        use crate::params::check_range;
        let at = |k: &str| format!("options.{k}");
        check_range(&at("temperature"), self.temperature, 0.0, 100.0)?;
        check_range(&at("top_p"), self.top_p, 0.0, 1.0)?;
        check_range(&at("min_p"), self.min_p, 0.0, 1.0)?;
        check_range(&at("top_k"), self.top_k, 0, i64::from(u32::MAX))?;
        check_range(&at("repeat_penalty"), self.repeat_penalty, 0.0, 100.0)?;
        check_range(
            &at("presence_penalty"),
            self.presence_penalty,
            -100.0,
            100.0,
        )?;
        check_range(
            &at("frequency_penalty"),
            self.frequency_penalty,
            -100.0,
            100.0,
        )?;
        let mut p = defaults.clone();
        if let Some(t) = self.temperature {
            p.temperature = t;
        }
        // Ollama's 0 means "off" for both.
        match self.top_p {
            Some(v) if v > 0.0 => p.top_p = v,
            Some(_) => p.top_p = 1.0,
            None => {}
        }
        if let Some(k) = self.top_k {
            p.top_k = k as usize;
        }
        if let Some(m) = self.min_p {
            p.min_p = m;
        }
        if let Some(r) = self.repeat_penalty {
            p.repetition_penalty = r;
        }
        if let Some(n) = self.repeat_last_n {
            // -1: the whole context; 0: off.
            p.repetition_context = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = v;
        }
        // A negative seed is Ollama's "random".
        p.seed = self.seed.and_then(|s| u64::try_from(s).ok());
        Ok(p)
    }

    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops: Vec<String> = self
            .stop
            .iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect();
        if stops.len() > MAX_STOPS {
            return Err(ApiError::param(
                "options.stop",
                format!(
                    "at most {MAX_STOPS} stop sequences are allowed, got {}",
                    stops.len()
                ),
            ));
        }
        Ok(stops)
    }

    /// The reply's token cap for a prompt that takes `prompt_len` positions
    /// (its tokens, less those an M-RoPE image lays out in 2-D): `num_predict`
    /// (negative: no cap), within `num_ctx` when given, a window in positions
    /// as the model's own is. A `num_ctx` at or
    /// above the model's window is the window (the reply then ends when the
    /// window is full, as `length`); one the prompt does not fit in is
    /// refused rather than the prompt cut silently.
    pub fn max_tokens(&self, prompt_len: usize, window: usize) -> Result<Option<usize>, ApiError> {
        let predict = match self.num_predict {
            None => None,
            Some(n) if n < 0 => None,
            Some(0) => {
                return Err(ApiError::param(
                    "options.num_predict",
                    "'options.num_predict' must be at least 1, or negative for no limit",
                ))
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        };
        let Some(ctx) = self.num_ctx else {
            return Ok(predict);
        };
        let ctx = usize::try_from(ctx).unwrap_or(0);
        if ctx == 0 {
            return Err(ApiError::param(
                "options.num_ctx",
                "'options.num_ctx' must be at least 1",
            ));
        }
        if ctx >= window {
            // The engine's own window bounds the reply, and refuses a
            // prompt that does not fit in it.
            return Ok(predict);
        }
        if prompt_len >= ctx {
            return Err(ApiError::param(
                "options.num_ctx",
                format!(
                    "the prompt takes {prompt_len} positions, which does not fit in 'options.num_ctx' {ctx}"
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let room = ctx - prompt_len;
        Ok(Some(predict.map_or(room, |p| p.min(room))))
    }
}

/// `format`: `"json"` or a JSON schema constrains the reply.
pub fn format_grammar(format: Option<&Value>) -> Result<Option<shoal_engine::Grammar>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(shoal_engine::Grammar::JsonObject)),
        Some(s @ Value::Object(_)) => Ok(Some(shoal_engine::Grammar::JsonSchema(s.clone()))),
        Some(other) => Err(ApiError::param(
            "format",
            format!("'format' must be \"json\" or a JSON schema object, got {other}"),
        )),
    }
}

/// `think`: `true`/`false` or an effort level. Asking a model that cannot
/// think is an error, as Ollama answers it; `false` is always fine.
pub fn wanted_thinking(
    think: Option<&Value>,
    can_think: bool,
    model: &str,
) -> Result<Option<Option<usize>>, ApiError> {
    let want = match think {
        None | Some(Value::Null) | Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => Some(None),
        Some(Value::String(level)) if matches!(level.as_str(), "low" | "medium" | "high") => {
            crate::dialects::common::effort_budget("think", level)?
        }
        Some(other) => {
            return Err(ApiError::param(
                "think",
                format!(
                    "'think' must be true, false, \"low\", \"medium\" or \"high\", got {other}"
                ),
            ))
        }
    };
    if !can_think {
        return Err(ApiError::param(
            "think",
            format!("\"{model}\" does not support thinking"),
        ));
    }
    Ok(want)
}

/// Whether the served model can think (a thinking switch or harmony's channels).
pub fn can_think(served: &crate::state::Served) -> bool {
    served.engine.model.vocab.capabilities().reasoning
}

/// Ollama's `images` (base64 strings) into `images`; returns their
/// markers, which go before the message's text (where Ollama puts them).
pub fn take_images(
    list: Option<&Vec<Value>>,
    at: &str,
    images: &mut crate::images::Images,
) -> Result<String, ApiError> {
    let mut markers = String::new();
    for (i, v) in list.into_iter().flatten().enumerate() {
        let here = format!("{at}[{i}]");
        let Some(s) = v.as_str() else {
            return Err(ApiError::param(
                &here,
                format!("{here} must be a base64 string"),
            ));
        };
        markers.push_str(images.push_base64(&here, s)?);
    }
    Ok(markers)
}

fn nanos(ms: f64) -> u64 {
    (ms.max(0.0) * 1e6).round() as u64
}

/// The fields of a final (`done: true`) object: the finish, the counts and
/// the durations in nanoseconds from the engine's own timings
/// (`load_duration` is the wait for the model to be in memory).
pub fn final_fields(c: &Completion, ready_after: Duration) -> serde_json::Map<String, Value> {
    let t = &c.timings;
    let load = ready_after.as_nanos() as u64;
    let mut m = serde_json::Map::new();
    m.insert("done_reason".into(), json!(done_reason(&c.finish)));
    m.insert("total_duration".into(), json!(load + nanos(t.total_ms)));
    m.insert("load_duration".into(), json!(load));
    m.insert(
        "prompt_eval_duration".into(),
        json!(nanos(t.ttft_ms - t.queue_ms)),
    );
    m.insert("eval_duration".into(), json!(nanos(t.total_ms - t.ttft_ms)));
    if let Value::Object(u) = DIALECT.usage_json(&c.usage) {
        m.extend(u);
    }
    m
}

/// The engine job for a prompt under a request's options (one choice).
pub fn job(
    served: &crate::state::Served,
    p: shoal_engine::prompt::ChatPrompt,
    options: &Options,
    format: Option<shoal_engine::Grammar>,
) -> Result<crate::run::Generation, ApiError> {
    let window = served.engine.model.info.context_length;
    Ok(crate::run::Generation {
        max_tokens: options.max_tokens(
            p.tokens
                .len()
                .saturating_sub(shoal_engine::vision::positions_saved(&p.images)),
            window,
        )?,
        prompts: vec![p.tokens],
        sampling: options.sampling(&served.engine.model.defaults.params())?,
        stop: options.stops()?,
        n: 1,
        cache_breakpoints: Vec::new(),
        images: p.images,
        reasoning: p.reasoning,
        // A required call's grammar outranks the reply format.
        grammar: p.grammar.or(format),
        tools: p.tools,
    })
}

/// `logprobs` / `top_logprobs` (Ollama 0.12.11 on): `Some(n)` when logprobs
/// are asked for, with the `n` most likely alternatives of each token.
pub fn wanted_logprobs(
    logprobs: Option<bool>,
    top: Option<i64>,
) -> Result<Option<usize>, ApiError> {
    if let Some(n) = top.filter(|n| !(0..=20).contains(n)) {
        return Err(ApiError::param(
            "top_logprobs",
            format!("top_logprobs must be between 0 and 20, got {n}"),
        ));
    }
    Ok(logprobs.unwrap_or(false).then(|| top.unwrap_or(0) as usize))
}

/// Tokens' logprobs in Ollama's shape.
pub fn logprobs_json(lps: &[shoal_engine::TokenLogprob]) -> Value {
    lps.iter()
        .map(|l| {
            let top: Vec<Value> = l
                .top
                .iter()
                .map(|(_, t, lp)| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()}))
                .collect();
            json!({"token": l.text, "logprob": l.logprob, "bytes": l.bytes, "top_logprobs": top})
        })
        .collect()
}

/// The one collected reply of a non-streamed request, or its failure.
pub fn only(collected: &[crate::run::Collected]) -> Result<&crate::run::Collected, ApiError> {
    let c = collected
        .first()
        .ok_or_else(|| ApiError::internal("the engine returned no reply"))?;
    match failure(c.completion()) {
        Some(e) => Err(e),
        None => Ok(c),
    }
}

/// What every Ollama reply of a generation carries, the same for
/// `/api/chat` and `/api/generate`: the model name as the client gave it
/// (echoed back), how long the model took to be ready, and whether the
/// client asked for logprobs.
pub struct Reply {
    pub model: String,
    pub ready_after: Duration,
    pub logprobs: bool,
}

impl Reply {
    pub fn new(served: &crate::state::Served, model: String, logprobs: Option<bool>) -> Self {
        Reply {
            model,
            ready_after: served.ready_after,
            logprobs: logprobs.unwrap_or(false),
        }
    }

    /// The whole (non-streamed) reply: the model and time, `body` (the
    /// message or response), the logprobs when asked for, and the
    /// [`closing`] fields.
    pub fn close(&self, body: Value, c: &crate::run::Collected) -> Value {
        let mut head = json!({"model": self.model, "created_at": now()});
        if let (Value::Object(h), Value::Object(b)) = (&mut head, body) {
            h.extend(b);
        }
        if self.logprobs {
            head["logprobs"] = logprobs_json(&c.logprobs);
        }
        closing(head, c.completion(), self.ready_after)
    }
}

/// A final object: `head` (model, created_at and the message or response)
/// with `done: true`, the finish, the counts and the durations; or, for a
/// failed generation, the error line with its usage.
pub fn closing(mut head: Value, c: &Completion, ready_after: Duration) -> Value {
    if let Some(e) = failure(c) {
        return e.body(ErrorShape::PLAIN);
    }
    if let Value::Object(o) = &mut head {
        o.insert("done".into(), Value::Bool(true));
        o.extend(final_fields(c, ready_after));
    }
    head
}

/// A failed generation's closing line or body: the error, with the usage
/// spent beside it.
pub fn failure(c: &Completion) -> Option<ApiError> {
    crate::wire::failed(DIALECT, std::slice::from_ref(c), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_reads_go_durations_and_seconds() {
        let p = |v: Value| KeepAlive::parse(&v);
        assert_eq!(
            p(json!("5m")).ok().flatten(),
            Some(KeepAlive::For(Duration::from_secs(300)))
        );
        assert_eq!(
            p(json!("1h30m")).ok().flatten(),
            Some(KeepAlive::For(Duration::from_secs(5400)))
        );
        assert_eq!(
            p(json!("250ms")).ok().flatten(),
            Some(KeepAlive::For(Duration::from_millis(250)))
        );
        assert_eq!(
            p(json!(30)).ok().flatten(),
            Some(KeepAlive::For(Duration::from_secs(30)))
        );
        assert_eq!(p(json!("-1")).ok().flatten(), Some(KeepAlive::Forever));
        assert_eq!(p(json!(-1)).ok().flatten(), Some(KeepAlive::Forever));
        assert_eq!(p(json!("-5m")).ok().flatten(), Some(KeepAlive::Forever));
        assert!(p(json!(0))
            .ok()
            .flatten()
            .is_some_and(KeepAlive::unloads_now));
        assert!(p(json!("0s"))
            .ok()
            .flatten()
            .is_some_and(KeepAlive::unloads_now));
        assert_eq!(p(Value::Null).ok().flatten(), None);
        for bad in [json!("soon"), json!("5x"), json!(true), json!("")] {
            assert!(p(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_map_both_ways() {
        assert_eq!(model_id("smollm2:latest"), "smollm2");
        assert_eq!(model_id("smollm2"), "smollm2");
        assert_eq!(model_id("org/m:q4"), "org/m:q4");
        assert_eq!(model_id(&tag_name("org/m")), "org/m");
    }

    #[test]
    fn options_cap_the_reply_within_num_ctx() {
        let o = |predict: Option<i64>, ctx: Option<i64>| Options {
            num_predict: predict,
            num_ctx: ctx,
            ..Options::default()
        };
        assert_eq!(o(None, None).max_tokens(10, 100).ok(), Some(None));
        assert_eq!(o(Some(-1), None).max_tokens(10, 100).ok(), Some(None));
        assert_eq!(o(Some(5), None).max_tokens(10, 100).ok(), Some(Some(5)));
        assert_eq!(
            o(Some(50), Some(20)).max_tokens(10, 100).ok(),
            Some(Some(10))
        );
        assert_eq!(o(None, Some(20)).max_tokens(10, 100).ok(), Some(Some(10)));
        // Above the window (LlamaIndex's num_ctx, say): the window caps it.
        assert_eq!(o(None, Some(200)).max_tokens(10, 100).ok(), Some(None));
        assert_eq!(
            o(Some(50), Some(100_000)).max_tokens(10, 100).ok(),
            Some(Some(50))
        );
        assert_eq!(o(None, Some(100)).max_tokens(10, 100).ok(), Some(None));
        assert!(o(None, Some(10)).max_tokens(10, 100).is_err());
        assert!(o(None, Some(0)).max_tokens(10, 100).is_err());
        assert!(o(None, Some(-5)).max_tokens(10, 100).is_err());
        assert!(o(Some(0), None).max_tokens(10, 100).is_err());
    }

    #[test]
    fn a_filtered_or_failed_reply_is_not_a_stop() {
        assert_eq!(done_reason(&FinishReason::ToolCalls), "stop");
        assert_eq!(done_reason(&FinishReason::ContextWindow), "length");
        assert_eq!(done_reason(&FinishReason::ContentFilter), "content_filter");
        assert_eq!(done_reason(&FinishReason::Error("x".into())), "error");
        assert_eq!(
            done_reason(&FinishReason::Timeout { limit_secs: 1 }),
            "error"
        );
    }

    #[test]
    fn format_is_json_or_a_schema() {
        use shoal_engine::Grammar;
        assert!(matches!(
            format_grammar(Some(&json!("json"))),
            Ok(Some(Grammar::JsonObject))
        ));
        assert!(matches!(
            format_grammar(Some(&json!({"type": "object"}))),
            Ok(Some(Grammar::JsonSchema(_)))
        ));
        assert!(matches!(format_grammar(Some(&json!(""))), Ok(None)));
        assert!(matches!(format_grammar(None), Ok(None)));
        assert!(format_grammar(Some(&json!("yaml"))).is_err());
        assert!(format_grammar(Some(&json!(3))).is_err());
    }

    #[test]
    fn thinking_on_a_model_without_it_is_refused() {
        assert!(wanted_thinking(Some(&json!(true)), false, "m").is_err());
        assert!(wanted_thinking(Some(&json!("high")), false, "m").is_err());
        assert_eq!(
            wanted_thinking(Some(&json!(false)), false, "m").ok(),
            Some(None)
        );
        assert_eq!(wanted_thinking(None, false, "m").ok(), Some(None));
        assert_eq!(
            wanted_thinking(Some(&json!(true)), true, "m").ok(),
            Some(Some(None))
        );
        assert!(wanted_thinking(Some(&json!("max")), true, "m").is_err());
    }
}
