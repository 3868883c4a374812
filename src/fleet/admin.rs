//! What the `ls` and `rm` commands do: list this package's sandboxes on one engine (one
//! namespace or all), and remove some of them by id; list and remove the image-work leases a
//! failed or interrupted pull or build left (engine-wide: they belong to no namespace). Only
//! containers with our labels whose name derives from them are ever listed or touched; probes
//! are not sandboxes and are left out.

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::ContainerSummary;
use serde::Serialize;

use crate::engine::Engine;
use crate::fleet::reaper;
use crate::gpu::GpuPlacement;
use crate::images::work::{self, Found, Liveness};
use crate::sandbox::container::{self, Owned, Placement, Role, Target};
use crate::sandbox::swap;
use crate::util::errors::{Result, SandboxError};
use crate::util::labels::{self, LABEL_TENANT};
use crate::util::logging::Logger;
use crate::util::timestamps::parse_time;

/// One sandbox as `ls` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
  pub sandbox_id: String,
  pub namespace: String,
  /// The engine's state: `running`, `exited`, `created`, …
  pub state: String,
  /// Creation time, epoch seconds.
  pub created: Option<u64>,
  /// Last exec, upload or download through any provider (the activity file's mtime), epoch
  /// seconds; `None` when the engine cannot say.
  pub last_activity: Option<u64>,
  pub image: String,
  pub tenant: Option<String>,
  /// An unclaimed member of a warm pool.
  pub pool_member: bool,
  /// Bytes written in the container's own layer, when the engine says.
  pub size_bytes: Option<i64>,
  pub container: String,
}

/// Ours and in `namespace` (any with `None`): a sandbox or an unclaimed pool member.
fn ours(c: &ContainerSummary, namespace: Option<&str>) -> Option<Owned> {
  let name = c.names.as_ref()?.first()?;
  container::owned(name, c.labels.as_ref(), namespace).filter(|o| o.role != Role::SetAside)
}

async fn list_raw(
  engine: &Engine,
  namespace: Option<&str>,
  size: bool,
) -> Result<Vec<ContainerSummary>> {
  let mut label = vec![labels::ours()];
  if let Some(ns) = namespace {
    label.push(labels::filter(labels::LABEL_NAMESPACE, ns));
  }
  let filters = HashMap::from([("label".to_string(), label)]);
  engine
    .list_containers("list sandbox containers", true, size, filters)
    .await
}

/// This package's sandboxes on `engine`, in `namespace` or in all namespaces, oldest first.
pub async fn list(engine: &Engine, namespace: Option<&str>) -> Result<Vec<SandboxInfo>> {
  let raw = list_raw(engine, namespace, true).await?;
  let mut out = Vec::new();
  for c in raw {
    let Some(Owned {
      namespace: ns,
      sandbox_id,
      name,
      role,
    }) = ours(&c, namespace)
    else {
      continue;
    };
    let labels = c.labels.clone().unwrap_or_default();
    let container = c.id.clone().unwrap_or_default();
    // Any answer but a stat (the file or the container is gone, a stopped container on an
    // engine that cannot stat those) means "unknown", not a failed listing.
    let last_activity = last_activity(engine, &container).await?;
    out.push(SandboxInfo {
      sandbox_id,
      namespace: ns,
      state: c
        .state
        .map(|s| s.to_string())
        .unwrap_or_else(|| "unknown".into()),
      created: labels
        .get(labels::LABEL_CREATED_AT)
        .and_then(|t| parse_time(t))
        .or(c.created.and_then(|t| u64::try_from(t).ok())),
      last_activity,
      image: c.image.unwrap_or_default(),
      tenant: labels.get(LABEL_TENANT).cloned(),
      pool_member: role == Role::PoolMember,
      size_bytes: c.size_rw,
      container: name,
    });
  }
  out.sort_by(|a, b| {
    (a.created, &a.sandbox_id)
      .partial_cmp(&(b.created, &b.sandbox_id))
      .unwrap_or(std::cmp::Ordering::Equal)
  });
  Ok(out)
}

/// What `rm` did with one id.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Removal {
  pub sandbox_id: String,
  /// `removed`, or `not-found` (no sandbox of ours with that id in the namespace(s)).
  pub outcome: String,
}

/// Removes the sandboxes with these ids (forced, volumes too, and what a GPU move left), in
/// `namespace` or any namespace, through the same placement a provider uses (an exclusive GPU
/// sandbox goes under the GPU lock). Containers that are not ours are never touched, whatever
/// their name.
pub async fn remove(
  engine: &Engine,
  namespace: Option<&str>,
  sandbox_ids: &[String],
) -> Result<Vec<Removal>> {
  let raw = list_raw(engine, namespace, false).await?;
  let placement = GpuPlacement::removal_only();
  let log = Logger::default();
  let mut out = Vec::new();
  for wanted in sandbox_ids {
    let mut removed = false;
    for c in &raw {
      let (Some(o), Some(container)) = (ours(c, namespace), c.id.as_deref()) else {
        continue;
      };
      if &o.sandbox_id != wanted {
        continue;
      }
      let labels = c.labels.clone().unwrap_or_default();
      let target = Target {
        sandbox_id: o.sandbox_id.clone(),
        name: o.name.clone(),
        container_id: container.to_string(),
        owner: None,
        tenant: labels.get(labels::LABEL_TENANT).cloned(),
        exclusive_gpus: labels.contains_key(labels::LABEL_GPUS),
        saved: swap::saved_of(Some(&labels)),
        user: None,
        agent: Default::default(),
      };
      container::forget(engine, o.name.trim_end_matches("-pool"));
      if placement.remove(engine, &target, true, &log).await? {
        swap::remove_saved(engine, &target.saved, &log).await;
        removed = true;
      }
    }
    out.push(Removal {
      sandbox_id: wanted.clone(),
      outcome: if removed { "removed" } else { "not-found" }.into(),
    });
  }
  Ok(out)
}

/// Removes the sandboxes stopped for at least `older_than`, in `namespace` or in every
/// namespace that has sandboxes; their ids.
pub async fn remove_stopped(
  engine: &Engine,
  namespace: Option<&str>,
  older_than: Duration,
) -> Result<Vec<String>> {
  let namespaces = match namespace {
    Some(n) => vec![n.to_string()],
    None => {
      let mut all: Vec<String> = list(engine, None)
        .await?
        .into_iter()
        .map(|s| s.namespace)
        .collect();
      all.sort();
      all.dedup();
      all
    }
  };
  let placement = GpuPlacement::removal_only();
  let log = Logger::default();
  let mut removed = Vec::new();
  for n in namespaces {
    removed.extend(reaper::reap(engine, &n, older_than, false, &placement, &log).await?);
  }
  Ok(removed)
}

/// When the sandbox last had a host call: the mtime of the agent's activity file, else (a
/// sandbox made by an earlier version) of the old one. Any answer but a stat (the file or the
/// container is gone, a stopped container on an engine that cannot stat those, a read-only
/// root's /tmp) means "unknown", not a failed listing.
async fn last_activity(engine: &Engine, container: &str) -> Result<Option<u64>> {
  for file in [
    trueforge_agent_proto::msg::ACTIVITY_FILE,
    crate::sandbox::layout::ACTIVITY_FILE,
  ] {
    match engine
      .archive_stat("stat the activity file", container, file)
      .await
    {
      Ok(Some(s)) => return Ok(s.modification_time.as_deref().and_then(parse_time)),
      Ok(None) | Err(SandboxError::Engine { .. }) => {}
      Err(e) => return Err(e),
    }
  }
  Ok(None)
}

/// What a lease row says it is, in `ls` and `rm` output.
pub const LEASE_KIND: &str = "image-work lease";

/// An image-work lease as `ls` and `doctor` show it: the engine-wide record of a pull or build
/// (see `images::work`), which a failed or interrupted one leaves behind.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseInfo {
  /// Always `image-work lease`.
  pub kind: String,
  /// The container's name (`trueforge-imagework-<hash>`): what `rm` takes.
  pub container: String,
  pub image: String,
  /// `pull` or `build`.
  pub work: String,
  /// `running` (its holder was heard from lately), `failed` (`reason` says why) or `silent`
  /// (its holder died: crashed, restarted, killed).
  pub state: String,
  /// `host:pid` of the server process that did the work.
  pub holder: String,
  pub reason: Option<String>,
  /// When the lease was made, epoch seconds.
  pub created: u64,
  /// Seconds since its holder last wrote it.
  pub age_seconds: u64,
}

fn lease_info(f: &Found) -> LeaseInfo {
  let state = match f.seen.liveness() {
    Liveness::Alive => "running",
    Liveness::Failed => "failed",
    Liveness::Silent(_) => "silent",
  };
  LeaseInfo {
    kind: LEASE_KIND.into(),
    container: f.name.clone(),
    image: f.image.clone(),
    work: f.seen.record.kind.clone(),
    state: state.into(),
    holder: f.seen.record.holder.clone(),
    reason: f.seen.record.reason.clone(),
    created: f.seen.created_ms / 1000,
    age_seconds: f.seen.age_ms() / 1000,
  }
}

/// The image-work leases on `engine`, by name.
pub async fn leases(engine: &Engine) -> Result<Vec<LeaseInfo>> {
  Ok(work::leases(engine).await?.iter().map(lease_info).collect())
}

/// What `rm` did with one lease.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRemoval {
  /// Always `image-work lease`.
  pub kind: String,
  pub container: String,
  /// The image it was for; absent when no lease has that name.
  #[serde(skip_serializing_if = "Option::is_none")]
  pub image: Option<String>,
  /// `removed`, `not-found` (no lease of ours by that name) or `in-use` (its holder is at
  /// work: a pull or build in progress, left alone).
  pub outcome: String,
}

fn removal(container: &str, image: Option<&str>, outcome: &str) -> LeaseRemoval {
  LeaseRemoval {
    kind: LEASE_KIND.into(),
    container: container.to_string(),
    image: image.map(String::from),
    outcome: outcome.into(),
  }
}

/// Removes the leases with these container names, unless their holder is at work.
pub async fn remove_leases(engine: &Engine, names: &[String]) -> Result<Vec<LeaseRemoval>> {
  let found = work::leases(engine).await?;
  let mut out = Vec::new();
  for name in names {
    let Some(f) = found.iter().find(|f| &f.name == name) else {
      out.push(removal(name, None, "not-found"));
      continue;
    };
    let outcome = if f.seen.liveness() == Liveness::Alive {
      "in-use"
    } else if work::remove_found(engine, f).await? {
      "removed"
    } else {
      "not-found"
    };
    out.push(removal(name, Some(&f.image), outcome));
  }
  Ok(out)
}

/// Removes every lease whose work failed or whose holder died, last written at least
/// `older_than` ago.
pub async fn remove_stale_leases(
  engine: &Engine,
  older_than: Duration,
) -> Result<Vec<LeaseRemoval>> {
  Ok(
    work::remove_stale(engine, older_than)
      .await?
      .iter()
      .map(|f| removal(&f.name, Some(&f.image), "removed"))
      .collect(),
  )
}
