//! Downloads: one regular file, symlinks followed inside the container, refused by its stat
//! before any body streams, and read again when it changes under the read.

use super::read::read_single_file;
use super::request::transfer_deadline;
use super::stat::{special_kind, stat, MODE_DIR, MODE_SYMLINK};
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

/// Symlink hops followed before giving up (as the kernel's MAXSYMLINKS).
const MAX_LINK_HOPS: usize = 40;

/// How many times a download is read when the engine's archive stream ends before the file's
/// bytes do: the file shrank between the tar header and its data, as one rewritten in place does.
const READ_TRIES: u32 = 4;

/// Reads one regular file, following symlinks inside the container. `shown` is the path as the
/// caller gave it, for messages. Missing → `FileNotFound` (the caller re-checks the container).
/// A file rewritten while it is read is read again, then `FileChanged`.
pub async fn download(
  engine: &Engine,
  container: &str,
  shown: &str,
  path: &str,
  max: u64,
) -> Result<Vec<u8>> {
  refuse_kernel_trees(shown, path)?;
  reread(|| async {
    let target = locate(engine, container, shown, path, max).await?;
    read_located(engine, container, shown, &target, max).await
  })
  .await
}

/// Runs `read` until it ends other than `FileChanged`, `READ_TRIES` times at most, a little
/// apart; the last `FileChanged` says how many tries were made.
async fn reread<F, Fut>(mut read: F) -> Result<Vec<u8>>
where
  F: FnMut() -> Fut,
  Fut: std::future::Future<Output = Result<Vec<u8>>>,
{
  let mut tries = 0;
  loop {
    tries += 1;
    match read().await {
      Err(SandboxError::FileChanged { path, .. }) if tries >= READ_TRIES => {
        return Err(SandboxError::FileChanged { path, tries })
      }
      Err(SandboxError::FileChanged { .. }) => {
        tokio::time::sleep(std::time::Duration::from_millis(10 << tries)).await
      }
      other => return other,
    }
  }
}

/// The regular file `path` names, symlinks followed: refused unless it is one, within `max`.
async fn locate(
  engine: &Engine,
  container: &str,
  shown: &str,
  path: &str,
  max: u64,
) -> Result<String> {
  let mut target = path.to_string();
  let mut hops = 0;
  let st = loop {
    let st = stat(engine, container, &target)
      .await?
      .ok_or_else(|| SandboxError::FileNotFound {
        path: shown.to_string(),
      })?;
    if st.mode & MODE_SYMLINK == 0 {
      break st;
    }
    hops += 1;
    if hops > MAX_LINK_HOPS || st.link_target.is_empty() {
      return Err(SandboxError::InvalidPath {
        path: shown.to_string(),
        reason: "too many levels of symbolic links".into(),
      });
    }
    target = resolve_link(&target, &st.link_target);
    refuse_kernel_trees(shown, &target)?;
  };
  if st.mode & MODE_DIR != 0 {
    return Err(SandboxError::PathIsDirectory {
      path: shown.to_string(),
    });
  }
  if let Some(kind) = special_kind(st.mode) {
    return Err(SandboxError::NotRegularFile {
      path: shown.to_string(),
      kind: kind.to_string(),
    });
  }
  if st.size > max {
    return Err(SandboxError::FileTooLarge {
      path: shown.to_string(),
      size: st.size,
      max,
    });
  }
  Ok(target)
}

/// Reads the located file's tar within the transfer deadline.
async fn read_located(
  engine: &Engine,
  container: &str,
  shown: &str,
  target: &str,
  max: u64,
) -> Result<Vec<u8>> {
  let body = engine.download_tar("read a file from the sandbox", container, target);
  match tokio::time::timeout(
    transfer_deadline(engine, max),
    read_single_file(body, shown, max),
  )
  .await
  {
    Ok(Err(SandboxError::FileNotFound { .. })) => Err(SandboxError::FileNotFound {
      path: shown.to_string(),
    }),
    Ok(r) => r,
    Err(_) => Err(engine.timeout(
      "read a file from the sandbox",
      transfer_deadline(engine, max),
    )),
  }
}

/// /dev, /proc and /sys are mounted at run time, so the archive stat cannot see them; nothing in
/// them is a file worth downloading (devices stream without end, /proc files report size 0).
fn refuse_kernel_trees(shown: &str, path: &str) -> Result<()> {
  match crate::sandbox::layout::kernel_tree(path) {
    Some(tree) => Err(SandboxError::NotRegularFile {
      path: shown.to_string(),
      kind: format!("a file under {tree}"),
    }),
    None => Ok(()),
  }
}

/// The engine reports link targets already absolute; relative ones are taken from the link's dir.
fn resolve_link(link: &str, target: &str) -> String {
  if target.starts_with('/') {
    return target.to_string();
  }
  let dir = link.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
  format!("{dir}/{target}")
}

#[cfg(test)]
mod tests {
  use super::*;

  #[tokio::test]
  async fn a_changed_file_is_read_again() {
    let changed = || SandboxError::FileChanged {
      path: "/f".into(),
      tries: 1,
    };
    let mut calls = 0;
    let got = reread(|| {
      calls += 1;
      let r = if calls < 3 {
        Err(changed())
      } else {
        Ok(b"ok".to_vec())
      };
      async move { r }
    })
    .await;
    assert_eq!((got.unwrap(), calls), (b"ok".to_vec(), 3));
    let mut calls = 0;
    let got = reread(|| {
      calls += 1;
      async { Err(changed()) }
    })
    .await;
    assert_eq!(
      (got.unwrap_err(), calls),
      (
        SandboxError::FileChanged {
          path: "/f".into(),
          tries: READ_TRIES
        },
        READ_TRIES
      )
    );
    // Any other outcome is final at once.
    let mut calls = 0;
    let got = reread(|| {
      calls += 1;
      async { Err(SandboxError::FileNotFound { path: "/f".into() }) }
    })
    .await;
    assert!(matches!(got, Err(SandboxError::FileNotFound { .. })) && calls == 1);
  }

  #[test]
  fn relative_links_are_taken_from_the_link_dir() {
    assert_eq!(resolve_link("/a/b/l", "c"), "/a/b/c");
  }
}
