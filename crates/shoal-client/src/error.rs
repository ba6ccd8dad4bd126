use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("request to {url} failed: {message}")]
    Transport { url: String, message: String },
    #[error("the provider's response could not be read: {0}")]
    Protocol(String),
    #[error(transparent)]
    Store(#[from] shoal_store::StoreError),
}

pub type Result<T> = std::result::Result<T, ClientError>;
