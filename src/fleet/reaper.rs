//! Removing sandboxes that have been stopped for longer than the delete interval. Runs in the
//! background for every live provider (at most one task per process, engine and namespace, at
//! most once a minute, never blocking a call), on demand (`reapStale()`), and from the `reap`
//! command for cron. It only ever touches stopped containers of its namespace that are ours by
//! name and labels (sandboxes, and the probes a crash left), and, engine-wide, leases and saved
//! images long unused: a container running a command is never removed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use bollard::models::{ContainerSummary, ContainerSummaryStateEnum};

use crate::engine::{claim, Engine};
use crate::gpu::GpuPlacement;
use crate::sandbox::container::{self, Owned, Placement, Role, Target};
use crate::sandbox::swap;
use crate::util::errors::Result;
use crate::util::labels::{self, LABEL_PROBE};
use crate::util::logging::Logger;
use crate::util::timestamps::parse_time;

/// How often the background reaper runs.
pub const REAP_PERIOD: Duration = Duration::from_secs(60);
/// Probe containers left by a crash are removed this long after they were made (a probe runs
/// for seconds and is removed by its maker; its deadline is 90 s).
const PROBE_GRACE: Duration = Duration::from_secs(600);

fn now_secs() -> u64 {
  SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .map(|d| d.as_secs())
    .unwrap_or(0)
}

/// Removes this namespace's sandboxes that have been stopped for at least `older_than`
/// (created-but-never-started ones count from creation), through `placement` (so an exclusive
/// GPU sandbox goes under the GPU lock, never in the middle of a move). Returns the sandbox ids
/// removed (or, with `dry_run`, that would be).
pub async fn reap(
  engine: &Engine,
  namespace: &str,
  older_than: Duration,
  dry_run: bool,
  placement: &dyn Placement,
  log: &Logger,
) -> Result<Vec<String>> {
  let labels = vec![
    labels::ours(),
    labels::filter(labels::LABEL_NAMESPACE, namespace),
  ];
  let list = stopped(engine, "list sandbox containers", labels).await?;
  let now = now_secs();
  let mut removed = Vec::new();
  for c in list {
    let Some(found) = stale(engine, &c, namespace, now, older_than).await? else {
      continue;
    };
    if !dry_run && !remove_stale(engine, &found, placement, log).await? {
      continue;
    }
    removed.push(found.owned.sandbox_id);
  }
  if !dry_run {
    reap_probes(engine, namespace).await;
    swap::sweep_saved_images(engine, now).await;
    // Best effort, like the probes: a lease left by a failed or crashed fetch long ago.
    let _ = crate::images::work::reap_forgotten(engine).await;
  }
  Ok(removed)
}

/// The containers carrying `labels` that are not running (created, exited, dead …). Filtered
/// here, not by the engine's `status` filter: Podman 4 refuses the whole list for a state it
/// does not know (`dead`).
async fn stopped(
  engine: &Engine,
  operation: &str,
  labels: Vec<String>,
) -> Result<Vec<ContainerSummary>> {
  let filters = HashMap::from([("label".to_string(), labels)]);
  let list = engine
    .list_containers(operation, true, false, filters)
    .await?;
  Ok(
    list
      .into_iter()
      .filter(|c| {
        !matches!(
          c.state,
          Some(
            ContainerSummaryStateEnum::RUNNING
              | ContainerSummaryStateEnum::PAUSED
              | ContainerSummaryStateEnum::RESTARTING
          )
        )
      })
      .collect(),
  )
}

/// A sandbox container found stale.
struct Stale {
  owned: Owned,
  container_id: String,
  labels: HashMap<String, String>,
  stopped_secs: u64,
}

/// `Some` when `c` is a container of ours in `namespace` (by name *and* labels: forged labels
/// and committed copies are not), stopped for at least `older_than`.
async fn stale(
  engine: &Engine,
  c: &ContainerSummary,
  namespace: &str,
  now: u64,
  older_than: Duration,
) -> Result<Option<Stale>> {
  let (Some(id), Some(name)) = (c.id.as_deref(), c.names.as_ref().and_then(|n| n.first())) else {
    return Ok(None);
  };
  let Some(owned) = container::owned(name, c.labels.as_ref(), Some(namespace)) else {
    return Ok(None);
  };
  let Some(info) = engine
    .inspect_container("inspect a stopped sandbox", id)
    .await?
  else {
    return Ok(None);
  };
  let state = info.state.unwrap_or_default();
  if state.running == Some(true) || state.restarting == Some(true) || state.paused == Some(true) {
    return Ok(None);
  }
  let since = state
    .finished_at
    .as_deref()
    .and_then(parse_time)
    .or_else(|| info.created.as_deref().and_then(parse_time));
  let Some(since) = since else { return Ok(None) };
  let stopped_secs = now.saturating_sub(since);
  if stopped_secs < older_than.as_secs() {
    return Ok(None);
  }
  Ok(Some(Stale {
    owned,
    container_id: id.to_string(),
    labels: c.labels.clone().unwrap_or_default(),
    stopped_secs,
  }))
}

/// Removes a stale container (not forced: if a call started it again meanwhile, the engine
/// refuses and it stays) with what it holds; `false` when it stayed.
async fn remove_stale(
  engine: &Engine,
  s: &Stale,
  placement: &dyn Placement,
  log: &Logger,
) -> Result<bool> {
  let target = Target {
    sandbox_id: s.owned.sandbox_id.clone(),
    name: s.owned.name.clone(),
    container_id: s.container_id.clone(),
    owner: None,
    tenant: s.labels.get(labels::LABEL_TENANT).cloned(),
    exclusive_gpus: s.labels.contains_key(labels::LABEL_GPUS),
    saved: swap::saved_of(Some(&s.labels)),
    user: None,
    agent: Default::default(),
  };
  if !placement.remove(engine, &target, false, log).await? {
    return Ok(false);
  }
  // A container a move set aside shares its volumes with the sandbox's current one.
  if s.owned.role != Role::SetAside {
    swap::remove_saved(engine, &target.saved, log).await;
  }
  if let Ok(name) = container::name_for(&s.owned.namespace, &s.owned.sandbox_id) {
    container::forget(engine, &name);
  }
  log.info(
    "removed stale sandbox",
    json!({ "sandboxId": s.owned.sandbox_id, "stoppedSeconds": s.stopped_secs }),
  );
  Ok(true)
}

/// The standalone reaper (the `reap` command): resolves the engine and the interval as a
/// provider would, then `reap`s one namespace.
pub async fn reap_standalone(
  namespace: Option<&str>,
  docker_host: Option<&str>,
  older_than_minutes: Option<f64>,
  dry_run: bool,
) -> Result<Vec<String>> {
  use crate::config;
  let namespace = config::validate_namespace(namespace.unwrap_or(config::DEFAULT_NAMESPACE))?;
  let secs = config::minutes(
    "olderThanMinutes",
    older_than_minutes.map(serde_json::Value::from),
    config::DEFAULT_AUTO_DELETE_MINUTES,
  )?
  .unwrap_or(0);
  let endpoint = crate::engine::effective_endpoint(docker_host, None)?;
  let engine = crate::engine::engine_for(&endpoint, crate::engine::CONTROL_TIMEOUT).await?;
  reap(
    &engine,
    &namespace,
    Duration::from_secs(secs),
    dry_run,
    &GpuPlacement::removal_only(),
    &Logger::default(),
  )
  .await
}

/// Removes the throwaway containers (image probes, GPU discovery) of `namespace` that a crash
/// left: ours by name and labels (`claim::probe_made_ms`), made longer than the grace ago, and
/// stopped. A probe runs for seconds and its maker removes it; a running one is left alone
/// (removal is not forced), as is any other namespace's. Best effort.
async fn reap_probes(engine: &Engine, namespace: &str) {
  let labels = vec![
    labels::ours(),
    labels::filter(labels::LABEL_NAMESPACE, namespace),
    LABEL_PROBE.to_string(),
  ];
  let Ok(list) = stopped(engine, "list probe containers", labels).await else {
    return;
  };
  let now = crate::util::timestamps::now_ms();
  for c in list {
    let Some(name) = c.names.as_ref().and_then(|n| n.first()) else {
      continue;
    };
    let Some(made) = claim::probe_made_ms(name, c.labels.as_ref(), namespace) else {
      continue;
    };
    if now.saturating_sub(made) <= PROBE_GRACE.as_millis() as u64 {
      continue;
    }
    if let Some(id) = c.id.as_deref() {
      let _ = engine
        .remove_stopped("remove a probe container a crash left", id)
        .await;
    }
  }
}

/// Held by live providers; the background reaper runs while any is held.
pub struct Lease;

/// Per-engine state (kept per engine: `EngineShared::state`).
#[derive(Default)]
pub struct State {
  /// The background reaper of each namespace, alive while a provider holds its lease.
  leases: Mutex<HashMap<String, Weak<Lease>>>,
}

impl State {
  /// Namespaces with a live background reaper.
  pub fn leases(&self) -> usize {
    let mut map = self.leases.lock().expect("leases");
    map.retain(|_, l| l.strong_count() > 0);
    map.len()
  }
}

/// Joins (or starts) the background reaper for this engine and namespace. It ends when the
/// last lease is dropped or the engine's background work is stopped.
pub fn lease(
  engine: &Engine,
  namespace: &str,
  older_than: Duration,
  placement: Arc<dyn Placement>,
  log: &Logger,
) -> Arc<Lease> {
  let state = engine.shared.state::<State>();
  let mut map = state.leases.lock().expect("leases");
  if let Some(l) = map.get(namespace).and_then(Weak::upgrade) {
    return l;
  }
  let lease = Arc::new(Lease);
  map.insert(namespace.to_string(), Arc::downgrade(&lease));
  let weak = Arc::downgrade(&lease);
  let (task_engine, namespace, log) = (engine.clone(), namespace.to_string(), log.clone());
  engine.shared.background.spawn_cancellable(async move {
    let engine = task_engine;
    while weak.upgrade().is_some() {
      if let Err(e) = reap(
        &engine,
        &namespace,
        older_than,
        false,
        placement.as_ref(),
        &log,
      )
      .await
      {
        log.warn(
          "background reaper failed; it will try again",
          json!({ "error": e.to_string() }),
        );
      }
      tokio::time::sleep(REAP_PERIOD).await;
    }
  });
  lease
}
