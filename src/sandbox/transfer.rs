//! File transfer over the Engine API archive endpoints: tar streamed in and out, no exec, no
//! argv, no base64. Size, type and link target come from the archive stat (a HEAD request)
//! before any body is read, so refusals cost one round trip and never stream a large body.

use bollard::query_parameters::UploadToContainerOptions;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

/// Why a path the engine mounts cannot take an upload (both transports say it so).
pub const MOUNTED_BY_ENGINE: &str = "the engine mounts a file or volume of its own there (as it does /etc/hosts, /etc/hostname and /etc/resolv.conf), which an upload cannot replace; change its content with a command instead";

const BLOCK: usize = 512;
/// Symlink hops followed before giving up (as the kernel's MAXSYMLINKS).
const MAX_LINK_HOPS: usize = 40;

// Go's os.FileMode type bits, as the engine reports them.
const MODE_DIR: u32 = 1 << 31;
const MODE_SYMLINK: u32 = 1 << 27;
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

/// A deadline that scales with the payload: the engine timeout plus 1 s per 8 MiB.
fn transfer_deadline(engine: &Engine, bytes: u64) -> std::time::Duration {
  engine.control_timeout + std::time::Duration::from_secs(bytes / (8 << 20))
}

/// The engine reports link targets already absolute; relative ones are taken from the link's dir.
fn resolve_link(link: &str, target: &str) -> String {
  if target.starts_with('/') {
    return target.to_string();
  }
  let dir = link.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
  format!("{dir}/{target}")
}

/// Pulls the first regular file out of a tar stream, holding only that file's bytes. Stops
/// reading as soon as the file is complete.
pub async fn read_single_file<S>(mut body: S, shown: &str, max: u64) -> Result<Vec<u8>>
where
  S: Stream<Item = Result<Bytes>> + Unpin,
{
  let mut buf = BytesMut::new();
  // Fills `buf` to at least `n` bytes; false at end of stream.
  async fn fill<S: Stream<Item = Result<Bytes>> + Unpin>(
    body: &mut S,
    buf: &mut BytesMut,
    n: usize,
  ) -> Result<bool> {
    while buf.len() < n {
      match body.next().await {
        Some(chunk) => buf.extend_from_slice(&chunk?),
        None => return Ok(false),
      }
    }
    Ok(true)
  }
  let truncated = || SandboxError::Internal("the engine's archive stream ended early".into());
  loop {
    if !fill(&mut body, &mut buf, BLOCK).await? {
      return Err(truncated());
    }
    let header_bytes = buf.split_to(BLOCK);
    if header_bytes.iter().all(|&b| b == 0) {
      return Err(SandboxError::FileNotFound {
        path: shown.to_string(),
      });
    }
    let header = tar::Header::from_byte_slice(&header_bytes);
    let size = header
      .entry_size()
      .map_err(|e| SandboxError::Internal(format!("bad tar header from the engine: {e}")))?;
    let padded = (size as usize).div_ceil(BLOCK) * BLOCK;
    match header.entry_type() {
      tar::EntryType::Regular | tar::EntryType::Continuous => {
        if size > max {
          return Err(SandboxError::FileTooLarge {
            path: shown.to_string(),
            size,
            max,
          });
        }
        let size = size as usize;
        let mut out = Vec::with_capacity(size);
        let take = buf.len().min(size);
        out.extend_from_slice(&buf.split_to(take));
        while out.len() < size {
          match body.next().await {
            Some(chunk) => {
              let chunk = chunk?;
              let n = chunk.len().min(size - out.len());
              out.extend_from_slice(&chunk[..n]);
            }
            // The engine wrote the header with the size it saw, then found fewer bytes: the
            // file shrank while it was read.
            None => {
              return Err(SandboxError::FileChanged {
                path: shown.to_string(),
                tries: 1,
              })
            }
          }
        }
        return Ok(out);
      }
      tar::EntryType::Directory => {
        return Err(SandboxError::PathIsDirectory {
          path: shown.to_string(),
        })
      }
      // Long names and PAX records precede the entry they describe: skip their bodies.
      tar::EntryType::GNULongName
      | tar::EntryType::GNULongLink
      | tar::EntryType::XHeader
      | tar::EntryType::XGlobalHeader => {
        if padded > (1 << 20) {
          return Err(SandboxError::Internal(
            "oversized tar extension header from the engine".into(),
          ));
        }
        if !fill(&mut body, &mut buf, padded).await? {
          return Err(truncated());
        }
        let _ = buf.split_to(padded);
      }
      other => {
        return Err(SandboxError::NotRegularFile {
          path: shown.to_string(),
          kind: format!("{other:?}").to_lowercase(),
        })
      }
    }
  }
}

/// One tar entry's header blocks (with a GNU long-name record when the name needs it).
pub fn entry_header(
  name: &str,
  size: u64,
  mode: u32,
  owner: Option<(u32, u32)>,
  dir: bool,
) -> Result<Vec<u8>> {
  let mut out = Vec::with_capacity(BLOCK * 2);
  let (uid, gid) = owner.unwrap_or((0, 0));
  let mut h = tar::Header::new_gnu();
  h.set_size(size);
  h.set_mode(mode);
  h.set_uid(uid as u64);
  h.set_gid(gid as u64);
  h.set_mtime(
    std::time::SystemTime::now()
      .duration_since(std::time::UNIX_EPOCH)
      .map(|d| d.as_secs())
      .unwrap_or(0),
  );
  h.set_entry_type(if dir {
    tar::EntryType::Directory
  } else {
    tar::EntryType::Regular
  });
  let name_bytes = name.as_bytes();
  if name_bytes.len() >= 100 {
    let mut long = tar::Header::new_gnu();
    long.set_entry_type(tar::EntryType::GNULongName);
    long.set_size(name_bytes.len() as u64 + 1);
    long.as_gnu_mut().expect("gnu").name[..13].copy_from_slice(b"././@LongLink");
    long.set_mode(0o644);
    long.set_cksum();
    out.extend_from_slice(long.as_bytes());
    out.extend_from_slice(name_bytes);
    out.push(0);
    out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    h.as_gnu_mut().expect("gnu").name[..99].copy_from_slice(&name_bytes[..99]);
  } else {
    h.as_gnu_mut().expect("gnu").name[..name_bytes.len()].copy_from_slice(name_bytes);
  }
  h.set_cksum();
  out.extend_from_slice(h.as_bytes());
  Ok(out)
}

/// Padding after an entry's data plus the two zero blocks that end an archive.
#[cfg(test)]
fn trailer(size: u64) -> Bytes {
  let pad = (BLOCK - (size as usize % BLOCK)) % BLOCK;
  Bytes::from(vec![0u8; pad + 2 * BLOCK])
}

/// Upload options: extract at `root` with entries carrying the rest of the path, so missing
/// parents are made without an exec; never replace a directory with a file. Ownership comes
/// from the entries' headers (`copyUIDGID` would look the user up in the *host's* passwd).
fn upload_options(root: &str) -> UploadToContainerOptions {
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

/// An archive's parts: `header`, the payload in 1 MiB slices of the caller's buffer (no copies,
/// so the HTTP layer never holds one huge chunk), then `tail`.
fn tar_parts(
  header: Bytes,
  content: Bytes,
  tail: Bytes,
) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
  const SLICE: usize = 1 << 20;
  let slices = (0..content.len().div_ceil(SLICE))
    .map(move |i| content.slice(i * SLICE..((i + 1) * SLICE).min(content.len())));
  futures_util::stream::iter(
    std::iter::once(header)
      .chain(slices)
      .chain(std::iter::once(tail)),
  )
}

/// Puts `content` as the one file `name` (root's, mode 0600) in the directory `dir`, which the
/// agent made for it and only root may enter: the agent checks it and moves it into place.
pub async fn put_staged(
  engine: &Engine,
  container: &str,
  dir: &str,
  name: &str,
  content: Bytes,
) -> Result<()> {
  let size = content.len() as u64;
  let header = Bytes::from(entry_header(name, size, 0o600, None, false)?);
  let pad = (BLOCK - (size as usize % BLOCK)) % BLOCK;
  let tail = Bytes::from(vec![0u8; pad + 2 * BLOCK]);
  engine
    .upload_tar_stream(
      "write a file into the sandbox",
      container,
      upload_options(dir),
      tar_parts(header, content, tail),
      transfer_deadline(engine, size),
    )
    .await
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

/// Records activity (the idle timer's clock) with one tiny archive write; best effort.
pub async fn touch_activity(engine: &Engine, container: &str, owner: Option<(u32, u32)>) {
  let Ok(mut tar) = entry_header(
    crate::sandbox::layout::ACTIVITY_NAME,
    0,
    0o644,
    owner,
    false,
  ) else {
    return;
  };
  tar.extend_from_slice(&[0u8; 2 * BLOCK]);
  let _ = engine
    .upload_tar(
      "record activity",
      container,
      upload_options(crate::sandbox::layout::LAYOUT_ROOT),
      tar.into(),
      std::time::Duration::from_secs(10),
      false,
    )
    .await;
}

/// Creates directories (and their missing parents) plus the activity file, owned by `owner`:
/// one archive per extraction point (one in all unless the root filesystem is read-only).
pub async fn make_layout(
  engine: &Engine,
  container: &str,
  dirs: &[String],
  owner: Option<(u32, u32)>,
  read_only: bool,
) -> Result<()> {
  let mut groups: Vec<(&'static str, Vec<u8>)> = Vec::new();
  for d in dirs {
    let (root, entry) = extract_point(d, read_only)?;
    let header = entry_header(
      &format!("{}/", entry.trim_end_matches('/')),
      0,
      0o755,
      owner,
      true,
    )?;
    match groups.iter_mut().find(|(r, _)| *r == root) {
      Some((_, tar)) => tar.extend_from_slice(&header),
      None => groups.push((root, header)),
    }
  }
  // The activity file is made here, owned by the exec user, so commands can refresh it even
  // when the layout root itself is not theirs.
  let (root, entry) = extract_point(crate::sandbox::layout::ACTIVITY_FILE, read_only)?;
  let header = entry_header(&entry, 0, 0o644, owner, false)?;
  match groups.iter_mut().find(|(r, _)| *r == root) {
    Some((_, tar)) => tar.extend_from_slice(&header),
    None => groups.push((root, header)),
  }
  for (root, mut tar) in groups {
    tar.extend_from_slice(&[0u8; 2 * BLOCK]);
    let tar = Bytes::from(tar);
    engine
      .upload_tar(
        "create the sandbox layout",
        container,
        upload_options(root),
        tar,
        engine.control_timeout,
        true,
      )
      .await?;
  }
  Ok(())
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

  fn tar_of(name: &str, data: &[u8]) -> Vec<u8> {
    let mut v = entry_header(name, data.len() as u64, 0o644, None, false).unwrap();
    v.extend_from_slice(data);
    v.extend_from_slice(&trailer(data.len() as u64));
    v
  }

  async fn read(tar: Vec<u8>, chunk: usize, max: u64) -> Result<Vec<u8>> {
    let chunks: Vec<Result<Bytes>> = tar
      .chunks(chunk)
      .map(|c| Ok(Bytes::copy_from_slice(c)))
      .collect();
    read_single_file(futures_util::stream::iter(chunks), "/f", max).await
  }

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

  #[tokio::test]
  async fn round_trips_through_our_own_headers() {
    let data: Vec<u8> = (0..70_000u32).map(|i| (i % 256) as u8).collect();
    for chunk in [1, 100, 512, 4096, 1 << 20] {
      assert_eq!(
        read(tar_of("a/b.bin", &data), chunk, 1 << 20)
          .await
          .unwrap(),
        data
      );
    }
    let long = format!("{}/file.txt", "d".repeat(200));
    assert_eq!(read(tar_of(&long, b"hi"), 7, 10).await.unwrap(), b"hi");
    assert_eq!(read(tar_of("empty", b""), 512, 10).await.unwrap(), b"");
  }

  #[tokio::test]
  async fn the_cap_is_enforced_from_the_header() {
    let err = read(tar_of("big", &[0u8; 2000]), 512, 1000)
      .await
      .unwrap_err();
    assert_eq!(
      err,
      SandboxError::FileTooLarge {
        path: "/f".into(),
        size: 2000,
        max: 1000
      }
    );
  }

  #[tokio::test]
  async fn a_file_that_shrank_while_read_is_a_change_and_is_read_again() {
    // The header promises 2000 bytes; the stream ends after 700 of them.
    let mut tar = tar_of("f", &[7u8; 2000]);
    tar.truncate(BLOCK + 700);
    assert_eq!(
      read(tar, 512, 1 << 20).await.unwrap_err(),
      SandboxError::FileChanged {
        path: "/f".into(),
        tries: 1
      }
    );
    // A stream cut inside the header is the engine's fault, not the file's.
    let mut tar = tar_of("f", b"x");
    tar.truncate(100);
    assert!(matches!(
      read(tar, 512, 10).await,
      Err(SandboxError::Internal(_))
    ));
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
  fn the_tar_crate_reads_what_we_write() {
    let long = format!("{}/x", "n".repeat(150));
    let bytes = tar_of(&long, b"payload");
    let mut ar = tar::Archive::new(&bytes[..]);
    let mut entries = ar.entries().unwrap();
    let mut e = entries.next().unwrap().unwrap();
    assert_eq!(e.path().unwrap().to_str().unwrap(), long);
    let mut s = String::new();
    std::io::Read::read_to_string(&mut e, &mut s).unwrap();
    assert_eq!(s, "payload");
  }

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

  #[test]
  fn modes() {
    assert_eq!(special_kind(420), None);
    assert_eq!(special_kind(2148532735), Some("directory"));
    assert_eq!(special_kind(134218239), Some("symlink"));
    assert_eq!(special_kind(69206454), Some("character device"));
    assert_eq!(special_kind(33554852), Some("named pipe"));
    assert_eq!(resolve_link("/a/b/l", "c"), "/a/b/c");
  }
}
