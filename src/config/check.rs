//! How an option is refused: the one error a bad option gets, and the typed value of an option
//! napi handed over, or its refusal; with the readers of whole numbers and flags that the option
//! modules share.

use serde_json::{Number, Value};

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

pub(crate) fn positive_int(
  option: &str,
  v: Option<Given<Number>>,
  default: u64,
  max: u64,
) -> Result<u64> {
  let n = typed(v, option, |v| format!("expected a number, got {v}"))?;
  let Some(n) = n else { return Ok(default) };
  let f = n.as_f64().unwrap_or(f64::NAN);
  if !f.is_finite() || f <= 0.0 || f.fract() != 0.0 {
    return Err(bad(
      option,
      format!("expected a positive whole number, got {n}"),
    ));
  }
  if f > max as f64 {
    return Err(bad(option, format!("{n} is above the maximum {max}")));
  }
  Ok(f as u64)
}

pub(crate) fn boolean(option: &str, v: Option<Given<bool>>, default: bool) -> Result<bool> {
  let b = typed(v, option, |v| format!("expected true or false, got {v}"))?;
  Ok(b.unwrap_or(default))
}
