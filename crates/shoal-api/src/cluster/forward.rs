//! Passing a request on: a model this node does not hold goes to the peer
//! that holds it (or to a pipeline's first stage), and the answer streams
//! back unchanged; a peer that goes away mid-answer ends the stream with the
//! dialect's error.
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, Method};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorShape};
use crate::state::AppState;

use super::peer::peer_rows;
use super::placement::{NotSent, Upstream, FORWARDED_HEADER};
use super::shards;

/// Sends requests for a model this node does not have to a peer that has
/// it loaded, and streams the peer's answer back unchanged. If the peer
/// goes away mid-answer, the stream ends with the dialect's error event.
pub async fn forward(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let routed = crate::dialect::Routed::of(req.extensions());
    let shape = routed.error_shape();
    let errors = ErrorFrames {
        shape,
        event: routed.stream_error_event(),
    };
    let Some(cluster) = s.cluster() else {
        return next.run(req).await;
    };
    if req.method() != Method::POST
        || !routed.names_model
        || req.headers().contains_key(FORWARDED_HEADER)
    {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, s.access.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return crate::body::too_large(Some(s.access.max_body_bytes))
                .in_dialect(shape)
                .into_response()
        }
    };
    let model = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_string));
    // A model split over nodes from here goes to its first stage.
    if let Some(target) = model.as_deref().and_then(|m| shards::route(&s, m)) {
        return proxy(target, parts, bytes, errors)
            .await
            .unwrap_or_else(|n| n.answer);
    }
    // A model loaded here is served here; one loaded on a peer goes there
    // (no second copy in memory); otherwise this node loads it if it can.
    let target = model
        .as_deref()
        .filter(|m| s.pool.loaded_engine(m).is_none())
        .and_then(|m| {
            cluster.peers().into_iter().find(|p| {
                // Ollama's `ID:latest` names the peer's `ID` too.
                let bare = m.strip_suffix(":latest").unwrap_or(m);
                p.status == "online" && p.models.iter().any(|x| x.id == m || x.id == bare)
            })
        });
    let Some(peer) = target else {
        let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
        return next.run(req).await;
    };
    let Some(addr) = cluster.address_of(&peer.id) else {
        let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
        return next.run(req).await;
    };
    tracing::info!(model = model.as_deref().unwrap_or(""), peer = %peer.id, "forwarding");
    let watched = cluster.clone();
    let id = peer.id.clone();
    let target = Upstream {
        addr,
        what: format!("node {}", peer.id),
        signer: Some(cluster),
        ledger: Some(s.ledger.clone()),
        ran_on: None,
        watch: Box::new(move || {
            watched
                .address_of(&id)
                .is_none()
                .then(|| format!("node {id} became unreachable mid-answer"))
        }),
    };
    match proxy(target, parts.clone(), bytes.clone(), errors).await {
        Ok(answer) => answer,
        // The peer went away before it got the request (its heartbeat has not
        // lapsed yet): nothing ran there, so this node serves it, loading the
        // model if it can.
        Err(NotSent { error, .. }) => {
            tracing::warn!(peer = %peer.id, %error, "peer unreachable; serving here");
            let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            next.run(req).await
        }
    }
}

pub async fn proxy(
    target: Upstream,
    parts: axum::http::request::Parts,
    body: axum::body::Bytes,
    dialect: ErrorFrames,
) -> Result<Response, NotSent> {
    let Upstream {
        addr,
        what: peer,
        signer,
        ledger,
        ran_on,
        watch: check,
    } = target;
    let tracked = parts.extensions.get::<crate::ledger::Tracked>().cloned();
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str())
        .to_string();
    let mut req = match &signer {
        Some(cluster) => cluster.signed(reqwest::Method::POST, &addr, &path, body.to_vec()),
        None => reqwest::Client::new()
            .post(format!("http://{addr}{path}"))
            .body(body.to_vec()),
    }
    .header(FORWARDED_HEADER, "1");
    // Who received the request, for the ledger of the node that runs it.
    if let (Some(t), Some(_)) = (&tracked, &signer) {
        let f = t.facts();
        use crate::ledger::{CLIENT_HEADER, ORIGIN_HEADER, RECEIVED_BY_HEADER, TURN_HEADER};
        for (name, value) in [
            (RECEIVED_BY_HEADER, f.node),
            (CLIENT_HEADER, f.client),
            (ORIGIN_HEADER, f.origin),
            (TURN_HEADER, f.turn),
            ("user-agent", f.user_agent),
        ] {
            // Bytes, not ASCII text: a key's name or a turn id may be any
            // words (only control characters are left out).
            if let Some(v) = value.and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()) {
                req = req.header(name, v);
            }
        }
    }
    let own = crate::dialects::registry().request_headers();
    for name in ["content-type", "accept", "authorization"]
        .into_iter()
        .chain(own)
    {
        if let Some(v) = parts.headers.get(name).and_then(|v| v.to_str().ok()) {
            req = req.header(name, v);
        }
    }
    // Generations can take long: no overall timeout, but the peer's health
    // is watched while the answer streams.
    let resp = match req
        .timeout(std::time::Duration::from_secs(24 * 3600))
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            let answer =
                ApiError::unavailable(format!("{peer} holding the model did not answer: {e}"))
                    .in_dialect(dialect.shape)
                    .into_response();
            if e.is_connect() {
                return Err(NotSent { error: e, answer });
            }
            return Ok(answer);
        }
    };
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let framing = crate::sse::Framing::of_content_type(&content_type);
    let out_status = axum::http::StatusCode::from_u16(status.as_u16())
        .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
    let request_id = resp
        .headers()
        .get(crate::ledger::REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Once the answer has ended, the peer's record is copied here under its id.
    let copy = match (ledger, request_id.clone()) {
        (Some(ledger), Some(id)) if status.is_success() => {
            // A local stage's record gets this node's facts of the request.
            let facts = match (&signer, &tracked) {
                (None, Some(t)) => Some(crate::ledger::Facts {
                    ran_on: ran_on.clone(),
                    ..t.facts()
                }),
                _ => None,
            };
            if let Some(t) = &tracked {
                let _ = t.recorded.set(id.clone());
            }
            let (addr, signer) = (addr.clone(), signer.clone());
            // Readers of this id wait for the copy, not only for the answer.
            let pending = ledger.expect(&id);
            Some(move || {
                tokio::spawn(copy_from_peer(ledger, signer, addr, id, facts, pending));
            })
        }
        _ => None,
    };
    let with_id = |mut r: Response| {
        if let Some(v) = request_id
            .as_deref()
            .and_then(|id| axum::http::HeaderValue::from_str(id).ok())
        {
            r.headers_mut().insert(crate::ledger::REQUEST_ID_HEADER, v);
        }
        r
    };
    if framing.is_none() {
        // A whole JSON answer: passed on as one sized body, or an error if
        // the peer died before finishing it.
        return Ok(match resp.bytes().await {
            Ok(b) => {
                if let Some(copy) = copy {
                    copy();
                }
                with_id(
                    (
                        out_status,
                        [(axum::http::header::CONTENT_TYPE, content_type)],
                        b,
                    )
                        .into_response(),
                )
            }
            Err(e) => ApiError::unavailable(format!("{peer} failed mid-answer: {e}"))
                .in_dialect(dialect.shape)
                .into_response(),
        });
    }
    let (tx, rx) =
        tokio::sync::mpsc::unbounded_channel::<Result<axum::body::Bytes, std::io::Error>>();
    tokio::spawn(async move {
        use futures::StreamExt;
        // However the answer ends (done, client gone, peer failed), the
        // peer's record is copied: a cancelled request is billed too.
        struct CopyOnDrop<F: FnOnce()>(Option<F>);
        impl<F: FnOnce()> Drop for CopyOnDrop<F> {
            fn drop(&mut self) {
                if let Some(f) = self.0.take() {
                    f();
                }
            }
        }
        let _copy = CopyOnDrop(copy);
        let mut upstream = resp.bytes_stream();
        let mut watch = tokio::time::interval(std::time::Duration::from_millis(500));
        loop {
            tokio::select! {
                chunk = upstream.next() => match chunk {
                    Some(Ok(b)) => {
                        if tx.send(Ok(b)).is_err() {
                            return; // client gone: dropping the upstream cancels there
                        }
                    }
                    Some(Err(e)) => {
                        fail(&tx, framing, dialect, &format!("{peer} failed mid-answer: {e}"));
                        return;
                    }
                    None => return,
                },
                _ = watch.tick() => {
                    if let Some(reason) = check() {
                        fail(&tx, framing, dialect, &reason);
                        return;
                    }
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let mut out = Response::new(axum::body::Body::from_stream(stream));
    *out.status_mut() = out_status;
    if let Ok(v) = axum::http::HeaderValue::from_str(&content_type) {
        out.headers_mut()
            .insert(axum::http::header::CONTENT_TYPE, v);
    }
    Ok(with_id(out))
}

/// How a request's dialect words an error in a stream: the body's shape
/// and the frame's event name.
#[derive(Clone, Copy)]
pub struct ErrorFrames {
    pub shape: ErrorShape,
    pub event: Option<&'static str>,
}

/// Ends a forwarded answer with the dialect's error (an error frame in its
/// stream, or a cut body for plain JSON, which a client reports as a broken
/// response).
pub(crate) fn fail(
    tx: &tokio::sync::mpsc::UnboundedSender<Result<axum::body::Bytes, std::io::Error>>,
    framing: Option<crate::sse::Framing>,
    dialect: ErrorFrames,
    message: &str,
) {
    tracing::warn!("{message}");
    if let Some(framing) = framing {
        let err = ApiError::unavailable(message.to_string()).body(dialect.shape);
        let frame = framing.frame(dialect.event, &err.to_string());
        let _ = tx.send(Ok(frame.into()));
    } else {
        let _ = tx.send(Err(std::io::Error::other(message.to_string())));
    }
}

/// Copies the record of a request this node forwarded from the node that
/// ran it (signed, through `cluster`) or from a local pipeline stage
/// (`cluster` none), once its answer has ended, so both ledgers hold it
/// under one id; `facts`, when given, replace the copy's request facts.
/// `_pending` holds the id as expected until the copy is done or given up.
pub(crate) async fn copy_from_peer(
    ledger: Arc<crate::ledger::Ledger>,
    cluster: Option<Arc<shoal_cluster::Cluster>>,
    addr: String,
    id: String,
    facts: Option<crate::ledger::Facts>,
    _pending: crate::ledger::Pending,
) {
    // The peer writes its record when the generation has stopped, which for
    // a client that hung up is a moment after the answer ended here.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let ask = serde_json::json!({ "id": id });
        match peer_rows(cluster.as_deref(), &addr, &ask).await {
            Ok(mut rows) => {
                for row in &mut rows {
                    if let Some(f) = &facts {
                        row.client = f.client.clone();
                        row.user_agent = f.user_agent.clone();
                        row.origin = f.origin.clone();
                        row.node = f.node.clone();
                        row.ran_on = f.ran_on.clone();
                    }
                    ledger.record_row(row);
                }
                if !rows.is_empty() {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(%id, %addr, %error, "could not copy a forwarded request's record");
                return;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(%id, %addr, "the node that ran a forwarded request has no record of it");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
