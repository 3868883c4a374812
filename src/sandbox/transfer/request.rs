//! What the archive requests share: where an upload is extracted and with which options, and
//! the deadline that scales with the payload.

use bollard::query_parameters::UploadToContainerOptions;

use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

/// A deadline that scales with the payload: the engine timeout plus 1 s per 8 MiB.
pub(super) fn transfer_deadline(engine: &Engine, bytes: u64) -> std::time::Duration {
  engine.control_timeout + std::time::Duration::from_secs(bytes / (8 << 20))
}

/// Upload options: extract at `root` with entries carrying the rest of the path, so missing
/// parents are made without an exec; never replace a directory with a file. Ownership comes
/// from the entries' headers (`copyUIDGID` would look the user up in the *host's* passwd).
pub(super) fn upload_options(root: &str) -> UploadToContainerOptions {
  UploadToContainerOptions {
    path: root.to_string(),
    no_overwrite_dir_non_dir: Some("true".to_string()),
    copy_uidgid: None,
  }
}

/// Where an archive for `path` is extracted, and the entry name under it. With a read-only
/// root filesystem the engine only writes into volumes, so the archive must be extracted at the
/// volume that holds the path.
pub fn extract_point(path: &str, read_only: bool) -> Result<(&'static str, String)> {
  if !read_only {
    return Ok(("/", path.trim_start_matches('/').to_string()));
  }
  for root in [
    crate::util::ids::WORKSPACE_ROOT,
    crate::sandbox::layout::LAYOUT_ROOT,
  ] {
    if let Some(rest) = path.strip_prefix(root).and_then(|r| r.strip_prefix('/')) {
      if !rest.is_empty() {
        return Ok((root, rest.to_string()));
      }
    }
  }
  Err(SandboxError::InvalidPath {
    path: path.to_string(),
    reason: "the sandbox's root filesystem is read-only: files can be written under /workspace and /trueforge".into(),
  })
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn extract_points() {
    assert_eq!(
      extract_point("/etc/x", false).unwrap(),
      ("/", "etc/x".to_string())
    );
    assert_eq!(
      extract_point("/workspace/A/b", true).unwrap(),
      ("/workspace", "A/b".to_string())
    );
    assert_eq!(
      extract_point("/trueforge/uploads/f", true).unwrap(),
      ("/trueforge", "uploads/f".to_string())
    );
    assert!(matches!(
      extract_point("/tmp/f", true),
      Err(SandboxError::InvalidPath { .. })
    ));
    assert!(matches!(
      extract_point("/workspacex/f", true),
      Err(SandboxError::InvalidPath { .. })
    ));
  }
}
