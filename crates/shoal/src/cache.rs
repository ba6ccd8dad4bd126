//! `shoal cache`: the prefix cache's disk tier from the terminal (no server
//! needed): each stored prefix with its model, tokens, bytes and last use,
//! and clearing them.
use anyhow::{bail, Result};

use crate::config;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Remove the entries (all, or --only's) instead of listing them.
    #[arg(long)]
    pub clear: bool,
    /// One model's entries only (the name it was served under).
    #[arg(long, value_name = "MODEL")]
    pub only: Option<String>,
    /// Print JSON, as GET /v1/cache lists entries.
    #[arg(long)]
    pub json: bool,
    /// The server's settings (the store and cache.disk_dir decide the folder).
    #[command(flatten)]
    pub settings: config::Flags,
}

/// Sizes as `shoal models` prints them.
fn size(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

fn ago(secs: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match now.saturating_sub(secs) {
        s if s < 120 => format!("{s} s ago"),
        s if s < 7200 => format!("{} min ago", s / 60),
        s if s < 172_800 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86_400),
    }
}

pub fn run(a: Args) -> Result<()> {
    let cfg = config::resolve(&a.settings)?.config;
    let Some(cache) = cfg.open_disk_cache() else {
        bail!(
            "the prefix cache's disk tier is off (cache.disk_mb = {})",
            cfg.cache.disk_mb
        );
    };
    if a.clear {
        let n = cache.clear(a.only.as_deref());
        println!("removed {n} entries from {}", cache.options().dir.display());
        return Ok(());
    }
    let entries: Vec<_> = cache
        .entries()
        .into_iter()
        .filter(|e| a.only.as_ref().is_none_or(|m| *m == e.model))
        .collect();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "dir": cache.options().dir,
                "budget_bytes": cache.options().budget_bytes,
                "entries": entries,
            }))?
        );
        return Ok(());
    }
    println!(
        "{:<40} {:>8} {:>8} {:>10} {:>6} {:<16} source",
        "model", "backend", "tokens", "bytes", "blocks", "last used"
    );
    for e in &entries {
        println!(
            "{:<40} {:>8} {:>8} {:>10} {:>6} {:<16} disk{}",
            e.model,
            e.backend,
            e.tokens,
            size(e.bytes),
            e.blocks,
            ago(e.last_used),
            if e.scoped { " (one key's)" } else { "" }
        );
    }
    // An entry's bytes count the blocks it shares with others (a common
    // system prompt), so the tier's total comes from its files, not a sum.
    let tier = cache.summary();
    println!(
        "{} entries, the tier holding {} in {} blocks of {} in {}",
        entries.len(),
        size(tier.bytes),
        tier.blocks,
        size(cache.options().budget_bytes),
        cache.options().dir.display()
    );
    Ok(())
}
