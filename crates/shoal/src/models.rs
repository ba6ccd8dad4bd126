//! `shoal pull`, `shoal models`, `shoal rm`: the local model library from
//! the terminal.
use std::collections::HashMap;

use anyhow::{Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use shoal::config;
use shoal_models::{HubOptions, Library, LocalModel, ModelCard, PullEvent, PullSpec, Source};

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// ORG/NAME or ORG/NAME@REVISION on the hub.
    pub repo: String,
    /// The GGUF file to take from a repo with several (default: the first
    /// quantization the engine loads natively: Q4_0, Q4_1, Q8_0, F16…).
    #[arg(long)]
    pub file: Option<String>,
    /// No progress bars; one line per finished file (also when stderr is
    /// not a terminal).
    #[arg(long)]
    pub quiet: bool,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// One JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub settings: config::Flags,
}

#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// The model's id as `shoal models` shows it.
    pub id: String,
}

fn bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

pub fn pull(a: PullArgs) -> Result<()> {
    let spec = PullSpec::parse(&a.repo, a.file.clone())?;
    let opts = HubOptions::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let model = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn({
            let opts = opts.clone();
            async move { shoal_models::pull(&spec, &opts, tx).await }
        });
        let mut view = PullView::new(a.quiet);
        while let Some(ev) = rx.recv().await {
            view.show(&ev);
        }
        view.finish();
        anyhow::Ok(task.await.context("pull task")??)
    })?;
    println!(
        "{}  {}  {}",
        model.id,
        bytes(model.card.size_bytes),
        model.path.display()
    );
    Ok(())
}

/// Progress bars for one pull: one per file and one overall.
struct PullView {
    quiet: bool,
    bars: MultiProgress,
    overall: Option<ProgressBar>,
    files: HashMap<String, ProgressBar>,
}

impl PullView {
    fn new(quiet: bool) -> Self {
        use std::io::IsTerminal;
        PullView {
            // Bars only make sense on a terminal; logs get a line per file.
            quiet: quiet || !std::io::stderr().is_terminal(),
            bars: MultiProgress::new(),
            overall: None,
            files: HashMap::new(),
        }
    }

    fn style(template: &str) -> ProgressStyle {
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ")
    }

    fn show(&mut self, ev: &PullEvent) {
        match ev {
            PullEvent::Plan {
                repo,
                commit,
                files,
                total_bytes,
                ..
            } => {
                let short = commit.get(..8).unwrap_or(commit);
                eprintln!(
                    "{repo} @ {short}: {} files, {}",
                    files.len(),
                    bytes(*total_bytes)
                );
                if self.quiet {
                    return;
                }
                for f in files {
                    let bar = self.bars.add(ProgressBar::new(f.size));
                    bar.set_style(Self::style(
                        "  {msg:40!} [{bar:30}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12}",
                    ));
                    bar.set_message(f.name.clone());
                    self.files.insert(f.name.clone(), bar);
                }
                let all = self.bars.add(ProgressBar::new(*total_bytes));
                all.set_style(Self::style(
                    "  {msg:40!} [{bar:30}] {bytes:>10}/{total_bytes:<10} eta {eta}",
                ));
                all.set_message("total");
                self.overall = Some(all);
            }
            PullEvent::Progress {
                file,
                file_bytes,
                bytes,
                ..
            } => {
                if let Some(b) = self.files.get(file) {
                    b.set_position(*file_bytes);
                }
                if let Some(b) = &self.overall {
                    b.set_position(*bytes);
                }
            }
            PullEvent::FileDone {
                file,
                verified,
                cached,
            } => {
                let how = match (cached, verified) {
                    (true, _) => "already here",
                    (false, true) => "checksum ok",
                    (false, false) => "no checksum listed",
                };
                match self.files.get(file) {
                    Some(b) => b.finish_with_message(format!("{file} ({how})")),
                    None => eprintln!("  {file} ({how})"),
                }
            }
            PullEvent::Done { .. } => {}
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.overall {
            b.finish();
        }
    }
}

/// Pulled models, plus the configured model when it is a file of its own.
fn local_models(settings: &config::Flags) -> Result<Vec<LocalModel>> {
    let mut all = Library::from_env().list();
    let cfg = config::resolve(settings)?.config;
    let path = cfg.model_path();
    if !all.iter().any(|m| m.path == path) {
        match ModelCard::read(&path) {
            Ok(card) => all.insert(
                0,
                LocalModel {
                    id: cfg.model_id(),
                    path,
                    source: Source::Path,
                    card,
                },
            ),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "configured model unreadable")
            }
        }
    }
    Ok(all)
}

pub fn list(a: ListArgs) -> Result<()> {
    let all = local_models(&a.settings)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    let rows: Vec<[String; 7]> = all
        .iter()
        .map(|m| {
            let c = &m.card;
            let from = match &m.source {
                Source::Hub { repo, commit } => {
                    format!("hub {repo}@{}", commit.get(..8).unwrap_or(commit))
                }
                Source::Path => m.path.display().to_string(),
            };
            [
                m.id.clone(),
                c.architecture.clone().unwrap_or_else(|| "?".into()),
                c.quantization.clone().unwrap_or_else(|| "?".into()),
                format!("{:.0}M", c.parameters as f64 / 1e6),
                bytes(c.size_bytes),
                c.context_length.map_or("?".into(), |n| n.to_string()),
                from,
            ]
        })
        .collect();
    let head = ["ID", "ARCH", "QUANT", "PARAMS", "SIZE", "CONTEXT", "FROM"];
    let mut widths = head.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(&head.map(String::from)));
    for r in &rows {
        println!("{}", line(r));
    }
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    let lib = Library::from_env();
    let freed = lib.remove(&a.id)?;
    println!("removed {} ({} freed)", a.id, bytes(freed));
    Ok(())
}
