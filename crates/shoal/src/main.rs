//! `shoal`: the command-line front of the engine.
mod bench;
mod chat;
mod generate;
mod serve;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use shoal::{config, id_from_path};

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Local LLM engine and server with exact token accounting"
)]
struct Cli {
    /// Log lines as human-readable text or as one JSON object per line.
    #[arg(long, global = true, value_enum, env = "SHOAL_LOG_FORMAT", default_value_t = shoal::LogFormat::Text)]
    log_format: shoal::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one chat turn and print the reply, its finish reason and usage.
    Generate(generate::Args),
    /// Measure prefill and decode speed and time to first token.
    Bench(bench::Args),
    /// Serve the OpenAI- and Anthropic-compatible HTTP API.
    Serve(serve::Args),
    /// Print the settings `serve` would use, as TOML, with where each came from.
    Config(config::Flags),
    /// Chat with any provider (four dialects); every reply is stored with its
    /// stop reason and usage.
    Chat(chat::Args),
    /// Stored conversations with per-reply reasons and usage, and totals per model.
    History(chat::HistoryArgs),
}

/// Model path for `generate` and `bench` (`serve` takes it from `config::Flags`).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// A .gguf file or a Hugging Face / MLX model directory.
    #[arg(long, env = "SHOAL_MODEL")]
    pub model: Option<PathBuf>,
    /// The name clients use for the model (default: the file or directory name).
    #[arg(long, env = "SHOAL_MODEL_ID")]
    pub model_id: Option<String>,
}

impl ModelArgs {
    pub fn path(&self) -> PathBuf {
        self.model
            .clone()
            .unwrap_or_else(shoal_engine::loader::default_model_path)
    }

    /// The id clients see: `--model-id`, else the model's file or directory name.
    pub fn id(&self) -> String {
        match &self.model_id {
            Some(id) => id.clone(),
            None => id_from_path(&self.path()),
        }
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    shoal::init_logging(cli.log_format);
    match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Chat(a) => chat::run(a),
        Command::History(a) => chat::history(a),
        Command::Config(flags) => {
            print!("{}", config::resolve(&flags)?.to_annotated_toml()?);
            Ok(())
        }
    }
}
