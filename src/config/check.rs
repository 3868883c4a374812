//! How an option is refused: the one error a bad option gets, and the typed value of an option
//! napi handed over, or its refusal.

use serde_json::Value;

use crate::config::options::Given;
use crate::util::errors::{Result, SandboxError};

/// The refusal of `option`, saying why.
pub(crate) fn bad(option: &str, reason: impl Into<String>) -> SandboxError {
  SandboxError::InvalidOption {
    option: option.to_string(),
    reason: reason.into(),
  }
}

/// The value when it has the type the option takes; otherwise a refusal naming the option (or
/// the unknown key in it), `expected` saying what it takes given what came.
pub(crate) fn must<T>(
  v: Given<T>,
  option: &str,
  expected: impl FnOnce(&Value) -> String,
) -> Result<T> {
  match v {
    Given::Typed(t) => Ok(t),
    Given::Mistyped(v) => Err(bad(option, expected(&v))),
    Given::Unknown { key, known } => Err(bad(
      &format!("{option}.{key}"),
      format!("unknown; known ones are {}", known.join(", ")),
    )),
  }
}

/// As `must`, for an option that may be absent.
pub(crate) fn typed<T>(
  v: Option<Given<T>>,
  option: &str,
  expected: impl FnOnce(&Value) -> String,
) -> Result<Option<T>> {
  v.map(|v| must(v, option, expected)).transpose()
}
