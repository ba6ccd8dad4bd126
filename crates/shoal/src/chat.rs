//! `shoal chat` and `shoal history`: talk to any provider in any of the four
//! dialects and keep every reply, with the provider's stop reason and usage,
//! in the conversation store.
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use shoal_client::target::{Dialect, Message, Piece, PieceKind, Request, Target, TargetConfig};
use shoal_client::Metadata;
use shoal_store::Store;
use shoal_store::StoredMessage;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A provider from the providers file (its dialect, URL, model, key,
    /// headers and prices); flags given too override it.
    #[arg(long)]
    pub provider: Option<String>,
    /// Providers file (default: providers.toml in the platform config directory).
    #[arg(long)]
    pub providers: Option<PathBuf>,
    /// API dialect: chat, completions, responses, messages or ollama (default chat).
    #[arg(long)]
    pub target: Option<String>,
    /// Server root, a trailing /v1 is fine (default http://127.0.0.1:8421) [env: SHOAL_BASE_URL].
    #[arg(long)]
    pub base_url: Option<String>,
    /// Model name (default: the server's first model from /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// API key (default: SHOAL_API_KEY, else OPENAI_API_KEY / ANTHROPIC_API_KEY by dialect).
    #[arg(long, hide_env_values = true)]
    pub api_key: Option<String>,
    /// Extra request header `NAME: VALUE` (repeatable).
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// Conversation store (default: the platform data directory) [env: SHOAL_DB].
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Send this one message, store and print the reply, and exit.
    #[arg(long)]
    pub once: Option<String>,
    #[arg(long)]
    pub max_tokens: Option<u64>,
    #[arg(long)]
    pub temperature: Option<f64>,
    #[arg(long)]
    pub system: Option<String>,
    /// Stop sequence (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Choices per request (chat and completions).
    #[arg(long)]
    pub n: Option<u32>,
    /// Request metadata `KEY=VALUE` (value parsed as JSON when it is JSON; repeatable).
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Wait for whole replies instead of streaming.
    #[arg(long)]
    pub no_stream: bool,
    /// With --once: print the stored pieces and metadata as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    #[arg(long)]
    pub db: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// One provider in the providers file. The key may be inline (the file is
/// the user's own, outside any keychain) or read from a named variable; it
/// is never printed or logged.
#[derive(serde::Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    pub target: Option<String>,
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Per-model prices (USD per million tokens) for `response_cost_usd`.
    #[serde(default)]
    pub prices: BTreeMap<String, shoal_client::metadata::Price>,
}

#[derive(serde::Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ProvidersFile {
    #[serde(default)]
    providers: BTreeMap<String, Provider>,
}

/// The named provider from the providers file.
fn provider(a: &Args) -> Result<Provider> {
    let Some(name) = &a.provider else {
        return Ok(Provider::default());
    };
    let path = match &a.providers {
        Some(p) => p.clone(),
        None => directories::ProjectDirs::from("", "", "shoal")
            .context("no config directory; pass --providers")?
            .config_dir()
            .join("providers.toml"),
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading providers file {}", path.display()))?;
    let mut file: ProvidersFile = toml::from_str(&text)
        .with_context(|| format!("invalid providers file {}", path.display()))?;
    file.providers
        .remove(name)
        .with_context(|| format!("no provider '{name}' in {}", path.display()))
}

fn db_path(flag: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("SHOAL_DB").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    shoal::default_db_path()
}

fn parse_metadata(items: &[String]) -> Result<Metadata> {
    let mut m = Metadata::new();
    for it in items {
        let Some((k, v)) = it.split_once('=') else {
            bail!("--metadata expects KEY=VALUE, got '{it}'");
        };
        let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
        m.insert(k.to_string(), value);
    }
    Ok(m)
}

fn api_key(a: &Args, p: &Provider, dialect: Dialect) -> Option<String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    a.api_key
        .clone()
        .or_else(|| p.api_key_env.as_deref().and_then(env))
        .or_else(|| p.api_key.clone())
        .or_else(|| env("SHOAL_API_KEY"))
        .or_else(|| match dialect {
            Dialect::Messages => env("ANTHROPIC_API_KEY"),
            _ => env("OPENAI_API_KEY"),
        })
}

/// Prints streamed text of the first choice as it arrives.
fn print_first_choice(choice: usize, text: &str) {
    if choice == 0 {
        print!("{text}");
        let _ = std::io::stdout().flush();
    }
}

/// One line per piece: finish reason and usage, as the provider put them.
fn summary(p: &Piece) -> String {
    let m = &p.metadata;
    let get = |k: &str| {
        m.get(k)
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
    };
    let reason = ["finish_reason", "stop_reason", "status"]
        .iter()
        .find_map(|k| get(k))
        .unwrap_or_else(|| "not reported".into());
    let mut out = format!("[{reason}");
    if let Some(r) = get("incomplete_reason") {
        out.push_str(&format!(": {r}"));
    }
    if let Some(s) = get("stop_sequence") {
        out.push_str(&format!(" {s:?}"));
    }
    out.push(']');
    let mut usage = Vec::new();
    for (k, label) in [
        ("token_usage_prompt_tokens", "prompt"),
        ("token_usage_cached_tokens", "cached"),
        ("token_usage_completion_tokens", "completion"),
        ("token_usage_reasoning_tokens", "reasoning"),
        ("token_usage_total_tokens", "total"),
    ] {
        if let Some(v) = get(k) {
            usage.push(format!("{label} {v}"));
        }
    }
    if !usage.is_empty() {
        out.push_str(&format!(" {}", usage.join(", ")));
    }
    if let Some(c) = get("response_cost_usd") {
        out.push_str(&format!(" ${c}"));
    }
    if p.kind == PieceKind::Error {
        out.push_str(&format!(" error: {}", get("error").unwrap_or_default()));
    }
    out
}

pub fn run(a: Args) -> Result<()> {
    let prov = provider(&a)?;
    let target_name = a
        .target
        .clone()
        .or_else(|| prov.target.clone())
        .unwrap_or_else(|| "chat".into());
    let dialect = Dialect::parse(&target_name).with_context(|| {
        let names: Vec<&str> = Dialect::ALL.iter().map(|d| d.name()).collect();
        format!(
            "--target must be one of {}, not '{target_name}'",
            names.join(", ")
        )
    })?;
    let base_url = a
        .base_url
        .clone()
        .or_else(|| {
            std::env::var("SHOAL_BASE_URL")
                .ok()
                .filter(|v| !v.is_empty())
        })
        .or_else(|| prov.base_url.clone())
        .unwrap_or_else(|| "http://127.0.0.1:8421".into());
    let metadata = parse_metadata(&a.metadata)?;
    let mut headers: Vec<(String, String)> = prov.headers.clone().into_iter().collect();
    for h in &a.headers {
        let (k, v) = h
            .split_once(':')
            .with_context(|| format!("--header expects 'NAME: VALUE', got '{h}'"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut store = Store::open(&db_path(&a.db)?)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let key = api_key(&a, &prov, dialect);
        let model = match a.model.clone().or_else(|| prov.model.clone()) {
            Some(m) => m,
            None => shoal_client::target::first_model(&base_url, key.as_deref())
                .await
                .context("finding the server's model (pass --model to name one)")?,
        };
        let target = Target::new(TargetConfig {
            dialect,
            base_url,
            model: model.clone(),
            api_key: key,
            headers,
            stream: !a.no_stream,
            price: prov.prices.get(&model).cloned(),
        })?;
        let mut history: Vec<Message> = Vec::new();
        if let Some(s) = &a.system {
            history.push(Message {
                role: "system".into(),
                content: s.clone(),
                images: Vec::new(),
            });
        }
        let title = a
            .once
            .clone()
            .unwrap_or_else(|| format!("chat with {model}"));
        let conv = store.create_conversation(&title.chars().take(80).collect::<String>())?;
        let turn = |text: String, history: &mut Vec<Message>, store: &mut Store| {
            let user = Piece {
                kind: PieceKind::Text,
                text: text.clone(),
                tool_calls: vec![],
                metadata: shoal_client::metadata::merge(&metadata, &Default::default()),
                ..Piece::default()
            };
            history.push(Message {
                role: "user".into(),
                content: text,
                images: Vec::new(),
            });
            store.add_message(conv, "user", Some(dialect.name()), Some(&model), &[user])?;
            let req = Request {
                messages: history.clone(),
                max_tokens: a.max_tokens,
                temperature: a.temperature,
                n: a.n,
                stop: a.stop.clone(),
                metadata: metadata.clone(),
                extra: Default::default(),
            };
            anyhow::Ok(req)
        };
        // The reply joins the conversation as the target gave it, pieces and
        // their reserved metadata alike.
        let keep_reply = |store: &mut Store, pieces: &[Piece]| {
            store.add_message(
                conv,
                "assistant",
                Some(dialect.name()),
                Some(&model),
                pieces,
            )
        };
        if let Some(text) = a.once.clone() {
            let req = turn(text, &mut history, &mut store)?;
            let quiet = a.json;
            let reply = target
                .send_streaming(&req, &mut |i, t| {
                    if !quiet {
                        print_first_choice(i, t)
                    }
                })
                .await;
            let id = keep_reply(&mut store, &reply.pieces)?;
            let stored = store
                .message(id)?
                .context("the reply just stored is missing")?;
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "conversation_id": conv, "message_id": id, "target": dialect.name(),
                        "model": model, "pieces": stored.pieces,
                    }))?
                );
            } else {
                if !a.no_stream {
                    println!();
                }
                for (i, p) in stored.pieces.iter().enumerate() {
                    if a.no_stream || i > 0 {
                        println!("{}", p.text);
                    }
                    eprintln!("{}", summary(p));
                }
            }
            return Ok(());
        }
        let stdin = std::io::stdin();
        eprintln!(
            "chatting with {model} via {} at {} (Ctrl-D to end)",
            dialect.name(),
            target.url()
        );
        loop {
            eprint!("> ");
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                break;
            }
            let text = line.trim_end().to_string();
            if text.is_empty() {
                continue;
            }
            let req = turn(text, &mut history, &mut store)?;
            let reply = target.send_streaming(&req, &mut print_first_choice).await;
            println!();
            keep_reply(&mut store, &reply.pieces)?;
            for p in &reply.pieces {
                eprintln!("{}", summary(p));
            }
            if let Some(first) = reply.pieces.first().filter(|p| p.kind == PieceKind::Text) {
                history.push(Message {
                    role: "assistant".into(),
                    content: first.text.clone(),
                    images: Vec::new(),
                });
            }
        }
        Ok(())
    })
}

/// Totals of the reported usage per model.
#[derive(Default, serde::Serialize)]
struct Totals {
    replies: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    cost_usd: f64,
}

pub fn history(a: HistoryArgs) -> Result<()> {
    let store = Store::open(&db_path(&a.db)?)?;
    let convs = store.conversations()?;
    let mut totals: BTreeMap<String, Totals> = BTreeMap::new();
    let num = |m: &Metadata, k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0);
    for c in &convs {
        for m in c.messages.iter().filter(|m| m.role == "assistant") {
            let t = totals
                .entry(m.model.clone().unwrap_or_default())
                .or_default();
            for p in &m.pieces {
                t.replies += 1;
                t.cost_usd += p
                    .metadata
                    .get("response_cost_usd")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0);
            }
            // Usage is per response: counted once even with several pieces.
            if let Some(p) = m.pieces.first() {
                t.prompt_tokens += num(&p.metadata, "token_usage_prompt_tokens");
                t.completion_tokens += num(&p.metadata, "token_usage_completion_tokens");
                t.total_tokens += num(&p.metadata, "token_usage_total_tokens");
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"conversations": convs, "totals": totals}))?
        );
        return Ok(());
    }
    for c in &convs {
        println!("#{} {}", c.id, c.title);
        for m in &c.messages {
            print_message(m);
        }
    }
    println!("\ntotals per model:");
    for (model, t) in &totals {
        println!(
            "  {model}: {} replies, prompt {}, completion {}, total {}{}",
            t.replies,
            t.prompt_tokens,
            t.completion_tokens,
            t.total_tokens,
            if t.cost_usd > 0.0 {
                format!(", ${:.6}", t.cost_usd)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

fn print_message(m: &StoredMessage) {
    for p in &m.pieces {
        let text: String = p.text.chars().take(60).collect();
        if m.role == "assistant" {
            println!(
                "  {} ({}): {text:?} {}",
                m.role,
                m.target.as_deref().unwrap_or("?"),
                summary(p)
            );
        } else {
            println!("  {}: {text:?}", m.role);
        }
    }
}
