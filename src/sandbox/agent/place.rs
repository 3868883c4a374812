//! Putting the agent binary into a sandbox that has no agent volume mounted (made by an earlier
//! version, or while the volume could not be had): through the archive endpoint, into
//! `/.trueforge-agent/<tag>/`, every directory root's and 0755. The binary runs as root, so no
//! directory on its way may be one the sandbox user can write: before every start the placed
//! copy is read back through the archive endpoint and checked (root's, writable by root alone,
//! the bytes ours), and `/` is checked to be closed to others.
//!
//! A read-only root leaves no such place the archive endpoint can write: Docker 20.10 writes
//! only into a read-only sandbox's volumes (here the sandbox user's `/workspace` and
//! `/trueforge`), not its `/tmp` (a tmpfs). Such a sandbox, when it has no agent volume, keeps
//! the engine's endpoints.

use std::io::Read;

use bollard::query_parameters::UploadToContainerOptions;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::sandbox::agent::binaries::Binary;
use crate::sandbox::transfer::{self, entry_header};
use crate::util::errors::{Result, SandboxError};

/// The name of the agents' directory in its parent (`/` or `/tmp`).
const DIR_NAME: &str = ".trueforge-agent";
/// Most bytes read back when checking a placed copy (the binary and its directory's headers).
const MAX_READBACK: usize = 24 << 20;
/// Go's `os.FileMode` bits for the archive stat: a directory, a symbolic link, sticky.
const MODE_DIR: u32 = 1 << 31;
const MODE_SYMLINK: u32 = 1 << 27;
const MODE_STICKY: u32 = 1 << 20;

/// Where the binary of `tag` is placed.
pub fn placed_path(tag: &str, binary: &Binary) -> String {
  format!("/{DIR_NAME}/{tag}/{}", binary.arch.file_name())
}

/// The binary's path in the container, placing it first unless a checked copy is there.
/// `Err(reason)` when it cannot be placed safely; an engine failure is `Ok(Err(..))`'s outer
/// error.
pub async fn ensure(
  engine: &Engine,
  container: &str,
  read_only_root: bool,
  tag: &str,
  binary: &Binary,
) -> Result<std::result::Result<String, String>> {
  if read_only_root {
    return Ok(Err(
      "its root filesystem is read-only and it has no agent volume (it was made by an earlier version): the engine cannot put the agent anywhere the sandbox's user could not change it".into(),
    ));
  }
  let (parent, path) = ("/", placed_path(tag, binary));
  if let Err(why) = parents_closed(engine, container, parent).await? {
    return Ok(Err(why));
  }
  if check(engine, container, parent, tag, binary).await?.is_ok() {
    return Ok(Ok(path));
  }
  put(engine, container, parent, tag, binary).await?;
  Ok(
    check(engine, container, parent, tag, binary)
      .await?
      .map(|()| path),
  )
}

/// The tar putting the binary with its two directories, all root's.
fn tar_of(tag: &str, binary: &Binary) -> Result<Bytes> {
  let mut tar = Vec::with_capacity(binary.bytes.len() + 4096);
  let root = Some((0, 0));
  tar.extend_from_slice(&entry_header(
    &format!("{DIR_NAME}/"),
    0,
    0o755,
    root,
    true,
  )?);
  tar.extend_from_slice(&entry_header(
    &format!("{DIR_NAME}/{tag}/"),
    0,
    0o755,
    root,
    true,
  )?);
  let file = format!("{DIR_NAME}/{tag}/{}", binary.arch.file_name());
  let size = binary.bytes.len() as u64;
  tar.extend_from_slice(&entry_header(&file, size, 0o755, root, false)?);
  tar.extend_from_slice(&binary.bytes);
  tar.resize(tar.len().div_ceil(512) * 512, 0);
  tar.extend_from_slice(&[0u8; 1024]);
  Ok(Bytes::from(tar))
}

async fn put(
  engine: &Engine,
  container: &str,
  parent: &str,
  tag: &str,
  binary: &Binary,
) -> Result<()> {
  // No `noOverwriteDirNonDir`: whatever the workload left at these names is replaced (the
  // engine also gives directories that exist the owner and mode of the entries).
  let opts = UploadToContainerOptions {
    path: parent.to_string(),
    ..Default::default()
  };
  engine
    .upload_tar(
      "place the sandbox agent",
      container,
      opts,
      tar_of(tag, binary)?,
      engine.control_timeout,
      true,
    )
    .await
}

/// `parent` must be a directory that only root may change: not group- or world-writable (or
/// sticky, where others cannot move a directory of root's). `Ok(Err(why))` when it is not.
async fn parents_closed(
  engine: &Engine,
  container: &str,
  parent: &str,
) -> Result<std::result::Result<(), String>> {
  let Some(st) = transfer::stat(engine, container, parent).await? else {
    return Ok(Err(format!("{parent} does not exist in the sandbox")));
  };
  let open = st.mode & 0o022 != 0 && st.mode & MODE_STICKY == 0;
  if st.mode & MODE_DIR == 0 || st.mode & MODE_SYMLINK != 0 || open {
    return Ok(Err(format!(
      "{parent} is not a directory closed to the sandbox's user (mode {:o}); the agent runs as root and cannot be placed there",
      st.mode & 0o7777
    )));
  }
  Ok(Ok(()))
}

/// Reads the agents' directory back and checks it: every directory and file in it root's and
/// writable by root alone, the binary's bytes ours. `Err(why)` otherwise.
async fn check(
  engine: &Engine,
  container: &str,
  parent: &str,
  tag: &str,
  binary: &Binary,
) -> Result<std::result::Result<(), String>> {
  let dir = format!("{}/{DIR_NAME}", parent.trim_end_matches('/'));
  let tar = read_back(engine, container, &dir).await?;
  Ok(check_tar(&tar, tag, binary))
}

async fn read_back(engine: &Engine, container: &str, path: &str) -> Result<Vec<u8>> {
  let op = "read the placed sandbox agent back";
  let fetch = async {
    let stream = engine.download_tar(op, container, path);
    futures_util::pin_mut!(stream);
    let mut bytes = BytesMut::new();
    while let Some(chunk) = stream.next().await {
      match chunk {
        Ok(c) => bytes.extend_from_slice(&c),
        Err(SandboxError::FileNotFound { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e),
      }
      if bytes.len() > MAX_READBACK {
        break;
      }
    }
    Ok(bytes.to_vec())
  };
  engine.bounded(engine.control_timeout, op, fetch).await
}

/// Checks a tar of the agents' directory (see `check`).
fn check_tar(tar: &[u8], tag: &str, binary: &Binary) -> std::result::Result<(), String> {
  if tar.is_empty() {
    return Err("not placed yet".into());
  }
  let mut archive = tar::Archive::new(tar);
  let entries = archive.entries().map_err(|e| e.to_string())?;
  let mut found = false;
  for entry in entries {
    let mut e = entry.map_err(|e| e.to_string())?;
    let h = e.header();
    let name = e.path().map_err(|e| e.to_string())?.display().to_string();
    let (uid, mode) = (h.uid().unwrap_or(1), h.mode().unwrap_or(0o777));
    if uid != 0 || mode & 0o022 != 0 {
      return Err(format!(
        "{name} in the placed agent is not root's alone (uid {uid}, mode {mode:o})"
      ));
    }
    let kind = h.entry_type();
    if name.trim_end_matches('/') == format!("{DIR_NAME}/{tag}/{}", binary.arch.file_name()) {
      if !kind.is_file() {
        return Err(format!("{name} is not a regular file"));
      }
      let mut bytes = Vec::new();
      e.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
      let sum: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
      if sum != binary.sha256 {
        return Err(format!("{name} is not this package's agent"));
      }
      found = true;
    } else if !(kind.is_dir() || kind.is_file()) {
      return Err(format!(
        "{name} in the placed agent's directory is a {kind:?}"
      ));
    }
  }
  if found {
    Ok(())
  } else {
    Err("the placed directory lacks the binary".into())
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::sandbox::agent::Arch;

  fn binary() -> Binary {
    let bytes = Bytes::from_static(b"\x7fELF not really");
    Binary {
      arch: Arch::X86_64,
      sha256: Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect(),
      bytes,
    }
  }

  /// The agents' directory as the engine would send it back, one header rewritten by `edit`.
  fn readback(edit: impl Fn(&mut tar::Header, &str)) -> Vec<u8> {
    let b = binary();
    let mut out = tar::Builder::new(Vec::new());
    let mut ar = tar::Archive::new(std::io::Cursor::new(tar_of("t", &b).unwrap().to_vec()));
    for e in ar.entries().unwrap() {
      let mut e = e.unwrap();
      let name = e.path().unwrap().display().to_string();
      let mut h = e.header().clone();
      edit(&mut h, &name);
      h.set_cksum();
      let mut data = Vec::new();
      e.read_to_end(&mut data).unwrap();
      out.append(&h, &data[..]).unwrap();
    }
    out.into_inner().unwrap()
  }

  #[test]
  fn a_placed_copy_passes_only_when_root_alone_can_change_it_and_it_is_ours() {
    let b = binary();
    assert_eq!(check_tar(&readback(|_, _| {}), "t", &b), Ok(()));
    let user_owned = readback(|h, name| {
      if name == ".trueforge-agent/" {
        h.set_uid(1000)
      }
    });
    assert!(check_tar(&user_owned, "t", &b)
      .unwrap_err()
      .contains("uid 1000"));
    let writable = readback(|h, name| {
      if name.ends_with("x86_64") {
        h.set_mode(0o777)
      }
    });
    assert!(check_tar(&writable, "t", &b)
      .unwrap_err()
      .contains("mode 777"));
    let mut other = b.clone();
    other.sha256 = "0".repeat(64);
    assert!(check_tar(&readback(|_, _| {}), "t", &other)
      .unwrap_err()
      .contains("not this package's agent"));
    assert!(check_tar(&[], "t", &b).is_err());
    assert_eq!(
      placed_path("t", &b),
      "/.trueforge-agent/t/trueforge-agent-x86_64"
    );
  }
}
