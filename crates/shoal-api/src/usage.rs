//! The usage ledger over HTTP: `/v1/usage` (one node's ledger or, with
//! `scope=cluster`, every online node's), `/v1/usage/keys`, the `track`
//! middleware that gives generation handlers their request's facts and
//! records what they could not, and the control route through which nodes
//! read each other's rows.
use axum::extract::{Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorShape};
use crate::ledger::{
    csv, grouped, grouped_csv, total_cost, Facts, LedgerEntry, Page, Tracked, UsageQuery,
    REQUEST_ID_HEADER,
};
use crate::ledger::{CLIENT_HEADER, MAX_TURN_LEN, ORIGIN_HEADER, RECEIVED_BY_HEADER, TURN_HEADER};

/// A bad `/v1/usage` parameter is a 400 naming it.
impl From<crate::ledger::QueryError> for ApiError {
    fn from(e: crate::ledger::QueryError) -> Self {
        ApiError::param(&e.param, e.message)
    }
}

/// Middleware around the generation endpoints: notes the request's facts
/// for the handler, then records what the handler could not — the status of
/// an error response after generation began, or a request refused before it
/// (bad body, unknown model, missing key, full queue …) as an error record.
/// A request another node forwarded here carries that node's facts (who
/// received it, the key's name, the origin), taken only when its cluster
/// signature checks out.
pub async fn track(State(s): State<crate::state::AppState>, req: Request, next: Next) -> Response {
    let Some(dialect) = crate::dialect::Routed::of(req.extensions()).generation else {
        return next.run(req).await;
    };
    let (mut req, forwarded) = match forwarded_facts(&s, req).await {
        Ok(pair) => pair,
        Err(resp) => return resp,
    };
    let tracked = tracked(&s, &req, forwarded);
    req.extensions_mut().insert(tracked.clone());
    let response = next.run(req).await;
    match tracked.recorded.get() {
        Some(id) => mark_recorded(&s, id, response),
        None if response.status().as_u16() < 400 => response,
        None => record_refusal(&s, dialect, &tracked, response).await,
    }
}

/// The request's facts as the handler gets them: the path, the client's
/// agent and origin, and which node received and which runs it.
fn tracked(s: &crate::state::AppState, req: &Request, forwarded: Option<Facts>) -> Tracked {
    let own = s.node.identity().id.clone();
    let endpoint = req.uri().path().to_string();
    let header = |name: &str| utf8_header(req.headers(), name);
    let user_agent = header(axum::http::header::USER_AGENT.as_str());
    let turn = header(TURN_HEADER).map(turn_id);
    let mut tracked = Tracked {
        facts: match forwarded {
            Some(f) => Facts {
                endpoint,
                user_agent: f.user_agent.or(user_agent),
                ran_on: Some(own),
                turn: f.turn.or(turn),
                ..f
            },
            None => Facts {
                endpoint,
                client: None,
                user_agent,
                origin: header(axum::http::header::ORIGIN.as_str()),
                node: Some(own),
                ran_on: None,
                turn,
            },
        },
        ..Tracked::default()
    };
    // The key's name lives in one place: set here for a forwarded request,
    // by the access check for one made here.
    if let Some(client) = tracked.facts.client.take() {
        let _ = tracked.client.set(client);
    }
    tracked
}

/// A header's value as UTF-8 text, not only ASCII: a client names its turn,
/// and a key its owner, in any words.
fn utf8_header(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .map(str::to_owned)
}

/// A client's turn id as the ledger keeps it: at most [`MAX_TURN_LEN`]
/// bytes, cut at a character boundary.
fn turn_id(mut t: String) -> String {
    if t.len() > MAX_TURN_LEN {
        let mut end = MAX_TURN_LEN;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
    }
    t
}

/// A request the handler recorded: an error status it ended with goes on
/// its row, and the response names the row.
fn mark_recorded(s: &crate::state::AppState, id: &str, mut response: Response) -> Response {
    let status = response.status().as_u16();
    if status != 200 {
        s.ledger.set_status(id, status);
    }
    if let Ok(v) = axum::http::HeaderValue::from_str(id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    response
}

/// A request refused before it generated: recorded as an error row with the
/// refusal's words, and the response names the row.
async fn record_refusal(
    s: &crate::state::AppState,
    dialect: crate::dialect::Dialect,
    tracked: &Tracked,
    response: Response,
) -> Response {
    let status = response.status().as_u16();
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    // The refusal as this server made it; a peer's passed on is read from
    // its body (the error's message in any dialect's shape).
    let message = match parts.extensions.get::<crate::error::Refusal>() {
        Some(r) => r.0.clone(),
        None => serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| {
                let m = v.pointer("/error/message").or_else(|| v.get("error"))?;
                m.as_str().map(str::to_owned)
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned()),
    };
    // A peer's refusal passed on keeps the peer's id.
    let id = parts
        .headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| crate::ids::new_id("err"), str::to_owned);
    let entry = LedgerEntry {
        id,
        dialect,
        model: String::new(),
        created: crate::ids::now_secs(),
        stream: false,
        per_prompt: 1,
        completions: Vec::new(),
        facts: tracked.facts(),
        backend: String::new(),
        status,
        error: Some(message),
    };
    s.ledger.record(&entry);
    if let Ok(v) = axum::http::HeaderValue::from_str(&entry.id) {
        parts.headers.insert(REQUEST_ID_HEADER, v);
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// The receiving node's facts on a request forwarded here, if its
/// signature checks out (the body is read for that and put back).
async fn forwarded_facts(
    s: &crate::state::AppState,
    req: Request,
) -> Result<(Request, Option<Facts>), Response> {
    if !req.headers().contains_key(crate::cluster::FORWARDED_HEADER) || s.cluster().is_none() {
        return Ok((req, None));
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, s.access.max_body_bytes).await else {
        return Err(crate::body::too_large(Some(s.access.max_body_bytes))
            .in_dialect(crate::dialect::Routed::of(&parts.extensions).error_shape())
            .into_response());
    };
    let verified = s
        .verify_peer(&parts.method, &parts.uri, &parts.headers, &bytes)
        .is_ok();
    let header = |name: &str| utf8_header(&parts.headers, name);
    let facts = verified.then(|| Facts {
        endpoint: String::new(),
        client: header(CLIENT_HEADER),
        user_agent: header(axum::http::header::USER_AGENT.as_str()),
        origin: header(ORIGIN_HEADER),
        node: header(RECEIVED_BY_HEADER),
        ran_on: None,
        turn: header(TURN_HEADER),
    });
    Ok((
        Request::from_parts(parts, axum::body::Body::from(bytes)),
        facts,
    ))
}

/// What a peer asks of this node's ledger: one request's row, or the rows a
/// `/v1/usage` query selects (for `scope=cluster`).
#[derive(serde::Deserialize)]
pub struct PeerUsage {
    pub id: Option<String>,
    #[serde(default)]
    pub query: Vec<(String, String)>,
}

/// `POST /v1/cluster/usage`: this node's rows for a peer (signed), or, on a
/// node in no cluster and open without a key (a pipeline's local stage),
/// for its parent node.
pub async fn peer_usage(State(s): State<crate::state::AppState>, req: Request) -> Response {
    let ask: PeerUsage = if s.cluster().is_some() || s.access.requires_key() {
        match <crate::cluster::Peer<PeerUsage> as axum::extract::FromRequest<_>>::from_request(
            req, &s,
        )
        .await
        {
            Ok(crate::cluster::Peer(ask)) => ask,
            Err(e) => return e.into_response(),
        }
    } else {
        let bytes = axum::body::to_bytes(req.into_body(), s.access.max_body_bytes)
            .await
            .unwrap_or_default();
        match serde_json::from_slice(&bytes) {
            Ok(ask) => ask,
            Err(e) => {
                return ApiError::invalid(e.to_string())
                    .in_dialect(ErrorShape::OPENAI)
                    .into_response()
            }
        }
    };
    let rows = match &ask.id {
        Some(id) => s
            .ledger
            .log()
            .get(id)
            .map(|r| r.into_iter().collect())
            .map_err(|e| ApiError::internal(format!("the usage ledger could not be read: {e}"))),
        None => UsageQuery::parse(
            ask.query.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            s.ledger.dialects(),
        )
        .map_err(ApiError::from)
        .and_then(|q| s.ledger.rows(&q).map(|(rows, _)| rows)),
    };
    match rows {
        Ok(rows) => axum::Json(json!({ "data": rows })).into_response(),
        Err(e) => e.in_dialect(ErrorShape::OPENAI).into_response(),
    }
}

/// `/v1/usage/{id}`: one request's entry, as `/v1/usage` lists it. A
/// request still generating is waited for (a stream the client left is
/// recorded once the engine has stopped it); an id the ledger neither holds
/// nor expects is a 404 at once.
pub async fn entry(
    State(s): State<crate::state::AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    const HANG_GUARD: std::time::Duration = std::time::Duration::from_secs(120);
    match s.ledger.wait_for(&id, HANG_GUARD).await {
        Some(e) => axum::Json(e.to_json_priced(&s.prices)).into_response(),
        None => ApiError::not_found(format!("the usage ledger has no request '{id}'"))
            .in_dialect(ErrorShape::OPENAI)
            .into_response(),
    }
}

/// `/v1/usage`: the ledger's entries newest first (`limit`, default 100;
/// `cursor` continues a listing), filtered by `model`, `dialect`, `finish`,
/// `client`, `node`, `since` and `until`; summed with `group_by`; or
/// exported with `format=csv` (every entry the filter selects unless
/// `limit` is given). Bad parameters get a 400. With `[prices.MODEL]` set,
/// entries and sums carry a `cost` (a group answer also its total) and the
/// answer names the `unpriced_models` whose rows add nothing to it.
pub async fn handle(
    State(s): State<crate::state::AppState>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Response {
    let answer = async {
        let mut q = UsageQuery::parse(
            pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            s.ledger.dialects(),
        )?;
        if q.filter.limit.is_none() && !q.csv {
            q.filter.limit = Some(100);
        }
        let (page, missing) = if q.cluster {
            cluster_page(&s, &q, &pairs).await?
        } else {
            (s.ledger.query(&q)?, Vec::new())
        };
        let prices = &*s.prices;
        if let Some(by) = q.group_by {
            let entries = page.entries();
            let data = grouped(&entries, by, prices);
            if q.csv {
                return Ok::<_, ApiError>(
                    (
                        [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
                        grouped_csv(&data, !prices.is_empty()),
                    )
                        .into_response(),
                );
            }
            let mut body = json!({"object": "list", "data": data, "missing_nodes": missing});
            if !prices.is_empty() {
                // The sums' total cost, and the models it leaves out.
                let (cost, unpriced) = total_cost(&entries, prices);
                body["cost"] = cost.to_json();
                body["unpriced_models"] = json!(unpriced);
            }
            return Ok(axum::Json(body).into_response());
        }
        if q.csv {
            return Ok((
                [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
                csv(&page.entries()),
            )
                .into_response());
        }
        let data: Vec<Value> = page
            .entries
            .iter()
            .map(|(seq, e)| {
                let mut v = e.to_json_priced(prices);
                // A cursor pages one node's ledger.
                if !q.cluster {
                    v["cursor"] = json!(seq);
                }
                v
            })
            .collect();
        let mut body = json!({
            "object": "list",
            "data": data,
            "has_more": page.has_more,
            "next_cursor": if q.cluster { None } else { page.next_cursor() },
            "missing_nodes": missing,
        });
        if !prices.is_empty() {
            // A page has no total: each entry carries its own cost.
            body["unpriced_models"] = json!(total_cost(&page.entries(), prices).1);
        }
        Ok(axum::Json(body).into_response())
    };
    answer
        .await
        .unwrap_or_else(|e| e.in_dialect(ErrorShape::OPENAI).into_response())
}

/// Every online node's rows for `q`, merged newest first; a request that
/// two nodes hold (received by one, run by the other) counts once. Returns
/// the page and the nodes that could not be asked.
async fn cluster_page(
    s: &crate::state::AppState,
    q: &UsageQuery,
    pairs: &[(String, String)],
) -> Result<(Page, Vec<String>), ApiError> {
    if q.filter.before.is_some() {
        return Err(ApiError::param(
            "cursor",
            "a cursor pages one node's ledger; it does not go with scope=cluster",
        ));
    }
    let (mut rows, mut has_more) = s.ledger.rows(q)?;
    let mut missing = Vec::new();
    if let Some(cluster) = s.cluster() {
        let ask: Vec<(String, String)> = pairs
            .iter()
            .filter(|(k, _)| k != "scope" && k != "format")
            .cloned()
            .collect();
        let ask = json!({ "query": ask });
        let peers: Vec<_> = cluster
            .peers()
            .into_iter()
            .filter(|p| p.status == "online")
            .collect();
        let asks = peers.iter().map(|p| {
            let (cluster, ask) = (&cluster, &ask);
            async move {
                let addr = cluster.address_of(&p.id)?;
                crate::cluster::peer_rows(Some(cluster), &addr, ask)
                    .await
                    .ok()
            }
        });
        for (peer, got) in peers.iter().zip(futures::future::join_all(asks).await) {
            match got {
                Some(r) => rows.extend(r),
                None => missing.push(peer.id.clone()),
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    rows.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.seq.cmp(&a.seq)));
    rows.retain(|r| seen.insert(r.id.clone()));
    if let Some(n) = q.filter.limit.filter(|_| q.group_by.is_none()) {
        has_more |= rows.len() > n;
        rows.truncate(n);
    }
    Ok((Page::of(rows, has_more, s.ledger.dialects()), missing))
}

/// `/v1/usage/keys`: each API key's use against its limits (names only).
pub async fn keys(State(s): State<crate::state::AppState>) -> Response {
    let listed: Result<Vec<Value>, ApiError> = s
        .access
        .keys()
        .iter()
        .map(|k| {
            let (used, _) = s.ledger.tokens_today(&k.name)?;
            Ok(json!({
                "name": k.name,
                "tokens_today": used,
                "tokens_per_day": k.tokens_per_day,
                "requests_last_minute": s.limits.last_minute(&k.name),
                "requests_per_minute": k.requests_per_minute,
            }))
        })
        .collect();
    match listed {
        Ok(data) => axum::Json(json!({"object": "list", "data": data})).into_response(),
        Err(e) => e.in_dialect(ErrorShape::OPENAI).into_response(),
    }
}
