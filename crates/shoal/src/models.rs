//! `shoal pull`, `shoal models`, `shoal rm`: the local model library from
//! the terminal.
use std::collections::HashMap;

use anyhow::{Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
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
        // Bars only make sense on a terminal; logs get a line per file.
        let quiet = quiet || !std::io::stderr().is_terminal();
        Self::drawn_to(quiet, ProgressDrawTarget::stderr())
    }

    fn drawn_to(quiet: bool, target: ProgressDrawTarget) -> Self {
        PullView {
            quiet,
            bars: MultiProgress::with_draw_target(target),
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

/// Pulled models, plus the configured models (the chat model, and the
/// embedding model if one is set) when they are files of their own.
fn local_models(settings: &config::Flags) -> Result<Vec<LocalModel>> {
    let mut all = Library::from_env().list();
    let cfg = config::resolve(settings)?.config;
    let mut configured = vec![(cfg.model_id(), cfg.model_path())];
    if let Some(path) = &cfg.embedding.path {
        let id = cfg
            .embedding
            .id
            .clone()
            .unwrap_or_else(|| shoal::id_from_path(path));
        configured.push((id, path.clone()));
    }
    for (at, (id, path)) in configured.into_iter().enumerate() {
        if all.iter().any(|m| m.path == path) {
            continue;
        }
        match ModelCard::read(&path) {
            Ok(card) => all.insert(
                at,
                LocalModel {
                    id,
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

/// `embedding` for a model that embeds, `chat` for one that generates.
fn kind(m: &LocalModel) -> &'static str {
    if m.card.embedding_pooling.is_some() {
        "embedding"
    } else {
        "chat"
    }
}

pub fn list(a: ListArgs) -> Result<()> {
    let all = local_models(&a.settings)?;
    let cfg = config::resolve(&a.settings)?.config;
    let choice = cfg.model.backend;
    // As `shoal serve` would load them: the pool's budget sizes an `auto` KV pool.
    let llama = cfg.llama_options()?.for_batch(cfg.server.max_batch.max(1));
    // The engine each model would run on, or why none can, before anyone
    // loads it, and the window a request would get there.
    let routes: Vec<std::result::Result<(String, Option<u64>), String>> = all
        .iter()
        .map(|m| {
            shoal_engine::backends::route(&m.path, choice)
                .map(|r| {
                    let window = match (&r.backend, &r.header) {
                        (shoal_engine::BackendKind::Llama, Some(h)) => {
                            Some(llama.window_for(h) as u64)
                        }
                        _ => m.card.context_length,
                    };
                    (r.backend.to_string(), window)
                })
                .map_err(|e| e.to_string())
        })
        .collect();
    let backends: Vec<std::result::Result<String, String>> = routes
        .iter()
        .map(|r| r.as_ref().map(|(b, _)| b.clone()).map_err(Clone::clone))
        .collect();
    // A GGUF on llama.cpp with a projector beside it (or named) reads images.
    let vision: Vec<bool> = all
        .iter()
        .zip(&backends)
        .map(|(m, b)| {
            b.as_ref().is_ok_and(|b| b == "llama") && llama.projector.for_model(&m.path).is_some()
        })
        .collect();
    let windows: Vec<Option<u64>> = all
        .iter()
        .zip(&routes)
        .map(|(m, r)| match r {
            Ok((_, w)) => *w,
            Err(_) => m.card.context_length,
        })
        .collect();
    if a.json {
        let mut v = serde_json::to_value(&all)?;
        if let Some(items) = v.as_array_mut() {
            for ((((item, b), m), w), sees) in items
                .iter_mut()
                .zip(&backends)
                .zip(&all)
                .zip(&windows)
                .zip(&vision)
            {
                item["kind"] = kind(m).into();
                item["vision"] = (*sees).into();
                item["backend"] = b.as_ref().ok().cloned().into();
                item["unavailable"] = b.as_ref().err().cloned().into();
                // The window served, beside the trained one.
                item["context_length"] = (*w).into();
                item["trained_context_length"] = m.card.context_length.into();
            }
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows: Vec<[String; 10]> = all
        .iter()
        .zip(&backends)
        .zip(&windows)
        .zip(&vision)
        .map(|(((m, backend), window), sees)| {
            let c = &m.card;
            let from = match &m.source {
                Source::Hub { repo, commit } => {
                    format!("hub {repo}@{}", commit.get(..8).unwrap_or(commit))
                }
                Source::Path => m.path.display().to_string(),
            };
            [
                m.id.clone(),
                if *sees {
                    format!("{}+vision", kind(m))
                } else {
                    kind(m).to_string()
                },
                c.architecture.clone().unwrap_or_else(|| "?".into()),
                c.quantization.clone().unwrap_or_else(|| "?".into()),
                format!("{:.0}M", c.parameters as f64 / 1e6),
                bytes(c.size_bytes),
                window.map_or("?".into(), |n| n.to_string()),
                c.context_length.map_or("?".into(), |n| n.to_string()),
                match backend {
                    Ok(b) => b.clone(),
                    Err(why) => format!("none: {why}"),
                },
                from,
            ]
        })
        .collect();
    let head = [
        "ID", "KIND", "ARCH", "QUANT", "PARAMS", "SIZE", "CONTEXT", "TRAINED", "BACKEND", "FROM",
    ];
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

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_models::PlannedFile;

    fn progress(file: &str, file_bytes: u64, file_total: u64, bytes: u64) -> PullEvent {
        PullEvent::Progress {
            file: file.into(),
            file_bytes,
            file_total,
            bytes,
            total_bytes: 150,
        }
    }

    /// One bar per planned file and one for the total; each ends at its
    /// size, named with the file's checksum verdict.
    #[test]
    fn bars_follow_a_pull() {
        let mut view = PullView::drawn_to(false, ProgressDrawTarget::hidden());
        let planned = |name: &str, size| PlannedFile {
            name: name.into(),
            size,
        };
        view.show(&PullEvent::Plan {
            repo: "org/m".into(),
            revision: "main".into(),
            commit: "0123456789abcdef".into(),
            files: vec![planned("a.gguf", 100), planned("config.json", 50)],
            total_bytes: 150,
        });
        assert_eq!(view.files.len(), 2);
        view.show(&progress("a.gguf", 60, 100, 60));
        assert_eq!(view.files["a.gguf"].position(), 60);
        assert_eq!(view.overall.as_ref().map(|b| b.position()), Some(60));
        view.show(&progress("a.gguf", 100, 100, 100));
        view.show(&PullEvent::FileDone {
            file: "a.gguf".into(),
            verified: true,
            cached: false,
        });
        view.show(&progress("config.json", 50, 50, 150));
        view.show(&PullEvent::FileDone {
            file: "config.json".into(),
            verified: false,
            cached: true,
        });
        view.finish();
        let a = &view.files["a.gguf"];
        assert!(a.is_finished() && a.position() == 100);
        assert_eq!(a.message(), "a.gguf (checksum ok)");
        assert_eq!(
            view.files["config.json"].message(),
            "config.json (already here)"
        );
        let all = view.overall.as_ref().expect("total bar");
        assert!(all.is_finished());
        assert_eq!((all.position(), all.length()), (150, Some(150)));
    }

    /// Quiet (or not on a terminal): no bars at all.
    #[test]
    fn quiet_pulls_draw_no_bars() {
        let mut view = PullView::drawn_to(true, ProgressDrawTarget::hidden());
        view.show(&PullEvent::Plan {
            repo: "org/m".into(),
            revision: "main".into(),
            commit: "01234567".into(),
            files: vec![PlannedFile {
                name: "a".into(),
                size: 1,
            }],
            total_bytes: 1,
        });
        assert!(view.files.is_empty() && view.overall.is_none());
    }
}
