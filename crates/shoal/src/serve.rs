//! `shoal serve`: the HTTP API on the loaded model.
use std::net::SocketAddr;

use anyhow::{Context, Result};

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
    let engine = shoal::load_engine(&cfg)?;
    let model_id = engine.model.id.clone();
    let state = shoal::app_state(&cfg, engine)?;
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
        let disk = cfg.open_disk_cache();
        let served = shoal_api::serve_until(listener, state, stop_signal())
            .await
            .context("server error");
        // Free the models before the process exits, so MLX is not torn
        // down under a running engine thread. (The desktop app keeps its
        // models across Stop / Start.)
        // Then let the prefix cache's last writes land.
        let _ = tokio::task::spawn_blocking(move || {
            pool.shutdown(std::time::Duration::from_secs(10));
            if let Some(d) = disk {
                d.wait_idle(std::time::Duration::from_secs(30));
            }
        })
        .await;
        served
    })
}

/// Ctrl-C, or (on Unix) SIGTERM as service managers and test harnesses
/// send it: either ends the server gracefully, so the prefix cache's last
/// writes land before the process exits.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
