//! The bounds on one sandbox's egress, each with a default and a range.

use std::ops::RangeInclusive;
use std::time::Duration;

use serde_json::Value;

/// Bounds on one sandbox's egress. Out-of-range values are refused by the checks below, not
/// clamped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
  /// Connections open at once (from accept to close); beyond it new ones are refused (503,
  /// SOCKS 0x01). Default 256; 1 to 65536.
  pub max_connections: u32,
  /// The buffer per direction per connection: the most bytes the host holds in flight for
  /// each way. Default 64 KiB; 4 KiB to 16 MiB.
  pub buffer_bytes: usize,
  /// A connection with no byte either way for this long is closed, as is one whose request
  /// head takes this long. Default 5 min; 1 s to 24 h.
  pub idle_timeout: Duration,
  /// Resolving the name and connecting, all addresses together. Default 10 s; 100 ms to 5 min.
  pub connect_timeout: Duration,
}

impl Default for Limits {
  fn default() -> Limits {
    Limits {
      max_connections: 256,
      buffer_bytes: 64 * 1024,
      idle_timeout: Duration::from_secs(300),
      connect_timeout: Duration::from_secs(10),
    }
  }
}

/// The option names `from_json` takes, as JavaScript spells them.
const KEYS: [&str; 4] = [
  "maxConnections",
  "bufferBytes",
  "idleTimeoutMs",
  "connectTimeoutMs",
];

fn integer(name: &str, v: &Value, range: RangeInclusive<u64>, default: u64) -> Result<u64, String> {
  // JavaScript numbers may arrive as floats: 256.0 is 256, 1.5 is refused.
  let whole = v.as_u64().or_else(|| {
    v.as_f64()
      .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15)
      .map(|f| f as u64)
  });
  match whole {
    Some(n) if range.contains(&n) => Ok(n),
    _ => Err(format!(
      "{name}: expected an integer from {} to {} (default {default}), got {v}",
      range.start(),
      range.end()
    )),
  }
}

impl Limits {
  /// The accepted values of each option, as the checks below take them.
  pub const MAX_CONNECTIONS: RangeInclusive<u64> = 1..=65_536;
  pub const BUFFER_BYTES: RangeInclusive<u64> = 4 * 1024..=16 * 1024 * 1024;
  pub const IDLE_TIMEOUT_MS: RangeInclusive<u64> = 1_000..=86_400_000;
  pub const CONNECT_TIMEOUT_MS: RangeInclusive<u64> = 100..=300_000;

  /// Each check takes a JSON number (a whole float is fine) and `name`, the option as the
  /// user wrote it, for the message.
  pub fn max_connections(name: &str, v: &Value) -> Result<u32, String> {
    let d = Limits::default().max_connections as u64;
    integer(name, v, Limits::MAX_CONNECTIONS, d).map(|n| n as u32)
  }

  pub fn buffer_bytes(name: &str, v: &Value) -> Result<usize, String> {
    let d = Limits::default().buffer_bytes as u64;
    integer(name, v, Limits::BUFFER_BYTES, d).map(|n| n as usize)
  }

  /// In milliseconds.
  pub fn idle_timeout(name: &str, v: &Value) -> Result<Duration, String> {
    let d = Limits::default().idle_timeout.as_millis() as u64;
    integer(name, v, Limits::IDLE_TIMEOUT_MS, d).map(Duration::from_millis)
  }

  /// In milliseconds.
  pub fn connect_timeout(name: &str, v: &Value) -> Result<Duration, String> {
    let d = Limits::default().connect_timeout.as_millis() as u64;
    integer(name, v, Limits::CONNECT_TIMEOUT_MS, d).map(Duration::from_millis)
  }

  /// `{ maxConnections?, bufferBytes?, idleTimeoutMs?, connectTimeoutMs? }`, each defaulted;
  /// `name` prefixes the messages (e.g. `egressLimits`).
  pub fn from_json(name: &str, v: &Value) -> Result<Limits, String> {
    let Value::Object(m) = v else {
      return Err(format!(
        "{name}: expected an object {{ {} }}, got {v}",
        KEYS.join("?, ") + "?"
      ));
    };
    if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str())) {
      return Err(format!(
        "{name}: unknown key '{k}'; expected {}",
        KEYS.join(", ")
      ));
    }
    let mut l = Limits::default();
    let at = |k: &str| (format!("{name}.{k}"), m.get(k));
    if let (n, Some(v)) = at(KEYS[0]) {
      l.max_connections = Limits::max_connections(&n, v)?;
    }
    if let (n, Some(v)) = at(KEYS[1]) {
      l.buffer_bytes = Limits::buffer_bytes(&n, v)?;
    }
    if let (n, Some(v)) = at(KEYS[2]) {
      l.idle_timeout = Limits::idle_timeout(&n, v)?;
    }
    if let (n, Some(v)) = at(KEYS[3]) {
      l.connect_timeout = Limits::connect_timeout(&n, v)?;
    }
    Ok(l)
  }
}

#[cfg(test)]
mod tests {
  use serde_json::json;

  use super::*;

  #[test]
  fn defaults_and_ranges() {
    let l = Limits::from_json("egressLimits", &json!({})).unwrap();
    assert_eq!(l, Limits::default());
    assert_eq!(Limits::max_connections("m", &json!(256.0)).unwrap(), 256);
    let l = Limits::from_json(
      "egressLimits",
      &json!({"maxConnections": 1, "bufferBytes": 4096, "idleTimeoutMs": 1000,
              "connectTimeoutMs": 300000}),
    )
    .unwrap();
    assert_eq!(l.max_connections, 1);
    assert_eq!(l.connect_timeout, Duration::from_secs(300));
    assert_eq!(
      Limits::from_json("egressLimits", &json!({"maxConnections": 0})).unwrap_err(),
      "egressLimits.maxConnections: expected an integer from 1 to 65536 (default 256), got 0"
    );
    for bad in [json!(1.5), json!(-1), json!("8"), json!(65537), json!(null)] {
      assert!(Limits::max_connections("m", &bad).is_err(), "{bad}");
    }
    assert!(Limits::buffer_bytes("b", &json!(1024))
      .unwrap_err()
      .contains("4096 to 16777216 (default 65536)"));
    assert!(Limits::idle_timeout("i", &json!(999)).is_err());
    assert!(Limits::connect_timeout("c", &json!(99)).is_err());
    assert_eq!(
      Limits::from_json("egressLimits", &json!({"max": 1})).unwrap_err(),
      "egressLimits: unknown key 'max'; expected maxConnections, bufferBytes, idleTimeoutMs, \
       connectTimeoutMs"
    );
    assert!(Limits::from_json("egressLimits", &json!(3))
      .unwrap_err()
      .contains("expected an object"));
  }
}
