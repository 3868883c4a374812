//! The archive stat (a HEAD request): a path's size, type and link target, read before any body
//! so refusals cost one round trip.

use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

// Go's os.FileMode type bits, as the engine reports them.
pub(super) const MODE_DIR: u32 = 1 << 31;
pub(super) const MODE_SYMLINK: u32 = 1 << 27;
const MODE_DEVICE: u32 = 1 << 26;
const MODE_PIPE: u32 = 1 << 25;
const MODE_SOCKET: u32 = 1 << 24;
const MODE_CHAR_DEVICE: u32 = 1 << 21;
const MODE_IRREGULAR: u32 = 1 << 19;

/// What the archive stat says about a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathStat {
  pub size: u64,
  pub mode: u32,
  pub link_target: String,
}

/// The kind of a non-regular file, for messages; `None` for a regular file.
pub fn special_kind(mode: u32) -> Option<&'static str> {
  if mode & MODE_DIR != 0 {
    Some("directory")
  } else if mode & MODE_SYMLINK != 0 {
    Some("symlink")
  } else if mode & MODE_CHAR_DEVICE != 0 {
    Some("character device")
  } else if mode & MODE_DEVICE != 0 {
    Some("block device")
  } else if mode & MODE_PIPE != 0 {
    Some("named pipe")
  } else if mode & MODE_SOCKET != 0 {
    Some("socket")
  } else if mode & MODE_IRREGULAR != 0 {
    Some("irregular file")
  } else {
    None
  }
}

/// Archive stat of `path`; `Ok(None)` when the engine answers 404 (the path, or the container,
/// is missing: the caller tells which).
pub async fn stat(engine: &Engine, container: &str, path: &str) -> Result<Option<PathStat>> {
  match engine
    .archive_stat("stat a path in the sandbox", container, path)
    .await
  {
    Ok(s) => Ok(s.map(|s| PathStat {
      size: s.size.max(0) as u64,
      mode: s.file_mode,
      link_target: s.link_target,
    })),
    // The engine answers 500 with no detail when it cannot resolve the path (a symlink loop).
    Err(SandboxError::Engine {
      status: 500,
      detail,
      ..
    }) if detail.trim().is_empty() || detail.contains("too many levels of symbolic links") => {
      Err(SandboxError::InvalidPath {
        path: path.to_string(),
        reason: "the engine cannot resolve it (a symbolic link loop?)".into(),
      })
    }
    Err(e) => Err(e),
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn modes() {
    assert_eq!(special_kind(420), None);
    assert_eq!(special_kind(2148532735), Some("directory"));
    assert_eq!(special_kind(134218239), Some("symlink"));
    assert_eq!(special_kind(69206454), Some("character device"));
    assert_eq!(special_kind(33554852), Some("named pipe"));
  }
}
