//! One error type for the engine; adapters map its variants to HTTP statuses.
use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    /// A model file or directory is missing a piece we need.
    #[error("model is missing {what}: {detail}")]
    MissingModelPart { what: String, detail: String },
    /// The model is of an architecture or format we do not run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// The model files are present but malformed.
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// The tokenizer could not be built or failed on input.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The chat template failed to render.
    #[error("chat template error: {0}")]
    Template(String),
    /// The caller asked for something impossible (bad parameters, prompt too long).
    #[error("{0}")]
    InvalidRequest(String),
    /// The rendered prompt does not fit the model's context window.
    #[error(
        "prompt has {prompt_tokens} tokens but the model's context window is {context} tokens"
    )]
    ContextOverflow {
        prompt_tokens: usize,
        context: usize,
    },
    /// An image prompt whose positions do not fit the model's window (an
    /// M-RoPE image takes fewer positions than tokens, so its tokens alone
    /// say too much).
    #[error(
        "prompt takes {positions} positions ({prompt_tokens} tokens, its images' included) but the model's context window is {context} positions"
    )]
    PositionOverflow {
        positions: usize,
        prompt_tokens: usize,
        context: usize,
    },
    /// A prompt whose positions fit the window but whose tokens do not fit
    /// the KV cells one request may hold.
    #[error(
        "prompt has {prompt_tokens} tokens, its images' included, but the KV cache holds at most {cells} for one request (--kv-cache-tokens)"
    )]
    CellOverflow { prompt_tokens: usize, cells: usize },
    /// A generation model asked for embeddings, or an embedding model asked
    /// to generate.
    #[error("{0}")]
    WrongKind(String),
    /// The backend (MLX or llama.cpp) raised an error.
    #[error("backend error: {0}")]
    Backend(String),
    /// Every KV position the backend reserved is in use (llama.cpp's cell
    /// pool); the engine frees prefix-cache entries and tries again.
    #[error("the KV cache is full: raise kv_cache_tokens or send fewer concurrent requests")]
    KvCacheFull,
    /// The engine thread is gone or its queue is full.
    #[error("engine unavailable: {0}")]
    Unavailable(String),
    /// An image the request sent was refused (bad, too large, or the model
    /// cannot read images).
    #[error("{0}")]
    Image(#[from] crate::vision::ImageError),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl From<mlx_rs::error::Exception> for EngineError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        EngineError::Backend(e.to_string())
    }
}
