//! The fixed in-container layout TrueForge writes to, and the rules that turn a caller's path
//! into an absolute one. The layout does not depend on the sandbox id, because the server asks
//! for it with `''` before any sandbox exists.

use crate::errors::{Result, SandboxError};

/// Everything TrueForge puts in a sandbox lives under here.
pub const LAYOUT_ROOT: &str = "/trueforge";
pub const UPLOADS_DIR: &str = "/trueforge/uploads";
pub const SKILLS_DIR: &str = "/trueforge/skills";
pub const TOOL_RESULTS_DIR: &str = "/trueforge/tool-results";
pub const BIN_DIR: &str = "/trueforge/bin";
pub const GIT_DOWNLOADER_PATH: &str = "/trueforge/bin/git_downloader.py";
pub const GIT_CREDENTIALS_PATH: &str = "/trueforge/.git-credentials";

/// Directories made at create time (relative to `/`, as tar entries want them).
pub const LAYOUT_DIRS: [&str; 5] = [
  LAYOUT_ROOT,
  UPLOADS_DIR,
  SKILLS_DIR,
  TOOL_RESULTS_DIR,
  BIN_DIR,
];

/// Longest path accepted (Linux's PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest single path segment (NAME_MAX).
pub const MAX_SEGMENT_BYTES: usize = 255;

/// Resolves a transfer path: relative paths are taken from the sandbox root; `..` segments,
/// NUL bytes, over-long paths and empty paths are refused. Returns a normalised absolute path.
pub fn resolve_path(sandbox_root: &str, path: &str) -> Result<String> {
  let invalid = |reason: &str| SandboxError::InvalidPath {
    path: path.to_string(),
    reason: reason.to_string(),
  };
  if path.is_empty() {
    return Err(invalid("the path is empty"));
  }
  if path.contains('\0') {
    return Err(invalid("the path contains a NUL byte"));
  }
  if path.len() > MAX_PATH_BYTES {
    return Err(invalid("the path is longer than 4096 bytes"));
  }
  let mut segments: Vec<&str> = Vec::new();
  let full_owned;
  let full = if path.starts_with('/') {
    path
  } else {
    full_owned = format!("{sandbox_root}/{path}");
    full_owned.as_str()
  };
  for seg in path.split('/') {
    if seg == ".." {
      return Err(SandboxError::PathTraversal {
        path: path.to_string(),
      });
    }
  }
  for seg in full.split('/') {
    match seg {
      "" | "." => {}
      s if s.len() > MAX_SEGMENT_BYTES => {
        return Err(invalid("a path segment is longer than 255 bytes"))
      }
      s => segments.push(s),
    }
  }
  let out = format!("/{}", segments.join("/"));
  if out.len() > MAX_PATH_BYTES {
    return Err(invalid("the resolved path is longer than 4096 bytes"));
  }
  Ok(out)
}

/// `resolve_path` for a file to write: the path must name a file, not `/` or `dir/`.
pub fn resolve_file_target(sandbox_root: &str, path: &str) -> Result<String> {
  let resolved = resolve_path(sandbox_root, path)?;
  if resolved == "/" || path.ends_with('/') || path.ends_with("/.") {
    return Err(SandboxError::PathIsDirectory {
      path: path.to_string(),
    });
  }
  Ok(resolved)
}

#[cfg(test)]
mod tests {
  use super::*;

  const ROOT: &str = "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV";

  #[test]
  fn relative_and_absolute() {
    assert_eq!(
      resolve_path(ROOT, "a/b.txt").unwrap(),
      format!("{ROOT}/a/b.txt")
    );
    assert_eq!(
      resolve_path(ROOT, "./a//b.txt").unwrap(),
      format!("{ROOT}/a/b.txt")
    );
    assert_eq!(resolve_path(ROOT, "/etc/hosts").unwrap(), "/etc/hosts");
    assert_eq!(resolve_path(ROOT, "/").unwrap(), "/");
    assert_eq!(
      resolve_path(ROOT, "name with spaces & $(x)").unwrap(),
      format!("{ROOT}/name with spaces & $(x)")
    );
  }

  #[test]
  fn refusals_are_typed() {
    assert!(matches!(
      resolve_path(ROOT, "../x"),
      Err(SandboxError::PathTraversal { .. })
    ));
    assert!(matches!(
      resolve_path(ROOT, "/a/../../etc"),
      Err(SandboxError::PathTraversal { .. })
    ));
    assert!(matches!(
      resolve_path(ROOT, "a/.."),
      Err(SandboxError::PathTraversal { .. })
    ));
    assert!(resolve_path(ROOT, "a..b/..c").is_ok());
    assert!(matches!(
      resolve_path(ROOT, ""),
      Err(SandboxError::InvalidPath { .. })
    ));
    assert!(matches!(
      resolve_path(ROOT, "a\0b"),
      Err(SandboxError::InvalidPath { .. })
    ));
    assert!(matches!(
      resolve_path(ROOT, &"a/".repeat(3000)),
      Err(SandboxError::InvalidPath { .. })
    ));
    assert!(matches!(
      resolve_path(ROOT, &"x".repeat(300)),
      Err(SandboxError::InvalidPath { .. })
    ));
    assert!(matches!(
      resolve_file_target(ROOT, "/"),
      Err(SandboxError::PathIsDirectory { .. })
    ));
    assert!(matches!(
      resolve_file_target(ROOT, "dir/"),
      Err(SandboxError::PathIsDirectory { .. })
    ));
  }
}
