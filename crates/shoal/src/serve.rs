//! `shoal serve`: the HTTP API on the loaded model.
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use shoal_api::AppState;
use shoal_engine::{Engine, EngineOptions};

use crate::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, env = "SHOAL_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,
    #[arg(long, env = "SHOAL_PORT", default_value_t = 8421)]
    pub port: u16,
    /// Requests allowed to wait behind the running one; more get 429/529.
    #[arg(long, env = "SHOAL_QUEUE", default_value_t = 64)]
    pub queue: usize,
    /// Memory for reusing KV state of shared prompt prefixes across requests (0 = off).
    #[arg(long, env = "SHOAL_PREFIX_CACHE_MB", default_value_t = 1024)]
    pub prefix_cache_mb: usize,
    /// Content filter: replies containing this phrase are cut before it and end
    /// with finish reason content_filter / refusal (repeatable).
    #[arg(long = "block", env = "SHOAL_BLOCK", value_delimiter = '\n')]
    pub blocked: Vec<String>,
    /// Content filter: a regular expression that ends a reply the same way (repeatable).
    #[arg(
        long = "block-regex",
        env = "SHOAL_BLOCK_REGEX",
        value_delimiter = '\n'
    )]
    pub blocked_regex: Vec<String>,
    /// Another name that resolves to the model (repeatable).
    #[arg(long = "alias")]
    pub aliases: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let path = a.model.path();
    let engine = Engine::start(
        &path,
        &a.model.id(),
        EngineOptions {
            queue_capacity: a.queue.max(1),
            prefix_cache_bytes: a.prefix_cache_mb << 20,
            blocked_phrases: a.blocked.into_iter().filter(|p| !p.is_empty()).collect(),
            blocked_patterns: a
                .blocked_regex
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect(),
            ..EngineOptions::default()
        },
    )
    .with_context(|| format!("loading {}", path.display()))?;
    let mut state = AppState::new(engine);
    state.aliases = std::sync::Arc::new(a.aliases);
    let addr = SocketAddr::new(a.host, a.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        // Tests and scripts wait for this line.
        println!(
            "shoal listening on http://{local} (model {})",
            state.engine.model.id
        );
        axum::serve(listener, shoal_api::router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("server error")
    })
}
