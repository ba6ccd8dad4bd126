//! Errors in each dialect's own shape and status.
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use shoal_engine::EngineError;

/// The shape and statuses of an error body, as a dialect chooses it
/// (`dialect::Words::error_shape`): data, so a dialect with a format of its
/// own declares it in its module (Anthropic's is
/// `dialects::anthropic::ERRORS`). OpenAI's, for its dialects and Shoal's
/// own routes, and the plain `{"error": "message"}` (Ollama's) are here.
#[derive(Clone, Copy)]
pub struct ErrorShape {
    /// Names the shape in logs and comparisons.
    pub name: &'static str,
    /// The error object in this shape's words, without usage.
    pub object: fn(&ApiError) -> serde_json::Value,
    /// The status an overloaded server answers with.
    pub overloaded: StatusCode,
}

impl PartialEq for ErrorShape {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for ErrorShape {}

impl std::fmt::Debug for ErrorShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ErrorShape({})", self.name)
    }
}

impl ErrorShape {
    /// OpenAI's: `{"error": {"message", "type", "param", "code"}}`; overload
    /// is a 429.
    pub const OPENAI: ErrorShape = ErrorShape {
        name: "openai",
        object: openai_object,
        overloaded: StatusCode::TOO_MANY_REQUESTS,
    };
    /// `{"error": "message"}`; overload is a 503.
    pub const PLAIN: ErrorShape = ErrorShape {
        name: "plain",
        object: |e| json!({"error": e.message}),
        overloaded: StatusCode::SERVICE_UNAVAILABLE,
    };
}

fn openai_object(e: &ApiError) -> serde_json::Value {
    let kind = match e.kind {
        ErrorKind::InvalidRequest | ErrorKind::NotFound | ErrorKind::TooLarge => {
            "invalid_request_error"
        }
        ErrorKind::Overloaded | ErrorKind::RateLimited { .. } => "rate_limit_error",
        ErrorKind::Unauthorized => "authentication_error",
        ErrorKind::Forbidden => "permission_error",
        ErrorKind::Timeout => "timeout_error",
        ErrorKind::Unavailable | ErrorKind::Upstream | ErrorKind::Internal => "server_error",
    };
    json!({"error": {"message": e.message, "type": kind, "param": e.param, "code": e.code}})
}

/// What went wrong, independent of dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    NotFound,
    TooLarge,
    Overloaded,
    /// A feature this server runs without (e.g. no conversation store).
    Unavailable,
    /// A server this one relies on failed (the model hub).
    Upstream,
    /// Missing or wrong credentials (API key, cluster signature).
    Unauthorized,
    /// Credentials fine, request not allowed (a foreign browser origin).
    Forbidden,
    /// The request ran past the server's time limit.
    Timeout,
    /// The API key is over its quota; try again after this many seconds.
    RateLimited {
        retry_after_secs: u64,
    },
    Internal,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The offending parameter, when known (OpenAI's `param`).
    pub param: Option<String>,
    /// A machine-readable code (OpenAI's `code`).
    pub code: Option<&'static str>,
    /// The dialect's usage object when a generation ended in this error (a
    /// timeout, an engine failure): sent beside the error, so a client
    /// still learns what the request spent. (Boxed: errors travel in
    /// `Result`s on every path and are kept small.)
    pub usage: Option<Box<serde_json::Value>>,
}

impl ApiError {
    /// An error of `kind`; the code, the parameter and the usage are added
    /// by the `with_` builders.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
            usage: None,
        }
    }
    /// Names the offending parameter (OpenAI's `param`).
    pub fn with_param(self, param: &str) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..self
        }
    }
    /// Sets the machine-readable code (OpenAI's `code`).
    pub fn with_code(self, code: &'static str) -> Self {
        ApiError {
            code: Some(code),
            ..self
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::InvalidRequest, message)
    }
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        ApiError::invalid(message).with_param(param)
    }
    pub fn model_not_found(model: &str) -> Self {
        ApiError::not_found(format!(
            "The model '{model}' does not exist or is not loaded"
        ))
        .with_param("model")
        .with_code("model_not_found")
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::NotFound, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Unavailable, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Unauthorized, message).with_code("unauthorized")
    }
    /// The engine failed part-way through a generation.
    pub fn generation_failed(detail: &str) -> Self {
        ApiError::internal(format!("generation failed: {detail}"))
    }
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Internal, message)
    }

    pub fn status(&self, dialect: ErrorShape) -> StatusCode {
        match self.kind {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Overloaded => dialect.overloaded,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Sets the usage a failed generation reports beside its error.
    pub fn with_usage(self, usage: serde_json::Value) -> Self {
        ApiError {
            usage: Some(Box::new(usage)),
            ..self
        }
    }

    /// The error as it appears in a body or a stream event, with the usage
    /// of a failed generation beside it (the official SDKs read `error`
    /// and let other top-level keys be).
    pub fn body(&self, dialect: ErrorShape) -> serde_json::Value {
        let mut body = self.error_object(dialect);
        if let (Some(usage), Some(obj)) = (&self.usage, body.as_object_mut()) {
            obj.insert("usage".into(), (**usage).clone());
        }
        body
    }

    /// The error object in the shape's words, without usage.
    fn error_object(&self, dialect: ErrorShape) -> serde_json::Value {
        (dialect.object)(self)
    }

    pub fn in_dialect(self, dialect: impl Into<ErrorShape>) -> DialectError {
        DialectError {
            dialect: dialect.into(),
            error: self,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match &e {
            EngineError::InvalidRequest(_) | EngineError::Template(_) => {
                ApiError::invalid(e.to_string())
            }
            // A prompt too long for the window (in tokens, or positions with
            // M-RoPE images) or for the KV cells one request may hold.
            EngineError::ContextOverflow { .. }
            | EngineError::PositionOverflow { .. }
            | EngineError::CellOverflow { .. } => {
                ApiError::invalid(e.to_string()).with_code("context_length_exceeded")
            }
            EngineError::WrongKind(_) => ApiError::invalid(e.to_string())
                .with_param("model")
                .with_code("model_not_supported"),
            EngineError::Unavailable(_) => {
                ApiError::new(ErrorKind::Overloaded, format!("{e}; retry shortly"))
                    .with_code("overloaded")
            }
            _ => ApiError::internal(e.to_string()),
        }
    }
}

/// An error bound to the dialect it must be rendered in.
#[derive(Debug)]
pub struct DialectError {
    pub dialect: ErrorShape,
    pub error: ApiError,
}

/// The message of an error response this server made, beside its body, so
/// the ledger records a refusal from the error itself.
#[derive(Clone, Debug)]
pub struct Refusal(pub String);

/// Seconds a client should wait after an overload answer.
pub const RETRY_AFTER_SECS: u64 = 1;

impl IntoResponse for DialectError {
    fn into_response(self) -> Response {
        let status = self.error.status(self.dialect);
        let mut resp = (status, axum::Json(self.error.body(self.dialect))).into_response();
        resp.extensions_mut()
            .insert(Refusal(self.error.message.clone()));
        let retry_after = match self.error.kind {
            ErrorKind::Overloaded => Some(RETRY_AFTER_SECS),
            ErrorKind::RateLimited { retry_after_secs } => Some(retry_after_secs.max(1)),
            _ => None,
        };
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
