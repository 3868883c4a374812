//! Containers: creating one per sandbox, finding ours again from an id in any process, starting
//! a stopped one once however many callers race, removing. A container is ours only when its
//! name derives from the id and its labels (managed-by, namespace, id) match.

use std::collections::HashMap;
use std::sync::Mutex;

use bollard::models::{ContainerCreateBody, ContainerInspectResponse, HostConfig};
use serde_json::json;

use crate::config::{Gpus, ProviderConfig};
use crate::engine::Engine;
use crate::sandbox::devices;
use crate::sandbox::layout;
use crate::sandbox::transfer;
use crate::util::errors::{Result, SandboxError};
use crate::util::ids;
use crate::util::labels;
use crate::util::labels::{LABEL_POOL, LABEL_TENANT};
use crate::util::logging::Logger;

/// The container's main process (under the init, which reaps zombies). It keeps the container
/// alive and stops it after `$1` idle seconds (0 = never), checking every `$2` seconds, so idle
/// sandboxes stop with no server process alive. Activity is the mtime of the activity file
/// (touched by every exec, upload and download) or a command still running (an exec wrapper,
/// whose `$0` is `trueforge-exec`, is alive). Exits at once on SIGTERM so stops are fast.
pub const INIT_SCRIPT: &str = r#"trap 'exit 0' TERM INT
act=/trueforge/.activity
: > "$act" 2>/dev/null
last=$(date +%s 2>/dev/null || echo 0)
if [ "$1" = 0 ]; then while :; do sleep 3600 & wait $!; done; fi
while :; do
  sleep "$2" & wait $!
  now=$(date +%s)
  if grep -qs 'trueforge-e[x]ec' /proc/[0-9]*/cmdline; then : > "$act" 2>/dev/null; last=$now; continue; fi
  m=$(stat -c %Y "$act" 2>/dev/null) && [ "$m" -gt "$last" ] && last=$m
  if [ $((now - last)) -ge "$1" ]; then exit 0; fi
done
"#;

/// A sandbox container we verified as ours.
#[derive(Debug, Clone)]
pub struct Target {
  pub sandbox_id: String,
  pub name: String,
  pub container_id: String,
  /// uid:gid the exec user maps to; `None` means root (no ownership to carry).
  pub owner: Option<(u32, u32)>,
  /// The tenant the container was verified for: a cached entry serves only that tenant.
  pub tenant: Option<String>,
  /// It holds exclusive GPUs: starting it again may move it (`gpumove`).
  pub exclusive_gpus: bool,
  /// What it holds beyond its container after a move; removed with it.
  pub saved: crate::gpu::relocate::Saved,
}

/// Per-engine state (kept per engine: `EngineShared::state`).
#[derive(Default)]
pub struct State {
  /// Containers verified as ours, by container name.
  targets: Mutex<HashMap<String, Target>>,
  /// One start at a time per container id; entries go when the start is done.
  pub start_locks: crate::engine::runtime::KeyedLocks<String>,
}

impl State {
  /// Containers cached as ours.
  pub fn cached(&self) -> usize {
    self.targets.lock().expect("targets").len()
  }

  fn get(&self, name: &str) -> Option<Target> {
    self.targets.lock().expect("targets").get(name).cloned()
  }
}

/// Records a container as ours (a claimed pool member).
pub fn remember(engine: &Engine, target: &Target) {
  engine
    .shared
    .state::<State>()
    .targets
    .lock()
    .expect("targets")
    .insert(target.name.clone(), target.clone());
}

/// Forgets a container (it was removed, or its id 404s): the next call looks it up again.
pub fn forget(engine: &Engine, name: &str) {
  engine
    .shared
    .state::<State>()
    .targets
    .lock()
    .expect("targets")
    .remove(name);
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

/// Who a provider is: the scope a container must match to be ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
  pub namespace: String,
  pub tenant: Option<String>,
}

impl Scope {
  pub fn of(cfg: &ProviderConfig) -> Self {
    Self {
      namespace: cfg.namespace.clone(),
      tenant: cfg.tenant.clone(),
    }
  }
}

/// Whether inspect output describes our container for this id and scope: the name derives
/// from the id AND the labels (managed-by, namespace, id, tenant) match.
pub fn is_ours(
  info: &ContainerInspectResponse,
  name: &str,
  scope: &Scope,
  sandbox_id: &str,
) -> bool {
  let labels = info.config.as_ref().and_then(|c| c.labels.as_ref());
  let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
  info.name.as_deref() == Some(&format!("/{name}"))
    && label(labels::LABEL_MANAGED_BY) == Some(labels::MANAGED_BY)
    && label(labels::LABEL_NAMESPACE) == Some(scope.namespace.as_str())
    && label(labels::LABEL_ID) == Some(sandbox_id)
    && label(LABEL_TENANT) == scope.tenant.as_deref()
}

/// Finds our container for `sandbox_id`, from the process cache or one inspect.
pub async fn resolve(engine: &Engine, scope: &Scope, sandbox_id: &str) -> Result<Target> {
  let name = name_for(&scope.namespace, sandbox_id)?;
  if let Some(t) = engine.shared.state::<State>().get(&name) {
    if t.tenant == scope.tenant {
      return Ok(t);
    }
  }
  let mut found = engine
    .inspect_container("inspect the sandbox container", &name)
    .await?;
  // Absent only for the instant a GPU move swaps containers under the name (or after a move
  // that died mid-swap, which this repairs).
  if found.is_none() && crate::gpu::relocate::await_move(engine, &name).await? {
    found = engine
      .inspect_container("inspect the sandbox container", &name)
      .await?;
  }
  let Some(info) = found else {
    return Err(not_available(sandbox_id));
  };
  if !is_ours(&info, &name, scope, sandbox_id) {
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
    tenant: scope.tenant.clone(),
    exclusive_gpus: devices::gpus_of(&info).is_some(),
    saved: crate::gpu::relocate::saved_of(info.config.as_ref().and_then(|c| c.labels.as_ref())),
  };
  remember(engine, &t);
  Ok(t)
}

/// What a 404 from an operation on a sandbox's container meant.
pub enum After404 {
  /// The container is there: the 404 was about a path in it.
  Same,
  /// The id now resolves to another container (the sandbox moved to other GPUs): try again.
  Replaced(Target),
  /// The sandbox is gone.
  Gone,
}

/// Tells a missing file from a missing (or replaced) container after a 404.
pub async fn after_404(engine: &Engine, scope: &Scope, target: &Target) -> Result<After404> {
  if let Some(info) = engine
    .inspect_container("inspect the sandbox container", &target.container_id)
    .await?
  {
    if is_ours(&info, &target.name, scope, &target.sandbox_id) {
      return Ok(After404::Same);
    }
  }
  // Gone, or no longer under the sandbox's name (set aside by a GPU move): look the name up.
  forget(engine, &target.name);
  match resolve(engine, scope, &target.sandbox_id).await {
    Ok(t) if t.container_id != target.container_id => Ok(After404::Replaced(t)),
    Ok(_) | Err(SandboxError::SandboxNotAvailable { .. }) => Ok(After404::Gone),
    Err(e) => Err(e),
  }
}

/// Starts a stopped container. Concurrent callers in this process share one start; other
/// processes racing us get the engine's "already started", which is success too. A container
/// that is gone is forgotten and `Ok`: the caller's next try resolves the id again (another
/// process may have moved the sandbox to other GPUs).
pub async fn ensure_started(
  engine: &Engine,
  cfg: &ProviderConfig,
  target: &Target,
  log: &Logger,
) -> Result<()> {
  let state = engine.shared.state::<State>();
  let _guard = state.start_locks.lock(target.container_id.clone()).await;
  let Some(info) = engine
    .inspect_container("inspect the sandbox container", &target.container_id)
    .await?
  else {
    forget(engine, &target.name);
    return Ok(());
  };
  let state = info.state.clone().unwrap_or_default();
  if state.running == Some(true) && state.paused != Some(true) && state.restarting != Some(true) {
    return Ok(());
  }
  if state.paused == Some(true) {
    log.info(
      "unpausing sandbox",
      json!({ "sandboxId": target.sandbox_id }),
    );
    return engine
      .unpause_container("unpause the sandbox", &target.container_id)
      .await;
  }
  // An exclusive GPU sandbox starts only on GPUs no other sandbox holds, decided under the
  // engine's GPU lock: its own, or others (a move).
  if devices::gpus_of(&info).is_some() {
    return crate::gpu::relocate::start_exclusive(engine, cfg, target, log).await;
  }
  start_stopped(engine, target, log).await
}

/// Starts a stopped sandbox container (no checks); one that is gone is forgotten.
pub async fn start_stopped(engine: &Engine, target: &Target, log: &Logger) -> Result<()> {
  log.info(
    "starting stopped sandbox",
    json!({ "sandboxId": target.sandbox_id }),
  );
  if !engine
    .start_container("start the sandbox container", &target.container_id)
    .await?
  {
    forget(engine, &target.name);
  }
  Ok(())
}

/// How often the init checks for idleness: often enough for short test intervals, at most
/// every 30 s.
pub fn idle_check_secs(idle: u64) -> u64 {
  (idle / 6).clamp(1, 30)
}

/// Whether `user` (an image's `USER` or the `user` option: `name`, `uid`, `name:group` …) is
/// someone other than root. No user at all means root.
fn non_root(user: Option<&str>) -> bool {
  user.is_some_and(|u| {
    let user = u.split(':').next().unwrap_or("");
    !user.is_empty() && user != "root" && user != "0"
  })
}

/// The `USER` an image runs as, if it names one.
async fn image_user(engine: &Engine, image: &str) -> Result<Option<String>> {
  let info = engine.inspect_image(image).await?;
  Ok(
    info
      .and_then(|i| i.config)
      .and_then(|c| c.user)
      .filter(|u| !u.is_empty()),
  )
}

/// Where Podman's Docker API differs in ways that matter for security (docs/podman.md):
/// - a non-root exec gets the container's capabilities as *ambient* ones (Docker: none), so a
///   sandbox whose user is not root keeps no capability at all there (root-only capabilities
///   are useless to a non-root user on Docker anyway). That user is the `user` option, else the
///   image's `USER` (`image_user`: the default image runs as `agent`);
/// - `HostConfig.Runtime` is ignored, so asking for a runtime is refused rather than silently
///   running under the default one.
pub fn podman_adjust(
  cfg: &ProviderConfig,
  image_user: Option<&str>,
  body: &mut ContainerCreateBody,
) -> Result<()> {
  if let Some(rt) = &cfg.runtime {
    return Err(SandboxError::CreateFailed {
      step: "runtime".into(),
      detail: format!(
        "the engine is Podman, whose Docker API ignores the OCI runtime asked for ({rt}); set it in Podman's containers.conf ([engine] runtime = \"{rt}\") and leave `runtime` unset"
      ),
    });
  }
  if non_root(cfg.user.as_deref().or(image_user)) {
    if let Some(hc) = body.host_config.as_mut() {
      hc.cap_add = Some(Vec::new());
    }
  }
  Ok(())
}

/// The container definition for a new sandbox: least privilege by default (see README).
pub fn container_body(
  cfg: &ProviderConfig,
  sandbox_id: &str,
  image: &str,
  pool: Option<&str>,
) -> ContainerCreateBody {
  container_body_with(cfg, sandbox_id, image, pool, None)
}

/// `container_body` with the GPUs picked for an exclusive sandbox (see `gpu::shape`).
pub fn container_body_with(
  cfg: &ProviderConfig,
  sandbox_id: &str,
  image: &str,
  pool: Option<&str>,
  gpus_picked: Option<&[String]>,
) -> ContainerCreateBody {
  let mut labels: HashMap<String, String> = cfg.labels.clone().into_iter().collect();
  labels.insert(labels::LABEL_MANAGED_BY.into(), labels::MANAGED_BY.into());
  labels.insert(labels::LABEL_NAMESPACE.into(), cfg.namespace.clone());
  labels.insert(labels::LABEL_ID.into(), sandbox_id.to_string());
  labels.insert(
    labels::LABEL_CREATED_AT.into(),
    crate::util::timestamps::rfc3339_now(),
  );
  if let Some(t) = &cfg.tenant {
    labels.insert(LABEL_TENANT.into(), t.clone());
  }
  if let Some(p) = pool {
    labels.insert(LABEL_POOL.into(), p.to_string());
  }
  let env: Vec<String> = cfg.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
  let idle = cfg.auto_stop_secs.unwrap_or(0);
  let r = &cfg.resources;
  let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
  // A read-only root still needs the sandbox root, the layout and /tmp writable: volumes keep
  // the first two across stops (nothing stored is lost), /tmp is scratch.
  let (volumes, tmpfs) = if cfg.read_only_rootfs {
    (
      Some(vec![
        ids::WORKSPACE_ROOT.to_string(),
        layout::LAYOUT_ROOT.to_string(),
      ]),
      Some(HashMap::from([(
        "/tmp".to_string(),
        "rw,nosuid,nodev,mode=1777".to_string(),
      )])),
    )
  } else {
    (None, None)
  };
  let mut body = ContainerCreateBody {
    image: Some(image.to_string()),
    entrypoint: Some(vec![
      "/bin/sh".into(),
      "-c".into(),
      INIT_SCRIPT.into(),
      "trueforge-init".into(),
      idle.to_string(),
      idle_check_secs(idle).to_string(),
    ]),
    env: Some(env),
    labels: Some(labels),
    working_dir: Some(sandbox_id.to_string()),
    hostname: Some("sandbox".into()),
    user: cfg.user.clone(),
    volumes,
    attach_stdin: Some(false),
    attach_stdout: Some(false),
    attach_stderr: Some(false),
    tty: Some(false),
    open_stdin: Some(false),
    network_disabled: None,
    host_config: Some(HostConfig {
      init: Some(true),
      cap_drop: Some(vec!["ALL".into()]),
      cap_add: Some(cfg.capabilities.clone()),
      security_opt: cfg
        .no_new_privileges
        .then(|| vec!["no-new-privileges:true".to_string()]),
      privileged: Some(false),
      memory: r.memory_bytes.map(to_i64),
      // Swap never above memory: the same figure for memory+swap means no swap at all.
      memory_swap: r.memory_bytes.map(to_i64),
      nano_cpus: r.nano_cpus.map(to_i64),
      pids_limit: r.pids_limit.map(to_i64),
      network_mode: Some(cfg.network.clone()),
      readonly_rootfs: Some(cfg.read_only_rootfs),
      tmpfs,
      runtime: cfg.runtime.clone(),
      ..Default::default()
    }),
    ..Default::default()
  };
  devices::shape(&mut body, cfg.gpus.as_ref(), gpus_picked);
  body
}

/// Creates, lays out and starts a sandbox from `image` (the resolved reference). A pool member
/// (`pool` = the configuration's fingerprint) gets a name no id resolves to until it is claimed.
/// On any failure the container is removed.
pub async fn create(
  engine: &Engine,
  cfg: &ProviderConfig,
  image: &str,
  pool: Option<&str>,
  log: &Logger,
) -> Result<Target> {
  create_with(engine, cfg, image, pool, log, None).await
}

/// `create` with the GPUs picked for an exclusive sandbox (`gpu::create_exclusive`). An engine
/// that cannot give the GPUs asked for fails with `GpuUnsupported`.
pub async fn create_with(
  engine: &Engine,
  cfg: &ProviderConfig,
  image: &str,
  pool: Option<&str>,
  log: &Logger,
  gpus_picked: Option<&[String]>,
) -> Result<Target> {
  if devices::needs_cdi(cfg, gpus_picked) {
    let names = match (&cfg.gpus, gpus_picked) {
      (_, Some(p)) => p.to_vec(),
      (Some(Gpus::Cdi(n)), None) => n.clone(),
      _ => Vec::new(),
    };
    devices::check_cdi_support(engine, &names)?;
  }
  create_inner(engine, cfg, image, pool, log, gpus_picked)
    .await
    .map_err(|e| devices::explain(e, cfg.gpus.as_ref(), gpus_picked))
}

async fn create_inner(
  engine: &Engine,
  cfg: &ProviderConfig,
  image: &str,
  pool: Option<&str>,
  log: &Logger,
  gpus_picked: Option<&[String]>,
) -> Result<Target> {
  let sandbox_id = ids::new_sandbox_id();
  let final_name = name_for(&cfg.namespace, &sandbox_id)?;
  let name = if pool.is_some() {
    pool_name(&final_name)
  } else {
    final_name
  };
  let mut body = container_body_with(cfg, &sandbox_id, image, pool, gpus_picked);
  if engine.podman {
    // One more request, on Podman only: who the image runs as decides its capabilities there.
    let image_user = match cfg.user {
      Some(_) => None,
      None => image_user(engine, image).await?,
    };
    podman_adjust(cfg, image_user.as_deref(), &mut body)?;
  }
  // Not retried: a create that reached the engine would collide with its own name.
  let created = engine
    .create_container("create the sandbox container", Some(&name), body)
    .await
    .map_err(|e| match e {
      SandboxError::Engine {
        status: 404,
        detail,
        ..
      } if detail.contains("image") => SandboxError::ImageNotAvailable {
        image: image.to_string(),
        reason: format!(
          "{detail}; call buildImage() and wait until getImageBuildStatus() says ready"
        ),
      },
      SandboxError::Engine { detail, .. } if detail.contains("runtime") => {
        SandboxError::CreateFailed {
          step: "create the container".into(),
          detail: format!(
            "{detail}; the `runtime` option names a runtime this engine does not have"
          ),
        }
      }
      SandboxError::Engine { detail, .. } => SandboxError::CreateFailed {
        step: "create the container".into(),
        detail,
      },
      other => other,
    });
  let created = match created {
    Ok(c) => c,
    Err(e) => {
      // No answer does not mean nothing happened: a hung engine may still run the buffered
      // request once it wakes. Remove the container by name when it does.
      if matches!(
        e,
        SandboxError::EngineTimeout { .. } | SandboxError::EngineUnreachable { .. }
      ) {
        remove_later(engine, &name, log);
      }
      return Err(e);
    }
  };
  let container_id = created;
  let finish = async {
    let info = engine
      .inspect_container("inspect the new sandbox", &container_id)
      .await?
      .ok_or_else(|| SandboxError::CreateFailed {
        step: "inspect the new container".into(),
        detail: "it was removed while it was being made".into(),
      })?;
    let user = info
      .config
      .as_ref()
      .and_then(|c| c.user.clone())
      .filter(|u| !u.is_empty());
    let owner = resolve_owner(engine, &container_id, user.as_deref()).await?;
    // With a read-only root the volumes at /workspace and /trueforge take the entries.
    let mut dirs: Vec<String> = layout::LAYOUT_DIRS
      .iter()
      .filter(|d| !cfg.read_only_rootfs || **d != layout::LAYOUT_ROOT)
      .map(|d| d.to_string())
      .collect();
    if !cfg.read_only_rootfs {
      dirs.push(ids::WORKSPACE_ROOT.to_string());
    }
    dirs.push(sandbox_id.clone());
    transfer::make_layout(engine, &container_id, &dirs, owner, cfg.read_only_rootfs)
      .await
      .map_err(|e| step_failed("create the sandbox layout", e))?;
    let started = engine
      .start_container("start the sandbox container", &container_id)
      .await
      .map_err(|e| step_failed("start the container", e))?;
    if !started {
      return Err(SandboxError::CreateFailed {
        step: "start the container".into(),
        detail: "it was removed while it was being made".into(),
      });
    }
    Ok::<_, SandboxError>(Target {
      sandbox_id: sandbox_id.clone(),
      name: name.clone(),
      container_id: container_id.clone(),
      owner,
      tenant: cfg.tenant.clone(),
      exclusive_gpus: gpus_picked.is_some(),
      saved: Default::default(),
    })
  };
  match finish.await {
    Ok(t) => {
      // A pool member is nobody's until claimed (the claim caches it under its final name).
      if pool.is_none() {
        remember(engine, &t);
      }
      log.info(
        "sandbox created",
        json!({ "sandboxId": sandbox_id, "container": name, "image": image }),
      );
      Ok(t)
    }
    Err(e) => {
      log.warn(
        "sandbox creation failed; removing its container",
        json!({ "container": name, "error": e.to_string() }),
      );
      if force_remove(engine, &container_id).await.is_err() {
        remove_later(engine, &container_id, log);
      }
      Err(e)
    }
  }
}

/// Removes a half-made container in the background once the engine answers again: polls for up
/// to ten minutes and, once the engine responds, keeps checking for half a minute more (a
/// request it buffered while hung may land late). When the engine's last provider is disposed
/// meanwhile, one last removal is tried (for at most `STOP_GRACE`, which dispose awaits) and
/// the rest is left to the reaper: the container carries our labels, so it is found.
fn remove_later(engine: &Engine, name_or_id: &str, log: &Logger) {
  let (task_engine, target, log) = (engine.clone(), name_or_id.to_string(), log.clone());
  engine.shared.background.spawn(|stop| async move {
    let engine = task_engine;
    let started = std::time::Instant::now();
    let mut answered_at: Option<std::time::Instant> = None;
    while started.elapsed() < std::time::Duration::from_secs(600) {
      match force_remove(&engine, &target).await {
        Ok(_) => {
          let since = *answered_at.get_or_insert_with(std::time::Instant::now);
          if since.elapsed() > std::time::Duration::from_secs(30) {
            return;
          }
        }
        Err(e) => log.debug(
          "half-made sandbox not removed yet",
          json!({ "container": target, "error": e.to_string() }),
        ),
      }
      tokio::select! {
        _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
        _ = stop.cancelled() => {
          let _ = tokio::time::timeout(STOP_GRACE, force_remove(&engine, &target)).await;
          return;
        }
      }
    }
    log.warn(
      "gave up removing a half-made sandbox; the reaper will",
      json!({ "container": target }),
    );
  });
}

/// How long a stopped clean-up still tries: dispose waits for it, so it stays short even when
/// the engine does not answer.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The name a pool member carries until it is claimed.
pub fn pool_name(final_name: &str) -> String {
  format!("{final_name}-pool")
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

/// Removes a container (and its anonymous volumes) whatever its state. `Ok(false)` when it was
/// already gone.
pub async fn force_remove(engine: &Engine, container: &str) -> Result<bool> {
  engine.force_remove(container).await
}

/// Restarts a container (one second's grace): kills every process in it, keeps its files.
/// Whether the engine did so within `limit`.
pub async fn restart(engine: &Engine, container: &str, limit: std::time::Duration) -> bool {
  engine.restart_container(container, 1, limit).await.is_ok()
}

/// Removes one sandbox; a sandbox that is already gone (or was never ours) is not an error.
pub async fn remove(
  engine: &Engine,
  scope: &Scope,
  sandbox_id: &str,
  log: &Logger,
) -> Result<bool> {
  // Twice at most: a cached container may have been replaced by a GPU move elsewhere.
  for _ in 0..2 {
    let target = match resolve(engine, scope, sandbox_id).await {
      Ok(t) => t,
      Err(SandboxError::SandboxNotAvailable { .. }) => return Ok(false),
      Err(e) => return Err(e),
    };
    forget(engine, &target.name);
    let removed = if target.exclusive_gpus {
      crate::gpu::relocate::remove_exclusive(engine, &target, log).await?
    } else {
      force_remove(engine, &target.container_id).await?
    };
    if removed {
      crate::gpu::relocate::remove_saved(engine, &target.saved, log).await;
      return Ok(true);
    }
  }
  Ok(false)
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
  // A missing passwd or group file means "no names"; an engine failure is an engine failure.
  let read = |path: &'static str| async move {
    match transfer::download(engine, container, path, path, 4 << 20).await {
      Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
      Err(SandboxError::FileNotFound { .. }) => Ok(String::new()),
      Err(e) => Err(e),
    }
  };
  let (uid, primary_gid) = match u.parse::<u32>() {
    Ok(uid) => {
      let passwd = if g.is_none() {
        read("/etc/passwd").await?
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
      let passwd = read("/etc/passwd").await?;
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
        let group = read("/etc/group").await?;
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

#[cfg(test)]
mod tests {
  use super::*;
  use crate::config::ProviderConfig;

  #[test]
  fn who_counts_as_non_root() {
    for root in [
      None,
      Some(""),
      Some("root"),
      Some("0"),
      Some("0:0"),
      Some("root:wheel"),
    ] {
      assert!(!non_root(root), "{root:?}");
    }
    for other in ["agent", "1000", "1000:1000", "nobody:nogroup", "65534"] {
      assert!(non_root(Some(other)), "{other}");
    }
  }

  #[test]
  fn body_carries_labels_init_and_no_gpu_by_default() {
    let cfg = ProviderConfig::from_json(serde_json::json!({
      "image": "img:1", "namespace": "ns1", "labels": { "team": "a" }, "env": { "A": "1" }
    }))
    .unwrap();
    let b = container_body(&cfg, "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV", "img:1", None);
    let l = b.labels.unwrap();
    assert_eq!(l[labels::LABEL_MANAGED_BY], labels::MANAGED_BY);
    assert_eq!(l[labels::LABEL_NAMESPACE], "ns1");
    assert_eq!(l[labels::LABEL_ID], "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV");
    assert_eq!(l["team"], "a");
    assert!(l.contains_key(labels::LABEL_CREATED_AT));
    let hc = b.host_config.unwrap();
    assert_eq!(hc.init, Some(true));
    assert_eq!(hc.device_requests, None);
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(hc.privileged, Some(false));
    assert_eq!(
      hc.security_opt,
      Some(vec!["no-new-privileges:true".to_string()])
    );
    assert_eq!(hc.memory, hc.memory_swap);
    assert!(hc.pids_limit.is_some());
    assert_eq!(hc.network_mode.as_deref(), Some("bridge"));
    assert!(
      hc.binds.is_none() && hc.mounts.is_none() && hc.pid_mode.is_none() && hc.ipc_mode.is_none()
    );
    assert!(b.volumes.is_none());
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
