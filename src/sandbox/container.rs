//! A sandbox's container: finding ours again from an id in any process, starting a stopped one
//! once however many callers race (through a `Placement`), removing it. A container is ours only when its
//! name derives from the id and its labels (managed-by, namespace, id) match.

use std::collections::HashMap;
use std::sync::Mutex;

use bollard::models::ContainerInspectResponse;
use futures_util::future::BoxFuture;
use serde_json::json;

use crate::config::ProviderConfig;
use crate::engine::Engine;
pub use crate::sandbox::ours::{owned, Owned, Role};
use crate::sandbox::owner::resolve_owner;
use crate::sandbox::{devices, swap};
use crate::util::errors::{Result, SandboxError};
use crate::util::ids;
use crate::util::labels::{self, LABEL_TENANT};
use crate::util::logging::Logger;

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
  /// It holds exclusive GPUs: starting it again may move it (`gpu::relocate`).
  pub exclusive_gpus: bool,
  /// What it holds beyond its container after a move; removed with it.
  pub saved: crate::sandbox::swap::Saved,
  /// The container's `Config.User`: whom commands and files run as (`None`: root).
  pub user: Option<String>,
  /// What the in-sandbox agent needs to know about the container.
  pub agent: std::sync::Arc<crate::sandbox::agent::facts::Facts>,
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

  fn put(&self, target: Option<&Target>, name: &str) {
    let mut targets = self.targets.lock().expect("targets");
    match target {
      Some(t) => targets.insert(name.to_string(), t.clone()),
      None => targets.remove(name),
    };
  }
}

/// Records a container as ours (a claimed pool member).
pub fn remember(engine: &Engine, target: &Target) {
  engine
    .shared
    .state::<State>()
    .put(Some(target), &target.name);
}

/// Forgets a container (it was removed, or its id 404s): the next call looks it up again.
pub fn forget(engine: &Engine, name: &str) {
  engine.shared.state::<State>().put(None, name);
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
  if found.is_none() && crate::sandbox::swap::await_move(engine, &name).await? {
    found = engine
      .inspect_container("inspect the sandbox container", &name)
      .await?;
  }
  let Some(info) = found else {
    return Err(not_available(sandbox_id));
  };
  if !is_ours(&info, &name, scope, sandbox_id) || standing_of(&info) == Standing::Removing {
    return Err(not_available(sandbox_id));
  }
  let container_id = info
    .id
    .clone()
    .ok_or_else(|| SandboxError::Internal("inspect returned no id".into()))?;
  let user = crate::sandbox::agent::facts::sandbox_user(&info);
  let owner = match resolve_owner(engine, &container_id, user.as_deref()).await {
    Ok(owner) => owner,
    // A container removed meanwhile fails the read of its passwd in odd ways (a missing file,
    // so "no such user"; the engine's 500s): the sandbox is gone, whatever the read said.
    Err(e) => {
      return Err(
        match engine
          .inspect_container("inspect the sandbox container", &container_id)
          .await?
        {
          Some(i) if standing_of(&i) != Standing::Removing => e,
          _ => not_available(sandbox_id),
        },
      )
    }
  };
  let t = Target {
    sandbox_id: sandbox_id.to_string(),
    name: name.clone(),
    container_id,
    owner,
    tenant: scope.tenant.clone(),
    exclusive_gpus: devices::gpus_of(&info).is_some(),
    saved: crate::sandbox::swap::saved_of(info.config.as_ref().and_then(|c| c.labels.as_ref())),
    agent: crate::sandbox::agent::facts::Facts::of(&info).into(),
    user,
  };
  remember(engine, &t);
  Ok(t)
}

/// Where a sandbox's container stands, asked after a call on it failed: the engine's errors
/// while a container stops or is removed are many and vague, its state is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
  /// No container of ours has that id any more (removed, or set aside by a GPU move).
  Gone,
  /// Being removed (or dead after a failed removal): it will not run again.
  Removing,
  /// Stopped, paused or restarting: starting it (again) may help.
  Stopped,
  Running,
}

fn standing_of(info: &ContainerInspectResponse) -> Standing {
  use bollard::models::ContainerStateStatusEnum as S;
  let state = info.state.clone().unwrap_or_default();
  match state.status {
    Some(S::REMOVING | S::DEAD) => Standing::Removing,
    _ if state.dead == Some(true) => Standing::Removing,
    _ if state.running == Some(true)
      && state.paused != Some(true)
      && state.restarting != Some(true) =>
    {
      Standing::Running
    }
    _ => Standing::Stopped,
  }
}

/// The standing of `target`'s container, by one inspect of its id.
pub async fn standing(engine: &Engine, scope: &Scope, target: &Target) -> Result<Standing> {
  let info = engine
    .inspect_container("inspect the sandbox container", &target.container_id)
    .await?;
  Ok(match info {
    Some(i) if is_ours(&i, &target.name, scope, &target.sandbox_id) => standing_of(&i),
    _ => Standing::Gone,
  })
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
    if is_ours(&info, &target.name, scope, &target.sandbox_id)
      && standing_of(&info) != Standing::Removing
    {
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

/// How a sandbox's container is started and removed. The plain way starts it and removes it;
/// the GPU one (`gpu::GpuPlacement`) starts an exclusive-GPU sandbox only on GPUs no other
/// sandbox holds, under the engine's GPU lock, moving it when its own are taken. A provider
/// builds its placement once; the sandbox layer only knows this trait.
pub trait Placement: Send + Sync {
  /// Starts the stopped container of `target`, whose inspect data is `info`.
  fn start<'a>(
    &'a self,
    engine: &'a Engine,
    target: &'a Target,
    info: &'a ContainerInspectResponse,
    log: &'a Logger,
  ) -> BoxFuture<'a, Result<()>>;

  /// Removes the container of `target` with its anonymous volumes: whatever its state with
  /// `force`, else only while it is stopped. `false` when it was gone (or, unforced, running).
  fn remove<'a>(
    &'a self,
    engine: &'a Engine,
    target: &'a Target,
    force: bool,
    log: &'a Logger,
  ) -> BoxFuture<'a, Result<bool>>;
}

/// Starts and removes containers as they are.
pub struct Plain;

impl Placement for Plain {
  fn start<'a>(
    &'a self,
    engine: &'a Engine,
    target: &'a Target,
    _info: &'a ContainerInspectResponse,
    log: &'a Logger,
  ) -> BoxFuture<'a, Result<()>> {
    Box::pin(start_stopped(engine, target, log))
  }

  fn remove<'a>(
    &'a self,
    engine: &'a Engine,
    target: &'a Target,
    force: bool,
    _log: &'a Logger,
  ) -> BoxFuture<'a, Result<bool>> {
    Box::pin(remove_container(engine, &target.container_id, force))
  }
}

/// Removes a container with its anonymous volumes, forced or only while stopped.
pub async fn remove_container(engine: &Engine, container: &str, force: bool) -> Result<bool> {
  if force {
    engine.force_remove(container).await
  } else {
    // Not forced: if a call started it again meanwhile, the engine refuses and it stays.
    engine
      .remove_stopped("remove a stopped sandbox", container)
      .await
  }
}

/// Starts a stopped container (or unpauses a paused one) through `placement`. Concurrent callers
/// in this process share one start; other processes racing us get the engine's "already
/// started", which is success too. A container that is gone is forgotten and `Ok`: the caller's
/// next try resolves the id again (another process may have moved the sandbox to other GPUs).
/// True when it was started through `placement`: its processes, its agent's included, are new.
pub async fn ensure_started(
  engine: &Engine,
  target: &Target,
  placement: &dyn Placement,
  log: &Logger,
) -> Result<bool> {
  let state = engine.shared.state::<State>();
  let _guard = state.start_locks.lock(target.container_id.clone()).await;
  let Some(info) = engine
    .inspect_container("inspect the sandbox container", &target.container_id)
    .await?
  else {
    forget(engine, &target.name);
    return Ok(false);
  };
  let run = info.state.clone().unwrap_or_default();
  if run.running == Some(true) && run.paused != Some(true) && run.restarting != Some(true) {
    return Ok(false);
  }
  if run.paused == Some(true) {
    log.info(
      "unpausing sandbox",
      json!({ "sandboxId": target.sandbox_id }),
    );
    return engine
      .unpause_container("unpause the sandbox", &target.container_id)
      .await
      .map(|()| false);
  }
  // A link's directory gone meanwhile would fail the start.
  crate::sandbox::agent::link::ensure(target.agent.link.as_deref());
  placement.start(engine, target, &info, log).await?;
  Ok(true)
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

/// The name a pool member carries until it is claimed.
pub fn pool_name(final_name: &str) -> String {
  format!("{final_name}-pool")
}

/// Removes one sandbox; a sandbox that is already gone (or was never ours) is not an error.
pub async fn remove(
  engine: &Engine,
  scope: &Scope,
  sandbox_id: &str,
  placement: &dyn Placement,
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
    if placement.remove(engine, &target, true, log).await? {
      swap::remove_saved(engine, &target.saved, log).await;
      if let Some(dir) = &target.agent.link {
        crate::sandbox::agent::link::remove(dir);
        crate::sandbox::agent::link::sweep_soon(engine);
      }
      return Ok(true);
    }
  }
  Ok(false)
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn only_derived_names_with_our_labels_are_ours() {
    let id = "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV";
    let name = name_for("ns", id).unwrap();
    let mut l = HashMap::from([
      (
        labels::LABEL_MANAGED_BY.to_string(),
        labels::MANAGED_BY.to_string(),
      ),
      (labels::LABEL_NAMESPACE.to_string(), "ns".to_string()),
      (labels::LABEL_ID.to_string(), id.to_string()),
    ]);
    let o = owned(&format!("/{name}"), Some(&l), Some("ns")).unwrap();
    assert_eq!((o.role, o.sandbox_id.as_str()), (Role::Sandbox, id));
    assert_eq!(
      owned(&format!("{name}.gpu-moved"), Some(&l), None).map(|o| o.role),
      Some(Role::SetAside)
    );
    // Another namespace, another name, a committed copy's random name, no pool label.
    assert!(owned(&name, Some(&l), Some("other")).is_none());
    assert!(owned("forged-name", Some(&l), None).is_none());
    assert!(owned(&format!("{name}x"), Some(&l), None).is_none());
    assert!(owned(&format!("{name}-pool"), Some(&l), None).is_none());
    l.insert(labels::LABEL_POOL.to_string(), "fp".to_string());
    assert_eq!(
      owned(&format!("{name}-pool"), Some(&l), None).map(|o| o.role),
      Some(Role::PoolMember)
    );
    // The labels must say the same namespace and id the name derives from.
    l.insert(labels::LABEL_NAMESPACE.to_string(), "other".to_string());
    assert!(owned(&name, Some(&l), None).is_none());
    l.remove(labels::LABEL_MANAGED_BY);
    assert!(owned(&name, Some(&l), None).is_none());
    assert!(owned(&name, None, None).is_none());
  }
}
