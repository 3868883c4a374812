//! Uploads: one file written through the archive endpoint, with the missing parents owned by the
//! user, the activity file refreshed by the same archive, Podman's write races retried and the
//! engine's refusals told as the caller's errors.

use bytes::Bytes;

use super::entry::{entry_header, tar_parts, BLOCK};
use super::layout::touch_activity;
use super::request::{extract_point, transfer_deadline, upload_options};
use super::stat::{stat, MODE_DIR};
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

/// Why a path the engine mounts cannot take an upload (both transports say it so).
pub const MOUNTED_BY_ENGINE: &str = "the engine mounts a file or volume of its own there (as it does /etc/hosts, /etc/hostname and /etc/resolv.conf), which an upload cannot replace; change its content with a command instead";

/// Writes `content` to the absolute `path`, replacing a file there (even a read-only one).
#[allow(clippy::too_many_arguments)]
pub async fn upload(
  engine: &Engine,
  container: &str,
  shown: &str,
  path: &str,
  content: Bytes,
  owner: Option<(u32, u32)>,
  read_only: bool,
) -> Result<()> {
  let (root, entry) = extract_point(path, read_only).map_err(|e| match e {
    SandboxError::InvalidPath { reason, .. } => SandboxError::InvalidPath {
      path: shown.to_string(),
      reason,
    },
    other => other,
  })?;
  let size = content.len() as u64;
  // The engine makes missing parents as root; for a non-root user, make them in the archive,
  // owned by that user, so the user can write next to the file it uploaded.
  let mut header = Vec::new();
  if owner.is_some() {
    for dir in missing_parents(engine, container, path).await? {
      if let Ok((_, rel)) = extract_point(&dir, read_only) {
        header.extend_from_slice(&entry_header(&format!("{rel}/"), 0, 0o755, owner, true)?);
      }
    }
  }
  header.extend_from_slice(&entry_header(&entry, size, 0o644, owner, false)?);
  let header = Bytes::from(header);
  // The same archive refreshes the activity file when it lands in the same tree: an upload is
  // activity for the idle timer.
  let activity = match root {
    "/" => Some(crate::sandbox::layout::ACTIVITY_FILE.trim_start_matches('/')),
    r if r == crate::sandbox::layout::LAYOUT_ROOT => Some(crate::sandbox::layout::ACTIVITY_NAME),
    _ => None,
  };
  let pad = (BLOCK - (size as usize % BLOCK)) % BLOCK;
  let mut tail = vec![0u8; pad];
  if let Some(a) = activity {
    tail.extend_from_slice(&entry_header(a, 0, 0o644, owner, false)?);
  }
  tail.extend_from_slice(&[0u8; 2 * BLOCK]);
  let tail = Bytes::from(tail);
  let deadline = transfer_deadline(engine, size);
  // Podman answers a write over an existing directory, and concurrent writes of one file (the
  // activity file every upload carries), with "file exists" or a failed lchown of a file another
  // write just replaced: a directory is the caller's error; a race is retried.
  const ATTEMPTS: u32 = 4;
  for attempt in 0..ATTEMPTS {
    let parts = tar_parts(header.clone(), content.clone(), tail.clone());
    let res = engine
      .upload_tar_stream(
        "write a file into the sandbox",
        container,
        upload_options(root),
        parts,
        deadline,
      )
      .await;
    match res {
      Err(SandboxError::Engine { ref detail, .. }) if is_put_race(detail) => {
        if detail.contains("file exists")
          && stat(engine, container, path)
            .await?
            .is_some_and(|s| s.mode & MODE_DIR != 0)
        {
          return Err(SandboxError::PathIsDirectory {
            path: shown.to_string(),
          });
        }
        if attempt + 1 < ATTEMPTS {
          tokio::time::sleep(std::time::Duration::from_millis(10 << attempt)).await;
          continue;
        }
        res.map_err(|e| classify_upload_error(e, shown))?;
      }
      other => {
        other.map_err(|e| classify_upload_error(e, shown))?;
        break;
      }
    }
  }
  if activity.is_none() {
    touch_activity(engine, container, owner).await;
  }
  Ok(())
}

/// Podman's archive writer losing a race with a concurrent write into the same tree: an entry
/// already made by the other write, or the activity file replaced under its lchown or utimes.
fn is_put_race(detail: &str) -> bool {
  let gone_or_there =
    detail.contains("no such file or directory") || detail.contains("file exists");
  (detail.contains("copier: put") && detail.contains("file exists"))
    || (detail.contains(crate::sandbox::layout::ACTIVITY_FILE) && gone_or_there)
}

/// The parents of `path` that do not exist yet, outermost first (one stat per missing level,
/// plus one for the first that exists; usually just that one).
async fn missing_parents(engine: &Engine, container: &str, path: &str) -> Result<Vec<String>> {
  let mut missing = Vec::new();
  let mut dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
  while !dir.is_empty() && missing.len() < 64 {
    if stat(engine, container, dir).await?.is_some() {
      break;
    }
    missing.push(dir.to_string());
    dir = dir.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
  }
  missing.reverse();
  Ok(missing)
}

fn classify_upload_error(e: SandboxError, shown: &str) -> SandboxError {
  if let SandboxError::Engine { detail, .. } = &e {
    if detail.contains("cannot overwrite directory") {
      return SandboxError::PathIsDirectory {
        path: shown.to_string(),
      };
    }
    if detail.contains("not a directory") {
      return SandboxError::InvalidPath {
        path: shown.to_string(),
        reason: "a parent of this path is a file, not a directory".into(),
      };
    }
    // The engine bind-mounts files of its own (/etc/hosts, /etc/hostname, /etc/resolv.conf)
    // and volumes into every container; a mount point cannot be replaced.
    if detail.contains("device or resource busy") {
      return SandboxError::InvalidPath {
        path: shown.to_string(),
        reason: MOUNTED_BY_ENGINE.into(),
      };
    }
    if detail.contains("read-only file system") {
      return SandboxError::InvalidPath {
        path: shown.to_string(),
        reason: "the path is on a read-only file system".into(),
      };
    }
  }
  e
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn only_podman_write_races_are_retried() {
    // The messages Podman 4.3 gave under concurrent uploads into one sandbox.
    assert!(is_put_race(
      "copier: put: error setting ownership of \"/trueforge/.activity\" to 0:0: lchown /trueforge/.activity: no such file or directory"
    ));
    assert!(is_put_race(
      "copier: put: error creating \"/trueforge/.activity\": file exists"
    ));
    assert!(!is_put_race(
      "copier: put: error creating \"/work/a/b\": no such file or directory"
    ));
    assert!(is_put_race(
      "setting access and modify timestamps on \"/trueforge/.activity\" to 2026-12-01 02:35:43 +0000 UTC and 2026-12-01 02:35:43 +0000 UTC: no such file or directory"
    ));
    assert!(!is_put_race("no space left on device"));
  }
}
