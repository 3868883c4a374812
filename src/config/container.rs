//! What a sandbox's container may use and who it runs as: `resources`, `network`, `user` and
//! `runtime`.

use serde_json::Value;

use crate::config::check::{bad, positive_int, typed};
use crate::config::options::Given;
use crate::util::errors::Result;

/// Default for `resources.memoryBytes`: 8 GiB, swap never above it.
pub const DEFAULT_MEMORY_BYTES: u64 = 8 << 30;
/// Default for `resources.pidsLimit`: ample for builds, fatal to fork bombs.
pub const DEFAULT_PIDS_LIMIT: u64 = 4096;

/// Container resource limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
  pub memory_bytes: Option<u64>,
  pub nano_cpus: Option<u64>,
  pub pids_limit: Option<u64>,
}

pub(crate) fn parse_network(v: Option<Given<String>>) -> Result<Option<String>> {
  typed(v, "network", |v| {
    format!("expected 'bridge', 'none' or a network name, got {v}")
  })?
  .map(|n| validate_network(&n))
  .transpose()
}

pub(crate) fn parse_user(v: Option<Given<String>>) -> Result<Option<String>> {
  typed(v, "user", |v| {
    format!("expected 'uid:gid' or a user name, got {v}")
  })?
  .map(|u| validate_user(&u))
  .transpose()
}

pub(crate) fn parse_runtime(v: Option<Given<String>>) -> Result<Option<String>> {
  let expected = |v: &Value| format!("expected a runtime name such as 'runsc', got {v}");
  typed(v, "runtime", expected)?
    .map(|r| match is_simple_name(&r, 64) {
      true => Ok(r),
      false => Err(bad("runtime", expected(&Value::String(r)))),
    })
    .transpose()
}

pub(crate) fn parse_resources(v: Option<Value>) -> Result<Resources> {
  let mut r = Resources {
    memory_bytes: Some(DEFAULT_MEMORY_BYTES),
    nano_cpus: None,
    pids_limit: Some(DEFAULT_PIDS_LIMIT),
  };
  let Some(v) = v else { return Ok(r) };
  let Value::Object(m) = v else {
    return Err(bad(
      "resources",
      format!("expected {{ memoryBytes?, nanoCpus?, pidsLimit? }}, got {v}"),
    ));
  };
  for (k, val) in m {
    // null means "no limit" for memory and CPU; pids are always limited.
    let n = |name: &str, min: u64, max: u64| -> Result<Option<u64>> {
      match &val {
        Value::Null if name != "resources.pidsLimit" => Ok(None),
        v => positive_int(name, Some(Given::from_value(v.clone())), 0, max).and_then(|x| {
          if x < min {
            Err(bad(name, format!("{x} is below the minimum {min}")))
          } else {
            Ok(Some(x))
          }
        }),
      }
    };
    match k.as_str() {
      "memoryBytes" => r.memory_bytes = n("resources.memoryBytes", 6 << 20, 1 << 44)?,
      "nanoCpus" => r.nano_cpus = n("resources.nanoCpus", 10_000_000, 1024 * 1_000_000_000)?,
      "pidsLimit" => r.pids_limit = n("resources.pidsLimit", 16, 4_194_304)?,
      other => {
        return Err(bad(
          &format!("resources.{other}"),
          "unknown; known ones are memoryBytes, nanoCpus, pidsLimit",
        ))
      }
    }
  }
  Ok(r)
}

fn is_simple_name(s: &str, max: usize) -> bool {
  !s.is_empty()
    && s.len() <= max
    && s
      .bytes()
      .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    && s.as_bytes()[0].is_ascii_alphanumeric()
}

/// `bridge`, `none` or a user-defined network; never the host's or another container's stack.
pub fn validate_network(n: &str) -> Result<String> {
  if n == "host" || n.starts_with("container:") {
    return Err(bad(
      "network",
      format!("{n:?} would share a network stack with the host or another container"),
    ));
  }
  if !is_simple_name(n, 128) {
    return Err(bad("network", format!("{n:?} is not a network name")));
  }
  Ok(n.to_string())
}

/// Linux's largest user or group id: 4294967295 is `(uid_t)-1`, "no id", which no user can have.
pub const MAX_LINUX_ID: u64 = 4_294_967_294;

/// `uid`, `uid:gid`, `name` or `name:group`; numeric ids within Linux's range.
pub fn validate_user(u: &str) -> Result<String> {
  let part_ok = |p: &str| is_simple_name(p, 32);
  let (user, group) = match u.split_once(':') {
    Some((a, b)) => (a, Some(b)),
    None => (u, None),
  };
  if !part_ok(user) || !group.is_none_or(part_ok) {
    return Err(bad(
      "user",
      format!("{u:?} is not 'uid', 'uid:gid' or a user name"),
    ));
  }
  for (what, id) in [("uid", Some(user)), ("gid", group)] {
    let Some(id) = id.filter(|p| p.bytes().all(|b| b.is_ascii_digit())) else {
      continue;
    };
    if id.parse::<u64>().map_or(true, |n| n > MAX_LINUX_ID) {
      return Err(bad(
        "user",
        format!("{what} {id} is out of range: Linux ids go from 0 to {MAX_LINUX_ID}"),
      ));
    }
  }
  Ok(u.to_string())
}

#[cfg(test)]
mod tests {
  use serde_json::json;

  use crate::config::tests::refusal;
  use crate::config::ProviderConfig;

  #[test]
  fn users_that_cannot_work_are_refused_with_the_rule() {
    let user = |u: &str| {
      let (o, r) = refusal(json!({ "image": "x", "user": u }));
      assert_eq!(o, "user");
      r
    };
    assert_eq!(
      user("4294967295"),
      "uid 4294967295 is out of range: Linux ids go from 0 to 4294967294"
    );
    assert!(user("1000:4294967295").starts_with("gid 4294967295 is out of range"));
    assert!(
      user("99999999999999999999999").starts_with("uid 99999999999999999999999 is out of range")
    );
    assert!(user("a:b:c").contains("is not 'uid', 'uid:gid' or a user name"));
    for ok in [
      "4294967294",
      "0:4294967294",
      "1000:1000",
      "app",
      "app:staff",
      "1000:staff",
    ] {
      let c = ProviderConfig::from_json(json!({ "image": "x", "user": ok })).unwrap();
      assert_eq!(c.user.as_deref(), Some(ok));
    }
  }
}
