//! `shoal pull`: fetches the files a model needs from a Hugging Face hub
//! (or any server laid out like one, via `HF_ENDPOINT`) into the hub cache.
//!
//! The transfer itself is `hf-hub`'s: ranged chunks written to a
//! `.sync.part` file that a later pull resumes from. On top of it this
//! module chooses the files, skips those already present, verifies every
//! file against the hash the hub lists (sha256 for LFS files, the git blob
//! id for the rest) and reports progress as [`PullEvent`]s.
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hf_hub::api::tokio::{Api, ApiBuilder, ApiError, ApiRepo, Progress};
use hf_hub::{Repo, RepoType};
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::error::{ModelsError, Result};
use crate::library::{is_projector, Library, LocalModel};

/// `org/name[@revision]` as typed by a user.
#[derive(Debug, Clone, PartialEq)]
pub struct PullSpec {
    pub repo: String,
    pub revision: String,
    /// The GGUF file to take from a repo that has several.
    pub file: Option<String>,
    /// Or the one GGUF whose name carries this quantization (`Q4_K_M`), as
    /// Ollama names a hub model's file (`hf.co/ORG/NAME:Q4_K_M`).
    pub quant: Option<String>,
}

impl PullSpec {
    pub fn parse(spec: &str, file: Option<String>) -> Result<PullSpec> {
        let (repo, revision) = match spec.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (spec, "main"),
        };
        let valid_part = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 || !parts.iter().all(|p| valid_part(p)) {
            return Err(ModelsError::BadSpec(format!(
                "{spec:?}: expected ORG/NAME or ORG/NAME@REVISION"
            )));
        }
        if revision.is_empty() || revision.contains("..") {
            return Err(ModelsError::BadSpec(format!("{spec:?}: bad revision")));
        }
        Ok(PullSpec {
            repo: repo.to_string(),
            revision: revision.to_string(),
            file,
            quant: None,
        })
    }
}

/// How to reach the hub. `from_env` honours `HF_ENDPOINT`, `HF_TOKEN` and
/// `HF_HOME` (and the token file the Python client writes there).
#[derive(Debug, Clone)]
pub struct HubOptions {
    pub endpoint: String,
    pub token: Option<String>,
    pub library: Library,
    /// Bytes per ranged request; a cut download resumes from the last whole chunk.
    pub chunk_bytes: usize,
    /// Further attempts at a file whose transfer broke off; each resumes
    /// from the last whole chunk.
    pub retries: usize,
}

impl HubOptions {
    pub fn from_env() -> HubOptions {
        let cache = hf_hub::Cache::from_env();
        let token = std::env::var("HF_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| cache.token());
        HubOptions {
            endpoint: std::env::var("HF_ENDPOINT")
                .ok()
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .to_string(),
            token,
            library: Library::at(cache.path().clone()),
            chunk_bytes: 10 << 20,
            retries: 2,
        }
    }

    pub(crate) fn api(&self) -> Result<Api> {
        let cache = hf_hub::Cache::new(self.library.hub_dir.clone());
        ApiBuilder::from_cache(cache)
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .with_chunk_size(Some(self.chunk_bytes.max(1)))
            .build()
            .map_err(|e| ModelsError::Hub(e.to_string()))
    }

    /// `spec`'s repository at its revision, as the hub client reaches it
    /// (listing, downloading).
    pub(crate) fn repo(&self, spec: &PullSpec) -> Result<ApiRepo> {
        Ok(self.api()?.repo(Repo::with_revision(
            spec.repo.clone(),
            RepoType::Model,
            spec.revision.clone(),
        )))
    }

    /// Sends a request of the hub's own API (a search, a byte range) with
    /// the token when there is one, so every such call authenticates and
    /// words an unreachable hub alike.
    pub(crate) async fn send(&self, mut req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req.send()
            .await
            .map_err(|e| ModelsError::Hub(format!("cannot reach the hub: {e}")))
    }
}

/// What a pull reports while it runs. Byte counts only grow; the last event
/// of a successful pull is `Done`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PullEvent {
    /// The files chosen, before any transfer.
    Plan {
        repo: String,
        revision: String,
        commit: String,
        files: Vec<PlannedFile>,
        total_bytes: u64,
    },
    Progress {
        file: String,
        file_bytes: u64,
        file_total: u64,
        bytes: u64,
        total_bytes: u64,
    },
    /// A file is in place and matches the hub's hash (`verified` is false
    /// only when the hub listed no hash for it).
    FileDone {
        file: String,
        verified: bool,
        /// It was already there from an earlier pull.
        cached: bool,
    },
    Done {
        model: Box<LocalModel>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedFile {
    pub name: String,
    pub size: u64,
}

/// The hub's listing of a revision (`/api/models/{repo}/revision/{rev}?blobs=true`).
#[derive(Debug, Deserialize)]
pub(crate) struct Listing {
    pub(crate) sha: String,
    #[serde(default)]
    pub(crate) siblings: Vec<Sibling>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Sibling {
    pub(crate) rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(rename = "blobId", default)]
    blob_id: Option<String>,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Debug, Clone, Deserialize)]
struct Lfs {
    sha256: String,
    size: u64,
}

impl Sibling {
    pub(crate) fn size(&self) -> u64 {
        self.lfs.as_ref().map(|l| l.size).or(self.size).unwrap_or(0)
    }
}

/// Files a model directory needs besides its weights.
pub(crate) const DIR_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
];

/// GGUF quantizations the engine loads natively, in order of preference.
const GGUF_PREFERENCE: &[&str] = &["Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "F32"];

/// Picks what to download: one GGUF file, or a model directory's config,
/// tokenizer, template and every safetensors shard.
fn choose(spec: &PullSpec, files: &[Sibling]) -> Result<Vec<Sibling>> {
    let mut chosen = choose_model(spec, files)?;
    // A GGUF of a vision model comes with its projector, which the
    // engine finds beside it.
    if chosen.len() == 1
        && chosen[0].rfilename.ends_with(".gguf")
        && !is_projector(&chosen[0].rfilename)
    {
        chosen.extend(projector(files));
    }
    Ok(chosen)
}

/// The repository's vision projector (`mmproj-*.gguf`), if it has one:
/// F16 first (what the repositories' own instructions use), then Q8_0,
/// else the first by name.
fn projector(files: &[Sibling]) -> Option<Sibling> {
    let mut all: Vec<&Sibling> = files
        .iter()
        .filter(|f| {
            f.rfilename.ends_with(".gguf")
                && !f.rfilename.contains('/')
                && is_projector(&f.rfilename)
        })
        .collect();
    all.sort_by(|a, b| a.rfilename.cmp(&b.rfilename));
    ["F16", "Q8_0"]
        .iter()
        .find_map(|q| {
            all.iter()
                .find(|f| f.rfilename.to_ascii_uppercase().contains(q))
                .copied()
        })
        .or_else(|| all.first().copied())
        .cloned()
}

fn choose_model(spec: &PullSpec, files: &[Sibling]) -> Result<Vec<Sibling>> {
    let ggufs: Vec<&Sibling> = files
        .iter()
        .filter(|f| {
            f.rfilename.ends_with(".gguf")
                && !f.rfilename.contains('/')
                && !is_projector(&f.rfilename)
        })
        .collect();
    if let Some(want) = &spec.file {
        return files
            .iter()
            .find(|f| &f.rfilename == want)
            .map(|f| vec![f.clone()])
            .ok_or_else(|| ModelsError::MissingFile {
                repo: spec.repo.clone(),
                revision: spec.revision.clone(),
                file: want.clone(),
            });
    }
    let has_config = files.iter().any(|f| f.rfilename == "config.json");
    let shards: Vec<&Sibling> = files
        .iter()
        .filter(|f| f.rfilename.ends_with(".safetensors") && !f.rfilename.contains('/'))
        .collect();
    if let Some(q) = spec.quant.as_deref().map(str::to_ascii_uppercase) {
        let hits: Vec<&&Sibling> = ggufs
            .iter()
            .filter(|f| f.rfilename.to_ascii_uppercase().contains(&q))
            .collect();
        return match hits.as_slice() {
            [one] => Ok(vec![(**one).clone()]),
            [] => Err(ModelsError::MissingFile {
                repo: spec.repo.clone(),
                revision: spec.revision.clone(),
                file: format!("a GGUF file of quantization {q}"),
            }),
            many => Err(ModelsError::ChooseFile {
                repo: spec.repo.clone(),
                files: many
                    .iter()
                    .map(|f| f.rfilename.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        };
    }
    if has_config && !shards.is_empty() {
        let mut out: Vec<Sibling> = files
            .iter()
            .filter(|f| DIR_FILES.contains(&f.rfilename.as_str()))
            .cloned()
            .collect();
        out.extend(shards.into_iter().cloned());
        return Ok(out);
    }
    if ggufs.len() == 1 {
        return Ok(vec![ggufs[0].clone()]);
    }
    let names: Vec<String> = ggufs.iter().map(|f| f.rfilename.clone()).collect();
    for quant in GGUF_PREFERENCE {
        let hits: Vec<&&Sibling> = ggufs
            .iter()
            .filter(|f| f.rfilename.to_ascii_uppercase().contains(quant))
            .collect();
        if hits.len() == 1 {
            return Ok(vec![(*hits[0]).clone()]);
        }
    }
    if names.is_empty() {
        Err(ModelsError::NoModelFiles(spec.repo.clone()))
    } else {
        Err(ModelsError::ChooseFile {
            repo: spec.repo.clone(),
            files: names.join(", "),
        })
    }
}

/// Shared progress across the files of one pull.
struct Tally {
    done: AtomicU64,
    total: u64,
    /// Per-mille of `total` last reported, so a large pull sends ~1000 events.
    reported: AtomicU64,
    /// Bytes in the last event: never report fewer (a retried chunk is
    /// taken back from `done` before it is counted again).
    sent: AtomicU64,
    events: tokio::sync::mpsc::UnboundedSender<PullEvent>,
}

/// Feeds one file's byte counts from `hf-hub` into the tally.
#[derive(Clone)]
struct FileProgress {
    tally: Arc<Tally>,
    file: String,
    file_total: u64,
    file_done: Arc<AtomicU64>,
}

impl FileProgress {
    fn report(&self, force: bool) {
        let t = &self.tally;
        let done = t.done.load(Ordering::Relaxed);
        let permille = (done * 1000).checked_div(t.total).unwrap_or(1000);
        let last = t.reported.load(Ordering::Relaxed);
        if (force || permille > last) && t.sent.fetch_max(done, Ordering::Relaxed) <= done {
            t.reported.fetch_max(permille, Ordering::Relaxed);
            let _ = t.events.send(PullEvent::Progress {
                file: self.file.clone(),
                file_bytes: self.file_done.load(Ordering::Relaxed),
                file_total: self.file_total,
                bytes: done,
                total_bytes: t.total,
            });
        }
    }
}

impl Progress for FileProgress {
    async fn init(&mut self, _size: usize, _filename: &str) {}

    async fn update(&mut self, size: usize) {
        // hf-hub reports a resumed file's committed bytes first, then each
        // network read; a chunk retried after a cut is counted again, so
        // cap at the file's size to keep the totals honest.
        let before = self.file_done.load(Ordering::Relaxed);
        let after = (before + size as u64).min(self.file_total);
        self.file_done.store(after, Ordering::Relaxed);
        self.tally.done.fetch_add(after - before, Ordering::Relaxed);
        self.report(false);
    }

    async fn finish(&mut self) {
        self.report(true);
    }
}

/// Downloads `spec` into the library, sending progress to `events`.
/// Files already present and intact are not fetched again.
pub async fn pull(
    spec: &PullSpec,
    opts: &HubOptions,
    events: tokio::sync::mpsc::UnboundedSender<PullEvent>,
) -> Result<LocalModel> {
    let repo = opts.repo(spec)?;
    let listing = list(&repo, spec).await?;
    let chosen = choose(spec, &listing.siblings)?;
    let total: u64 = chosen.iter().map(Sibling::size).sum();
    let _ = events.send(PullEvent::Plan {
        repo: spec.repo.clone(),
        revision: spec.revision.clone(),
        commit: listing.sha.clone(),
        files: chosen
            .iter()
            .map(|f| PlannedFile {
                name: f.rfilename.clone(),
                size: f.size(),
            })
            .collect(),
        total_bytes: total,
    });
    let tally = Arc::new(Tally {
        done: AtomicU64::new(0),
        total,
        reported: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        events: events.clone(),
    });
    let snapshot = opts.library.snapshot_dir(&spec.repo, &listing.sha);
    for file in &chosen {
        let progress = FileProgress {
            tally: tally.clone(),
            file: file.rfilename.clone(),
            file_total: file.size(),
            file_done: Arc::new(AtomicU64::new(0)),
        };
        let local = snapshot.join(&file.rfilename);
        let cached = intact(&local, file).await;
        if !cached {
            let got = fetch(&repo, spec, opts, &file.rfilename, &progress).await?;
            if got != local {
                return Err(ModelsError::Hub(format!(
                    "{}: the hub served commit {} but listed {}",
                    file.rfilename,
                    got.display(),
                    listing.sha
                )));
            }
            if !matches_hash(&local, file).await? {
                discard(&local);
                return Err(ModelsError::Checksum {
                    file: file.rfilename.clone(),
                });
            }
        } else {
            progress.clone().update(file.size() as usize).await;
        }
        progress.report(true);
        let _ = events.send(PullEvent::FileDone {
            file: file.rfilename.clone(),
            verified: file.lfs.is_some() || file.blob_id.is_some(),
            cached,
        });
    }
    // Nothing left half-written: a listed main commit makes the library
    // show this snapshot.
    let model_path = if chosen[0].rfilename.ends_with(".gguf") {
        snapshot.join(&chosen[0].rfilename)
    } else {
        snapshot.clone()
    };
    let model = opts
        .library
        .list()
        .into_iter()
        .find(|m| m.path == model_path)
        .ok_or_else(|| ModelsError::Unreadable {
            path: model_path.clone(),
            why: "downloaded, but not a loadable model".into(),
        })?;
    let _ = events.send(PullEvent::Done {
        model: Box::new(model.clone()),
    });
    Ok(model)
}

/// Downloads one file, trying again (resuming) after a broken transfer.
async fn fetch(
    repo: &ApiRepo,
    spec: &PullSpec,
    opts: &HubOptions,
    name: &str,
    progress: &FileProgress,
) -> Result<std::path::PathBuf> {
    let mut attempt = 0;
    loop {
        match repo.download_with_progress(name, progress.clone()).await {
            Ok(path) => return Ok(path),
            Err(e) => {
                let err = hub_error(e, spec, Some(name));
                if !matches!(err, ModelsError::Hub(_)) || attempt >= opts.retries {
                    return Err(err);
                }
                attempt += 1;
                tracing::warn!(file = name, attempt, error = %err, "transfer broke off; resuming");
                // hf-hub reports the committed bytes again on resume.
                let done = progress.file_done.swap(0, Ordering::Relaxed);
                progress.tally.done.fetch_sub(done, Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(200 * attempt as u64)).await;
            }
        }
    }
}

pub(crate) async fn list(repo: &ApiRepo, spec: &PullSpec) -> Result<Listing> {
    let resp = repo
        .info_request()
        .query(&[("blobs", "true")])
        .send()
        .await
        .map_err(|e| ModelsError::Hub(format!("cannot reach the hub: {e}")))?;
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        return Err(ModelsError::Unauthorized(spec.repo.clone()));
    }
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(ModelsError::RepoNotFound {
            repo: spec.repo.clone(),
            revision: spec.revision.clone(),
        });
    }
    if !status.is_success() {
        return Err(ModelsError::Hub(format!(
            "listing {}@{}: HTTP {status}",
            spec.repo, spec.revision
        )));
    }
    resp.json()
        .await
        .map_err(|e| ModelsError::Hub(format!("listing {}: {e}", spec.repo)))
}

fn hub_error(e: ApiError, spec: &PullSpec, file: Option<&str>) -> ModelsError {
    if let ApiError::RequestError(r) = &e {
        match r.status().map(|s| s.as_u16()) {
            Some(401 | 403) => return ModelsError::Unauthorized(spec.repo.clone()),
            Some(404) => {
                return ModelsError::MissingFile {
                    repo: spec.repo.clone(),
                    revision: spec.revision.clone(),
                    file: file.unwrap_or_default().to_string(),
                }
            }
            _ => {}
        }
    }
    let what = file.unwrap_or(&spec.repo);
    ModelsError::Hub(format!("{what}: {e} (run the pull again to resume)"))
}

/// A file from an earlier pull that still has the listed size and hash.
async fn intact(local: &Path, file: &Sibling) -> bool {
    let Ok(meta) = tokio::fs::metadata(local).await else {
        return false;
    };
    meta.len() == file.size() && matches_hash(local, file).await.unwrap_or(false)
}

/// Checks a file against the hub's listing: sha256 for LFS files, the git
/// blob id (sha1 of `blob <len>\0` + content) for small ones.
async fn matches_hash(path: &Path, file: &Sibling) -> Result<bool> {
    let path = path.to_path_buf();
    let file = file.clone();
    tokio::task::spawn_blocking(move || -> Result<bool> {
        if let Some(lfs) = &file.lfs {
            Ok(hex_digest::<sha2::Sha256>(&path, None)? == lfs.sha256.to_ascii_lowercase())
        } else if let Some(oid) = &file.blob_id {
            let len = std::fs::metadata(&path)?.len();
            let prefix = format!("blob {len}\0");
            Ok(hex_digest::<sha1::Sha1>(&path, Some(prefix.as_bytes()))?
                == oid.to_ascii_lowercase())
        } else {
            Ok(true)
        }
    })
    .await
    .map_err(|e| ModelsError::Hub(format!("hashing: {e}")))?
}

fn hex_digest<D: Digest>(path: &Path, prefix: Option<&[u8]>) -> Result<String> {
    let mut hasher = D::new();
    if let Some(p) = prefix {
        hasher.update(p);
    }
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Removes a bad download: the snapshot link and the blob behind it.
fn discard(pointer: &Path) {
    if let Ok(blob) = std::fs::canonicalize(pointer) {
        let _ = std::fs::remove_file(blob);
    }
    let _ = std::fs::remove_file(pointer);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sib(name: &str) -> Sibling {
        Sibling {
            rfilename: name.into(),
            size: Some(1),
            blob_id: None,
            lfs: None,
        }
    }

    fn spec(file: Option<&str>) -> PullSpec {
        PullSpec::parse("org/model", file.map(str::to_string)).unwrap()
    }

    fn names(v: Vec<Sibling>) -> Vec<String> {
        v.into_iter().map(|s| s.rfilename).collect()
    }

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let s = PullSpec::parse("mlx-community/Qwen3-0.6B-4bit@abc123", None).unwrap();
        assert_eq!(
            (s.repo.as_str(), s.revision.as_str()),
            ("mlx-community/Qwen3-0.6B-4bit", "abc123")
        );
        assert_eq!(PullSpec::parse("a/b", None).unwrap().revision, "main");
        for bad in ["noslash", "a/b/c", "../x", "a/..", "a/b@", "a b/c", ""] {
            assert!(PullSpec::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_directory_model_takes_config_tokenizer_and_every_shard() {
        let files: Vec<Sibling> = [
            "README.md",
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "pytorch_model.bin",
            "images/a.png",
        ]
        .iter()
        .map(|n| sib(n))
        .collect();
        let got = names(choose(&spec(None), &files).unwrap());
        assert_eq!(
            got,
            [
                "config.json",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
    }

    #[test]
    fn a_quantization_picks_its_one_gguf() {
        let files: Vec<Sibling> = ["m-Q4_K_M.gguf", "m-q8_0.gguf", "m-Q4_K_S.gguf"]
            .iter()
            .map(|n| sib(n))
            .collect();
        let with = |q: &str| PullSpec {
            quant: Some(q.into()),
            ..spec(None)
        };
        assert_eq!(
            names(choose(&with("q4_k_m"), &files).unwrap()),
            ["m-Q4_K_M.gguf"]
        );
        assert!(matches!(
            choose(&with("Q5_0"), &files).unwrap_err(),
            ModelsError::MissingFile { .. }
        ));
        assert!(matches!(
            choose(&with("Q4_K"), &files).unwrap_err(),
            ModelsError::ChooseFile { .. }
        ));
    }

    #[test]
    fn a_vision_gguf_comes_with_its_projector_which_is_never_taken_for_the_model() {
        let files: Vec<Sibling> = [
            "mmproj-m-Q8_0.gguf",
            "mmproj-m-f16.gguf",
            "m-Q4_K_M.gguf",
            "m-Q8_0.gguf",
        ]
        .into_iter()
        .map(sib)
        .collect();
        assert_eq!(
            names(choose(&spec(None), &files).unwrap()),
            ["m-Q8_0.gguf", "mmproj-m-f16.gguf"]
        );
        assert_eq!(
            names(choose(&spec(Some("m-Q4_K_M.gguf")), &files).unwrap()),
            ["m-Q4_K_M.gguf", "mmproj-m-f16.gguf"]
        );
        // A text-only repository gets no projector.
        let text: Vec<Sibling> = ["m-Q4_K_M.gguf"].into_iter().map(sib).collect();
        assert_eq!(
            names(choose(&spec(None), &text).unwrap()),
            ["m-Q4_K_M.gguf"]
        );
    }

    #[test]
    fn a_gguf_repo_gives_one_file_by_preference_or_by_name() {
        let files: Vec<Sibling> = ["m-Q2_K.gguf", "m-q8_0.gguf", "m-Q4_K_M.gguf", "README.md"]
            .iter()
            .map(|n| sib(n))
            .collect();
        assert_eq!(names(choose(&spec(None), &files).unwrap()), ["m-q8_0.gguf"]);
        assert_eq!(
            names(choose(&spec(Some("m-Q2_K.gguf")), &files).unwrap()),
            ["m-Q2_K.gguf"]
        );
        let err = choose(&spec(Some("nope.gguf")), &files).unwrap_err();
        assert!(matches!(err, ModelsError::MissingFile { .. }), "{err}");
        let only_k: Vec<Sibling> = ["m-Q2_K.gguf", "m-Q6_K.gguf"]
            .iter()
            .map(|n| sib(n))
            .collect();
        let err = choose(&spec(None), &only_k).unwrap_err().to_string();
        assert!(err.contains("m-Q2_K.gguf, m-Q6_K.gguf"), "{err}");
        let err = choose(&spec(None), &[sib("README.md")]).unwrap_err();
        assert!(matches!(err, ModelsError::NoModelFiles(_)), "{err}");
    }
}
