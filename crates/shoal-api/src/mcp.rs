//! `/v1/mcp`: the MCP servers of `mcp.json`, their tools (each also as an
//! OpenAI function tool, ready for a request's `tools`), calls to them, and
//! the file itself. The chat window runs its tool loop over these routes
//! and asks the user before each call; an API client that calls
//! `/v1/mcp/call` is its own approver. Errors answer in OpenAI's shape, as
//! the other management routes do.
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_mcp::{McpError, McpFile};

use crate::body::OpenAiJson;
use crate::error::{ApiError, DialectError, ErrorKind, ErrorShape};
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/mcp/servers", get(servers))
        .route("/v1/mcp/tools", get(tools))
        .route("/v1/mcp/call", post(call))
        .route("/v1/mcp/config", get(config).put(set_config))
        .route(
            "/v1/mcp/always_allow",
            axum::routing::put(always_allow).delete(forget_always_allow),
        )
}

type Reply = Result<Json<Value>, DialectError>;

fn err(e: McpError) -> DialectError {
    let kind = match &e {
        McpError::UnknownServer(_) | McpError::UnknownTool { .. } => ErrorKind::NotFound,
        McpError::Disabled(_) | McpError::BadArguments | McpError::Config(_) => {
            ErrorKind::InvalidRequest
        }
        McpError::Timeout { .. } => ErrorKind::Timeout,
        McpError::Failed { .. } => ErrorKind::Upstream,
    };
    ApiError::new(kind, e.to_string())
        .with_code("mcp_error")
        .in_dialect(ErrorShape::OPENAI)
}

/// `GET /v1/mcp/servers`: each server, started if it was not, with its
/// state (`ready`, `failed` and why, `disabled`) and tool count.
async fn servers(State(s): State<AppState>) -> Json<Value> {
    let list = s.mcp.servers().await;
    Json(json!({
        "object": "list",
        "data": list,
        "path": s.mcp.path().map(|p| p.display().to_string()),
        "file_error": s.mcp.file_error(),
        "timeout_secs": s.mcp.limits().timeout.as_secs(),
        "max_result_chars": s.mcp.limits().max_result_chars,
    }))
}

/// `GET /v1/mcp/tools`: the enabled servers' tools, each with the function
/// tool a chat request offers the model.
async fn tools(State(s): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = s
        .mcp
        .tools()
        .await
        .into_iter()
        .map(|t| {
            let mut v = json!(t);
            v["tool"] = json!({"type": "function", "function": {
                "name": t.function,
                "description": t.description,
                "parameters": t.input_schema,
            }});
            v
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// A call: by server and tool, or by the function name the model used;
/// arguments as an object or as the JSON text a model's tool call carries.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    server: Option<String>,
    tool: Option<String>,
    function: Option<String>,
    #[serde(default)]
    arguments: Value,
}

/// Which tool a body names: `server` and `tool`, or the `function` name
/// the model calls it by.
fn named_tool(
    server: Option<String>,
    tool: Option<String>,
    function: Option<String>,
) -> Result<(String, String), DialectError> {
    let bad = |m: &str| ApiError::invalid(m).in_dialect(ErrorShape::OPENAI);
    match (server, tool, function) {
        (Some(server), Some(tool), None) => Ok((server, tool)),
        (None, None, Some(f)) => match f.split_once(shoal_mcp::hub::SEPARATOR) {
            Some((server, tool)) => Ok((server.to_string(), tool.to_string())),
            None => Err(bad("'function' is 'server__tool'")),
        },
        _ => Err(bad("give 'server' and 'tool', or 'function'")),
    }
}

/// An answer kept for good: run this tool without asking (`allow`), or ask again.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    server: Option<String>,
    tool: Option<String>,
    function: Option<String>,
    allow: bool,
}

/// `PUT /v1/mcp/always_allow`: the user's "Always allow" for one tool (or
/// its withdrawal), kept in the server's `alwaysAllow` list in `mcp.json`,
/// so every window of this server (and the file's other readers) sees it.
async fn always_allow(State(s): State<AppState>, OpenAiJson(a): OpenAiJson<Answer>) -> Reply {
    let (server, tool) = named_tool(a.server, a.tool, a.function)?;
    if tool.is_empty() {
        return Err(ApiError::param("tool", "'tool' is empty").in_dialect(ErrorShape::OPENAI));
    }
    s.mcp
        .always_allow(&server, &tool, a.allow)
        .await
        .map_err(err)?;
    tracing::info!(%server, %tool, allow = a.allow, "MCP tool answer kept");
    Ok(Json(
        json!({"server": server, "tool": tool, "always_allow": a.allow}),
    ))
}

/// `DELETE /v1/mcp/always_allow`: every kept answer forgotten; each tool asks again.
async fn forget_always_allow(State(s): State<AppState>) -> Reply {
    let n = s.mcp.forget_always_allow().await.map_err(err)?;
    Ok(Json(json!({"forgotten": n})))
}

/// `POST /v1/mcp/call`: runs the tool and answers with its text (cut to the
/// limit), whether the tool reported an error, and how long it took.
async fn call(State(s): State<AppState>, OpenAiJson(c): OpenAiJson<Call>) -> Reply {
    let bad = |m: &str| ApiError::invalid(m).in_dialect(ErrorShape::OPENAI);
    let (server, tool) = named_tool(c.server, c.tool, c.function)?;
    let arguments = match c.arguments {
        // A model's tool call carries its arguments as JSON text.
        Value::String(text) if text.trim().is_empty() => Value::Null,
        Value::String(text) => serde_json::from_str(&text)
            .map_err(|e| bad(&format!("'arguments' is not valid JSON: {e}")))?,
        v => v,
    };
    let out = s.mcp.call(&server, &tool, arguments).await.map_err(err)?;
    tracing::info!(
        server = %out.server,
        tool = %out.tool,
        took_ms = out.took_ms,
        is_error = out.is_error,
        truncated = out.truncated,
        "MCP tool called"
    );
    Ok(Json(json!(out)))
}

/// `GET /v1/mcp/config`: `mcp.json` as it stands.
async fn config(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.mcp.config()))
}

/// `PUT /v1/mcp/config`: replaces `mcp.json` (checked first; a bad file is
/// a 400 and changes nothing). Servers whose entry changed restart on next use.
async fn set_config(State(s): State<AppState>, OpenAiJson(file): OpenAiJson<McpFile>) -> Reply {
    s.mcp.set_config(file).await.map_err(err)?;
    Ok(Json(json!(s.mcp.config())))
}
