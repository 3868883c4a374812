//! The fixed in-container layout TrueForge writes to, and the rules that turn a caller's path
//! into an absolute one. The layout does not depend on the sandbox id, because the server asks
//! for it with `''` before any sandbox exists.

use crate::util::errors::{Result, SandboxError};

/// Everything TrueForge puts in a sandbox lives under here.
pub const LAYOUT_ROOT: &str = "/trueforge";
pub const UPLOADS_DIR: &str = "/trueforge/uploads";
pub const SKILLS_DIR: &str = "/trueforge/skills";
pub const TOOL_RESULTS_DIR: &str = "/trueforge/tool-results";
pub const BIN_DIR: &str = "/trueforge/bin";
/// Everything Code Mode puts in a sandbox lives under here (the sandbox user's).
pub const CODE_MODE_DIR: &str = "/trueforge/codemode";
/// Where Code Mode links `mcp-client`; every command has it first on `PATH`.
pub const CODE_MODE_BIN_DIR: &str = "/trueforge/codemode/bin";
pub const GIT_DOWNLOADER_PATH: &str = "/trueforge/bin/git_downloader.py";
pub const GIT_CREDENTIALS_PATH: &str = "/trueforge/.git-credentials";
/// The activity file's name in `LAYOUT_ROOT`: its mtime is the idle timer's clock (touched by
/// every exec, upload and download).
pub const ACTIVITY_NAME: &str = ".activity";
/// Where activity is recorded inside the container. The init and exec scripts spell it out
/// (they are string constants); tests check they agree.
pub const ACTIVITY_FILE: &str = "/trueforge/.activity";

/// Directories made at create time (relative to `/`, as tar entries want them).
pub const LAYOUT_DIRS: [&str; 5] = [
  LAYOUT_ROOT,
  UPLOADS_DIR,
  SKILLS_DIR,
  TOOL_RESULTS_DIR,
  BIN_DIR,
];

/// Longest path accepted. Linux's PATH_MAX is 4096, but the engine resolves a path on the host
/// under the container's root (`/var/lib/docker/overlay2/<64 hex>/merged`, about 100 bytes or
/// more), so leave room for that.
pub const MAX_PATH_BYTES: usize = 3800;
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
    return Err(invalid("the path is longer than 3800 bytes"));
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
    return Err(invalid("the resolved path is longer than 3800 bytes"));
  }
  Ok(out)
}

/// Trees the kernel mounts at run time: the archive endpoints see the layer beneath, not them.
pub const KERNEL_TREES: [&str; 3] = ["/dev", "/proc", "/sys"];

/// The kernel tree a path lies in, if any.
pub fn kernel_tree(path: &str) -> Option<&'static str> {
  KERNEL_TREES
    .into_iter()
    .find(|t| path == *t || path.strip_prefix(t).is_some_and(|r| r.starts_with('/')))
}

/// `resolve_path` for a file to write: the path must name a file, not `/` or `dir/`, and not lie
/// in /dev, /proc or /sys (a file put there would be hidden under the kernel's mount).
pub fn resolve_file_target(sandbox_root: &str, path: &str) -> Result<String> {
  let resolved = resolve_path(sandbox_root, path)?;
  if resolved == "/" || path.ends_with('/') || path.ends_with("/.") {
    return Err(SandboxError::PathIsDirectory {
      path: path.to_string(),
    });
  }
  if let Some(tree) = kernel_tree(&resolved) {
    return Err(SandboxError::InvalidPath {
      path: path.to_string(),
      reason: format!("{tree} belongs to the kernel, mounted over the sandbox's files: a file written there would be hidden"),
    });
  }
  Ok(resolved)
}

#[cfg(test)]
mod tests {
  use super::*;

  const ROOT: &str = "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV";

  #[test]
  fn the_scripts_record_activity_where_the_layout_says() {
    assert_eq!(ACTIVITY_FILE, format!("{LAYOUT_ROOT}/{ACTIVITY_NAME}"));
    assert!(crate::sandbox::body::INIT_SCRIPT.contains(&format!("act={ACTIVITY_FILE}\n")));
    assert!(crate::sandbox::exec::WRAPPER.contains(&format!(": > {ACTIVITY_FILE} ")));
  }

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
    assert!(matches!(
      resolve_file_target(ROOT, "/dev/x"),
      Err(SandboxError::InvalidPath { .. })
    ));
    assert!(matches!(
      resolve_file_target(ROOT, "/proc/1/x"),
      Err(SandboxError::InvalidPath { .. })
    ));
    assert!(resolve_file_target(ROOT, "/devices/x").is_ok());
    assert_eq!(kernel_tree("/sys"), Some("/sys"));
    assert_eq!(kernel_tree("/system"), None);
  }
}
