//! Sandbox ids, container names and labels. An id is `/workspace/<ULID>`: an absolute path (the
//! exec working directory, as path-id backends do) that sorts by creation time. Anything that
//! does not match the grammar is rejected before any request reaches the engine.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;

/// Where sandbox roots live inside the container.
pub const WORKSPACE_ROOT: &str = "/workspace";
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const ULID_LEN: usize = 26;

/// `host:pid`: this process, as the holder of a lock or a lease other processes can see.
pub fn holder() -> String {
  let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
    .ok()
    .or_else(|| std::env::var("HOSTNAME").ok())
    .map(|h| h.trim().to_string())
    .filter(|h| !h.is_empty())
    .unwrap_or_else(|| "unknown-host".into());
  format!("{host}:{}", std::process::id())
}

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
  is_ulid(ulid).then_some(ulid)
}

/// Whether `s` is a ULID as `new_ulid` writes them (upper-case Crockford base32).
pub fn is_ulid(s: &str) -> bool {
  s.len() == ULID_LEN && s.as_bytes()[0] <= b'7' && s.bytes().all(|b| CROCKFORD.contains(&b))
}

/// When a ULID was made, in milliseconds since the epoch (its first 48 bits); `None` for
/// anything that is not a ULID.
pub fn ulid_ms(ulid: &str) -> Option<u64> {
  if !is_ulid(ulid) {
    return None;
  }
  ulid[..10].bytes().try_fold(0u64, |acc, b| {
    let digit = CROCKFORD.iter().position(|c| *c == b)? as u64;
    Some((acc << 5) | digit)
  })
}

/// The container name for a sandbox: derived, so any process can find it without a registry.
pub fn container_name(namespace: &str, ulid: &str) -> String {
  format!("trueforge-{namespace}-{}", ulid.to_ascii_lowercase())
}

/// The name of a throwaway container (an image probe, GPU discovery) of `namespace`. The dot
/// cannot occur in a namespace, so no sandbox of any namespace ever has this name.
pub fn probe_name(namespace: &str, ulid: &str) -> String {
  format!("trueforge-{namespace}.probe-{}", ulid.to_ascii_lowercase())
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
  fn ulids_carry_their_time_and_probes_a_name_no_sandbox_has() {
    // 01ARZ3NDEK: 1469922850259 ms, July 2016.
    assert_eq!(
      ulid_ms("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
      Some(1_469_922_850_259)
    );
    let before = crate::util::timestamps::now_ms();
    let made = ulid_ms(&new_ulid()).unwrap();
    assert!(made >= before && made <= crate::util::timestamps::now_ms());
    assert_eq!(ulid_ms("01arz3ndektsv4rrffq69g5fav"), None);
    assert_eq!(ulid_ms("x"), None);
    let probe = probe_name("a-b", "01ARZ3NDEKTSV4RRFFQ69G5FAV");
    assert_eq!(probe, "trueforge-a-b.probe-01arz3ndektsv4rrffq69g5fav");
    assert!(!container_name("a-b", "01ARZ3NDEKTSV4RRFFQ69G5FAV").contains('.'));
  }
}
