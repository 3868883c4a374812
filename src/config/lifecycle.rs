//! How long sandboxes live and how many wait ready: `autoStopIntervalInMinutes`,
//! `autoDeleteIntervalInMinutes` and `warmPool`.

use serde_json::{Number, Value};

use crate::config::check::{bad, typed};
use crate::config::options::{Given, WarmPoolOptions};
use crate::util::errors::Result;

/// Default for `autoStopIntervalInMinutes`.
pub const DEFAULT_AUTO_STOP_MINUTES: f64 = 15.0;
/// Default for `autoDeleteIntervalInMinutes` (five days).
pub const DEFAULT_AUTO_DELETE_MINUTES: f64 = 7200.0;

pub(crate) fn parse_warm_pool(w: WarmPoolOptions) -> Result<u32> {
  let expected =
    |got: &dyn std::fmt::Display| format!("expected a whole number from 0 to 64, got {got}");
  let n = typed(w.size, "warmPool.size", |v| expected(v))?
    .ok_or_else(|| bad("warmPool.size", expected(&"nothing")))?;
  n.as_u64()
    .filter(|size| *size <= 64)
    .map(|size| size as u32)
    .ok_or_else(|| bad("warmPool.size", expected(&n)))
}

/// Minutes (fractions allowed, 0 = never) as whole seconds, at least one.
pub fn minutes(option: &str, v: Option<Value>, default: f64) -> Result<Option<u64>> {
  minutes_of(option, v.map(Given::from_value), default)
}

pub(crate) fn minutes_of(
  option: &str,
  v: Option<Given<Number>>,
  default: f64,
) -> Result<Option<u64>> {
  let m = typed(v, option, |v| {
    format!("expected a number of minutes, got {v}")
  })?
  .map_or(default, |n| n.as_f64().unwrap_or(f64::NAN));
  if !m.is_finite() || !(0.0..=5_256_000.0).contains(&m) {
    return Err(bad(
      option,
      format!("{m} is not a number of minutes from 0 (never) to ten years"),
    ));
  }
  if m == 0.0 {
    return Ok(None);
  }
  Ok(Some(((m * 60.0).round() as u64).max(1)))
}
