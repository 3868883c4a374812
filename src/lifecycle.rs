//! Containers: creating one per sandbox, finding ours again from an id in any process, starting
//! a stopped one once however many callers race, removing. A container is ours only when its
//! name derives from the id and its labels (managed-by, namespace, id) match.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use bollard::models::{ContainerCreateBody, ContainerInspectResponse, DeviceRequest, HostConfig};
use bollard::query_parameters::{CreateContainerOptions, RemoveContainerOptions};
use serde_json::json;

use crate::client::{status_of, Engine};
use crate::config::{Gpus, ProviderConfig};
use crate::errors::{Result, SandboxError};
use crate::ids;
use crate::layout;
use crate::logging::Logger;
use crate::transfer;

/// Keeps the container alive under the init process; exits at once on SIGTERM so stops are fast.
pub const KEEPALIVE_SCRIPT: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// A sandbox container we verified as ours.
#[derive(Debug, Clone)]
pub struct Target {
  pub sandbox_id: String,
  pub name: String,
  pub container_id: String,
  /// uid:gid the exec user maps to; `None` means root (no ownership to carry).
  pub owner: Option<(u32, u32)>,
  pub user: Option<String>,
}

fn cache() -> &'static Mutex<HashMap<String, Target>> {
  static C: OnceLock<Mutex<HashMap<String, Target>>> = OnceLock::new();
  C.get_or_init(|| Mutex::new(HashMap::new()))
}

fn cache_key(engine: &Engine, name: &str) -> String {
  format!("{}\n{name}", engine.host)
}

/// Forgets a container (it was removed, or its id 404s): the next call looks it up again.
pub fn forget(engine: &Engine, name: &str) {
  cache()
    .lock()
    .expect("cache")
    .remove(&cache_key(engine, name));
}

fn not_available(sandbox_id: &str) -> SandboxError {
  SandboxError::SandboxNotAvailable {
    sandbox_id: sandbox_id.to_string(),
  }
}

/// The container name for an id, or `SandboxNotAvailable` for an id outside the grammar.
pub fn name_for(namespace: &str, sandbox_id: &str) -> Result<String> {
  let ulid = ids::parse_sandbox_id(sandbox_id).ok_or_else(|| not_available(sandbox_id))?;
  Ok(ids::container_name(namespace, ulid))
}

/// Whether inspect output describes our container for this id and namespace.
pub fn is_ours(
  info: &ContainerInspectResponse,
  name: &str,
  namespace: &str,
  sandbox_id: &str,
) -> bool {
  let labels = info.config.as_ref().and_then(|c| c.labels.as_ref());
  let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
  info.name.as_deref() == Some(&format!("/{name}"))
    && label(ids::LABEL_MANAGED_BY) == Some(ids::MANAGED_BY)
    && label(ids::LABEL_NAMESPACE) == Some(namespace)
    && label(ids::LABEL_ID) == Some(sandbox_id)
}

/// Finds our container for `sandbox_id`, from the process cache or one inspect.
pub async fn resolve(engine: &Engine, namespace: &str, sandbox_id: &str) -> Result<Target> {
  let name = name_for(namespace, sandbox_id)?;
  if let Some(t) = cache()
    .lock()
    .expect("cache")
    .get(&cache_key(engine, &name))
  {
    return Ok(t.clone());
  }
  let info = match engine
    .control(
      "inspect the sandbox container",
      engine.docker.inspect_container(&name, None),
    )
    .await
  {
    Ok(i) => i,
    Err(e) if status_of(&e) == Some(404) => return Err(not_available(sandbox_id)),
    Err(e) => return Err(e),
  };
  if !is_ours(&info, &name, namespace, sandbox_id) {
    return Err(not_available(sandbox_id));
  }
  let container_id = info
    .id
    .clone()
    .ok_or_else(|| SandboxError::Internal("inspect returned no id".into()))?;
  let user = info
    .config
    .as_ref()
    .and_then(|c| c.user.clone())
    .filter(|u| !u.is_empty());
  let owner = resolve_owner(engine, &container_id, user.as_deref()).await?;
  let t = Target {
    sandbox_id: sandbox_id.to_string(),
    name: name.clone(),
    container_id,
    owner,
    user,
  };
  cache()
    .lock()
    .expect("cache")
    .insert(cache_key(engine, &name), t.clone());
  Ok(t)
}

/// Whether the container still exists as ours (used to tell a missing file from a missing
/// container after a 404).
pub async fn still_exists(engine: &Engine, namespace: &str, target: &Target) -> Result<bool> {
  match engine
    .control(
      "inspect the sandbox container",
      engine.docker.inspect_container(&target.container_id, None),
    )
    .await
  {
    Ok(info) => Ok(is_ours(&info, &target.name, namespace, &target.sandbox_id)),
    Err(e) if status_of(&e) == Some(404) => {
      forget(engine, &target.name);
      Ok(false)
    }
    Err(e) => Err(e),
  }
}

/// Starts a stopped container. Concurrent callers in this process share one start; other
/// processes racing us get the engine's "already started", which is success too.
pub async fn ensure_started(engine: &Engine, target: &Target, log: &Logger) -> Result<()> {
  static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
  let lock = LOCKS
    .get_or_init(Default::default)
    .lock()
    .expect("locks")
    .entry(target.container_id.clone())
    .or_default()
    .clone();
  let _guard = lock.lock().await;
  let info = match engine
    .control(
      "inspect the sandbox container",
      engine.docker.inspect_container(&target.container_id, None),
    )
    .await
  {
    Ok(i) => i,
    Err(e) if status_of(&e) == Some(404) => {
      forget(engine, &target.name);
      return Err(not_available(&target.sandbox_id));
    }
    Err(e) => return Err(e),
  };
  let state = info.state.unwrap_or_default();
  if state.running == Some(true) && state.paused != Some(true) && state.restarting != Some(true) {
    return Ok(());
  }
  if state.paused == Some(true) {
    log.info(
      "unpausing sandbox",
      json!({ "sandboxId": target.sandbox_id }),
    );
    return engine
      .control(
        "unpause the sandbox",
        engine.docker.unpause_container(&target.container_id),
      )
      .await;
  }
  log.info(
    "starting stopped sandbox",
    json!({ "sandboxId": target.sandbox_id }),
  );
  match engine
    .control(
      "start the sandbox container",
      engine.docker.start_container(&target.container_id, None),
    )
    .await
  {
    Ok(()) => Ok(()),
    Err(e) if status_of(&e) == Some(404) => {
      forget(engine, &target.name);
      Err(not_available(&target.sandbox_id))
    }
    Err(e) => Err(e),
  }
}

/// The engine's device requests for `gpus`, as `docker run --gpus` builds them.
pub fn device_requests(gpus: &Gpus) -> Vec<DeviceRequest> {
  let caps = Some(vec![vec!["gpu".to_string()]]);
  let req = match gpus {
    Gpus::All => DeviceRequest {
      count: Some(-1),
      capabilities: caps,
      ..Default::default()
    },
    Gpus::Count(n) => DeviceRequest {
      count: Some(i64::from(*n)),
      capabilities: caps,
      ..Default::default()
    },
    Gpus::Devices(ids) => DeviceRequest {
      device_ids: Some(ids.clone()),
      capabilities: caps,
      ..Default::default()
    },
  };
  vec![req]
}

/// The container definition for a new sandbox.
pub fn container_body(cfg: &ProviderConfig, sandbox_id: &str) -> ContainerCreateBody {
  let mut labels: HashMap<String, String> = cfg.labels.clone().into_iter().collect();
  labels.insert(ids::LABEL_MANAGED_BY.into(), ids::MANAGED_BY.into());
  labels.insert(ids::LABEL_NAMESPACE.into(), cfg.namespace.clone());
  labels.insert(ids::LABEL_ID.into(), sandbox_id.to_string());
  labels.insert(ids::LABEL_CREATED_AT.into(), ids::rfc3339_now());
  let env: Vec<String> = cfg.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
  ContainerCreateBody {
    image: Some(cfg.image.clone()),
    entrypoint: Some(vec!["/bin/sh".into(), "-c".into(), KEEPALIVE_SCRIPT.into()]),
    env: Some(env),
    labels: Some(labels),
    working_dir: Some(sandbox_id.to_string()),
    hostname: Some("sandbox".into()),
    attach_stdin: Some(false),
    attach_stdout: Some(false),
    attach_stderr: Some(false),
    tty: Some(false),
    open_stdin: Some(false),
    host_config: Some(HostConfig {
      init: Some(true),
      device_requests: cfg.gpus.as_ref().map(device_requests),
      ..Default::default()
    }),
    ..Default::default()
  }
}

/// Creates, lays out and starts a sandbox. On any failure the container is removed.
pub async fn create(engine: &Engine, cfg: &ProviderConfig, log: &Logger) -> Result<Target> {
  let sandbox_id = ids::new_sandbox_id();
  let name = name_for(&cfg.namespace, &sandbox_id)?;
  let opts = CreateContainerOptions {
    name: Some(name.clone()),
    ..Default::default()
  };
  let created = engine
    .control(
      "create the sandbox container",
      engine
        .docker
        .create_container(Some(opts), container_body(cfg, &sandbox_id)),
    )
    .await
    .map_err(|e| match e {
      SandboxError::Engine {
        status: 404,
        detail,
        ..
      } if detail.contains("image") => SandboxError::ImageNotAvailable {
        image: cfg.image.clone(),
        reason: format!(
          "{detail}; call buildImage() and wait until getImageBuildStatus() says ready"
        ),
      },
      SandboxError::Engine { detail, .. } => SandboxError::CreateFailed {
        step: "create the container".into(),
        detail,
      },
      other => other,
    })?;
  let container_id = created.id;
  let finish = async {
    let info = engine
      .control(
        "inspect the new sandbox",
        engine.docker.inspect_container(&container_id, None),
      )
      .await?;
    let user = info
      .config
      .as_ref()
      .and_then(|c| c.user.clone())
      .filter(|u| !u.is_empty());
    let owner = resolve_owner(engine, &container_id, user.as_deref()).await?;
    let mut dirs: Vec<String> = layout::LAYOUT_DIRS.iter().map(|d| d.to_string()).collect();
    dirs.push(ids::WORKSPACE_ROOT.to_string());
    dirs.push(sandbox_id.clone());
    transfer::make_dirs(engine, &container_id, &dirs, owner)
      .await
      .map_err(|e| step_failed("create the sandbox layout", e))?;
    engine
      .control(
        "start the sandbox container",
        engine.docker.start_container(&container_id, None),
      )
      .await
      .map_err(|e| step_failed("start the container", e))?;
    Ok::<_, SandboxError>(Target {
      sandbox_id: sandbox_id.clone(),
      name: name.clone(),
      container_id: container_id.clone(),
      owner,
      user,
    })
  };
  match finish.await {
    Ok(t) => {
      cache()
        .lock()
        .expect("cache")
        .insert(cache_key(engine, &name), t.clone());
      log.info(
        "sandbox created",
        json!({ "sandboxId": sandbox_id, "container": name, "image": cfg.image }),
      );
      Ok(t)
    }
    Err(e) => {
      log.warn(
        "sandbox creation failed; removing its container",
        json!({ "container": name, "error": e.to_string() }),
      );
      let _ = force_remove(engine, &container_id).await;
      Err(e)
    }
  }
}

fn step_failed(step: &str, e: SandboxError) -> SandboxError {
  match e {
    SandboxError::Engine { detail, .. } => SandboxError::CreateFailed {
      step: step.into(),
      detail,
    },
    other => other,
  }
}

/// Removes a container and its anonymous volumes, whatever its state.
pub async fn force_remove(engine: &Engine, container: &str) -> Result<()> {
  let opts = RemoveContainerOptions {
    force: true,
    v: true,
    ..Default::default()
  };
  match engine
    .control(
      "remove the sandbox container",
      engine.docker.remove_container(container, Some(opts)),
    )
    .await
  {
    Ok(()) => Ok(()),
    Err(e) if status_of(&e) == Some(404) => Ok(()),
    Err(e) if status_of(&e) == Some(409) && e.to_string().contains("already in progress") => Ok(()),
    Err(e) => Err(e),
  }
}

/// Removes one sandbox; a sandbox that is already gone (or was never ours) is not an error.
pub async fn remove(engine: &Engine, namespace: &str, sandbox_id: &str) -> Result<bool> {
  let target = match resolve(engine, namespace, sandbox_id).await {
    Ok(t) => t,
    Err(SandboxError::SandboxNotAvailable { .. }) => return Ok(false),
    Err(e) => return Err(e),
  };
  forget(engine, &target.name);
  force_remove(engine, &target.container_id).await?;
  Ok(true)
}

/// Maps the container's `User` to numeric ids, reading the image's passwd and group files for
/// names. Root maps to `None`: files then need no ownership carried.
pub async fn resolve_owner(
  engine: &Engine,
  container: &str,
  user: Option<&str>,
) -> Result<Option<(u32, u32)>> {
  let Some(user) = user else { return Ok(None) };
  let (u, g) = match user.split_once(':') {
    Some((u, g)) => (u, Some(g)),
    None => (user, None),
  };
  let read = |path: &'static str| async move {
    transfer::download(engine, container, path, path, 4 << 20)
      .await
      .map(|b| String::from_utf8_lossy(&b).into_owned())
      .unwrap_or_default()
  };
  let (uid, primary_gid) = match u.parse::<u32>() {
    Ok(uid) => {
      let passwd = if g.is_none() {
        read("/etc/passwd").await
      } else {
        String::new()
      };
      (
        uid,
        lookup(&passwd, 2, &uid.to_string())
          .and_then(|f| f[3].parse().ok())
          .or(Some(uid)),
      )
    }
    Err(_) => {
      let passwd = read("/etc/passwd").await;
      let fields = lookup(&passwd, 0, u).ok_or_else(|| SandboxError::CreateFailed {
        step: "resolve the image's user".into(),
        detail: format!("user {u:?} is not in the image's /etc/passwd"),
      })?;
      (fields[2].parse().unwrap_or(0), fields[3].parse().ok())
    }
  };
  let gid = match g {
    None => primary_gid.unwrap_or(uid),
    Some(g) => match g.parse::<u32>() {
      Ok(n) => n,
      Err(_) => {
        let group = read("/etc/group").await;
        lookup(&group, 0, g)
          .and_then(|f| f[2].parse().ok())
          .unwrap_or(uid)
      }
    },
  };
  Ok(if uid == 0 && gid == 0 {
    None
  } else {
    Some((uid, gid))
  })
}

/// The colon-separated record whose field `field` equals `value` (with at least 4 fields).
fn lookup<'a>(db: &'a str, field: usize, value: &str) -> Option<Vec<&'a str>> {
  db.lines()
    .map(|l| l.split(':').collect::<Vec<_>>())
    .find(|f| f.len() >= 4 && f[field] == value)
}

/// Labels as a sorted map, for tests and listings.
pub fn labels_of(info: &ContainerInspectResponse) -> BTreeMap<String, String> {
  info
    .config
    .as_ref()
    .and_then(|c| c.labels.clone())
    .map(|l| l.into_iter().collect())
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::config::ProviderConfig;

  #[test]
  fn gpu_requests_match_the_cli() {
    let all = &device_requests(&Gpus::All)[0];
    assert_eq!(all.count, Some(-1));
    assert_eq!(all.capabilities, Some(vec![vec!["gpu".to_string()]]));
    assert_eq!(device_requests(&Gpus::Count(2))[0].count, Some(2));
    let d = &device_requests(&Gpus::Devices(vec!["0".into(), "3".into()]))[0];
    assert_eq!(d.device_ids, Some(vec!["0".to_string(), "3".to_string()]));
    assert_eq!(d.count, None);
  }

  #[test]
  fn body_carries_labels_init_and_no_gpu_by_default() {
    let cfg = ProviderConfig::from_json(serde_json::json!({
      "image": "img:1", "namespace": "ns1", "labels": { "team": "a" }, "env": { "A": "1" }
    }))
    .unwrap();
    let b = container_body(&cfg, "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV");
    let l = b.labels.unwrap();
    assert_eq!(l[ids::LABEL_MANAGED_BY], ids::MANAGED_BY);
    assert_eq!(l[ids::LABEL_NAMESPACE], "ns1");
    assert_eq!(l[ids::LABEL_ID], "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV");
    assert_eq!(l["team"], "a");
    assert!(l.contains_key(ids::LABEL_CREATED_AT));
    let hc = b.host_config.unwrap();
    assert_eq!(hc.init, Some(true));
    assert_eq!(hc.device_requests, None);
    assert_eq!(b.env.unwrap(), vec!["A=1".to_string()]);
  }

  #[test]
  fn passwd_lookup() {
    let db = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n";
    assert_eq!(lookup(db, 0, "app").unwrap()[2], "1000");
    assert_eq!(lookup(db, 2, "1000").unwrap()[3], "1001");
    assert!(lookup(db, 0, "nobody").is_none());
  }
}
