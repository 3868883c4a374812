//! What the `ls` and `rm` commands do: list this package's sandboxes on one engine (one
//! namespace or all), and remove some of them by id. Only containers with our labels whose
//! name derives from their id are ever listed or touched; probe and image-work containers are
//! not sandboxes and are left out.

use std::collections::HashMap;

use bollard::models::ContainerSummary;
use serde::Serialize;

use crate::engine::Engine;
use crate::sandbox::container;
use crate::util::errors::{Result, SandboxError};
use crate::util::labels;
use crate::util::labels::{LABEL_POOL, LABEL_TENANT};
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

fn ours(c: &ContainerSummary, namespace: Option<&str>) -> Option<(String, String, String)> {
  let labels = c.labels.as_ref()?;
  if labels.get(labels::LABEL_MANAGED_BY).map(String::as_str) != Some(labels::MANAGED_BY) {
    return None;
  }
  let ns = labels.get(labels::LABEL_NAMESPACE)?;
  if namespace.is_some_and(|n| n != ns) {
    return None;
  }
  let id = labels.get(labels::LABEL_ID)?;
  let expected = container::name_for(ns, id).ok()?;
  let name = c
    .names
    .as_ref()?
    .first()?
    .trim_start_matches('/')
    .to_string();
  if name != expected && name != container::pool_name(&expected) {
    return None;
  }
  Some((ns.clone(), id.clone(), name))
}

async fn list_raw(
  engine: &Engine,
  namespace: Option<&str>,
  size: bool,
) -> Result<Vec<ContainerSummary>> {
  let mut label = vec![format!(
    "{}={}",
    labels::LABEL_MANAGED_BY,
    labels::MANAGED_BY
  )];
  if let Some(ns) = namespace {
    label.push(format!("{}={ns}", labels::LABEL_NAMESPACE));
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
    let Some((ns, sandbox_id, name)) = ours(&c, namespace) else {
      continue;
    };
    let labels = c.labels.clone().unwrap_or_default();
    let container = c.id.clone().unwrap_or_default();
    // Any answer but a stat (the file or the container is gone, a stopped container on an
    // engine that cannot stat those) means "unknown", not a failed listing.
    let last_activity = match engine
      .archive_stat(
        "stat the activity file",
        &container,
        crate::sandbox::layout::ACTIVITY_FILE,
      )
      .await
    {
      Ok(s) => s.and_then(|s| s.modification_time.as_deref().and_then(parse_time)),
      Err(SandboxError::Engine { .. }) => None,
      Err(e) => return Err(e),
    };
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
      pool_member: labels.contains_key(LABEL_POOL) && name.ends_with("-pool"),
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

/// Removes the sandboxes with these ids (forced, volumes too), in `namespace` or any namespace.
/// Containers that are not ours are never touched, whatever their name.
pub async fn remove(
  engine: &Engine,
  namespace: Option<&str>,
  sandbox_ids: &[String],
) -> Result<Vec<Removal>> {
  let raw = list_raw(engine, namespace, false).await?;
  let mut out = Vec::new();
  for wanted in sandbox_ids {
    let mut removed = false;
    for c in &raw {
      let Some((_, id, name)) = ours(c, namespace) else {
        continue;
      };
      if &id != wanted {
        continue;
      }
      let Some(container) = c.id.as_deref() else {
        continue;
      };
      container::forget(engine, name.trim_end_matches("-pool"));
      removed |= engine.force_remove(container).await?;
    }
    out.push(Removal {
      sandbox_id: wanted.clone(),
      outcome: if removed { "removed" } else { "not-found" }.into(),
    });
  }
  Ok(out)
}
