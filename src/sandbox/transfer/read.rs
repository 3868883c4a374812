//! Reading a download's archive: the first regular file of a tar stream, held alone and capped
//! from its header.

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

use super::entry::BLOCK;
use crate::util::errors::{Result, SandboxError};

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

#[cfg(test)]
mod tests {
  use super::super::entry::tar_of;
  use super::*;

  async fn read(tar: Vec<u8>, chunk: usize, max: u64) -> Result<Vec<u8>> {
    let chunks: Vec<Result<Bytes>> = tar
      .chunks(chunk)
      .map(|c| Ok(Bytes::copy_from_slice(c)))
      .collect();
    read_single_file(futures_util::stream::iter(chunks), "/f", max).await
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
  async fn a_file_that_shrank_while_read_is_a_change() {
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
  }
}
