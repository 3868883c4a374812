//! Starting a stopped exclusive-GPU sandbox again: on its own GPUs when they are still free,
//! else on others (a move), else a typed error once `gpuWaitMs` has passed.
//!
//! An engine fixes a container's devices at create, so a move makes a new container: the old
//! one's files are saved as an image (commit), its volumes are mounted into the new one, and the
//! new one takes the old one's name. Everything that decides and hands out GPUs runs under the
//! engine's GPU lock; the commit (slow: the whole writable layer) runs outside it and is used
//! only when the container has not run since (its start and finish times are unchanged). The
//! new container's labels name the saved image and the carried volumes, which go with it.
//! Between the two renames the name is briefly absent: `container::resolve` waits that out.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::models::{
  ContainerCreateBody, ContainerInspectResponse, HostConfig, Mount, MountType,
};
use futures_util::future::BoxFuture;
use serde_json::json;

use crate::config::{Gpus, ProviderConfig};
use crate::engine::Engine;
use crate::gpu::alloc::{held, unavailable};
use crate::gpu::inventory::inventory;
use crate::gpu::lock::{self, Lock};
use crate::sandbox::container::{self, remove_container, Role, Target};
use crate::sandbox::devices;
use crate::sandbox::swap::{MOVED_SUFFIX, MOVING_SUFFIX};
use crate::util::errors::{Result, SandboxError};
use crate::util::labels::{
  LABEL_CARRIED_VOLUMES, LABEL_GPUS, LABEL_ID, LABEL_SAVED_FROM, LABEL_SAVED_IMAGE,
};
use crate::util::logging::Logger;

/// The image GPU discovery runs `nvidia-smi -L` in (the provider's), asked for only when
/// discovery must run a container.
pub type ImageFn = Arc<dyn Fn() -> BoxFuture<'static, Result<String>> + Send + Sync>;

/// What starting an exclusive sandbox again needs from its provider.
#[derive(Clone)]
pub struct StartSettings {
  /// `gpuDevices`: the GPUs to hand out; empty = discovered.
  pub devices: Vec<String>,
  /// `gpuWaitMs`: how long a start waits for GPUs to free up.
  pub wait: Duration,
  pub image: ImageFn,
  /// The provider's namespace, which GPU discovery's throwaway container is made in.
  pub namespace: String,
}

impl StartSettings {
  pub fn of(cfg: &ProviderConfig, image: ImageFn) -> Self {
    Self {
      devices: cfg.gpu_devices.clone(),
      wait: Duration::from_millis(cfg.gpu_wait_ms),
      image,
      namespace: cfg.namespace.clone(),
    }
  }
}

/// How long a commit may take: it copies everything the sandbox wrote outside its volumes.
const COMMIT_LIMIT: Duration = Duration::from_secs(600);

/// Removes an exclusive sandbox's container under the GPU lock, so never in the middle of a
/// move, with anything a move left under the sandbox's name (`.gpu-move`, `.gpu-moved`), which
/// a later lookup would otherwise bring back. `false` when the container was already gone (or,
/// unforced, running).
pub async fn remove_exclusive(
  engine: &Engine,
  target: &Target,
  force: bool,
  log: &Logger,
) -> Result<bool> {
  let lock = Lock::take(engine).await?;
  let outcome = async {
    let removed = remove_container(engine, &target.container_id, force).await?;
    if !removed && !force {
      return Ok(false);
    }
    for suffix in [MOVING_SUFFIX, MOVED_SUFFIX] {
      if let Some(id) = left_by_move(engine, &target.name, &target.sandbox_id, suffix).await? {
        engine
          .remove_stopped("remove what a GPU move left", &id)
          .await?;
      }
    }
    Ok(removed)
  }
  .await;
  lock.release(log).await;
  outcome
}

/// The id of the container a move of the sandbox `sandbox_id` (container `name`) left under
/// `<name><suffix>`, when it is one: ours by name and labels as a set-aside container of this
/// very sandbox (its namespace and id), and not running (neither container of a move runs under
/// those names). Anything else there is somebody's, never touched.
async fn left_by_move(
  engine: &Engine,
  name: &str,
  sandbox_id: &str,
  suffix: &str,
) -> Result<Option<String>> {
  let name = format!("{name}{suffix}");
  let Some(left) = engine
    .inspect_container("inspect a stale move", &name)
    .await?
  else {
    return Ok(None);
  };
  let labels = left.config.as_ref().and_then(|c| c.labels.as_ref());
  let ours = container::owned(&name, labels, None)
    .is_some_and(|o| o.role == Role::SetAside && o.sandbox_id == sandbox_id && o.name == name)
    && left.name.as_deref() == Some(format!("/{name}").as_str());
  let state = left.state.clone().unwrap_or_default();
  let idle =
    state.running != Some(true) && state.paused != Some(true) && state.restarting != Some(true);
  Ok(left.id.filter(|_| ours && idle))
}

/// What one pass under the lock decided.
enum Step {
  /// Started (on its GPUs or moved), running already, or gone (the caller resolves again).
  Done,
  /// A move is needed and no save of the container as it is now exists: save it, come back.
  Save { version: String },
}

/// Starts the stopped exclusive sandbox `target`: its own GPUs if free, else `count` others
/// (moving it), else `GpusUnavailable` naming the holders, at once or after `gpuWaitMs`.
pub async fn start_exclusive(
  engine: &Engine,
  settings: &StartSettings,
  target: &Target,
  log: &Logger,
) -> Result<()> {
  // Which GPUs exist is known before the lock is taken (discovery runs a container, of the
  // provider's image: a saved one carries the old GPUs' environment).
  let inventory = inventory(engine, &settings.devices, &settings.namespace, || {
    (settings.image)()
  })
  .await?;
  let deadline = Instant::now() + settings.wait;
  let mut saved: Option<(String, String)> = None;
  let outcome = loop {
    let step = lock::until_free(engine, deadline, log, || {
      decide(engine, &inventory, target, saved.as_ref(), log)
    })
    .await;
    match step {
      Ok(Step::Done) => break Ok(()),
      Ok(Step::Save { version }) => {
        // An older save is not current any more (or was swept while we waited for GPUs).
        if let Some((old, _)) = saved.take() {
          let _ = engine.remove_unused_image(&old).await;
        }
        match save(engine, target, log).await {
          Ok(Some(image)) => saved = Some((image, version)),
          // Removed meanwhile: the caller's next try finds it gone (or moved by another process).
          Ok(None) => break Ok(()),
          Err(e) => break Err(e),
        }
      }
      Err(e) => break Err(e),
    }
  };
  // A save that was not used (it started on its own GPUs, or failed) goes; a used one is in use.
  if let Some((image, _)) = saved {
    let _ = engine.remove_unused_image(&image).await;
  }
  outcome
}

/// Saves a stopped sandbox's files as an image (outside the lock: it copies the whole writable
/// layer); `None` when the container was removed meanwhile.
async fn save(engine: &Engine, target: &Target, log: &Logger) -> Result<Option<String>> {
  log.info(
    "saving a stopped sandbox's files to move it to free GPUs",
    json!({ "sandboxId": target.sandbox_id }),
  );
  let image = engine
    .commit_container(
      &target.container_id,
      HashMap::from([(LABEL_SAVED_FROM.to_string(), target.sandbox_id.clone())]),
      COMMIT_LIMIT,
    )
    .await;
  match image {
    Ok(image) => Ok(Some(image)),
    Err(SandboxError::Engine { status: 404, .. }) => Ok(None),
    Err(e) => Err(e),
  }
}

/// Changes whenever the container runs: a save with the same version has every file.
fn version_of(info: &ContainerInspectResponse) -> String {
  let s = info.state.clone().unwrap_or_default();
  format!(
    "{}|{}",
    s.started_at.unwrap_or_default(),
    s.finished_at.unwrap_or_default()
  )
}

/// One pass under the GPU lock.
async fn decide(
  engine: &Engine,
  inventory: &[String],
  target: &Target,
  saved: Option<&(String, String)>,
  log: &Logger,
) -> Result<Step> {
  let Some(info) = engine
    .inspect_container("inspect the sandbox container", &target.container_id)
    .await?
  else {
    container::forget(engine, &target.name);
    return Ok(Step::Done);
  };
  // Only the container under the sandbox's name is the sandbox: one set aside by a move (or a
  // cached id that is no longer it) is never started; the caller resolves the name again.
  if info.name.as_deref() != Some(format!("/{}", target.name).as_str()) {
    container::forget(engine, &target.name);
    return Ok(Step::Done);
  }
  let state = info.state.clone().unwrap_or_default();
  if state.running == Some(true) {
    return Ok(Step::Done);
  }
  let own = devices::gpus_of(&info).unwrap_or_default();
  let held = held(engine).await?;
  let taken = held
    .iter()
    .any(|(g, who)| own.contains(g) && *who != target.sandbox_id);
  if !taken {
    container::start_stopped(engine, target, log).await?;
    return Ok(Step::Done);
  }
  let Some(picked) = pick_keeping(inventory, &own, &held, own.len()) else {
    return Err(unavailable(own.len() as u32, inventory, &held, inventory));
  };
  let version = version_of(&info);
  match saved {
    Some((image, v)) if *v == version => match move_to(engine, &info, image, &picked, log).await {
      Ok(()) => {
        log.info(
          "sandbox moved to free GPUs",
          json!({ "sandboxId": target.sandbox_id, "from": own, "to": picked }),
        );
        container::forget(engine, &target.name);
        Ok(Step::Done)
      }
      // The save was swept (a reaper saw it unused for long): save again.
      Err(SandboxError::Engine {
        status: 404,
        ref detail,
        ..
      }) if detail.to_ascii_lowercase().contains("image") => Ok(Step::Save { version }),
      Err(e) => Err(e),
    },
    _ => Ok(Step::Save { version }),
  }
}

/// `n` free GPUs, the sandbox's own free ones first (fewer changes for the agent).
fn pick_keeping(
  inventory: &[String],
  own: &[String],
  held: &BTreeMap<String, String>,
  n: usize,
) -> Option<Vec<String>> {
  let mut order: Vec<String> = own
    .iter()
    .filter(|g| inventory.contains(g))
    .cloned()
    .collect();
  order.extend(inventory.iter().filter(|g| !own.contains(g)).cloned());
  let free: Vec<String> = order
    .into_iter()
    .filter(|g| !held.contains_key(g))
    .take(n)
    .collect();
  (n > 0 && free.len() == n).then_some(free)
}

/// The new container's definition: the old one's (the fields our creates set; an engine's
/// inspect output is not a valid create body as a whole: Podman lists every volume in `Binds`,
/// the last run's devices and rlimits), from the saved image, with the GPUs, their environment
/// and labels replaced and every volume of the old one mounted by name.
pub fn moved_body(
  info: &ContainerInspectResponse,
  image: &str,
  picked: &[String],
) -> (ContainerCreateBody, Vec<String>) {
  let c = info.config.clone().unwrap_or_default();
  let h = info.host_config.clone().unwrap_or_default();
  let mut volumes = Vec::new();
  let mut mounts = Vec::new();
  for m in info.mounts.iter().flatten() {
    if m.typ.as_deref() != Some("volume") {
      continue;
    }
    let (Some(name), Some(dest)) = (m.name.clone(), m.destination.clone()) else {
      continue;
    };
    mounts.push(Mount {
      target: Some(dest),
      source: Some(name.clone()),
      typ: Some(MountType::VOLUME),
      read_only: Some(m.rw == Some(false)),
      ..Default::default()
    });
    // The agent volume is every sandbox's: mounted again, never carried (nor removed) as the
    // sandbox's own.
    if !crate::sandbox::agent::is_agent_volume(&name) {
      volumes.push(name);
    }
  }
  // A declared volume path that is mounted now would get a second, anonymous volume.
  let declared: Vec<String> = c
    .volumes
    .unwrap_or_default()
    .into_iter()
    .filter(|p| {
      !mounts
        .iter()
        .any(|m| m.target.as_deref() == Some(p.as_str()))
    })
    .collect();
  let mut env = c.env.unwrap_or_default();
  env.retain(|e| {
    !e.starts_with("NVIDIA_VISIBLE_DEVICES=") && !e.starts_with(&format!("{}=", devices::ENV_GPUS))
  });
  let mut labels = c.labels.unwrap_or_default();
  labels.remove(LABEL_GPUS);
  labels.insert(LABEL_SAVED_IMAGE.into(), image.to_string());
  labels.insert(LABEL_CARRIED_VOLUMES.into(), volumes.join(","));
  let mut body = ContainerCreateBody {
    image: Some(image.to_string()),
    entrypoint: c.entrypoint,
    cmd: c.cmd,
    env: Some(env),
    labels: Some(labels),
    working_dir: c.working_dir,
    hostname: c.hostname,
    user: c.user.filter(|u| !u.is_empty()),
    volumes: (!declared.is_empty()).then_some(declared),
    stop_signal: c.stop_signal,
    attach_stdin: Some(false),
    attach_stdout: Some(false),
    attach_stderr: Some(false),
    tty: Some(false),
    open_stdin: Some(false),
    host_config: Some(HostConfig {
      init: h.init,
      cap_drop: h.cap_drop,
      cap_add: h.cap_add,
      security_opt: h.security_opt,
      privileged: h.privileged,
      memory: h.memory,
      memory_swap: h.memory_swap,
      nano_cpus: h.nano_cpus,
      pids_limit: h.pids_limit,
      network_mode: h.network_mode,
      readonly_rootfs: h.readonly_rootfs,
      tmpfs: h.tmpfs,
      runtime: h.runtime,
      mounts: (!mounts.is_empty()).then_some(mounts),
      ..Default::default()
    }),
    ..Default::default()
  };
  devices::shape(
    &mut body,
    Some(&Gpus::Exclusive(picked.len() as u32)),
    Some(picked),
  );
  (body, volumes)
}

/// Replaces the stopped container `info` by one from `image` with `picked` GPUs, under the same
/// name, and starts it. On failure the old container keeps its name and the new one goes.
async fn move_to(
  engine: &Engine,
  info: &ContainerInspectResponse,
  image: &str,
  picked: &[String],
  log: &Logger,
) -> Result<()> {
  let old_id = info.id.clone().unwrap_or_default();
  let name = info
    .name
    .as_deref()
    .unwrap_or_default()
    .trim_start_matches('/')
    .to_string();
  let moving = format!("{name}{MOVING_SUFFIX}");
  let moved = format!("{name}{MOVED_SUFFIX}");
  let (body, _) = moved_body(info, image, picked);
  // Left by a move of this sandbox that died (ours by name and labels, stopped): the volumes
  // stay, the container it moves from mounts them.
  let sandbox_id = info
    .config
    .as_ref()
    .and_then(|c| c.labels.as_ref())
    .and_then(|l| l.get(LABEL_ID))
    .cloned()
    .unwrap_or_default();
  for suffix in [MOVING_SUFFIX, MOVED_SUFFIX] {
    if let Some(id) = left_by_move(engine, &name, &sandbox_id, suffix).await? {
      let _ = engine
        .remove_stopped_keeping_volumes("remove a stale move", &id)
        .await;
    }
  }
  let new_id = engine
    .create_container("create the moved sandbox container", Some(&moving), body)
    .await
    .map_err(|e| devices::explain(e, Some(&Gpus::Exclusive(picked.len() as u32)), Some(picked)))?;
  if let Err(e) = engine
    .rename_container("rename the old sandbox container", &old_id, &moved)
    .await
  {
    let _ = engine
      .remove_keeping_volumes("remove the unused moved container", &new_id)
      .await;
    return Err(e);
  }
  let swap = async {
    engine
      .rename_container("rename the moved sandbox container", &new_id, &name)
      .await?;
    let found = engine
      .start_container("start the moved sandbox container", &new_id)
      .await?;
    found
      .then_some(())
      .ok_or_else(|| SandboxError::CreateFailed {
        step: "start the moved container".into(),
        detail: "it was removed while it was being started".into(),
      })
  };
  if let Err(e) = swap.await {
    // The new one goes first, so the name is free for the old one again.
    let _ = engine
      .remove_keeping_volumes("remove the unused moved container", &new_id)
      .await;
    let _ = engine
      .rename_container(
        "give the old sandbox container its name back",
        &old_id,
        &name,
      )
      .await;
    return Err(e);
  }
  // The old container's saved image (when it was moved before) is the new one's parent: it
  // goes with it, so only the container goes now, keeping the volumes the new one mounts.
  if let Err(e) = engine
    .remove_keeping_volumes("remove the old sandbox container", &old_id)
    .await
  {
    log.warn(
      "could not remove the container a sandbox moved from; the reaper will",
      json!({ "container": old_id, "error": e.to_string() }),
    );
  }
  Ok(())
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::sandbox::swap::{saved_of, Saved};
  use crate::util::labels;
  use bollard::models::{ContainerConfig, MountPoint};

  fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
  }

  #[test]
  fn own_free_gpus_are_kept_first() {
    let inv = s(&["0", "1", "2", "3"]);
    let mut held = BTreeMap::new();
    held.insert("1".to_string(), "other".to_string());
    assert_eq!(
      pick_keeping(&inv, &s(&["1", "3"]), &held, 2),
      Some(s(&["3", "0"]))
    );
    held.insert("0".to_string(), "x".to_string());
    held.insert("2".to_string(), "y".to_string());
    assert_eq!(pick_keeping(&inv, &s(&["1", "3"]), &held, 2), None);
    assert_eq!(pick_keeping(&inv, &s(&[]), &held, 0), None);
  }

  #[test]
  fn the_moved_body_changes_only_gpus_image_and_volumes() {
    let info = ContainerInspectResponse {
      name: Some("/trueforge-ns-01abc".into()),
      config: Some(ContainerConfig {
        image: Some("base:1".into()),
        env: Some(s(&[
          "A=1",
          "NVIDIA_VISIBLE_DEVICES=0",
          "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
          "TRUEFORGE_GPUS=0",
        ])),
        labels: Some(HashMap::from([
          (LABEL_GPUS.to_string(), "0".to_string()),
          (labels::LABEL_ID.to_string(), "/workspace/x".to_string()),
        ])),
        volumes: Some(s(&["/workspace", "/trueforge"])),
        working_dir: Some("/workspace/x".into()),
        ..Default::default()
      }),
      host_config: Some(HostConfig {
        pids_limit: Some(64),
        device_requests: Some(vec![Default::default()]),
        ..Default::default()
      }),
      mounts: Some(vec![
        MountPoint {
          typ: Some("volume".into()),
          name: Some("v1".into()),
          destination: Some("/workspace".into()),
          rw: Some(true),
          ..Default::default()
        },
        MountPoint {
          typ: Some("tmpfs".into()),
          destination: Some("/tmp".into()),
          ..Default::default()
        },
        MountPoint {
          typ: Some("volume".into()),
          name: Some("trueforge-agent-0.1.0-0123456789ab".into()),
          destination: Some("/.trueforge-agent/0.1.0-0123456789ab".into()),
          rw: Some(false),
          ..Default::default()
        },
      ]),
      ..Default::default()
    };
    let (body, vols) = moved_body(&info, "sha256:saved", &s(&["2"]));
    // The shared agent volume is mounted again, read-only, but not carried.
    assert_eq!(vols, s(&["v1"]));
    let mounts = body.host_config.as_ref().unwrap().mounts.clone().unwrap();
    let agent = mounts
      .iter()
      .find(|m| m.source.as_deref() == Some("trueforge-agent-0.1.0-0123456789ab"))
      .expect("the agent volume stays mounted");
    assert_eq!(agent.read_only, Some(true));
    assert_eq!(body.image.as_deref(), Some("sha256:saved"));
    assert_eq!(body.working_dir.as_deref(), Some("/workspace/x"));
    assert_eq!(body.volumes, Some(s(&["/trueforge"])));
    let env = body.env.clone().unwrap();
    assert!(env.contains(&"A=1".to_string()));
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=2".to_string()));
    assert!(env.contains(&"TRUEFORGE_GPUS=2".to_string()));
    assert!(!env.iter().any(|e| e == "NVIDIA_VISIBLE_DEVICES=0"));
    assert_eq!(
      env
        .iter()
        .filter(|e| e.starts_with("NVIDIA_DRIVER_CAPABILITIES="))
        .count(),
      1
    );
    let labels = body.labels.clone().unwrap();
    assert_eq!(labels[LABEL_GPUS], "2");
    assert_eq!(labels[labels::LABEL_ID], "/workspace/x");
    assert_eq!(
      saved_of(Some(&labels)),
      Saved {
        image: Some("sha256:saved".into()),
        volumes: s(&["v1"])
      }
    );
    let host = body.host_config.unwrap();
    assert_eq!(host.pids_limit, Some(64));
    let reqs = host.device_requests.unwrap();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].device_ids, Some(s(&["2"])));
    let mounts = host.mounts.unwrap();
    assert_eq!(mounts.len(), 2, "the sandbox's volume and the agent's");
    assert_eq!(mounts[0].source.as_deref(), Some("v1"));
    assert_eq!(mounts[0].target.as_deref(), Some("/workspace"));
    assert_eq!(saved_of(None), Saved::default());
  }
}
