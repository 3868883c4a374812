//! Which GPUs are free, and creating a sandbox on free ones. The engine is the only shared
//! record: a sandbox's GPUs are in its `trueforge.sandbox.gpus` label, and the GPUs held are
//! those of our *running* (or paused, or restarting) containers, so a stopped sandbox holds none.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bollard::models::ContainerSummaryStateEnum;

use crate::config::ProviderConfig;
use crate::engine::Engine;
use crate::gpu::inventory::inventory;
use crate::gpu::lock;
use crate::sandbox::container::Target;
use crate::sandbox::devices::gpus_in;
use crate::util::errors::{Result, SandboxError};
use crate::util::labels::{self, LABEL_GPUS};
use crate::util::logging::Logger;

/// The GPUs our running sandboxes hold on this engine: GPU → the sandbox id holding it.
pub async fn held(engine: &Engine) -> Result<BTreeMap<String, String>> {
  // States are filtered here: Podman refuses a `restarting` status filter.
  let filters = HashMap::from([(
    "label".to_string(),
    vec![labels::ours(), LABEL_GPUS.to_string()],
  )]);
  let list = engine
    .list_containers("list the sandboxes holding GPUs", true, false, filters)
    .await?;
  let mut out = BTreeMap::new();
  for c in list {
    if !matches!(
      c.state,
      Some(
        ContainerSummaryStateEnum::RUNNING
          | ContainerSummaryStateEnum::PAUSED
          | ContainerSummaryStateEnum::RESTARTING
      )
    ) {
      continue;
    }
    let labels = c.labels.unwrap_or_default();
    let who = labels
      .get(labels::LABEL_ID)
      .cloned()
      .unwrap_or_else(|| c.id.clone().unwrap_or_default());
    for g in gpus_in(labels.get(LABEL_GPUS).map(String::as_str).unwrap_or("")) {
      out.insert(g, who.clone());
    }
  }
  Ok(out)
}

/// The first `n` GPUs of `inventory` nobody holds, in inventory order.
pub fn pick(inventory: &[String], held: &BTreeMap<String, String>, n: u32) -> Option<Vec<String>> {
  let free: Vec<String> = inventory
    .iter()
    .filter(|g| !held.contains_key(*g))
    .take(n as usize)
    .cloned()
    .collect();
  (free.len() == n as usize).then_some(free)
}

pub fn unavailable(
  n: u32,
  inventory: &[String],
  held: &BTreeMap<String, String>,
  wanted: &[String],
) -> SandboxError {
  let relevant: Vec<(&String, &String)> = held.iter().filter(|(g, _)| wanted.contains(g)).collect();
  let mut holders: Vec<String> = relevant.iter().map(|(_, s)| (*s).clone()).collect();
  holders.sort();
  holders.dedup();
  let text = if relevant.is_empty() {
    "none is held by a sandbox".to_string()
  } else {
    relevant
      .iter()
      .map(|(g, s)| format!("GPU {g} is held by {s}"))
      .collect::<Vec<_>>()
      .join(", ")
  };
  SandboxError::GpusUnavailable {
    wanted: n,
    total: inventory.len(),
    devices: inventory.join(", "),
    held: text,
    holders,
  }
}

/// Creates an exclusive sandbox: under the engine's lock, picks `n` GPUs no running sandbox
/// holds and creates and starts the container with them. With none free, waits up to
/// `gpuWaitMs`, then fails with `GpusUnavailable` naming the holders.
pub async fn create_exclusive(
  engine: &Engine,
  cfg: &ProviderConfig,
  image: &str,
  n: u32,
  log: &Logger,
) -> Result<Target> {
  let inventory = inventory(engine, &cfg.gpu_devices, &cfg.namespace, || async {
    Ok(image.to_string())
  })
  .await?;
  let deadline = Instant::now() + Duration::from_millis(cfg.gpu_wait_ms);
  lock::until_free(engine, deadline, log, || async {
    let held = held(engine).await?;
    match pick(&inventory, &held, n) {
      Some(ids) => {
        crate::sandbox::create::create_with(engine, cfg, image, None, log, Some(&ids)).await
      }
      None => Err(unavailable(n, &inventory, &held, &inventory)),
    }
  })
  .await
}

#[cfg(test)]
mod tests {
  use super::*;
  use serde_json::json;

  #[test]
  fn picking_and_the_unavailable_error() {
    let inv: Vec<String> = ["0", "1", "2"].iter().map(|s| s.to_string()).collect();
    let mut held = BTreeMap::new();
    held.insert("1".to_string(), "/workspace/A".to_string());
    assert_eq!(
      pick(&inv, &held, 2),
      Some(vec!["0".to_string(), "2".to_string()])
    );
    assert_eq!(pick(&inv, &held, 3), None);
    held.insert("0".to_string(), "/workspace/B".to_string());
    held.insert("2".to_string(), "/workspace/A".to_string());
    assert_eq!(pick(&inv, &held, 1), None);
    let e = unavailable(1, &inv, &held, &inv);
    assert_eq!(e.code(), "GPUS_UNAVAILABLE");
    let p = e.fields();
    assert_eq!(p["holders"], json!(["/workspace/A", "/workspace/B"]));
    let m = e.to_string();
    assert!(m.contains("GPU 0 is held by /workspace/B"), "{m}");
    assert!(m.contains("gpuWaitMs"), "{m}");
  }
}
