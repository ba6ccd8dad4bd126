use std::path::PathBuf;

/// Everything that can go wrong pulling, listing or removing models.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    #[error("{0}")]
    BadSpec(String),
    #[error("{repo}@{revision} was not found on the hub")]
    RepoNotFound { repo: String, revision: String },
    #[error("{file} is not in {repo}@{revision}")]
    MissingFile {
        repo: String,
        revision: String,
        file: String,
    },
    #[error("the hub refused access to {0}: set HF_TOKEN to a token that may read it")]
    Unauthorized(String),
    #[error("{file}: the downloaded bytes do not match the hub's checksum; the file was removed, pull again")]
    Checksum { file: String },
    #[error("{0} has no model files (a .gguf file, or config.json with .safetensors weights)")]
    NoModelFiles(String),
    #[error("{repo} has several GGUF files; choose one with --file: {files}")]
    ChooseFile { repo: String, files: String },
    #[error("no local model {0:?} (see `shoal models`)")]
    NotFound(String),
    #[error("{path}: {why}")]
    Unreadable { path: PathBuf, why: String },
    #[error("hub: {0}")]
    Hub(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, ModelsError>;
