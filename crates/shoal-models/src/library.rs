//! The models on this machine: what `shoal pull` put in the Hugging Face
//! cache (the layout the Python hub client uses, so models it downloaded show
//! up too) plus models named by path in the config.
//!
//! Ids: a model directory is its repo id (`org/name`); a GGUF file is
//! `org/name/FILE.gguf`, and `org/name` also finds it while the repo holds
//! only one GGUF file.
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::card::ModelCard;
use crate::error::{ModelsError, Result};

/// Where a local model came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// Pulled from a hub: repository and the commit the files are from.
    Hub { repo: String, commit: String },
    /// A path given in the config or on the command line.
    Path,
}

/// One model on disk.
#[derive(Debug, Clone, Serialize)]
pub struct LocalModel {
    pub id: String,
    /// The `.gguf` file or model directory the engine loads.
    pub path: PathBuf,
    pub source: Source,
    #[serde(flatten)]
    pub card: ModelCard,
}

/// The hub cache directory models are pulled into and listed from.
#[derive(Debug, Clone)]
pub struct Library {
    /// `<HF_HOME>/hub`.
    pub hub_dir: PathBuf,
}

impl Library {
    /// `$HF_HOME/hub`, or `~/.cache/huggingface/hub` like the Python client.
    pub fn from_env() -> Library {
        Library {
            hub_dir: hf_hub::Cache::from_env().path().clone(),
        }
    }

    pub fn at(hub_dir: impl Into<PathBuf>) -> Library {
        Library {
            hub_dir: hub_dir.into(),
        }
    }

    /// Every loadable model in the cache, sorted by id. Unreadable entries
    /// are skipped with a warning rather than hiding the rest.
    pub fn list(&self) -> Vec<LocalModel> {
        let mut out = Vec::new();
        let Ok(repos) = std::fs::read_dir(&self.hub_dir) else {
            return out;
        };
        for repo_dir in repos.flatten() {
            let name = repo_dir.file_name().to_string_lossy().into_owned();
            let Some(repo) = repo_id(&name) else { continue };
            let Some((commit, snapshot)) = latest_snapshot(&repo_dir.path()) else {
                continue;
            };
            for (id, path) in models_in(&repo, &snapshot) {
                match ModelCard::read(&path) {
                    Ok(card) => out.push(LocalModel {
                        id,
                        path,
                        source: Source::Hub {
                            repo: repo.clone(),
                            commit: commit.clone(),
                        },
                        card,
                    }),
                    Err(e) => tracing::warn!(%id, error = %e, "skipping unreadable model"),
                }
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The model a client's name refers to: an exact id, or a repo id whose
    /// snapshot holds exactly one GGUF file.
    pub fn find(&self, id: &str) -> Option<LocalModel> {
        let all = self.list();
        if let Some(m) = all.iter().find(|m| m.id == id) {
            return Some(m.clone());
        }
        let mut in_repo = all
            .into_iter()
            .filter(|m| matches!(&m.source, Source::Hub { repo, .. } if repo == id));
        match (in_repo.next(), in_repo.next()) {
            (Some(only), None) => Some(only),
            _ => None,
        }
    }

    /// Deletes a pulled model's files (and its repo folder once nothing is
    /// left in it). Returns the bytes freed.
    pub fn remove(&self, id: &str) -> Result<u64> {
        let model = self
            .find(id)
            .ok_or_else(|| ModelsError::NotFound(id.to_string()))?;
        let Source::Hub { repo, .. } = &model.source else {
            return Err(ModelsError::NotFound(id.to_string()));
        };
        let repo_dir = self.hub_dir.join(folder_name(repo));
        let others = self
            .list()
            .into_iter()
            .filter(|m| {
                m.id != model.id && matches!(&m.source, Source::Hub { repo: r, .. } if r == repo)
            })
            .count();
        let freed = model.card.size_bytes;
        if others == 0 {
            std::fs::remove_dir_all(&repo_dir)?;
        } else {
            // Another GGUF of the same repo stays: drop this file and its blob.
            let blob = std::fs::canonicalize(&model.path)?;
            std::fs::remove_file(&model.path)?;
            if blob.starts_with(repo_dir.join("blobs")) {
                std::fs::remove_file(blob)?;
            }
        }
        Ok(freed)
    }

    /// The snapshot folder `commit` of `repo` would be in.
    pub fn snapshot_dir(&self, repo: &str, commit: &str) -> PathBuf {
        self.hub_dir
            .join(folder_name(repo))
            .join("snapshots")
            .join(commit)
    }
}

/// `org/name` → `models--org--name`, the hub cache's folder name.
pub fn folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

fn repo_id(folder: &str) -> Option<String> {
    let rest = folder.strip_prefix("models--")?;
    Some(rest.replace("--", "/"))
}

/// The snapshot `refs/main` points at, else the most recently written one.
fn latest_snapshot(repo_dir: &Path) -> Option<(String, PathBuf)> {
    let snapshots = repo_dir.join("snapshots");
    if let Ok(main) = std::fs::read_to_string(repo_dir.join("refs").join("main")) {
        let commit = main.trim().to_string();
        let dir = snapshots.join(&commit);
        if dir.is_dir() {
            return Some((commit, dir));
        }
    }
    std::fs::read_dir(&snapshots)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
}

/// The models a snapshot holds: each GGUF file, or the folder itself when it
/// has a config and safetensors weights.
/// Whether a file name is a vision model's projector (`mmproj-….gguf`), as
/// GGUF repositories and llama.cpp name them.
pub fn is_projector(name: &str) -> bool {
    name.to_ascii_lowercase().starts_with("mmproj")
}

fn models_in(repo: &str, snapshot: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(snapshot) else {
        return Vec::new();
    };
    let files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    let has = |ext: &str| {
        files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == ext))
    };
    let mut out: Vec<(String, PathBuf)> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "gguf"))
        // A vision projector rides beside its model; it is not one.
        .filter(|f| !is_projector(&f.file_name().unwrap_or_default().to_string_lossy()))
        .filter_map(|f| {
            let name = f.file_name()?.to_string_lossy().into_owned();
            Some((format!("{repo}/{name}"), f.clone()))
        })
        .collect();
    if snapshot.join("config.json").is_file() && has("safetensors") {
        out.push((repo.to_string(), snapshot.to_path_buf()));
    }
    out
}
