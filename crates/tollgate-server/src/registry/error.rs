//! The registry's errors, each with a stable code ([`RegistryError::code`]). The HTTP API maps
//! them to responses in one place (its registry endpoints): handlers return `RegistryError`
//! and never build an error response themselves.

use crate::error::ApiError;
use tollgate_core::rules::RuleErrors;
use tollgate_core::StoreError;

/// Everything that can go wrong with a registry request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RegistryError {
    /// The request could not be read (body too large, timed out, wrong content type).
    #[error(transparent)]
    Request(#[from] ApiError),
    /// The body's content type is neither YAML nor JSON.
    #[error("unsupported content type `{0}`: send application/yaml or application/json")]
    UnsupportedMediaType(String),
    /// The registry is not running, or runs without an admin token: no writes.
    #[error("registry writes are off: {0}")]
    WritesOff(&'static str),
    /// No `Authorization: Bearer` header.
    #[error("missing admin token: send `Authorization: Bearer <token>`")]
    Unauthenticated,
    /// A token, not the admin token.
    #[error("wrong admin token")]
    WrongToken,
    /// The domain name cannot be registered.
    #[error(
        "invalid domain name `{0}`: use 1 to 128 of A-Z a-z 0-9 . _ : - (not starting with `.`)"
    )]
    InvalidDomain(String),
    /// The body is not valid rules (each problem at its line and column inside the body).
    #[error("invalid rules:\n{0}")]
    InvalidRules(RuleErrors),
    /// The body is not in a shape the registry reads (not UTF-8, a bad service registration).
    #[error("{0}")]
    InvalidBody(String),
    /// A listing's query is not valid (`limit` out of range).
    #[error("{0}")]
    InvalidQuery(String),
    /// The body's `domain` is not the domain of the URL.
    #[error("the body defines domain `{body}`, the URL names `{path}`: they must be the same")]
    DomainMismatch {
        /// The domain in the body.
        body: String,
        /// The domain in the URL.
        path: String,
    },
    /// The rules cannot run on this store (count-min sketch on Redis, ...).
    #[error("the store cannot serve these rules: {0}")]
    Unsupported(String),
    /// `If-Match` is not a version.
    #[error("invalid If-Match `{0}`: send a version as the ETag gives it (\"7\") or `*`")]
    InvalidPrecondition(String),
    /// The domain is not registered.
    #[error("domain `{0}` is not registered")]
    NotFound(String),
    /// The domain is defined by a rules file: the file owns it.
    #[error("domain `{domain}` is defined by the rules file {file}: it is owned by that file, change it there (or remove the file first)")]
    FileOwned {
        /// The domain.
        domain: String,
        /// The file defining it.
        file: String,
    },
    /// `If-Match` names another version than the current one.
    #[error("domain `{domain}` is at version {}, not {expected}: read it again and retry", current.map_or("none (not registered)".to_string(), |v| v.to_string()))]
    Stale {
        /// The domain.
        domain: String,
        /// The version the client expected.
        expected: String,
        /// The current version (`None`: not registered).
        current: Option<u64>,
    },
    /// The registry holds `--registry-max-domains` domains already.
    #[error(
        "the registry holds {max} domains, its limit (--registry-max-domains): delete one first"
    )]
    TooManyDomains {
        /// The cap.
        max: usize,
    },
    /// The domain has more descriptors than `--registry-max-descriptors`.
    #[error(
        "the domain has {count} descriptors; at most {max} allowed (--registry-max-descriptors)"
    )]
    TooManyDescriptors {
        /// Descriptors in the body.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// The registry's storage failed (Redis down, disk full): nothing was changed.
    #[error("registry storage unavailable, nothing changed: {0}")]
    Storage(String),
}

impl From<StoreError> for RegistryError {
    fn from(e: StoreError) -> Self {
        RegistryError::Storage(e.to_string())
    }
}

impl RegistryError {
    /// The stable machine-readable code (`error.code`).
    pub(crate) fn code(&self) -> &'static str {
        use RegistryError as E;
        match self {
            E::Request(e) => e.code(),
            E::WritesOff(_) => "registry_writes_off",
            E::Unauthenticated => "unauthenticated",
            E::UnsupportedMediaType(_) => "unsupported_media_type",
            E::WrongToken => "forbidden",
            E::InvalidDomain(_) => "invalid_domain",
            E::InvalidRules(_) => "invalid_rules",
            E::InvalidBody(_) => "invalid_body",
            E::InvalidQuery(_) => "invalid_query",
            E::DomainMismatch { .. } => "domain_mismatch",
            E::Unsupported(_) => "unsupported_by_store",
            E::InvalidPrecondition(_) => "invalid_if_match",
            E::NotFound(_) => "domain_not_found",
            E::FileOwned { .. } => "domain_owned_by_file",
            E::Stale { .. } => "version_mismatch",
            E::TooManyDomains { .. } => "too_many_domains",
            E::TooManyDescriptors { .. } => "too_many_descriptors",
            E::Storage(_) => "registry_unavailable",
        }
    }
}
