//! Claims: containers that are created and never started, named the same in every process.
//! Container names are unique per engine, so creating one is an atomic claim that every process
//! sharing the engine sees; the holder removes it (by id) when done. A claim carries one small
//! file, `/lease.json`, that its holder may rewrite and anyone may read: locks and leases keep
//! their record there. Also the body every helper container of ours (claims, probes) starts
//! from: our managed-by label and no network; and what makes a throwaway (a probe) verifiably
//! ours: its namespace, and a name derived from its namespace and the ULID its label carries.

use std::collections::HashMap;
use std::io::Read;

use bollard::models::{
  ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, HostConfig,
};
use bollard::query_parameters::{CreateImageOptions, UploadToContainerOptions};
use futures_util::StreamExt;

use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};
use crate::util::{ids, labels};

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

/// A throwaway container of `namespace` (an image probe, GPU discovery): its name, derived
/// from the namespace and a fresh ULID, and its body, labelled with both, so a reaper of that
/// namespace can tell one a crash left from anything else that carries our labels.
pub fn probe_body(image: &str, namespace: &str) -> (String, ContainerCreateBody) {
  let ulid = ids::new_ulid();
  let body = helper_body(
    image,
    [
      (labels::LABEL_NAMESPACE.to_string(), namespace.to_string()),
      (labels::LABEL_PROBE.to_string(), ulid.clone()),
    ],
  );
  (ids::probe_name(namespace, &ulid), body)
}

/// When the container named `name` (with or without the engine's `/`) carrying `labels` was
/// made, in ms since the epoch, if it is a throwaway of `namespace`: our labels, that namespace,
/// a probe label holding a ULID, and the name those derive. Forged labels on another name, or a
/// copy made from a commit of one (it inherits the labels, not the name), are not.
pub fn probe_made_ms(
  name: &str,
  labels: Option<&HashMap<String, String>>,
  namespace: &str,
) -> Option<u64> {
  let l = labels?;
  let ulid = l.get(labels::LABEL_PROBE)?;
  let ours = labels::managed(Some(l))
    && l.get(labels::LABEL_NAMESPACE).map(String::as_str) == Some(namespace)
    && name.trim_start_matches('/') == ids::probe_name(namespace, ulid);
  ours.then(|| ids::ulid_ms(ulid)).flatten()
}

/// Whether inspect output describes a container that was created and never started: what a
/// claim is. One that ever ran is somebody's workload, whatever its name and labels. Told by
/// its start time (the engine's zero time until it first starts), not its status: a claim its
/// holder is removing reads `removing` for a moment.
pub fn never_started(info: &ContainerInspectResponse) -> bool {
  let Some(state) = info.state.as_ref() else {
    return false;
  };
  state.running != Some(true)
    && state.status != Some(ContainerStateStatusEnum::RUNNING)
    && state
      .started_at
      .as_deref()
      .is_none_or(|t| t.is_empty() || t.starts_with("0001-01-01"))
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
  fn probes_are_ours_only_under_the_name_their_labels_derive() {
    let (name, body) = probe_body("img", "ns");
    let l = body.labels.clone().unwrap();
    let made = probe_made_ms(&format!("/{name}"), Some(&l), "ns").unwrap();
    assert!(made.abs_diff(crate::util::timestamps::now_ms()) < 5_000);
    assert_eq!(body.network_disabled, Some(true));
    // Another namespace, another name (a committed copy's), old probes' `1`, no managed-by.
    assert_eq!(probe_made_ms(&name, Some(&l), "other"), None);
    assert_eq!(probe_made_ms("eager_turing", Some(&l), "ns"), None);
    let mut old = l.clone();
    old.insert(labels::LABEL_PROBE.into(), "1".into());
    assert_eq!(probe_made_ms(&name, Some(&old), "ns"), None);
    let mut unmanaged = l.clone();
    unmanaged.remove(labels::LABEL_MANAGED_BY);
    assert_eq!(probe_made_ms(&name, Some(&unmanaged), "ns"), None);
    assert_eq!(probe_made_ms(&name, None, "ns"), None);
  }

  #[test]
  fn only_created_never_started_containers_are_claims() {
    use bollard::models::ContainerState;
    let info = |status, started: &str| ContainerInspectResponse {
      state: Some(ContainerState {
        status: Some(status),
        started_at: Some(started.to_string()),
        ..Default::default()
      }),
      ..Default::default()
    };
    use ContainerStateStatusEnum::*;
    assert!(never_started(&info(CREATED, "0001-01-01T00:00:00Z")));
    assert!(never_started(&info(CREATED, "")));
    // Its holder is removing it.
    assert!(never_started(&info(REMOVING, "0001-01-01T00:00:00Z")));
    assert!(!never_started(&info(RUNNING, "2026-12-01T00:00:00Z")));
    assert!(!never_started(&info(EXITED, "2026-12-01T00:00:00Z")));
    assert!(!never_started(&info(REMOVING, "2026-12-01T00:00:00Z")));
    // A start time means it ran, whatever the status says.
    assert!(!never_started(&info(CREATED, "2026-12-01T00:00:00Z")));
    assert!(!never_started(&ContainerInspectResponse::default()));
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
