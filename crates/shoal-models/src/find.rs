//! Finding a model on the hub before downloading it: a search by name
//! (`/api/models?search=`), a repository's model files with their
//! quantization and size, and a GGUF file's header read from its first bytes
//! by ranged requests, so whoever asks can estimate the memory a file takes
//! once loaded without fetching its weights.
use serde::{Deserialize, Serialize};

use crate::error::{ModelsError, Result};
use crate::hub::{list, HubOptions, PullSpec, Sibling, DIR_FILES};

/// A repository the hub's search found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubRepo {
    pub id: String,
    #[serde(default)]
    pub downloads: u64,
    #[serde(default)]
    pub likes: u64,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// What a file of a repository is to Shoal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// One GGUF file: a model by itself (llama.cpp).
    Gguf,
    /// A Hugging Face / MLX directory: config, tokenizer and safetensors
    /// shards, pulled together (MLX).
    Directory,
}

/// A model a repository offers: a GGUF file, or the repository's directory
/// of safetensors shards taken as one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HubFile {
    /// The file's name; for a directory, the repository's name.
    pub name: String,
    pub kind: FileKind,
    /// Bytes to download (every shard and side file of a directory).
    pub size_bytes: u64,
    /// As the file's name says (`Q4_K_M`, `F16`…); none for a directory.
    pub quantization: Option<String>,
}

/// A repository's model files at a revision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RepoFiles {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<HubFile>,
}

/// The hub's models whose names contain `query`, most downloaded first, at most `limit`.
pub async fn search(opts: &HubOptions, query: &str, limit: usize) -> Result<Vec<HubRepo>> {
    let url = format!("{}/api/models", opts.endpoint);
    let req = reqwest::Client::new().get(&url).query(&[
        ("search", query),
        ("sort", "downloads"),
        ("direction", "-1"),
        ("limit", &limit.to_string()),
    ]);
    let resp = opts.send(req).await?;
    let status = resp.status();
    if !status.is_success() {
        return Err(ModelsError::Hub(format!(
            "searching {query:?}: HTTP {status}"
        )));
    }
    resp.json()
        .await
        .map_err(|e| ModelsError::Hub(format!("searching {query:?}: {e}")))
}

/// The model files of `spec`'s repository: each GGUF file at its top
/// level, and the safetensors directory when it has a `config.json`.
pub async fn files(opts: &HubOptions, spec: &PullSpec) -> Result<RepoFiles> {
    let listing = list(&opts.repo(spec)?, spec).await?;
    let top = |f: &&Sibling| !f.rfilename.contains('/');
    let mut files: Vec<HubFile> = listing
        .siblings
        .iter()
        .filter(top)
        .filter(|f| f.rfilename.ends_with(".gguf"))
        .map(|f| HubFile {
            name: f.rfilename.clone(),
            kind: FileKind::Gguf,
            size_bytes: f.size(),
            quantization: quantization_in(&f.rfilename),
        })
        .collect();
    let has_config = listing
        .siblings
        .iter()
        .any(|f| f.rfilename == "config.json");
    let shards = listing
        .siblings
        .iter()
        .filter(top)
        .filter(|f| f.rfilename.ends_with(".safetensors"));
    if has_config && shards.clone().next().is_some() {
        let side: u64 = listing
            .siblings
            .iter()
            .filter(|f| DIR_FILES.contains(&f.rfilename.as_str()))
            .map(Sibling::size)
            .sum();
        files.push(HubFile {
            name: spec.repo.clone(),
            kind: FileKind::Directory,
            size_bytes: side + shards.map(Sibling::size).sum::<u64>(),
            quantization: None,
        });
    }
    if files.is_empty() {
        return Err(ModelsError::NoModelFiles(spec.repo.clone()));
    }
    files.sort_by(|a, b| a.size_bytes.cmp(&b.size_bytes).then(a.name.cmp(&b.name)));
    Ok(RepoFiles {
        repo: spec.repo.clone(),
        revision: spec.revision.clone(),
        commit: listing.sha,
        files,
    })
}

/// The quantization a GGUF file's name carries, as the hub's uploaders
/// name them (`…-Q4_K_M.gguf`, `….IQ3_XXS.gguf`, `…-f16.gguf`, `…-bf16.gguf`).
pub fn quantization_in(name: &str) -> Option<String> {
    let stem = name
        .strip_suffix(".gguf")
        .unwrap_or(name)
        .to_ascii_uppercase();
    let parts: Vec<&str> = stem.split(['-', '.']).collect();
    // The last part that reads as a quantization (`Q4_K_M`, `IQ2_XS`, `F16`, `BF16`, `MXFP4`…).
    parts.iter().rev().find_map(|p| {
        let q = p.trim_start_matches("UD_");
        // A letter code then the bits: Q4_0, Q4_K_M, IQ3_XXS, TQ1_0.
        let coded = ["Q", "IQ", "TQ"].iter().any(|pre| {
            q.strip_prefix(pre)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        }) && q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let known = ["F32", "F16", "BF16", "MXFP4"].contains(&q) || coded;
        known.then(|| q.to_string())
    })
}

/// The header of the GGUF file `file` of `spec`, read from its first bytes
/// (a few MiB, more while the header runs on; at most 64 MiB).
pub async fn gguf_header(
    opts: &HubOptions,
    spec: &PullSpec,
    file: &str,
    file_len: u64,
) -> Result<shoal_gguf::Header> {
    let url = format!(
        "{}/{}/resolve/{}/{}",
        opts.endpoint, spec.repo, spec.revision, file
    );
    let client = reqwest::Client::new();
    let mut want: u64 = 4 << 20;
    loop {
        let n = want.min(file_len.max(1));
        let req = client
            .get(&url)
            .header(reqwest::header::RANGE, format!("bytes=0-{}", n - 1));
        let resp = opts.send(req).await?;
        let status = resp.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(ModelsError::Unauthorized(spec.repo.clone()));
        }
        if !status.is_success() {
            return Err(ModelsError::Hub(format!("{file}: HTTP {status}")));
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ModelsError::Hub(format!("{file}: {e}")))?;
        let name = std::path::Path::new(file);
        match shoal_gguf::Header::from_prefix(&bytes, file_len, name) {
            Err(shoal_gguf::GgufError::CutShort { .. }) if n < file_len && n < 64 << 20 => {
                want = n * 4;
            }
            Err(e) => return Err(ModelsError::Hub(e.to_string())),
            Ok(h) => return Ok(h),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::quantization_in;

    #[test]
    fn quantization_is_read_from_the_names_uploaders_use() {
        for (name, q) in [
            ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", Some("Q4_K_M")),
            ("SmolLM2-135M-Instruct.Q4_1.gguf", Some("Q4_1")),
            ("Llama-3.2-1B-Instruct-IQ3_XXS.gguf", Some("IQ3_XXS")),
            ("gemma-3-270m-it-bf16.gguf", Some("BF16")),
            ("model-f16.gguf", Some("F16")),
            ("Qwen3-4B-UD-Q4_K_XL.gguf", Some("Q4_K_XL")),
            ("gpt-oss-20b-MXFP4.gguf", Some("MXFP4")),
            ("model.gguf", None),
            ("Qwen-7B.gguf", None),
            ("Qwen3-4B.gguf", None),
        ] {
            assert_eq!(quantization_in(name).as_deref(), q, "{name}");
        }
    }
}
