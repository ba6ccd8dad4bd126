//! `/v1/conversations`: the chat history of the web UI and the desktop app,
//! kept in the same SQLite store as `shoal chat` / `shoal history`.
//!
//! An assistant reply is stored with what *this server* recorded for it: the
//! reserved keys (finish reason, every `token_usage_` figure) come from the
//! request ledger by response id, never from the posting client, which can
//! only add keys of its own.
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use shoal_client::metadata::{is_reserved, merge};
use shoal_client::ProviderMeta;
use shoal_engine::vision::{self, ImageError};
use shoal_store::{Metadata, Piece, PieceKind, Store};

use crate::access::Access;
use crate::error::{ApiError, DialectError, ErrorKind, ErrorShape};
use crate::ledger::LedgerEntry;
use crate::state::AppState;

/// Metadata keys written by the server besides the reserved ones; a client
/// cannot set them either.
const SERVER_KEYS: &[&str] = &[
    "response_id",
    "engine_finish_reason",
    "ttft_ms",
    "decode_tokens_per_s",
    "draft_tokens",
    "draft_accepted",
    "cached_disk_tokens",
    "image_tokens",
    "reasoning_content",
    "error",
];

/// A reply's ledger entry may lag behind the client's post: a generation
/// the client cancelled is recorded once the engine has stopped it, which
/// the post waits for. This only bounds a wait that would never end.
const LEDGER_HANG_GUARD: Duration = Duration::from_secs(120);

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/conversations", get(list).post(create))
        .route(
            "/v1/conversations/{id}",
            get(one).patch(update).delete(remove),
        )
        .route("/v1/conversations/{id}/messages", post(add_message))
        .route(
            "/v1/conversations/{id}/messages/{message_id}",
            delete(truncate).patch(edit_message),
        )
        .route(
            "/v1/conversations/{id}/messages/{message_id}/pieces",
            post(add_piece),
        )
}

type Reply = Result<Json<Value>, DialectError>;

fn err(e: ApiError) -> DialectError {
    e.in_dialect(ErrorShape::OPENAI)
}

/// Runs `f` on the store off the async runtime.
async fn with_store<T: Send + 'static>(
    s: &AppState,
    f: impl FnOnce(&mut Store) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, DialectError> {
    let store = s.store.clone().ok_or_else(|| {
        err(ApiError::unavailable(
            "this server runs without a conversation store",
        ))
    })?;
    tokio::task::spawn_blocking(move || {
        let mut guard = store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    })
    .await
    .map_err(|e| err(ApiError::internal(format!("store task failed: {e}"))))?
    .map_err(err)
}

fn store_err(e: shoal_store::StoreError) -> ApiError {
    tracing::error!(error = %e, "conversation store");
    ApiError::internal(format!("conversation store: {e}"))
}

/// Ids in paths are the store's integers; anything else is a 400 in our shape.
fn parse_id(raw: &str) -> Result<i64, DialectError> {
    raw.parse().map_err(|_| {
        err(ApiError::invalid(format!(
            "{raw:?} is not a conversation or message id"
        )))
    })
}

fn missing(id: i64) -> ApiError {
    ApiError::not_found(format!("no conversation {id}"))
}

/// A 404 unless conversation `id` exists.
fn require(st: &Store, id: i64) -> Result<(), ApiError> {
    if st.has_conversation(id).map_err(store_err)? {
        Ok(())
    } else {
        Err(missing(id))
    }
}

fn conversation_json(store: &Store, id: i64) -> Result<Value, ApiError> {
    let c = store
        .conversation(id)
        .map_err(store_err)?
        .ok_or_else(|| missing(id))?;
    serde_json::to_value(c).map_err(|e| ApiError::internal(e.to_string()))
}

async fn list(State(s): State<AppState>) -> Reply {
    let mut all = with_store(&s, |st| st.conversations().map_err(store_err)).await?;
    all.sort_by(|a, b| b.updated_ms.cmp(&a.updated_ms).then(b.id.cmp(&a.id)));
    Ok(Json(json!({"object": "list", "data": all})))
}

async fn one(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    let id = parse_id(&id)?;
    Ok(Json(
        with_store(&s, move |st| conversation_json(st, id)).await?,
    ))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Edit {
    title: Option<String>,
    settings: Option<Map<String, Value>>,
}

/// Parses a JSON body into `T`, with a 400 naming the problem.
fn body_of<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, DialectError> {
    serde_json::from_slice(body).map_err(|e| err(ApiError::invalid(format!("bad body: {e}"))))
}

/// A message's place in a route (`…/conversations/{id}/messages/{message_id}…`),
/// both ids parsed, a 400 in our shape when one is not an id.
struct MessageAt {
    id: i64,
    message_id: i64,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for MessageAt {
    type Rejection = DialectError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let Path((id, message_id)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e| err(ApiError::invalid(e.body_text())))?;
        Ok(MessageAt {
            id: parse_id(&id)?,
            message_id: parse_id(&message_id)?,
        })
    }
}

/// One stored message as the API returns it.
fn message_json(st: &Store, message_id: i64) -> Result<Value, ApiError> {
    let stored = st.message(message_id).map_err(store_err)?;
    serde_json::to_value(stored).map_err(|e| ApiError::internal(e.to_string()))
}

/// A 404 for a message that is not (or not of that role) in conversation `id`.
fn no_message(what: &str, message_id: i64, id: i64) -> ApiError {
    ApiError::not_found(format!("no {what} {message_id} in conversation {id}"))
}

/// Parses an optional JSON body into `T`, with a 400 naming the problem.
fn parse<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, DialectError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    body_of(body)
}

async fn create(State(s): State<AppState>, body: axum::body::Bytes) -> Reply {
    let edit: Edit = parse(&body)?;
    let title = edit.title.unwrap_or_else(|| "New chat".into());
    let settings = Value::Object(edit.settings.unwrap_or_default());
    let v = with_store(&s, move |st| {
        let id = st
            .create_conversation_with(&title, &settings)
            .map_err(store_err)?;
        conversation_json(st, id)
    })
    .await?;
    Ok(Json(v))
}

async fn update(
    State(s): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Reply {
    let id = parse_id(&id)?;
    let edit: Edit = parse(&body)?;
    let v = with_store(&s, move |st| {
        let settings = edit.settings.map(Value::Object);
        if !st
            .update_conversation(id, edit.title.as_deref(), settings.as_ref())
            .map_err(store_err)?
        {
            return Err(missing(id));
        }
        conversation_json(st, id)
    })
    .await?;
    Ok(Json(v))
}

async fn remove(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    let id = parse_id(&id)?;
    let gone = with_store(&s, move |st| st.delete_conversation(id).map_err(store_err)).await?;
    if !gone {
        return Err(err(missing(id)));
    }
    Ok(Json(json!({"id": id, "deleted": true})))
}

async fn truncate(State(s): State<AppState>, at: MessageAt) -> Reply {
    let MessageAt { id, message_id } = at;
    let n = with_store(&s, move |st| {
        require(st, id)?;
        let n = st.truncate_from(id, message_id).map_err(store_err)?;
        if n == 0 {
            return Err(no_message("message", message_id, id));
        }
        Ok(n)
    })
    .await?;
    Ok(Json(json!({"deleted": n})))
}

/// A message's body. `POST …/messages` names its `role`; `POST …/messages/{message_id}/pieces`
/// adds a step or version to a stored reply instead, so it names the `version` and `step`
/// it adds and no role (a reply's steps are the reply's).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NewMessage {
    role: Option<String>,
    content: String,
    reasoning: Option<String>,
    response_id: Option<String>,
    error: Option<String>,
    #[serde(default)]
    metadata: Metadata,
    version: Option<u32>,
    step: Option<u32>,
}

async fn add_message(
    State(s): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Reply {
    let id = parse_id(&id)?;
    let mut m: NewMessage = body_of(&body)?;
    if m.version.is_some() || m.step.is_some() {
        return Err(err(ApiError::invalid(
            "a new message has no version or step: those add to a stored reply, at …/messages/{message_id}/pieces",
        )));
    }
    let role = m.role.take().unwrap_or_default();
    let (piece, target, model) = match role.as_str() {
        "user" => {
            if m.response_id.is_some() || m.reasoning.is_some() || m.error.is_some() {
                return Err(err(ApiError::invalid(
                    "a user message has only content and metadata",
                )));
            }
            let piece = Piece {
                kind: PieceKind::Text,
                text: m.content,
                tool_calls: Vec::new(),
                metadata: client_keys(&m.metadata),
                ..Piece::default()
            };
            (piece, None, None)
        }
        "assistant" => assistant_piece(&s, m).await,
        other => {
            return Err(err(ApiError::param(
                "role",
                format!("role must be \"user\" or \"assistant\", not {other:?}"),
            )))
        }
    };
    let access = s.access.clone();
    let v = with_store(&s, move |st| {
        require(st, id)?;
        check_images(st, id, &piece.metadata, &access)?;
        let mid = st
            .add_message(id, &role, target.as_deref(), model.as_deref(), &[piece])
            .map_err(store_err)?;
        message_json(st, mid)
    })
    .await?;
    Ok(Json(v))
}

/// A reply's piece as this server recorded it: the ledger's usage and finish
/// for its response id, the client's own keys beside them; with the dialect it
/// was served in and the model, for the message row.
async fn assistant_piece(s: &AppState, m: NewMessage) -> (Piece, Option<String>, Option<String>) {
    let entry = match &m.response_id {
        Some(rid) => s.ledger.wait_for(rid, LEDGER_HANG_GUARD).await,
        None => None,
    };
    let mut metadata = match &entry {
        Some(e) => merge(&client_keys(&m.metadata), &provider_meta(e)),
        None => client_keys(&m.metadata),
    };
    if let Some(e) = &entry {
        metadata.insert("response_id".into(), json!(e.id));
        if let Some(f) = e.finish() {
            metadata.insert("engine_finish_reason".into(), json!(f.as_str()));
        }
        let t = e.timings();
        metadata.insert("ttft_ms".into(), json!(t.ttft_ms));
        metadata.insert("decode_tokens_per_s".into(), json!(t.decode_tokens_per_s));
        if t.draft_tokens > 0 {
            metadata.insert("draft_tokens".into(), json!(t.draft_tokens));
            metadata.insert("draft_accepted".into(), json!(t.draft_accepted));
        }
        // Of the cached prompt tokens, those read back from disk.
        let disk = e.usage().cached_disk_tokens;
        if disk > 0 {
            metadata.insert("cached_disk_tokens".into(), json!(disk));
        }
        // Of the prompt tokens, those its images took.
        let image = e.usage().image_tokens;
        if image > 0 {
            metadata.insert("image_tokens".into(), json!(image));
        }
    }
    if let Some(r) = m.reasoning.filter(|r| !r.is_empty()) {
        metadata.insert("reasoning_content".into(), json!(r));
    }
    let kind = if let Some(e) = m.error.filter(|e| !e.is_empty()) {
        metadata.insert("error".into(), json!(e));
        PieceKind::Error
    } else {
        PieceKind::Text
    };
    let piece = Piece {
        kind,
        text: m.content,
        tool_calls: Vec::new(),
        metadata,
        ..Piece::default()
    };
    let target = entry.as_ref().map(|e| e.dialect.ledger_name().to_string());
    let model = entry.map(|e| e.model);
    (piece, target, model)
}

/// The next step of a continued reply, or the first step of a new version of a
/// regenerated one: `POST …/messages/{message_id}/pieces` with a reply's body and
/// the `version` and `step` it adds.
async fn add_piece(State(s): State<AppState>, at: MessageAt, body: axum::body::Bytes) -> Reply {
    let MessageAt { id, message_id } = at;
    let m: NewMessage = body_of(&body)?;
    let (Some(version), Some(step), None) = (m.version, m.step, &m.role) else {
        return Err(err(ApiError::invalid(
            "a reply's step names its version and step, and no role (it is the reply's)",
        )));
    };
    // The message must be a reply of this conversation before the ledger is asked.
    with_store(&s, move |st| {
        require(st, id)?;
        match st.role_of(id, message_id).map_err(store_err)?.as_deref() {
            Some("assistant") => Ok(()),
            _ => Err(no_message("reply", message_id, id)),
        }
    })
    .await?;
    let (mut piece, _, _) = assistant_piece(&s, m).await;
    piece.version = version;
    piece.step = step;
    let access = s.access.clone();
    let v = with_store(&s, move |st| {
        check_images(st, id, &piece.metadata, &access)?;
        if !st.add_piece(id, message_id, &piece).map_err(store_err)? {
            return Err(no_message("reply", message_id, id));
        }
        message_json(st, message_id)
    })
    .await?;
    Ok(Json(v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextEdit {
    content: String,
}

/// `PATCH …/messages/{message_id}` `{"content": …}`: a user message edited
/// before it is sent again; the reply after it keeps what each of its versions
/// answered.
async fn edit_message(State(s): State<AppState>, at: MessageAt, body: axum::body::Bytes) -> Reply {
    let MessageAt { id, message_id } = at;
    let e: TextEdit = body_of(&body)?;
    let v = with_store(&s, move |st| {
        require(st, id)?;
        if !st
            .edit_text(id, message_id, &e.content)
            .map_err(store_err)?
        {
            return Err(no_message("user message", message_id, id));
        }
        message_json(st, message_id)
    })
    .await?;
    Ok(Json(v))
}

/// The images a stored piece carries (`images` in its metadata, where the
/// chat window keeps what it sent: `{media_type, data, name}` objects), held
/// to what a request may send (each a real picture within the image limits,
/// no more of them than one request takes) and to what one conversation may
/// keep (`server.max_chat_images_mb`), so the store cannot be grown without
/// bound through a chat.
fn check_images(st: &Store, id: i64, meta: &Metadata, access: &Access) -> Result<(), ApiError> {
    let Some(list) = meta.get("images") else {
        return Ok(());
    };
    let shape =
        "metadata.images: a list of {\"media_type\": \"image/…\", \"data\": base64} objects";
    let list = list
        .as_array()
        .ok_or_else(|| ApiError::param("metadata.images", shape))?;
    let limits = access.images;
    if list.len() > limits.max_images {
        return Err(ImageError::TooMany {
            n: list.len(),
            max: limits.max_images,
        }
        .into());
    }
    let mut adding = 0;
    for (i, image) in list.iter().enumerate() {
        let at = format!("metadata.images[{i}]");
        let media = image.get("media_type").and_then(Value::as_str);
        let (Some(data), Some(true)) = (
            image.get("data").and_then(Value::as_str),
            media.map(|m| m.starts_with("image/")),
        ) else {
            return Err(ApiError::param(&at, format!("{at}: {shape}")));
        };
        let bytes = crate::images::base64_bytes(&at, data)?;
        vision::decode(&at, &bytes, &limits)?;
        adding += bytes.len();
    }
    let held = st
        .conversation(id)
        .map_err(store_err)?
        .map_or(0, |c| images_held(&c));
    if held + adding > access.max_chat_image_bytes {
        return Err(ApiError::new(
            ErrorKind::TooLarge,
            format!(
                "this chat keeps {held} bytes of images already; {adding} more would pass its bound of {} (server.max_chat_images_mb)",
                access.max_chat_image_bytes
            ),
        )
        .with_param("metadata.images"));
    }
    Ok(())
}

/// Bytes of the images a conversation keeps, as decoded from their base64.
fn images_held(c: &shoal_store::Conversation) -> usize {
    c.messages
        .iter()
        .flat_map(|m| &m.pieces)
        .filter_map(|p| p.metadata.get("images")?.as_array())
        .flatten()
        .filter_map(|i| i.get("data")?.as_str())
        .map(|d| d.len() / 4 * 3)
        .sum()
}

/// The client's own metadata: everything but reserved and server keys.
fn client_keys(m: &Metadata) -> Metadata {
    m.iter()
        .filter(|(k, _)| !is_reserved(k) && !SERVER_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// What the ledger says about a request's first choice, under the reserved
/// keys of the dialect it was served in.
fn provider_meta(e: &LedgerEntry) -> ProviderMeta {
    crate::wire::provider_meta(e.dialect, e.finish(), &e.usage())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_client::Dialect as WireDialect;
    use shoal_engine::{Completion, FinishReason, Usage};

    /// The server's dialect a recorder client's dialect talks to.
    fn server(d: WireDialect) -> crate::dialect::Dialect {
        crate::dialects::registry()
            .parse(d.ledger_name())
            .expect("every client dialect is served")
    }

    fn entry(dialect: WireDialect, finishes: Vec<FinishReason>, usage: Usage) -> LedgerEntry {
        LedgerEntry {
            id: "r1".into(),
            dialect: server(dialect),
            model: "m".into(),
            created: 0,
            stream: true,
            per_prompt: 1,
            completions: finishes
                .into_iter()
                .map(|finish| Completion {
                    finish,
                    usage,
                    timings: Default::default(),
                })
                .collect(),
            facts: Default::default(),
            backend: "mlx".into(),
            status: 200,
            error: None,
        }
    }

    fn usage(prompt: usize, cached: usize, completion: usize, reasoning: usize) -> Usage {
        Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            reasoning_tokens: reasoning,
            ..Usage::default()
        }
    }

    #[test]
    fn ledger_usage_maps_to_reserved_keys_per_dialect() {
        let stop = || FinishReason::StopSequence("END".into());
        let chat = provider_meta(&entry(WireDialect::Chat, vec![stop()], usage(10, 6, 4, 0)));
        assert_eq!(chat.finish_reason.as_deref(), Some("stop"));
        assert_eq!(chat.stop_sequence.as_deref(), Some("END"));
        assert_eq!(
            (
                chat.token_usage_prompt_tokens,
                chat.token_usage_cached_tokens,
                chat.token_usage_total_tokens
            ),
            (Some(10), Some(6), Some(14))
        );
        let resp = provider_meta(&entry(
            WireDialect::Responses,
            vec![FinishReason::Length],
            usage(3, 0, 2, 0),
        ));
        assert_eq!(resp.status.as_deref(), Some("incomplete"));
        assert_eq!(resp.incomplete_reason.as_deref(), Some("max_output_tokens"));
        assert_eq!(resp.token_usage_completion_tokens, Some(2));
        let msg = provider_meta(&entry(
            WireDialect::Messages,
            vec![stop()],
            usage(8, 5, 2, 0),
        ));
        assert_eq!(msg.stop_reason.as_deref(), Some("stop_sequence"));
        assert_eq!(msg.token_usage_prompt_tokens, Some(8));
        assert_eq!(msg.token_usage_input_tokens, Some(3));
        let gone = provider_meta(&entry(
            WireDialect::Responses,
            vec![FinishReason::Cancelled],
            usage(3, 0, 1, 0),
        ));
        assert_eq!(gone.status.as_deref(), Some("cancelled"));
        assert_eq!(gone.incomplete_reason, None);
    }

    /// The reserved keys taken from the typed record are exactly what a
    /// recorder client reading the reply off the wire would store: the
    /// dialect's finish words and its usage object read by the client's own
    /// reader.
    #[test]
    fn reserved_keys_from_the_record_equal_what_a_client_reads_off_the_wire() {
        let finishes = [
            FinishReason::Stop,
            FinishReason::StopSequence("END".into()),
            FinishReason::Length,
            FinishReason::ContextWindow,
            FinishReason::ToolCalls,
            FinishReason::ContentFilter,
            FinishReason::Cancelled,
        ];
        let usages = [usage(10, 6, 4, 2), usage(7, 0, 0, 0), usage(3, 3, 9, 0)];
        for d in WireDialect::ALL {
            for f in &finishes {
                for u in &usages {
                    let e = entry(d, vec![f.clone()], *u);
                    let typed = provider_meta(&e);
                    let mut wire = ProviderMeta::default();
                    d.read_usage(&crate::wire::usage_json(server(d), u), &mut wire);
                    // The finish as the response body carries it; a client
                    // that left hears none, and the ledger says "cancelled".
                    let gone = *f == FinishReason::Cancelled;
                    let word = |w: &str| Some(if gone { "cancelled" } else { w }.to_string());
                    match d {
                        WireDialect::Chat | WireDialect::Completions => {
                            wire.finish_reason =
                                word(crate::dialects::openai_words::finish_reason(f))
                        }
                        WireDialect::Messages => {
                            wire.stop_reason = word(crate::dialects::anthropic::stop_reason(f))
                        }
                        WireDialect::Ollama => {
                            wire.finish_reason =
                                word(crate::dialects::ollama::shared::done_reason(f))
                        }
                        WireDialect::Responses => {
                            let (status, incomplete, _) =
                                crate::dialects::openai_responses::words::status(f);
                            wire.status = word(status);
                            wire.incomplete_reason =
                                incomplete["reason"].as_str().map(str::to_string);
                        }
                    }
                    if let FinishReason::StopSequence(s) = f {
                        wire.stop_sequence = Some(s.clone());
                    }
                    assert_eq!(typed, wire, "{d:?} {f:?} {u:?}");
                }
            }
        }
    }

    #[test]
    fn client_metadata_cannot_carry_server_or_reserved_keys() {
        let mut m = Metadata::new();
        for k in [
            "finish_reason",
            "token_usage_prompt_tokens",
            "ttft_ms",
            "response_id",
        ] {
            m.insert(k.into(), json!(1));
        }
        m.insert("client_finish".into(), json!("cancelled"));
        let kept = client_keys(&m);
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(kept["client_finish"], "cancelled");
    }
}
