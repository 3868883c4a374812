//! Tar as the archive endpoints take it: the block size, one entry's header blocks, and an
//! archive's parts streamed without copying the payload.

use bytes::Bytes;

use crate::util::errors::Result;

pub(super) const BLOCK: usize = 512;

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

/// A one-file archive, as the tests of writing and reading archives need it.
#[cfg(test)]
pub(super) fn tar_of(name: &str, data: &[u8]) -> Vec<u8> {
  let mut v = entry_header(name, data.len() as u64, 0o644, None, false).unwrap();
  v.extend_from_slice(data);
  v.extend_from_slice(&trailer(data.len() as u64));
  v
}

/// An archive's parts: `header`, the payload in 1 MiB slices of the caller's buffer (no copies,
/// so the HTTP layer never holds one huge chunk), then `tail`.
pub(super) fn tar_parts(
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

#[cfg(test)]
mod tests {
  use super::*;

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
}
