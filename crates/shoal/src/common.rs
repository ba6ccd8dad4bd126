//! What several commands share: the model flags of `generate` and `bench`,
//! `bench`'s own flags (its variants in `bench_*.rs` read them too) and the
//! median its figures are.
use anyhow::Result;
use shoal::config;

/// The model settings of `generate` and `bench`: `serve`'s `[model]` rows,
/// resolved the same way (config file, environment, flags).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    #[command(flatten)]
    pub settings: config::ModelFlags,
}

impl ModelArgs {
    pub fn config(&self) -> Result<config::Config> {
        Ok(config::resolve(&self.settings.0)?.config)
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Also run this many streams at once and report aggregate and
    /// per-stream decode speed (continuous batching).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Also split the model by layers over this many local processes (MLX's
    /// ring backend on loopback, as a cluster pipeline runs) and report its
    /// decode speed and the cost per token of the hops.
    #[arg(long, default_value_t = 1)]
    pub split: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Benchmark an embedding model (`--model`) instead: embeddings and
    /// tokens per second for requests of 1, 16 and 256 short inputs.
    #[arg(long)]
    pub embeddings: bool,
    /// With `--embeddings`: another server's base URL (e.g. `llama-server
    /// --embeddings` on the same file and threads), asked in turn with the
    /// same requests; prints the ratios.
    #[arg(long, value_name = "URL", requires = "embeddings")]
    pub against: Option<String>,
    /// Benchmark a running cluster instead: the model on the node at this
    /// URL alone, then split over `--nodes` as a pipeline instance.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// With `--server`: the node ids to split over, comma-separated
    /// (default: every online node).
    #[arg(long, requires = "server")]
    pub nodes: Option<String>,
    /// Benchmark speculative decoding instead: a code-editing task and an
    /// open chat, each decoded with drafts and without, interleaved, with
    /// the acceptance rate and whether the replies are equal.
    #[arg(long, conflicts_with_all = ["embeddings", "server", "kv_types"])]
    pub drafting: bool,
    /// Benchmark the KV cache types instead: bytes per position and greedy
    /// agreement of q8_0 and q4_0 with f16 over a set of prompts.
    #[arg(long, conflicts_with_all = ["embeddings", "server"])]
    pub kv_types: bool,
    /// With `--server`: the server's API key.
    #[arg(long, env = "SHOAL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// The median of `v` (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
