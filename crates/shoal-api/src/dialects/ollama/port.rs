//! Ollama's own port (11434) beside the main one, for tools that look for
//! Ollama there. Off unless the config turns it on; the settings switch
//! (`GET`/`PUT /v1/settings/ollama-port`, the desktop app's and the web UI's
//! Settings) opens and closes it on a running server and is remembered in
//! the store. A port already taken (a running Ollama) is reported, never
//! fatal: the main port serves regardless.
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use serde_json::{json, Value};

/// Ollama's default port.
pub const DEFAULT_PORT: u16 = 11434;

/// The store's key for the switch's last setting (the port, or "off").
pub const SETTING: &str = "ollama_port";

/// Marks requests that came in on the Ollama port: there `/` is Ollama's
/// liveness text even for a browser.
#[derive(Clone, Copy, Debug)]
pub struct OnOllamaPort;

/// The switch and what listening on it gave.
#[derive(Debug, Default)]
pub struct OllamaPort {
    inner: Mutex<Inner>,
    /// Serializes opening and switching (both await a bind).
    op: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The port asked for; `None`: off.
    wanted: Option<u16>,
    /// The main listener's host, once serving has started (the Ollama port
    /// listens on the same one).
    host: Option<IpAddr>,
    /// The last attempt: the address bound, or why binding failed.
    outcome: Option<Result<SocketAddr, String>>,
    /// What the port serves: the main router marked [`OnOllamaPort`], given
    /// when serving starts.
    app: Option<axum::Router>,
    /// Ends the listener that is open, and its task.
    stop: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
}

/// How long responses open on the Ollama port get to finish when it closes.
const GRACE: std::time::Duration = std::time::Duration::from_secs(10);

impl OllamaPort {
    /// A switch set to `port` (`None`: off); nothing listens before [`Self::open`].
    pub fn new(port: Option<u16>) -> Self {
        OllamaPort {
            inner: Mutex::new(Inner {
                wanted: port,
                ..Inner::default()
            }),
            op: tokio::sync::Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The switch as `/health` and the settings route show it: on or off,
    /// the port, and whether it listens (or why not).
    pub fn status(&self) -> Value {
        let g = self.lock();
        let mut v = json!({
            "enabled": g.wanted.is_some(),
            "port": g.wanted.unwrap_or(DEFAULT_PORT),
            "listening": false,
        });
        if g.wanted.is_some() {
            match &g.outcome {
                Some(Ok(addr)) => {
                    v["listening"] = json!(true);
                    v["address"] = json!(addr.to_string());
                }
                Some(Err(why)) => v["error"] = json!(why),
                None => {}
            }
        }
        v
    }

    /// Starts serving `app` on the switch's port, if on, beside a main
    /// listener on `host`, and keeps it for the switch's later changes.
    /// Called when serving starts (again, after a stop).
    pub(crate) async fn open(&self, app: axum::Router, host: IpAddr) {
        let _op = self.op.lock().await;
        let port = {
            let mut g = self.lock();
            g.host = Some(host);
            g.app = Some(app.layer(axum::Extension(OnOllamaPort)));
            g.wanted
        };
        if let Some(port) = port {
            self.listen(host, port).await;
        }
    }

    /// Stops listening (the main server is stopping, or the switch went
    /// off); returns once the port is free again, after open responses
    /// finished or [`GRACE`] ran out.
    pub(crate) async fn close(&self) {
        Self::closed(self.begin_close()).await;
    }

    /// Tells the listener to stop accepting; [`Self::closed`] waits for it.
    pub(crate) fn begin_close(&self) -> Option<tokio::task::JoinHandle<()>> {
        let mut g = self.lock();
        g.outcome = None;
        let (stop, task) = g.stop.take()?;
        let _ = stop.send(());
        Some(task)
    }

    /// Waits for a closing listener's open responses, for up to [`GRACE`].
    pub(crate) async fn closed(task: Option<tokio::task::JoinHandle<()>>) {
        let Some(mut task) = task else { return };
        if tokio::time::timeout(GRACE, &mut task).await.is_err() {
            tracing::warn!("responses on the Ollama port did not finish in time; closing them");
            task.abort();
            let _ = task.await;
        }
    }

    /// Sets the switch on a running server: closes what listens, then opens
    /// `port` (`None`: stays off).
    pub(crate) async fn set(&self, port: Option<u16>) {
        let _op = self.op.lock().await;
        self.close().await;
        let host = {
            let mut g = self.lock();
            g.wanted = port;
            g.host
        };
        if let (Some(port), Some(host)) = (port, host) {
            self.listen(host, port).await;
        }
    }

    async fn listen(&self, host: IpAddr, port: u16) {
        let addr = SocketAddr::new(host, port);
        let Some(app) = self.lock().app.clone() else {
            return;
        };
        let outcome = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                let bound = l.local_addr().unwrap_or(addr);
                tracing::info!(address = %bound, "serving Ollama's API on its own port too");
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let task = tokio::spawn(async move {
                    let done = async move {
                        let _ = stopped.await;
                    };
                    if let Err(e) = axum::serve(l, app).with_graceful_shutdown(done).await {
                        tracing::warn!(error = %e, "the Ollama port stopped serving");
                    }
                });
                self.lock().stop = Some((stop, task));
                Ok(bound)
            }
            Err(e) => {
                let why = if e.kind() == std::io::ErrorKind::AddrInUse {
                    format!(
                        "port {port} is taken (a running Ollama?): Ollama's API is served on the main port only"
                    )
                } else {
                    format!("could not listen on {addr} for Ollama's API: {e}")
                };
                tracing::warn!("{why}");
                Err(why)
            }
        };
        self.lock().outcome = Some(outcome);
    }
}

/// The remembered switch from the store: `Some(None)` for off, `None` when
/// never set (the config's default applies).
pub fn remembered(store: &shoal_store::Store) -> Option<Option<u16>> {
    match store.setting(SETTING).ok().flatten()?.as_str() {
        "off" => Some(None),
        p => p.parse().ok().map(Some),
    }
}
