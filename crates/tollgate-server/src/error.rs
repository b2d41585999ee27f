//! The one error type of the service. Transports map it once, at their boundary, by
//! `ApiError::class`: HTTP to a status and `{"error":{"code","message"}}`, gRPC to a
//! `tonic::Status`.

use tollgate_core::store::StoreError;

/// What kind of failure an [`ApiError`] is, independent of the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The client sent something invalid (HTTP 400, gRPC INVALID_ARGUMENT).
    InvalidInput,
    /// The body is too large (HTTP 413, gRPC RESOURCE_EXHAUSTED / INVALID_ARGUMENT).
    TooLarge,
    /// Wrong content type (HTTP 415).
    UnsupportedMediaType,
    /// No such endpoint (HTTP 404).
    NotFound,
    /// The endpoint exists, not with this method (HTTP 405).
    MethodNotAllowed,
    /// The store could not decide (HTTP 503, gRPC UNAVAILABLE).
    Unavailable,
    /// A bug (HTTP 500, gRPC INTERNAL).
    Internal,
}

/// Everything that can go wrong serving a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The request is invalid; `code` is a stable machine-readable identifier.
    #[error("{message}")]
    Invalid {
        /// Stable code, e.g. `invalid_json`, `domain_empty`, `too_many_descriptors`.
        code: &'static str,
        /// Human-readable explanation.
        message: String,
    },
    /// The body is larger than the configured limit.
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body did not arrive within the body-read timeout (HTTP 408; the connection is
    /// closed).
    #[error("request body not received within {} ms", .0.as_millis())]
    BodyTimeout(std::time::Duration),
    /// The body is not JSON.
    #[error("unsupported content type `{0}`: send `Content-Type: application/json`")]
    UnsupportedMediaType(String),
    /// No route.
    #[error("{0}")]
    NotFound(String),
    /// A route, not for this method.
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// A bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// An invalid-input error.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            code,
            message: message.into(),
        }
    }

    /// `too_many_descriptors`: a request with more than `max` descriptors. The message names the
    /// limit, not the total: the readers stop at the first descriptor past it.
    pub(crate) fn too_many_descriptors(max: usize) -> Self {
        Self::invalid(
            "too_many_descriptors",
            format!("more than the maximum {max} descriptors"),
        )
    }

    /// `too_many_entries`: descriptor `i` has more than `max` entries (named as
    /// [`ApiError::too_many_descriptors`] names its limit).
    pub(crate) fn too_many_entries(i: usize, max: usize) -> Self {
        Self::invalid(
            "too_many_entries",
            format!("descriptors[{i}] has more than the maximum {max} entries"),
        )
    }

    /// The transport-neutral class.
    pub(crate) fn class(&self) -> ErrorClass {
        match self {
            ApiError::Invalid { .. } => ErrorClass::InvalidInput,
            ApiError::PayloadTooLarge { .. } => ErrorClass::TooLarge,
            // The client's fault; only the HTTP listener reads bodies this way (see `status`).
            ApiError::BodyTimeout(_) => ErrorClass::InvalidInput,
            ApiError::UnsupportedMediaType(_) => ErrorClass::UnsupportedMediaType,
            ApiError::NotFound(_) => ErrorClass::NotFound,
            ApiError::MethodNotAllowed => ErrorClass::MethodNotAllowed,
            ApiError::Store(_) => ErrorClass::Unavailable,
            ApiError::Internal(_) => ErrorClass::Internal,
        }
    }

    /// The stable machine-readable code (`error.code` in HTTP bodies).
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid { code, .. } => code,
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Store(_) => "store_unavailable",
            ApiError::Internal(_) => "internal",
        }
    }
}

/// The JSON error body: `{"error":{"code":"...","message":"..."}}`.
pub(crate) fn error_body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"code": code, "message": message}})
}
