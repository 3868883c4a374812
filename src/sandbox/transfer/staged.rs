//! Staged uploads: the bytes of a large upload written by the engine into the staging directory
//! the agent made, for the agent to check and place.

use bytes::Bytes;

use super::entry::{entry_header, tar_parts, BLOCK};
use super::request::{transfer_deadline, upload_options};
use crate::engine::Engine;
use crate::util::errors::Result;

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
