//! Claims: containers that are created and never started, named the same in every process.
//! Container names are unique per engine, so creating one is an atomic claim that every process
//! sharing the engine sees; the holder removes it (by id) when done. A claim carries one small
//! file, `/lease.json`, that its holder may rewrite and anyone may read: locks and leases keep
//! their record there. Also the body every helper container of ours (claims, probes) starts
//! from: our managed-by label and no network.

use std::collections::HashMap;
use std::io::Read;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateImageOptions, UploadToContainerOptions};
use futures_util::StreamExt;

use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};
use crate::util::labels;

/// The image claims are created from: a few bytes, imported locally, so no registry is needed.
const IMAGE_REPO: &str = "trueforge-sandbox-lease";
const IMAGE_TAG: &str = "1";
/// The file a claim carries (the image ships it empty-ish, `{}`).
pub const FILE: &str = "lease.json";
/// Largest claim file read back.
const MAX_FILE_BYTES: usize = 1 << 20;

/// A container of ours that does nothing by itself: our managed-by label plus `extra`, no
/// network. Callers add the command, and whatever else they need.
pub fn helper_body(
  image: &str,
  extra: impl IntoIterator<Item = (String, String)>,
) -> ContainerCreateBody {
  let mut l: HashMap<String, String> = extra.into_iter().collect();
  l.insert(labels::LABEL_MANAGED_BY.into(), labels::MANAGED_BY.into());
  ContainerCreateBody {
    image: Some(image.to_string()),
    labels: Some(l),
    network_disabled: Some(true),
    host_config: Some(HostConfig {
      network_mode: Some("none".into()),
      ..Default::default()
    }),
    ..Default::default()
  }
}

/// A tar holding only the claim file.
fn file_tar(body: &[u8]) -> Result<Vec<u8>> {
  let mut header = tar::Header::new_gnu();
  header.set_size(body.len() as u64);
  header.set_mode(0o644);
  header.set_mtime(crate::util::timestamps::now_ms() / 1000);
  let mut builder = tar::Builder::new(Vec::new());
  builder
    .append_data(&mut header, FILE, body)
    .and_then(|_| builder.into_inner())
    .map_err(|e| SandboxError::Internal(format!("packing a claim's file: {e}")))
}

/// The claim image's id, importing it when the engine lacks it (two processes racing here both
/// import the same tag, harmlessly). By id: Podman 4 files an image imported through the Docker
/// API under `latest`, whatever tag was asked for, where the name with its tag misses it.
pub async fn image(engine: &Engine) -> Result<String> {
  let reference = format!("{IMAGE_REPO}:{IMAGE_TAG}");
  for candidate in [reference.as_str(), IMAGE_REPO] {
    if let Some(id) = engine.inspect_image(candidate).await?.and_then(|i| i.id) {
      return Ok(id);
    }
  }
  let tar = file_tar(b"{}")?;
  let opts = CreateImageOptions {
    from_src: Some("-".into()),
    repo: Some(IMAGE_REPO.into()),
    tag: Some(IMAGE_TAG.into()),
    ..Default::default()
  };
  let operation = "import the claim image";
  let import = async {
    let stream = engine.create_image(operation, opts, Some(tar.into()), None);
    futures_util::pin_mut!(stream);
    while let Some(item) = stream.next().await {
      if let Some(detail) = item?.error_detail.and_then(|d| d.message) {
        return Err(SandboxError::Engine {
          operation: operation.to_string(),
          status: 500,
          detail,
        });
      }
    }
    Ok(())
  };
  engine
    .bounded(engine.control_timeout, operation, import)
    .await?;
  for candidate in [reference.as_str(), IMAGE_REPO] {
    if let Some(id) = engine.inspect_image(candidate).await?.and_then(|i| i.id) {
      return Ok(id);
    }
  }
  Ok(reference)
}

/// Creates the claim `name` carrying `extra` labels; its container id, or `None` when another
/// holder has it. Not retried on a broken connection: a second create could find our own first.
pub async fn create(
  engine: &Engine,
  operation: &str,
  name: &str,
  extra: impl IntoIterator<Item = (String, String)>,
) -> Result<Option<String>> {
  let image = image(engine).await?;
  let mut body = helper_body(&image, extra);
  body.cmd = Some(vec!["/claim".into()]);
  engine.create_named(operation, name, body).await
}

/// Rewrites a claim's file.
pub async fn write(
  engine: &Engine,
  operation: &str,
  container_id: &str,
  body: &[u8],
) -> Result<()> {
  let opts = UploadToContainerOptions {
    path: "/".into(),
    ..Default::default()
  };
  let tar = file_tar(body)?;
  engine
    .upload_tar(
      operation,
      container_id,
      opts,
      tar.into(),
      engine.control_timeout,
      false,
    )
    .await
}

/// A claim's file (at most 1 MiB of it); `None` when the tar holds no readable file.
/// `FileNotFound` when the claim is gone.
pub async fn read(
  engine: &Engine,
  operation: &'static str,
  container_id: &str,
) -> Result<Option<Vec<u8>>> {
  let path = format!("/{FILE}");
  let fetch = async {
    let stream = engine.download_tar(operation, container_id, &path);
    futures_util::pin_mut!(stream);
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
      bytes.extend_from_slice(&chunk?);
      if bytes.len() > MAX_FILE_BYTES {
        break;
      }
    }
    Ok(bytes)
  };
  let tar = engine
    .bounded(engine.control_timeout, operation, fetch)
    .await?;
  let mut archive = tar::Archive::new(tar.as_slice());
  let Ok(mut entries) = archive.entries() else {
    return Ok(None);
  };
  let Some(Ok(entry)) = entries.next() else {
    return Ok(None);
  };
  let mut body = Vec::new();
  if entry
    .take(MAX_FILE_BYTES as u64)
    .read_to_end(&mut body)
    .is_err()
  {
    return Ok(None);
  }
  Ok(Some(body))
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn helper_bodies_are_ours_and_offline() {
    let b = helper_body("img", [("k".to_string(), "v".to_string())]);
    let l = b.labels.unwrap();
    assert_eq!(l[labels::LABEL_MANAGED_BY], labels::MANAGED_BY);
    assert_eq!(l["k"], "v");
    assert_eq!(b.network_disabled, Some(true));
    assert_eq!(b.host_config.unwrap().network_mode.as_deref(), Some("none"));
  }

  #[test]
  fn the_file_tar_holds_one_file() {
    let tar = file_tar(b"{\"a\":1}").unwrap();
    let mut archive = tar::Archive::new(tar.as_slice());
    let mut entries = archive.entries().unwrap();
    let mut e = entries.next().unwrap().unwrap();
    assert_eq!(e.path().unwrap().to_str(), Some(FILE));
    let mut s = String::new();
    e.read_to_string(&mut s).unwrap();
    assert_eq!(s, "{\"a\":1}");
    assert!(entries.next().is_none());
  }
}
