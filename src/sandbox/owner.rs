//! Who owns a sandbox's files: the container's user mapped to numeric ids, reading the image's
//! own passwd and group files for names.

use crate::engine::Engine;
use crate::sandbox::transfer;
use crate::util::errors::{Result, SandboxError};

/// Maps the container's `User` to numeric ids, reading the image's passwd and group files for
/// names. Root maps to `None`: files then need no ownership carried.
pub async fn resolve_owner(
  engine: &Engine,
  container: &str,
  user: Option<&str>,
) -> Result<Option<(u32, u32)>> {
  let Some(user) = user else { return Ok(None) };
  let (u, g) = match user.split_once(':') {
    Some((u, g)) => (u, Some(g)),
    None => (user, None),
  };
  // A missing passwd or group file means "no names"; an engine failure is an engine failure.
  let read = |path: &'static str| async move {
    match transfer::download(engine, container, path, path, 4 << 20).await {
      Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
      Err(SandboxError::FileNotFound { .. }) => Ok(String::new()),
      Err(e) => Err(e),
    }
  };
  let (uid, primary_gid) = match u.parse::<u32>() {
    Ok(uid) => {
      let passwd = if g.is_none() {
        read("/etc/passwd").await?
      } else {
        String::new()
      };
      (
        uid,
        lookup(&passwd, 2, &uid.to_string())
          .and_then(|f| f[3].parse().ok())
          .or(Some(uid)),
      )
    }
    Err(_) => {
      let passwd = read("/etc/passwd").await?;
      let fields = lookup(&passwd, 0, u).ok_or_else(|| SandboxError::CreateFailed {
        step: "resolve the image's user".into(),
        detail: format!("user {u:?} is not in the image's /etc/passwd"),
      })?;
      (fields[2].parse().unwrap_or(0), fields[3].parse().ok())
    }
  };
  let gid = match g {
    None => primary_gid.unwrap_or(uid),
    Some(g) => match g.parse::<u32>() {
      Ok(n) => n,
      Err(_) => {
        let group = read("/etc/group").await?;
        lookup(&group, 0, g)
          .and_then(|f| f[2].parse().ok())
          .unwrap_or(uid)
      }
    },
  };
  Ok(if uid == 0 && gid == 0 {
    None
  } else {
    Some((uid, gid))
  })
}

/// The colon-separated record whose field `field` equals `value` (with at least 4 fields).
fn lookup<'a>(db: &'a str, field: usize, value: &str) -> Option<Vec<&'a str>> {
  db.lines()
    .map(|l| l.split(':').collect::<Vec<_>>())
    .find(|f| f.len() >= 4 && f[field] == value)
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn passwd_lookup() {
    let db = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n";
    assert_eq!(lookup(db, 0, "app").unwrap()[2], "1000");
    assert_eq!(lookup(db, 2, "1000").unwrap()[3], "1001");
    assert!(lookup(db, 0, "nobody").is_none());
  }
}
