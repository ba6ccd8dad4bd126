//! The connections to the configured MCP servers: started (or reached) on
//! first use, their tools listed once per connection, and each call bounded
//! by a timeout and a result size.
//!
//! A server that fails to start, hangs past the timeout or dies is dropped
//! (a stdio child is killed with it) and its error kept for the server
//! list; the next use starts it again. Nothing here decides whether a call
//! may run: approval is the caller's (the chat asks the user; an API
//! caller is its own approver).
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Mutex;

use crate::config::{ConfigError, McpFile, ServerSpec, Transport};

/// Separates a server's name from its tool's in the name the model sees.
pub const SEPARATOR: &str = "__";

/// How long a call and a start may take, and how much of a result reaches
/// the model.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// One call's limit.
    pub timeout: Duration,
    /// Starting (or reaching) a server and listing its tools: `npx` may
    /// fetch a package first, so this is longer than a call's.
    pub start_timeout: Duration,
    /// Characters of a result's text kept; the rest is cut, and the cut said.
    pub max_result_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(120),
            max_result_chars: 16_000,
        }
    }
}

/// A tool one of the servers offers.
#[derive(Clone, Debug, Serialize)]
pub struct ToolInfo {
    pub server: String,
    pub name: String,
    /// The function name the model calls it by: `server__name`.
    pub function: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
    /// The server says the tool changes nothing (`readOnlyHint`): a hint a
    /// user may choose to trust for automatic approval, never a guarantee.
    pub read_only: bool,
    /// The user allowed it for good (the server's `alwaysAllow`).
    pub always_allow: bool,
}

/// The servers at a glance, as the tray shows them: read without starting
/// any server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Servers in the file, off ones included.
    pub servers: usize,
    /// Turned off in the file (`disabled`).
    pub disabled: usize,
    /// Started and connected (or busy starting or calling).
    pub running: usize,
    /// Whose last start failed.
    pub failed: usize,
    /// The file read at start is broken and not in use.
    pub file_error: bool,
}

/// A server as the list shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ServerStatus {
    pub name: String,
    pub transport: Transport,
    /// `ready`, `failed` or `disabled`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub tools: usize,
}

/// What a call gave, as the model will read it.
#[derive(Clone, Debug, Serialize)]
pub struct CallOutcome {
    pub server: String,
    pub tool: String,
    /// The result's text (text blocks as they are; other blocks described),
    /// cut to the limit.
    pub content: String,
    /// The tool itself reported an error (`isError`): the model still
    /// reads it, as MCP intends.
    pub is_error: bool,
    pub truncated: bool,
    /// The text's length before any cut, in characters.
    pub chars: usize,
    pub took_ms: u64,
}

/// Why a call or a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("no MCP server is named '{0}'")]
    UnknownServer(String),
    #[error("MCP server '{0}' is disabled")]
    Disabled(String),
    #[error("MCP server '{server}' has no tool '{tool}'")]
    UnknownTool { server: String, tool: String },
    #[error("MCP server '{server}' did not answer within {secs} s; it was stopped and starts again on next use")]
    Timeout { server: String, secs: u64 },
    #[error("MCP server '{server}' failed: {why}")]
    Failed { server: String, why: String },
    #[error("'arguments' must be a JSON object")]
    BadArguments,
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A live connection and what it offered.
struct Live {
    service: RunningService<RoleClient, ClientConfig>,
    tools: Vec<ToolInfo>,
    /// The child's last stderr lines, to explain a death.
    stderr: Arc<SyncMutex<VecDeque<String>>>,
    /// A stdio server's process, killed (with its process group) when the
    /// connection goes.
    _process: Option<crate::spawn::ServerProcess>,
}

/// One server's connection, behind its own lock: `None` until started, and
/// again after a failure.
type Slot = Arc<Mutex<Option<Arc<Live>>>>;

/// The servers of one `mcp.json`.
pub struct McpHub {
    /// Where the servers are kept (`None`: in memory only, for tests and
    /// for a server started without a config directory).
    path: Option<PathBuf>,
    limits: Limits,
    file: SyncMutex<McpFile>,
    file_error: SyncMutex<Option<String>>,
    /// One lock per server name, so one slow server never holds up another.
    conns: SyncMutex<BTreeMap<String, Slot>>,
    /// Edits of the file that read it first (the answers), one at a time,
    /// so two answers given at once both stay.
    edits: Mutex<()>,
    /// Servers whose last start failed (for [`Self::summary`]).
    failed: SyncMutex<std::collections::BTreeSet<String>>,
}

const STDERR_LINES: usize = 20;

impl McpHub {
    /// The hub of the servers in `path`, read now. A missing file is no
    /// servers; a broken one is no servers too, its error logged and kept
    /// for [`Self::file_error`], so a bad edit never stops the server (or
    /// the desktop app) from starting, and saving a good file mends it.
    pub fn open(path: Option<PathBuf>, limits: Limits) -> Self {
        let (file, error) = match path.as_deref().map(McpFile::load) {
            None => (McpFile::default(), None),
            Some(Ok(f)) => (f, None),
            Some(Err(e)) => {
                tracing::error!(error = %e, "MCP servers: the file is not used");
                (McpFile::default(), Some(e.to_string()))
            }
        };
        let hub = Self::with_file(path, file, limits);
        *lock(&hub.file_error) = error;
        hub
    }

    fn with_file(path: Option<PathBuf>, file: McpFile, limits: Limits) -> Self {
        McpHub {
            path,
            limits,
            file: SyncMutex::new(file),
            file_error: SyncMutex::new(None),
            conns: SyncMutex::new(BTreeMap::new()),
            edits: Mutex::new(()),
            failed: SyncMutex::new(Default::default()),
        }
    }

    /// Why the file read at start is not in use, until a good one is saved.
    pub fn file_error(&self) -> Option<String> {
        lock(&self.file_error).clone()
    }

    /// A hub with no servers and no file.
    pub fn empty() -> Self {
        Self::with_file(None, McpFile::default(), Limits::default())
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Where the file lives, if anywhere.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// The configuration as it stands.
    pub fn config(&self) -> McpFile {
        lock(&self.file).clone()
    }

    /// Replaces the configuration (checked, then saved): servers whose
    /// entry changed or went are stopped; the rest keep running.
    pub async fn set_config(&self, new: McpFile) -> Result<(), McpError> {
        new.check()?;
        if let Some(p) = &self.path {
            new.save(p)?;
        }
        let old = std::mem::replace(&mut *lock(&self.file), new.clone());
        *lock(&self.file_error) = None;
        let (names, stale): (Vec<String>, Vec<_>) = {
            let mut conns = lock(&self.conns);
            let names: Vec<String> = conns
                .keys()
                .filter(|n| match (old.servers.get(*n), new.servers.get(*n)) {
                    (Some(a), Some(b)) => !a.same_server(b),
                    _ => true,
                })
                .cloned()
                .collect();
            let stale = names.iter().filter_map(|n| conns.remove(n)).collect();
            (names, stale)
        };
        // A changed entry has not failed yet (the lock taken apart from
        // `conns`, as `summary` takes them in the other order).
        {
            let mut failed = lock(&self.failed);
            for n in &names {
                failed.remove(n);
            }
        }
        for slot in stale {
            if let Some(live) = slot.lock().await.take() {
                stop(live);
            }
        }
        Ok(())
    }

    /// Puts `tool` of `server` on the server's `alwaysAllow` list (`allow`)
    /// or takes it off, and saves the file; the server keeps running.
    pub async fn always_allow(
        &self,
        server: &str,
        tool: &str,
        allow: bool,
    ) -> Result<(), McpError> {
        let _one_edit = self.edits.lock().await;
        let mut file = self.config();
        let spec = file
            .servers
            .get_mut(server)
            .ok_or_else(|| McpError::UnknownServer(server.to_string()))?;
        spec.always_allow.retain(|t| t != tool);
        if allow {
            spec.always_allow.push(tool.to_string());
            spec.always_allow.sort();
        }
        self.set_config(file).await
    }

    /// Empties every server's `alwaysAllow` list: each tool asks again.
    /// Returns how many answers were forgotten.
    pub async fn forget_always_allow(&self) -> Result<usize, McpError> {
        let _one_edit = self.edits.lock().await;
        let mut file = self.config();
        let n = file
            .servers
            .values_mut()
            .map(|s| std::mem::take(&mut s.always_allow).len())
            .sum();
        if n > 0 {
            self.set_config(file).await?;
        }
        Ok(n)
    }

    /// The servers at a glance, without starting any.
    pub fn summary(&self) -> Summary {
        let file = self.config();
        let failed = lock(&self.failed);
        let conns = lock(&self.conns);
        let enabled = || file.servers.iter().filter(|(_, s)| !s.disabled);
        let running = enabled()
            .filter(|(name, _)| {
                conns.get(*name).is_some_and(|slot| match slot.try_lock() {
                    Ok(live) => live.as_ref().is_some_and(|l| !l.service.is_closed()),
                    // Busy: starting, or answering a call.
                    Err(_) => !failed.contains(*name),
                })
            })
            .count();
        Summary {
            servers: file.servers.len(),
            disabled: file.servers.len() - enabled().count(),
            running,
            failed: enabled().filter(|(name, _)| failed.contains(*name)).count(),
            file_error: self.file_error().is_some(),
        }
    }

    /// Every configured server, started if it is not yet.
    pub async fn servers(&self) -> Vec<ServerStatus> {
        let specs = self.config().servers;
        let mut out = Vec::with_capacity(specs.len());
        for (name, spec) in specs {
            let (state, error, tools) = if spec.disabled {
                ("disabled", None, 0)
            } else {
                match self.connect(&name, &spec).await {
                    Ok(live) => ("ready", None, live.tools.len()),
                    Err(e) => ("failed", Some(e.to_string()), 0),
                }
            };
            out.push(ServerStatus {
                name,
                transport: spec.transport(),
                state,
                error,
                tools,
            });
        }
        out
    }

    /// The tools of every enabled server that is up (a failed server's
    /// tools are missing; [`Self::servers`] says why).
    pub async fn tools(&self) -> Vec<ToolInfo> {
        let mut out = Vec::new();
        for (name, spec) in self.config().servers {
            if spec.disabled {
                continue;
            }
            if let Ok(live) = self.connect(&name, &spec).await {
                out.extend(live.tools.iter().map(|t| ToolInfo {
                    always_allow: spec.always_allow.contains(&t.name),
                    ..t.clone()
                }));
            }
        }
        out
    }

    /// Calls `tool` on `server` with `arguments` (an object, or null for none).
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Value,
    ) -> Result<CallOutcome, McpError> {
        let arguments: Option<Map<String, Value>> = match arguments {
            Value::Null => None,
            Value::Object(m) => Some(m),
            _ => return Err(McpError::BadArguments),
        };
        let spec = self
            .config()
            .servers
            .get(server)
            .cloned()
            .ok_or_else(|| McpError::UnknownServer(server.to_string()))?;
        if spec.disabled {
            return Err(McpError::Disabled(server.to_string()));
        }
        let live = self.connect(server, &spec).await?;
        if !live.tools.iter().any(|t| t.name == tool) {
            return Err(McpError::UnknownTool {
                server: server.to_string(),
                tool: tool.to_string(),
            });
        }
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        let started = Instant::now();
        let answer =
            tokio::time::timeout(self.limits.timeout, live.service.call_tool(params)).await;
        let result = match answer {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                let why = explain(&e.to_string(), &live);
                self.drop_conn(server).await;
                return Err(McpError::Failed {
                    server: server.to_string(),
                    why,
                });
            }
            Err(_) => {
                self.drop_conn(server).await;
                return Err(McpError::Timeout {
                    server: server.to_string(),
                    secs: self.limits.timeout.as_secs(),
                });
            }
        };
        let value = serde_json::to_value(&result).unwrap_or(Value::Null);
        let text = result_text(&value);
        let chars = text.chars().count();
        let (content, truncated) = cut(&text, self.limits.max_result_chars);
        Ok(CallOutcome {
            server: server.to_string(),
            tool: tool.to_string(),
            content,
            is_error: value["isError"].as_bool().unwrap_or(false),
            truncated,
            chars,
            took_ms: started.elapsed().as_millis() as u64,
        })
    }

    /// Stops every server (at shutdown).
    pub async fn shutdown(&self) {
        let slots: Vec<_> = std::mem::take(&mut *lock(&self.conns))
            .into_values()
            .collect();
        for slot in slots {
            if let Some(live) = slot.lock().await.take() {
                stop(live);
            }
        }
    }

    fn slot(&self, name: &str) -> Slot {
        lock(&self.conns)
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// The live connection to `name`, made now if there is none (or the
    /// last one failed or closed).
    async fn connect(&self, name: &str, spec: &ServerSpec) -> Result<Arc<Live>, McpError> {
        let slot = self.slot(name);
        let mut conn = slot.lock().await;
        if let Some(live) = &*conn {
            if !live.service.is_closed() {
                return Ok(live.clone());
            }
        }
        let made = tokio::time::timeout(self.limits.start_timeout, start(name, spec)).await;
        let made = match made {
            Ok(r) => r,
            Err(_) => Err(format!(
                "did not start within {} s",
                self.limits.start_timeout.as_secs()
            )),
        };
        match made {
            Ok(live) => {
                let live = Arc::new(live);
                lock(&self.failed).remove(name);
                tracing::info!(server = name, tools = live.tools.len(), "MCP server ready");
                *conn = Some(live.clone());
                Ok(live)
            }
            Err(why) => {
                tracing::warn!(server = name, %why, "MCP server failed");
                lock(&self.failed).insert(name.to_string());
                *conn = None;
                Err(McpError::Failed {
                    server: name.to_string(),
                    why,
                })
            }
        }
    }

    /// Stops `name`'s connection after a failure; the next use starts it again.
    async fn drop_conn(&self, name: &str) {
        let slot = self.slot(name);
        let old = slot.lock().await.take();
        if let Some(live) = old {
            stop(live);
        }
    }
}

/// Starts or reaches one server and lists its tools.
async fn start(name: &str, spec: &ServerSpec) -> Result<Live, String> {
    let info = ClientConfig::default();
    let stderr = Arc::new(SyncMutex::new(VecDeque::new()));
    let mut process = None;
    let service = match spec.transport() {
        Transport::Stdio => {
            let (proc, pipes) = crate::spawn::spawn(spec)?;
            process = Some(proc);
            let keep = stderr.clone();
            let server = name.to_string();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(pipes.stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(server, "{line}");
                    let mut k = lock(&keep);
                    if k.len() == STDERR_LINES {
                        k.pop_front();
                    }
                    k.push_back(line);
                }
            });
            info.serve((pipes.stdout, pipes.stdin))
                .await
                .map_err(|e| e.to_string())?
        }
        Transport::Http => {
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            // rustls needs a process-wide crypto provider for https; ring
            // is the one the rest of the build uses. (Already set: fine.)
            let _ = rustls::crypto::ring::default_provider().install_default();
            let url = spec.url.clone().unwrap_or_default();
            let mut headers = std::collections::HashMap::new();
            for (k, v) in &spec.headers {
                let k = k
                    .parse()
                    .map_err(|_| format!("header name '{k}' is not valid"))?;
                let v = v
                    .parse()
                    .map_err(|_| format!("header '{k}' has a value that is not valid"))?;
                headers.insert(k, v);
            }
            let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
            let transport = StreamableHttpClientTransport::from_config(config);
            info.serve(transport).await.map_err(|e| e.to_string())?
        }
    };
    let listed = service
        .list_all_tools()
        .await
        .map_err(|e| format!("listing its tools failed: {e}"))?;
    let tools = listed
        .iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .filter_map(|t| tool_info(name, &t))
        .filter(|t| {
            spec.enabled_tools
                .as_ref()
                .is_none_or(|only| only.contains(&t.name))
        })
        .collect();
    Ok(Live {
        service,
        tools,
        stderr,
        _process: process,
    })
}

/// A listed tool as the chat offers it (from the tool's JSON, so fields
/// the protocol adds later do not break it).
fn tool_info(server: &str, t: &Value) -> Option<ToolInfo> {
    let name = t["name"].as_str()?.to_string();
    Some(ToolInfo {
        function: format!("{server}{SEPARATOR}{name}"),
        server: server.to_string(),
        title: t["title"]
            .as_str()
            .or(t["annotations"]["title"].as_str())
            .map(str::to_string),
        description: t["description"].as_str().unwrap_or_default().to_string(),
        input_schema: t
            .get("inputSchema")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        read_only: t["annotations"]["readOnlyHint"].as_bool().unwrap_or(false),
        always_allow: false,
        name,
    })
}

/// A result's blocks as text: text as it is, anything else described by
/// its kind and size, so the model knows it is there.
fn result_text(result: &Value) -> String {
    let mut parts = Vec::new();
    for block in result["content"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => parts.push(block["text"].as_str().unwrap_or_default().to_string()),
            Some("resource") => {
                let r = &block["resource"];
                match r["text"].as_str() {
                    Some(t) => parts.push(t.to_string()),
                    None => parts.push(format!(
                        "[resource {}]",
                        r["uri"].as_str().unwrap_or_default()
                    )),
                }
            }
            Some("resource_link") => parts.push(format!(
                "[resource link {}]",
                block["uri"].as_str().unwrap_or_default()
            )),
            Some(kind) => parts.push(format!(
                "[{kind} {}, {} bytes of base64]",
                block["mimeType"].as_str().unwrap_or("?"),
                block["data"].as_str().map_or(0, str::len)
            )),
            None => {}
        }
    }
    if parts.is_empty() {
        if let Some(s) = result.get("structuredContent") {
            return s.to_string();
        }
    }
    parts.join("\n")
}

/// `text` cut to `max` characters, with the cut said at its end.
fn cut(text: &str, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        None => (text.to_string(), false),
        Some((at, _)) => {
            let total = text.chars().count();
            (
                format!(
                    "{}\n[… cut: {max} of {total} characters shown]",
                    &text[..at]
                ),
                true,
            )
        }
    }
}

/// An error with the server's last stderr lines, when it left any.
fn explain(error: &str, live: &Live) -> String {
    let tail: Vec<String> = lock(&live.stderr).iter().cloned().collect();
    if tail.is_empty() {
        error.to_string()
    } else {
        format!("{error} (its last output: {})", tail.join(" | "))
    }
}

fn stop(live: Arc<Live>) {
    // Cancelling closes the transport; a stdio child is killed when the
    // last handle to it goes.
    live.service.cancellation_token().cancel();
}

fn lock<T>(m: &SyncMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_read_as_text_and_are_cut_by_characters() {
        let v = serde_json::json!({"content": [
            {"type": "text", "text": "héllo"},
            {"type": "image", "mimeType": "image/png", "data": "AAAA"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}}
        ]});
        assert_eq!(
            result_text(&v),
            "héllo\n[image image/png, 4 bytes of base64]\ninside"
        );
        assert_eq!(cut("héllo", 5), ("héllo".to_string(), false));
        let (c, t) = cut("héllo", 2);
        assert!(t);
        assert!(c.starts_with("hé\n[… cut: 2 of 5 characters"), "{c}");
        let structured = serde_json::json!({"content": [], "structuredContent": {"n": 3}});
        assert_eq!(result_text(&structured), r#"{"n":3}"#);
    }

    #[test]
    fn tools_carry_their_server_and_read_only_hint() {
        let t = serde_json::json!({"name": "echo", "description": "Echoes",
            "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}});
        let info = tool_info("every", &t).expect("tool");
        assert_eq!(info.function, "every__echo");
        assert!(info.read_only);
        let t = serde_json::json!({"name": "write"});
        let info = tool_info("s", &t).expect("tool");
        assert!(!info.read_only);
        assert_eq!(info.input_schema, serde_json::json!({"type": "object"}));
    }

    #[tokio::test]
    async fn a_broken_file_is_no_servers_until_a_good_one_is_saved() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("mcp.json");
        std::fs::write(&path, "{\"mcpServers\": {").expect("write");
        let hub = McpHub::open(Some(path.clone()), Limits::default());
        assert!(hub.servers().await.is_empty());
        assert!(hub.summary().file_error);
        let why = hub.file_error().expect("the error is kept");
        assert!(why.contains("not a valid mcp.json"), "{why}");
        let good = McpFile::parse(
            r#"{"mcpServers": {"a": {"command": "x", "disabled": true}}}"#,
            "t",
        )
        .expect("valid");
        hub.set_config(good.clone()).await.expect("saved");
        assert_eq!(hub.file_error(), None);
        assert_eq!(McpFile::load(&path).expect("reads back"), good);
    }

    #[tokio::test]
    async fn a_command_that_does_not_exist_is_a_failed_server_and_calls_say_so() {
        let file = McpFile::parse(
            r#"{"mcpServers": {"gone": {"command": "/nonexistent/mcp-server"}, "off": {"command": "x", "disabled": true}}}"#,
            "t",
        )
        .expect("valid");
        let hub = McpHub::with_file(None, file, Limits::default());
        // Nothing started yet: the summary starts nothing either.
        let idle = Summary {
            servers: 2,
            disabled: 1,
            ..Summary::default()
        };
        assert_eq!(hub.summary(), idle);
        let list = hub.servers().await;
        assert_eq!(
            hub.summary(),
            Summary {
                failed: 1,
                ..idle.clone()
            }
        );
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].state, "failed");
        assert!(
            list[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("cannot start")),
            "{list:?}"
        );
        assert_eq!(list[1].state, "disabled");
        // A changed entry is no longer counted as failed.
        let mut fixed = hub.config();
        if let Some(gone) = fixed.servers.get_mut("gone") {
            gone.command = Some("/nonexistent/other-server".into());
        }
        hub.set_config(fixed).await.expect("set");
        assert_eq!(hub.summary(), idle);
        assert!(hub.tools().await.is_empty());
        let e = hub
            .call("off", "x", Value::Null)
            .await
            .expect_err("disabled");
        assert!(matches!(e, McpError::Disabled(_)), "{e}");
        let e = hub
            .call("nobody", "x", Value::Null)
            .await
            .expect_err("unknown");
        assert!(matches!(e, McpError::UnknownServer(_)), "{e}");
        let e = hub
            .call("gone", "x", serde_json::json!([1]))
            .await
            .expect_err("args");
        assert!(matches!(e, McpError::BadArguments), "{e}");
    }
}
