//! `shoal shard`: one rank of a model split by layers over several nodes
//! (started by a node's server when an instance is placed, not by hand).
//! `MLX_RANK` and `MLX_HOSTFILE` say where it sits in MLX's ring. Rank 0
//! serves the HTTP API on its layers plus the others'; later ranks run
//! their layers until told to stop. A shard exits when its parent closes
//! its stdin, so it never outlives the server that started it.
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use shoal_api::AppState;
use shoal_engine::backend::LanguageModel;
use shoal_engine::backends::mlx::pipeline::{serve_stage, Group, PipelineModel};
use shoal_engine::loader::{self, Loaded};
use shoal_engine::{Engine, EngineOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model file or directory.
    #[arg(long)]
    pub model: PathBuf,
    /// The name clients use for it.
    #[arg(long)]
    pub model_id: String,
    /// This rank's layers, `FIRST:END` (END excluded).
    #[arg(long)]
    pub layers: String,
    /// Rank 0: address for its API.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Rank 0: port for its API (0 = any free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

fn parse_layers(s: &str) -> Result<std::ops::Range<usize>> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| anyhow!("--layers wants FIRST:END, got {s:?}"))?;
    let (a, b): (usize, usize) = (a.parse()?, b.parse()?);
    if a >= b {
        bail!("--layers {s}: empty range");
    }
    Ok(a..b)
}

pub fn run(a: Args) -> Result<()> {
    let layers = parse_layers(&a.layers)?;
    let rank: usize = std::env::var("MLX_RANK")
        .context("MLX_RANK is not set")?
        .parse()
        .context("MLX_RANK")?;
    // Gone parent, gone shard.
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        tracing::info!("parent closed stdin; shard exiting");
        std::process::exit(0);
    });
    if rank > 0 {
        let group = Group::init_ring().context("joining the ring")?;
        let (stage, _) = loader::load_stage(&a.model, Some(layers.clone()))
            .with_context(|| format!("loading layers {layers:?} of {}", a.model.display()))?;
        tracing::info!(
            rank,
            ?layers,
            weights_mib = stage.info().weight_bytes >> 20,
            peak_rss_mib = shoal_engine::process::peak_resident_mb().map(|m| m.round()),
            "shard ready"
        );
        serve_stage(stage, group).context("pipeline stage")?;
        return Ok(());
    }
    let opts = EngineOptions {
        prefix_cache_bytes: 0,
        ..EngineOptions::default()
    };
    let range = layers.clone();
    let engine = Engine::start_with(&a.model, &a.model_id, opts, move |p| {
        let group = Group::init_ring()?;
        let (stage, vocab) = loader::load_stage(p, Some(range))?;
        Ok(Loaded {
            model: Box::new(PipelineModel::new(stage, group)?),
            vocab,
            path: p.to_path_buf(),
        })
    })
    .context("starting the pipeline's first stage")?;
    let state = AppState::new(engine);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(a.host, a.port)).await?;
        let local = listener.local_addr()?;
        println!("shoal listening on http://{local} (model {})", a.model_id);
        shoal_api::serve_until(listener, state, std::future::pending())
            .await
            .context("shard server")
    })
}
