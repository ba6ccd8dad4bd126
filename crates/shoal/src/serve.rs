//! `shoal serve`: the HTTP API on the loaded model.
use std::net::SocketAddr;

use anyhow::{Context, Result};
use shoal_api::models::ModelPool;
use shoal_api::AppState;
use shoal_engine::Engine;

use crate::config;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub settings: config::Flags,
}

pub fn run(a: Args) -> Result<()> {
    let resolved = config::resolve(&a.settings)?;
    if let Some(file) = &resolved.file {
        tracing::info!(file = %file.display(), "config file");
    }
    let cfg = resolved.config;
    cfg.check_exposure()?;
    let path = cfg.model_path();
    // The configured model loads now, so a broken one fails at start; others
    // load on first use.
    let engine = Engine::start(&path, &cfg.model_id(), cfg.engine_options()?)
        .with_context(|| format!("loading {}", path.display()))?;
    let model_id = engine.model.id.clone();
    let pool = ModelPool::new(cfg.pool_options()?);
    pool.insert(engine, cfg.model.aliases.clone());
    let mut state = shoal::open_store(AppState::with_pool(pool), &cfg);
    state.log_prompts = cfg.server.log_prompts;
    state.cluster_options = cfg.cluster_options();
    state.access = std::sync::Arc::new(cfg.access());
    let addr = SocketAddr::new(cfg.server.host, cfg.server.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        // Tests and scripts wait for this line.
        println!("shoal listening on http://{local} (model {model_id})");
        let pool = state.pool.clone();
        let served = shoal_api::serve_until(listener, state, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("server error");
        // Free the models before the process exits, so MLX is not torn
        // down under a running engine thread. (The desktop app keeps its
        // models across Stop / Start.)
        let _ =
            tokio::task::spawn_blocking(move || pool.shutdown(std::time::Duration::from_secs(10)))
                .await;
        served
    })
}
