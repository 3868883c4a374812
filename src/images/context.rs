//! Build contexts: a directory tarred for the Engine build API, and a content hash of it (files,
//! modes, the Dockerfile name and the build args) from which the image tag derives, so an
//! unchanged context never rebuilds and any change always does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::BuildSpec;
use crate::util::errors::{Result, SandboxError};

/// The repository locally built images are tagged into.
pub const BUILD_REPOSITORY: &str = "trueforge-sandbox-build";
/// Refuse contexts bigger than this: the tar is held in memory for the request.
const MAX_CONTEXT_BYTES: u64 = 1 << 30;

/// A tarred context and the tag its content hashes to.
pub struct PreparedContext {
  pub tar: Vec<u8>,
  pub tag: String,
}

fn invalid(spec: &BuildSpec, reason: String) -> SandboxError {
  SandboxError::InvalidOption {
    option: "build.context".into(),
    reason: format!("{}: {reason}", spec.context),
  }
}

/// Refuses, when the provider is built, a context that is not a directory it can read: a build
/// from it could never start.
pub fn check_readable(spec: &BuildSpec) -> Result<()> {
  let root = Path::new(&spec.context);
  match std::fs::metadata(root) {
    Ok(m) if !m.is_dir() => Err(invalid(spec, "not a directory".into())),
    Ok(_) => std::fs::read_dir(root)
      .map(|_| ())
      .map_err(|e| invalid(spec, format!("not a readable directory ({e})"))),
    Err(e) => Err(invalid(spec, format!("not a readable directory ({e})"))),
  }
}

/// Relative paths of every entry under `root`, sorted, skipping `.git` and what
/// `.dockerignore` names exactly (full glob support is left to the engine's own builder).
fn walk(root: &Path) -> std::io::Result<Vec<PathBuf>> {
  let ignore: Vec<String> = std::fs::read_to_string(root.join(".dockerignore"))
    .unwrap_or_default()
    .lines()
    .map(|l| {
      l.trim()
        .trim_start_matches("./")
        .trim_end_matches('/')
        .to_string()
    })
    .filter(|l| !l.is_empty() && !l.starts_with('#'))
    .collect();
  let mut out = Vec::new();
  let mut stack = vec![PathBuf::new()];
  while let Some(rel) = stack.pop() {
    for entry in std::fs::read_dir(root.join(&rel))? {
      let entry = entry?;
      let r = rel.join(entry.file_name());
      let rs = r.to_string_lossy();
      if rs == ".git" || ignore.iter().any(|i| *i == rs) {
        continue;
      }
      if entry.file_type()?.is_dir() {
        stack.push(r.clone());
      }
      out.push(r);
    }
  }
  out.sort();
  Ok(out)
}

/// Hashes the context and, with `with_tar`, tars the very bytes it hashed (so the tag always
/// names what is sent). Blocking file I/O: call it from `spawn_blocking`.
pub fn prepare(spec: &BuildSpec, with_tar: bool) -> Result<PreparedContext> {
  let root = Path::new(&spec.context);
  if !root.is_dir() {
    return Err(invalid(spec, "not a directory".into()));
  }
  if !root.join(&spec.dockerfile).is_file() {
    return Err(SandboxError::InvalidOption {
      option: "build.dockerfile".into(),
      reason: format!("{} has no file {}", spec.context, spec.dockerfile),
    });
  }
  let entries = walk(root).map_err(|e| invalid(spec, e.to_string()))?;
  let mut hasher = Sha256::new();
  let mut builder = tar::Builder::new(Vec::new());
  builder.follow_symlinks(false);
  let mut total = 0u64;
  for rel in &entries {
    let full = root.join(rel);
    let meta = std::fs::symlink_metadata(&full).map_err(|e| invalid(spec, e.to_string()))?;
    hasher.update(rel.to_string_lossy().as_bytes());
    hasher.update([0]);
    #[cfg(unix)]
    {
      use std::os::unix::fs::PermissionsExt;
      hasher.update(meta.permissions().mode().to_le_bytes());
    }
    if meta.is_file() {
      total += meta.len();
      if total > MAX_CONTEXT_BYTES {
        return Err(invalid(spec, "the context is larger than 1 GiB".into()));
      }
      let data = std::fs::read(&full).map_err(|e| invalid(spec, e.to_string()))?;
      hasher.update((data.len() as u64).to_le_bytes());
      hasher.update(&data);
      if with_tar {
        let mut header = tar::Header::new_gnu();
        header.set_metadata(&meta);
        header.set_size(data.len() as u64);
        builder
          .append_data(&mut header, rel, &data[..])
          .map_err(|e| invalid(spec, e.to_string()))?;
      }
    } else {
      if meta.file_type().is_symlink() {
        let t = std::fs::read_link(&full).map_err(|e| invalid(spec, e.to_string()))?;
        hasher.update(t.to_string_lossy().as_bytes());
      }
      if with_tar {
        builder
          .append_path_with_name(&full, rel)
          .map_err(|e| invalid(spec, e.to_string()))?;
      }
    }
    hasher.update([0]);
  }
  hasher.update(b"\0dockerfile\0");
  hasher.update(spec.dockerfile.as_bytes());
  for (k, v) in &spec.args {
    hasher.update(b"\0arg\0");
    hasher.update(k.as_bytes());
    hasher.update([0]);
    hasher.update(v.as_bytes());
  }
  let tar = builder
    .into_inner()
    .map_err(|e| invalid(spec, e.to_string()))?;
  let digest = hasher.finalize();
  let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
  Ok(PreparedContext {
    tar,
    tag: format!("{BUILD_REPOSITORY}:{hex}"),
  })
}

/// The last `n` non-empty lines of a build log, for failure reasons.
pub fn last_lines(log: &[String], n: usize) -> String {
  let lines: Vec<&str> = log
    .iter()
    .flat_map(|s| s.lines())
    .map(str::trim_end)
    .filter(|l| !l.is_empty())
    .collect();
  lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Build args as the Engine wants them.
pub fn build_args(spec: &BuildSpec) -> std::collections::HashMap<String, String> {
  spec
    .args
    .iter()
    .map(|(k, v)| (k.clone(), v.clone()))
    .collect::<BTreeMap<_, _>>()
    .into_iter()
    .collect()
}

#[cfg(test)]
mod tests {
  use super::*;

  fn spec(dir: &Path) -> BuildSpec {
    BuildSpec {
      context: dir.to_string_lossy().into_owned(),
      dockerfile: "Dockerfile".into(),
      args: BTreeMap::new(),
    }
  }

  #[test]
  fn tag_follows_content_and_args() {
    let dir = std::env::temp_dir().join(format!("tf-ctx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("Dockerfile"), "FROM scratch\nCOPY sub/a /a\n").unwrap();
    std::fs::write(dir.join("sub/a"), "one").unwrap();
    let s = spec(&dir);
    let t1 = prepare(&s, true).unwrap().tag;
    assert_eq!(
      prepare(&s, true).unwrap().tag,
      t1,
      "unchanged context, same tag"
    );
    std::fs::write(dir.join("sub/a"), "two").unwrap();
    let t2 = prepare(&s, true).unwrap().tag;
    assert_ne!(t1, t2, "changed file, new tag");
    let mut s2 = s.clone();
    s2.args.insert("V".into(), "1".into());
    assert_ne!(prepare(&s2, true).unwrap().tag, t2, "changed args, new tag");
    let tar = prepare(&s, true).unwrap().tar;
    let names: Vec<String> = tar::Archive::new(&tar[..])
      .entries()
      .unwrap()
      .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
      .collect();
    assert!(names.contains(&"Dockerfile".to_string()) && names.contains(&"sub/a".to_string()));
    assert!(t1.starts_with("trueforge-sandbox-build:"));
    std::fs::remove_dir_all(&dir).unwrap();
  }

  #[test]
  fn a_context_must_be_a_readable_directory() {
    let spec = |context: &str| BuildSpec {
      context: context.into(),
      dockerfile: "Dockerfile".into(),
      args: BTreeMap::new(),
    };
    let reason = |context: &str| match check_readable(&spec(context)) {
      Err(SandboxError::InvalidOption { option, reason }) => {
        assert_eq!(option, "build.context");
        reason
      }
      other => panic!("{context} was not refused: {other:?}"),
    };
    assert!(
      reason("/nonexistent").starts_with("/nonexistent: not a readable directory (No such file")
    );
    assert_eq!(reason("/etc/hostname"), "/etc/hostname: not a directory");
    let dir = std::env::temp_dir();
    assert!(check_readable(&spec(&dir.to_string_lossy())).is_ok());
  }

  #[test]
  fn missing_context_or_dockerfile_is_an_option_error() {
    let s = BuildSpec {
      context: "/nonexistent/ctx".into(),
      dockerfile: "Dockerfile".into(),
      args: BTreeMap::new(),
    };
    assert!(matches!(
      prepare(&s, false),
      Err(SandboxError::InvalidOption { .. })
    ));
  }

  #[test]
  fn log_tail() {
    let log = vec![
      "Step 1/2 : FROM x\n".to_string(),
      "a\nb\n".to_string(),
      "c".to_string(),
    ];
    assert_eq!(last_lines(&log, 2), "b\nc");
  }
}
