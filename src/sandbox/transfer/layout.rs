//! The sandbox's layout written as archives: its directories and the activity file at creation,
//! and the activity file refreshed on its own.

use bytes::Bytes;

use super::entry::{entry_header, BLOCK};
use super::request::{extract_point, upload_options};
use crate::engine::Engine;
use crate::util::errors::Result;

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
