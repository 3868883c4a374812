//! Sandbox ids, container names and labels. An id is `/workspace/<ULID>`: an absolute path (the
//! exec working directory, as path-id backends do) that sorts by creation time. Anything that
//! does not match the grammar is rejected before any request reaches the engine.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;

/// Where sandbox roots live inside the container.
pub const WORKSPACE_ROOT: &str = "/workspace";
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const ULID_LEN: usize = 26;

/// Labels every container of ours carries.
pub const LABEL_MANAGED_BY: &str = "trueforge.sandbox.managed-by";
pub const LABEL_NAMESPACE: &str = "trueforge.sandbox.namespace";
pub const LABEL_ID: &str = "trueforge.sandbox.id";
pub const LABEL_CREATED_AT: &str = "trueforge.sandbox.created-at";
/// The value of `LABEL_MANAGED_BY`.
pub const MANAGED_BY: &str = "trueforge-docker-sandbox";

/// A new ULID: 48 bits of milliseconds then 80 random bits, Crockford base32.
pub fn new_ulid() -> String {
  let ms = SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .map(|d| d.as_millis())
    .unwrap_or(0);
  let rnd: u128 = rand::rng().random::<u128>() & ((1u128 << 80) - 1);
  let v = ((ms & ((1u128 << 48) - 1)) << 80) | rnd;
  (0..ULID_LEN)
    .map(|i| CROCKFORD[((v >> (5 * (ULID_LEN - 1 - i))) & 31) as usize] as char)
    .collect()
}

/// A fresh sandbox id.
pub fn new_sandbox_id() -> String {
  format!("{WORKSPACE_ROOT}/{}", new_ulid())
}

/// The ULID inside a well-formed sandbox id, or `None` for anything else.
pub fn parse_sandbox_id(id: &str) -> Option<&str> {
  let ulid = id.strip_prefix(WORKSPACE_ROOT)?.strip_prefix('/')?;
  let ok = ulid.len() == ULID_LEN
    && ulid.as_bytes()[0] <= b'7'
    && ulid.bytes().all(|b| CROCKFORD.contains(&b));
  ok.then_some(ulid)
}

/// The container name for a sandbox: derived, so any process can find it without a registry.
pub fn container_name(namespace: &str, ulid: &str) -> String {
  format!("trueforge-{namespace}-{}", ulid.to_ascii_lowercase())
}

/// RFC 3339 UTC timestamp (seconds) without a date crate.
pub fn rfc3339_now() -> String {
  let secs = SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .map(|d| d.as_secs())
    .unwrap_or(0);
  rfc3339(secs)
}

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
  let days = (secs / 86_400) as i64;
  let rem = secs % 86_400;
  // Days to civil date (Howard Hinnant's algorithm).
  let z = days + 719_468;
  let era = z.div_euclid(146_097);
  let doe = z - era * 146_097;
  let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
  let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  let mp = (5 * doy + 2) / 153;
  let d = doy - (153 * mp + 2) / 5 + 1;
  let m = if mp < 10 { mp + 3 } else { mp - 9 };
  let y = yoe + era * 400 + i64::from(m <= 2);
  format!(
    "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
    rem / 3600,
    rem % 3600 / 60,
    rem % 60
  )
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn ids_round_trip_and_are_unique() {
    let a = new_sandbox_id();
    let b = new_sandbox_id();
    assert_ne!(a, b);
    assert!(a.starts_with("/workspace/"));
    let u = parse_sandbox_id(&a).unwrap();
    assert_eq!(u.len(), 26);
    assert!(container_name("default", u).starts_with("trueforge-default-"));
  }

  #[test]
  fn malformed_ids_are_rejected() {
    for bad in [
      "",
      "/workspace/",
      "workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV",
      "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FA",
      "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAVX",
      "/workspace/01arz3ndektsv4rrffq69g5fav",
      "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAU",
      "/workspace/81ARZ3NDEKTSV4RRFFQ69G5FAV",
      "/workspace/../etc/passwd000000000000000",
      "/tmp/01ARZ3NDEKTSV4RRFFQ69G5FAV",
      "my-container",
      "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV/",
    ] {
      assert!(parse_sandbox_id(bad).is_none(), "{bad:?} accepted");
    }
    assert!(parse_sandbox_id("/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV").is_some());
  }

  #[test]
  fn timestamps() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
  }
}
