use thiserror::Error;

/// Every way the engine can refuse or fail; the binding maps each kind to a Python exception.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    /// The model's config or weights cannot be used; the message names the file or tensor.
    #[error("{0}")]
    ModelLoad(String),
    /// The model is well-formed but rsgl does not run it.
    #[error("{0}")]
    UnsupportedModel(String),
    /// The request itself is wrong; the message says which field and what is allowed.
    #[error("{0}")]
    InvalidRequest(String),
    /// The engine was shut down before or while the request ran.
    #[error("the engine has been shut down; create a new Engine to keep generating")]
    Closed,
}

pub type Result<T> = std::result::Result<T, EngineError>;

pub(crate) fn invalid(msg: impl Into<String>) -> EngineError {
    EngineError::InvalidRequest(msg.into())
}
