//! The agent's volume: one named volume per engine and binaries tag
//! (`trueforge-agent-<version>-<hash12>`, labelled ours), filled once and mounted read-only into
//! every new sandbox at `/.trueforge-agent/<tag>`, so no create copies a byte. It is filled under
//! an engine claim (`engine::claim`): the process that creates the claim container (named like
//! the volume, the volume mounted, never started) puts the binaries with the archive endpoint,
//! then a `ready` marker; other processes wait for the marker. The claim container stays as the
//! volume's record (and keeps it in use, so a volume prune leaves it alone).
//!
//! The mount point's parent is made by the runtime as root (0755) in the container's root, which
//! the sandbox user cannot write: nothing on the way to the binary can be swapped by the
//! workload, which matters since the binary runs as root.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::{ContainerInspectResponse, Mount, MountType, MountVolumeOptions};
use bytes::Bytes;
use serde_json::json;

use crate::engine::{claim, Engine};
use crate::sandbox::agent::binaries::{Bundle, Setup};
use crate::sandbox::transfer::entry_header;
use crate::util::errors::{Result, SandboxError};
use crate::util::labels;
use crate::util::logging::Logger;

use crate::sandbox::agent::facts::{MOUNT_ROOT, VOLUME_PREFIX};
use crate::util::labels::LABEL_AGENT;
/// Where the claim container mounts the volume.
const CLAIM_MOUNT: &str = "/agent";
/// The marker the filling process puts last.
const READY: &str = ".ready";
/// How long a process waits for another to fill the volume, and after how long a claim with no
/// marker is taken as left by a process that died.
const FILL_WAIT: Duration = Duration::from_secs(60);
/// After a failure, creates go without a mount (the binary is placed on first use) until then.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// What became of one tag's volume in this process.
#[derive(Clone)]
enum Made {
  Ready,
  Failed(Instant),
}

/// The agent volume of each binaries tag, once made (or why not), per engine.
#[derive(Default)]
struct Volumes(tokio::sync::Mutex<HashMap<String, Made>>);

pub fn volume_name(tag: &str) -> String {
  format!("{VOLUME_PREFIX}{tag}")
}

/// The directory the agent of `tag` is in, mounted or placed.
pub fn mount_dir(tag: &str) -> String {
  format!("{MOUNT_ROOT}/{tag}")
}

/// The read-only mount of the agent volume for a new sandbox, making and filling the volume on
/// first use on this engine. `None` when the agent is off, has no binaries, or the volume cannot
/// be had (logged): the sandbox is made without it and gets the binary on first use.
pub async fn mount_for_create(engine: &Engine, setup: &Setup, log: &Logger) -> Option<Mount> {
  if !setup.enabled {
    return None;
  }
  let bundle = setup.binaries.bundle().await.ok()?;
  let state = engine.shared.state::<Volumes>();
  let mut volumes = state.0.lock().await;
  match volumes.get(&bundle.tag) {
    Some(Made::Ready) => {}
    Some(Made::Failed(at)) if at.elapsed() < RETRY_AFTER => return None,
    _ => {
      // Held across the fill: concurrent creates in this process wait for one fill.
      let made = match ensure(engine, &bundle).await {
        Ok(()) => Made::Ready,
        Err(e) => {
          log.warn(
            "the agent volume could not be made; new sandboxes get the agent on first use instead",
            json!({ "volume": volume_name(&bundle.tag), "error": e.to_string() }),
          );
          Made::Failed(Instant::now())
        }
      };
      volumes.insert(bundle.tag.clone(), made.clone());
      if matches!(made, Made::Failed(_)) {
        return None;
      }
    }
  }
  Some(Mount {
    target: Some(mount_dir(&bundle.tag)),
    source: Some(volume_name(&bundle.tag)),
    typ: Some(MountType::VOLUME),
    read_only: Some(true),
    // Never seeded from the image: what is in the volume is ours alone.
    volume_options: Some(MountVolumeOptions {
      no_copy: Some(true),
      ..Default::default()
    }),
    ..Default::default()
  })
}

fn ours(labels: Option<&HashMap<String, String>>, tag: &str) -> bool {
  labels::managed(labels)
    && labels.and_then(|l| l.get(LABEL_AGENT)).map(String::as_str) == Some(tag)
}

/// Makes sure the engine has the volume of `bundle`, filled and marked ready. An engine error
/// on the way (another process filling the same volume at the same moment can draw one, from
/// Podman especially) is tried again a few times; a name that is not ours fails at once.
async fn ensure(engine: &Engine, bundle: &Bundle) -> Result<()> {
  let name = volume_name(&bundle.tag);
  let started = Instant::now();
  let mut errors = 0;
  loop {
    match step(engine, bundle, &name).await {
      Ok(Look::Ready) => return Ok(()),
      Ok(Look::Refused(e)) => return Err(e),
      Ok(Look::Wait) if started.elapsed() > FILL_WAIT => {
        return Err(refused(
          &name,
          "another process has been filling it for too long",
        ));
      }
      Ok(Look::Wait) => errors = 0,
      Err(e) => {
        errors += 1;
        if errors >= ERROR_TRIES || started.elapsed() > FILL_WAIT {
          return Err(e);
        }
      }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
  }
}

/// Engine errors in a row after which making the volume gives up.
const ERROR_TRIES: u32 = 5;

/// What one look at the volume found.
enum Look {
  Ready,
  /// Another process is filling it (or the engine erred a moment ago).
  Wait,
  /// A volume or claim of its name that is not ours.
  Refused(SandboxError),
}

async fn step(engine: &Engine, bundle: &Bundle, name: &str) -> Result<Look> {
  match engine
    .inspect_container("inspect the agent volume's claim", name)
    .await?
  {
    Some(info) => {
      if !ours(
        info.config.as_ref().and_then(|c| c.labels.as_ref()),
        &bundle.tag,
      ) {
        return Ok(Look::Refused(refused(
          name,
          "a container of that name is not ours",
        )));
      }
      let id = info.id.clone().unwrap_or_else(|| name.to_string());
      if is_ready(engine, &id).await? {
        return Ok(Look::Ready);
      }
      if claim_age(&info).is_some_and(|age| age > FILL_WAIT) {
        // Its maker died before the marker: take the claim over.
        let _ = engine.force_remove(&id).await;
      }
      Ok(Look::Wait)
    }
    None => match claim_and_create(engine, bundle, name).await? {
      Claim::Made(id) => {
        // Ours to fill; the puts only write the same files again, so a failed one is retried.
        let mut tries = 0;
        loop {
          tries += 1;
          match fill(engine, bundle, &id).await {
            Ok(()) => return Ok(Look::Ready),
            Err(e) if tries >= 3 => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
          }
        }
      }
      Claim::Taken => Ok(Look::Wait),
      Claim::NotOurs(e) => Ok(Look::Refused(e)),
    },
  }
}

/// How a claim went.
enum Claim {
  /// The claim container, ours to fill.
  Made(String),
  /// Another process made it first.
  Taken,
  NotOurs(SandboxError),
}

fn refused(name: &str, why: &str) -> SandboxError {
  SandboxError::Internal(format!("the agent volume {name} cannot be used: {why}"))
}

/// How long ago the claim container was created, when the engine says.
fn claim_age(info: &ContainerInspectResponse) -> Option<Duration> {
  let created = crate::util::timestamps::parse_time(info.created.as_deref()?)?;
  let now = crate::util::timestamps::now_ms() / 1000;
  Some(Duration::from_secs(now.saturating_sub(created)))
}

/// Creates the volume (or finds ours) and the claim container mounting it; the claim's id, or
/// `None` when another process holds the claim.
async fn claim_and_create(engine: &Engine, bundle: &Bundle, name: &str) -> Result<Claim> {
  let mut l = HashMap::from([
    (
      labels::LABEL_MANAGED_BY.to_string(),
      labels::MANAGED_BY.to_string(),
    ),
    (LABEL_AGENT.to_string(), bundle.tag.clone()),
  ]);
  let mut volume = engine.create_volume(name, l.clone()).await?;
  if !ours(Some(&volume.labels), &bundle.tag) {
    // A create that met a volume another process made a moment earlier may be answered
    // without its labels; the volume's inspect has them.
    if let Some(v) = engine.inspect_volume(name).await? {
      volume = v;
    }
  }
  if !ours(Some(&volume.labels), &bundle.tag) {
    return Ok(Claim::NotOurs(refused(
      name,
      "a volume of that name is not ours",
    )));
  }
  let image = claim::image(engine).await?;
  l.remove(labels::LABEL_MANAGED_BY);
  let mut body = claim::helper_body(&image, l);
  body.cmd = Some(vec!["/claim".into()]);
  if let Some(hc) = body.host_config.as_mut() {
    hc.mounts = Some(vec![Mount {
      target: Some(CLAIM_MOUNT.into()),
      source: Some(name.to_string()),
      typ: Some(MountType::VOLUME),
      ..Default::default()
    }]);
  }
  Ok(
    match engine
      .create_named("claim the agent volume", name, body)
      .await?
    {
      Some(id) => Claim::Made(id),
      None => Claim::Taken,
    },
  )
}

/// Puts the binaries into the volume through the claim, then the marker.
async fn fill(engine: &Engine, bundle: &Bundle, claim_id: &str) -> Result<()> {
  let mut tar = Vec::new();
  for b in &bundle.binaries {
    tar.extend_from_slice(&entry_header(
      &b.arch.file_name(),
      b.bytes.len() as u64,
      0o755,
      None,
      false,
    )?);
    tar.extend_from_slice(&b.bytes);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
  }
  tar.extend_from_slice(&[0u8; 1024]);
  put(engine, claim_id, Bytes::from(tar)).await?;
  let mut marker = entry_header(READY, 0, 0o644, None, false)?;
  marker.extend_from_slice(&[0u8; 1024]);
  put(engine, claim_id, Bytes::from(marker)).await
}

async fn put(engine: &Engine, claim_id: &str, tar: Bytes) -> Result<()> {
  let opts = bollard::query_parameters::UploadToContainerOptions {
    path: CLAIM_MOUNT.into(),
    ..Default::default()
  };
  engine
    .upload_tar(
      "fill the agent volume",
      claim_id,
      opts,
      tar,
      engine.control_timeout,
      true,
    )
    .await
}

async fn is_ready(engine: &Engine, claim_id: &str) -> Result<bool> {
  let path = format!("{CLAIM_MOUNT}/{READY}");
  Ok(
    engine
      .archive_stat("read the agent volume's marker", claim_id, &path)
      .await?
      .is_some(),
  )
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::sandbox::agent::facts::mounted_dir;
  use bollard::models::{ContainerInspectResponse, HostConfig};

  #[test]
  fn names_and_the_mounted_dir() {
    assert_eq!(volume_name("0.1.0-abc"), "trueforge-agent-0.1.0-abc");
    assert_eq!(mount_dir("0.1.0-abc"), "/.trueforge-agent/0.1.0-abc");
    let info = ContainerInspectResponse {
      host_config: Some(HostConfig {
        mounts: Some(vec![Mount {
          target: Some("/.trueforge-agent/0.1.0-abc".into()),
          source: Some("trueforge-agent-0.1.0-abc".into()),
          typ: Some(MountType::VOLUME),
          ..Default::default()
        }]),
        ..Default::default()
      }),
      ..Default::default()
    };
    assert_eq!(
      mounted_dir(&info).as_deref(),
      Some("/.trueforge-agent/0.1.0-abc")
    );
    assert_eq!(mounted_dir(&ContainerInspectResponse::default()), None);
    let mut l = HashMap::from([
      (
        labels::LABEL_MANAGED_BY.to_string(),
        labels::MANAGED_BY.to_string(),
      ),
      (LABEL_AGENT.to_string(), "t".to_string()),
    ]);
    assert!(ours(Some(&l), "t"));
    assert!(!ours(Some(&l), "u"));
    l.remove(labels::LABEL_MANAGED_BY);
    assert!(!ours(Some(&l), "t"));
  }
}
