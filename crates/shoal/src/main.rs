//! `shoal`: the command-line front of the engine.
mod bench;
mod bench_cluster;
mod bench_draft;
mod bench_embed;
mod cache;
mod chat;
mod common;
mod generate;
mod models;
mod serve;
mod usage;

use anyhow::Result;
use clap::{Parser, Subcommand};
use shoal::config;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Local LLM engine and server with exact token accounting"
)]
struct Cli {
    /// Log lines as human-readable text or as one JSON object per line
    /// (default: the config file's server.log_format, else text).
    /// (The environment's SHOAL_LOG_FORMAT is one of the settings.)
    #[arg(long, global = true, value_enum)]
    log_format: Option<shoal::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one chat turn and print the reply, its finish reason and usage.
    Generate(generate::Args),
    /// Measure prefill and decode speed and time to first token.
    Bench(common::Args),
    /// Serve the OpenAI- and Anthropic-compatible HTTP API.
    Serve(serve::Args),
    /// Print the settings `serve` would use, as TOML, with where each came from.
    Config(config::Flags),
    /// Chat with any provider (four dialects); every reply is stored with its
    /// stop reason and usage.
    Chat(chat::Args),
    /// Stored conversations with per-reply reasons and usage, and totals per model.
    History(chat::HistoryArgs),
    /// The server's usage ledger: requests, sums per day, model, client …,
    /// or each API key against its quota (read from the store; no server needed).
    Usage(usage::Args),
    /// The prefix cache's disk tier: stored prefixes (model, tokens, bytes,
    /// last use), or --clear them (no server needed).
    Cache(cache::Args),
    /// Download a model from the Hugging Face hub (HF_ENDPOINT, HF_TOKEN and
    /// HF_HOME are honoured); an interrupted pull resumes.
    Pull(models::PullArgs),
    /// List local models: pulled ones and the configured one.
    Models(models::ListArgs),
    /// Delete a pulled model's files.
    Rm(models::RmArgs),
    /// One rank of a model split over nodes (started by the server).
    #[command(hide = true)]
    Shard(shoal::shard::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let flags = match &cli.command {
        Command::Serve(a) => a.settings.clone(),
        Command::Config(f) => f.clone(),
        _ => config::Flags::default(),
    };
    // The config file may set the format; a broken file is reported by the
    // command itself, with the format's default meanwhile.
    let format = cli.log_format.unwrap_or_else(|| {
        config::resolve(&flags).map_or(shoal::LogFormat::Text, |r| r.config.server.log_format)
    });
    shoal::init_logging(format);
    match cli.command {
        Command::Generate(a) => generate::run(a),
        // `--server`: a split on a running cluster, measured over HTTP.
        Command::Bench(a) => match a.server.clone() {
            Some(server) => bench_cluster::run(&a, &server),
            None => bench::run(a),
        },
        Command::Serve(a) => serve::run(a),
        Command::Chat(a) => chat::run(a),
        Command::History(a) => chat::history(a),
        Command::Usage(a) => usage::run(a),
        Command::Cache(a) => cache::run(a),
        Command::Pull(a) => models::pull(a),
        Command::Models(a) => models::list(a),
        Command::Rm(a) => models::rm(a),
        Command::Shard(a) => shoal::shard::run(a),
        Command::Config(flags) => {
            let mut resolved = config::resolve(&flags)?;
            if let Some(f) = cli.log_format {
                resolved.set_log_format_flag(f);
            }
            print!("{}", resolved.to_annotated_toml()?);
            Ok(())
        }
    }
}
