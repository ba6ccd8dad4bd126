//! The engine and the HTTP API, run in-process: loaded once, the server
//! started and stopped on demand from the tray, and shut down cleanly on quit.
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use shoal::config::Config;
use shoal_api::AppState;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long open responses get to finish (with their final event) once the
/// server stops accepting; after that they are cut.
pub const GRACE: Duration = Duration::from_secs(10);

/// What the tray shows and the menu acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Loading,
    Failed(String),
    Stopped {
        model: String,
    },
    Serving {
        url: String,
        model: String,
        in_flight: u64,
        queued: u64,
    },
}

impl Status {
    /// The tray's status line.
    pub fn line(&self) -> String {
        match self {
            Status::Loading => "Loading model…".to_string(),
            Status::Failed(e) => format!("Error: {}", shorten(e, 80)),
            Status::Stopped { model } => format!("Server stopped · {model}"),
            Status::Serving {
                url,
                model,
                in_flight,
                queued,
            } => {
                let mut line = format!("{url} · {model} · {in_flight} in flight");
                if *queued > 0 {
                    line.push_str(&format!(", {queued} queued"));
                }
                line
            }
        }
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

#[derive(Default)]
struct Inner {
    state: Option<AppState>,
    failed: Option<String>,
    /// Where the server listens; fixed after the first start so the URL stays
    /// the same across stop/start (even when the config asked for port 0).
    addr: Option<SocketAddr>,
    running: Option<Running>,
}

/// The in-process server. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    config: Arc<Config>,
    inner: Arc<Mutex<Inner>>,
    /// Serializes start and stop (both await).
    op: Arc<tokio::sync::Mutex<()>>,
}

impl Server {
    pub fn new(config: Config) -> Self {
        Server {
            config: Arc::new(config),
            inner: Arc::default(),
            op: Arc::default(),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Loads the model (blocking; run it off the UI thread).
    pub fn load(&self) -> Result<()> {
        let loaded = shoal::load_engine(&self.config)
            .and_then(|engine| shoal::app_state(&self.config, engine));
        let mut inner = self.inner();
        match loaded {
            Ok(state) => {
                inner.state = Some(state);
                Ok(())
            }
            Err(e) => {
                inner.failed = Some(format!("{e:#}"));
                Err(e)
            }
        }
    }

    /// Starts serving; returns the URL. Does nothing if already serving.
    pub async fn start(&self) -> Result<String> {
        let _op = self.op.lock().await;
        let (state, addr) = {
            let inner = self.inner();
            if let (Some(_), Some(addr)) = (&inner.running, inner.addr) {
                return Ok(url(addr));
            }
            let state = inner.state.clone().context("the model is not loaded")?;
            let addr = inner.addr.unwrap_or(SocketAddr::new(
                self.config.server.host,
                self.config.server.port,
            ));
            (state, addr)
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(shoal_api::serve_until(listener, state, async move {
            let _ = stopped.await;
        }));
        let mut inner = self.inner();
        inner.addr = Some(local);
        inner.running = Some(Running { stop, task });
        tracing::info!(url = %url(local), "server started");
        Ok(url(local))
    }

    /// Stops accepting, lets open responses finish for up to [`GRACE`], then
    /// cuts the rest. Does nothing if not serving.
    /// Frees the loaded models (at Quit, before the process exits, so MLX is
    /// not torn down under a running engine thread).
    pub async fn free_models(&self) {
        let pool = self.inner().state.as_ref().map(|s| s.pool.clone());
        if let Some(pool) = pool {
            let _ = tokio::task::spawn_blocking(move || {
                pool.shutdown(std::time::Duration::from_secs(5))
            })
            .await;
        }
    }

    pub async fn stop(&self) {
        let _op = self.op.lock().await;
        let Some(Running { stop, mut task }) = self.inner().running.take() else {
            return;
        };
        let _ = stop.send(());
        match tokio::time::timeout(GRACE, &mut task).await {
            Ok(Ok(Ok(()))) => tracing::info!("server stopped"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "server ended with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "server task failed"),
            Err(_) => {
                tracing::warn!(
                    grace_secs = GRACE.as_secs(),
                    "open responses did not finish in time; closing them"
                );
                task.abort();
                let _ = task.await;
            }
        }
    }

    /// The server's URL once it has listened (stays known while stopped).
    pub fn url(&self) -> Option<String> {
        self.inner().addr.map(url)
    }

    pub fn status(&self) -> Status {
        let inner = self.inner();
        if let Some(e) = &inner.failed {
            return Status::Failed(e.clone());
        }
        let Some(state) = &inner.state else {
            return Status::Loading;
        };
        let model = self.config.model_id();
        match (&inner.running, inner.addr) {
            (Some(_), Some(addr)) => {
                let (in_flight, queued) = state.busy();
                Status::Serving {
                    url: url(addr),
                    model,
                    in_flight,
                    queued,
                }
            }
            _ => Status::Stopped { model },
        }
    }
}

impl Server {
    /// The tray's line for Ollama's own port: off, where it listens, or why
    /// it does not (a running Ollama holding it). `None` before the model
    /// has loaded.
    pub fn ollama_line(&self) -> Option<String> {
        let inner = self.inner();
        let state = inner.state.as_ref()?;
        Some(ollama_line(&state.ollama.status(), inner.running.is_some()))
    }

    /// The tray's line for the MCP servers (`None` before the model has
    /// loaded): read without starting any of them.
    pub fn mcp_line(&self) -> Option<String> {
        let inner = self.inner();
        let state = inner.state.as_ref()?;
        Some(mcp_line(&state.mcp.summary()))
    }
}

/// Words for the MCP servers at a glance: how many, and those running,
/// failed and off; figures that are zero are left out.
fn mcp_line(s: &shoal_mcp::Summary) -> String {
    if s.file_error {
        return "MCP: mcp.json has an error (see the Server page)".to_string();
    }
    if s.servers == 0 {
        return "MCP: no servers".to_string();
    }
    let mut parts = vec![format!(
        "{} {}",
        s.servers,
        if s.servers == 1 { "server" } else { "servers" }
    )];
    for (n, what) in [
        (s.running, "running"),
        (s.failed, "failed"),
        (s.disabled, "off"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    format!("MCP: {}", parts.join(" · "))
}

/// Words for the Ollama port's status (`/v1/settings/ollama-port`'s body).
fn ollama_line(status: &serde_json::Value, serving: bool) -> String {
    let port = status["port"].as_u64().unwrap_or(0);
    if status["enabled"] != true {
        return "Ollama API: off".to_string();
    }
    if !serving {
        return format!("Ollama API: port {port}, with the server stopped");
    }
    if let Some(addr) = status["address"].as_str() {
        return format!("Ollama API: on {addr}");
    }
    match status["error"].as_str() {
        Some(why) if why.contains("taken") => format!("Ollama API: port {port} is taken"),
        Some(why) => format!("Ollama API: {}", shorten(why, 60)),
        None => format!("Ollama API: opening port {port}…"),
    }
}

/// `text` cut to `max` characters, marked with an ellipsis when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The address clients and the chat window use (the UI is served at `/`).
fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        let serving = Status::Serving {
            url: "http://127.0.0.1:8421/".into(),
            model: "smollm2".into(),
            in_flight: 2,
            queued: 0,
        };
        assert_eq!(
            serving.line(),
            "http://127.0.0.1:8421/ · smollm2 · 2 in flight"
        );
        let busy = Status::Serving {
            url: "http://127.0.0.1:8421/".into(),
            model: "m".into(),
            in_flight: 16,
            queued: 3,
        };
        assert_eq!(
            busy.line(),
            "http://127.0.0.1:8421/ · m · 16 in flight, 3 queued"
        );
        assert_eq!(
            Status::Stopped { model: "m".into() }.line(),
            "Server stopped · m"
        );
    }

    #[test]
    fn long_errors_are_shortened() {
        let line = Status::Failed("é".repeat(200)).line();
        assert_eq!(line.chars().count(), "Error: ".len() + 80);
        assert!(line.ends_with('…'));
        assert_eq!(Status::Failed("no model".into()).line(), "Error: no model");
    }

    #[test]
    fn mcp_lines() {
        use shoal_mcp::Summary;
        assert_eq!(mcp_line(&Summary::default()), "MCP: no servers");
        let some = Summary {
            servers: 3,
            disabled: 1,
            running: 1,
            failed: 1,
            file_error: false,
        };
        assert_eq!(
            mcp_line(&some),
            "MCP: 3 servers · 1 running · 1 failed · 1 off"
        );
        let one = Summary {
            servers: 1,
            ..Summary::default()
        };
        assert_eq!(mcp_line(&one), "MCP: 1 server");
        let broken = Summary {
            file_error: true,
            ..Summary::default()
        };
        assert!(mcp_line(&broken).contains("mcp.json has an error"));
    }

    #[test]
    fn ollama_port_lines() {
        use serde_json::json;
        let off = json!({"enabled": false, "port": 11434, "listening": false});
        assert_eq!(ollama_line(&off, true), "Ollama API: off");
        let on = json!({"enabled": true, "port": 11434, "listening": true,
                        "address": "127.0.0.1:11434"});
        assert_eq!(ollama_line(&on, true), "Ollama API: on 127.0.0.1:11434");
        assert_eq!(
            ollama_line(&on, false),
            "Ollama API: port 11434, with the server stopped"
        );
        let taken = json!({"enabled": true, "port": 11434, "listening": false,
            "error": "port 11434 is taken (a running Ollama?): Ollama's API is served on the main port only"});
        assert_eq!(ollama_line(&taken, true), "Ollama API: port 11434 is taken");
    }

    #[test]
    fn url_is_the_root() {
        let addr: SocketAddr = ([127, 0, 0, 1], 8421).into();
        assert_eq!(url(addr), "http://127.0.0.1:8421/");
    }
}
