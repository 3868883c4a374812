//! GPUs: the container fields a `gpus` option becomes (NVIDIA device requests, CDI devices, the
//! environment the NVIDIA runtime reads), the errors an engine without GPU support gives, and
//! exclusive allocation.
//!
//! Exclusive allocation (`gpus: { count, exclusive: true }`) hands each sandbox GPUs that no
//! other running sandbox on the engine holds, whichever process or provider made it. The engine
//! is the only shared record: a sandbox's GPUs are in its `trueforge.sandbox.gpus` label, and
//! the GPUs held are those of our *running* (or paused, or restarting) containers, so a stopped
//! sandbox holds none. Choosing GPUs and starting the container is serialised across processes
//! by a lock: a container created and never started, named the same in every process (names
//! are unique per engine, so creating it is an atomic claim), removed by its id when done and
//! broken by anyone once it is older than `LOCK_STALE` (its holder died).

pub mod relocate;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, ContainerSummaryStateEnum, HostConfig};
use futures_util::StreamExt;
use serde_json::json;

use crate::config::gpus::{is_cdi_name, is_device_id};
use crate::config::{Gpus, ProviderConfig};
use crate::engine::Engine;
use crate::sandbox::container::{self, Target};
use crate::sandbox::devices::{explain, nvidia_requests, DRIVER_CAPABILITIES};
use crate::util::errors::{Result, SandboxError};
use crate::util::labels;
use crate::util::labels::{LABEL_GPUS, LABEL_GPU_LOCK, LABEL_GPU_LOCK_AT};
use crate::util::logging::Logger;

/// The lock's container name: one per engine.
pub const LOCK_NAME: &str = "trueforge-gpu-lock";
/// A lock older than this belongs to a holder that died. A holder keeps it for one container
/// create and start (well under a second here), or one start.
pub const LOCK_STALE: Duration = Duration::from_secs(30);
/// How often a waiting `createSandbox()` looks for free GPUs again.
pub const POLL: Duration = Duration::from_millis(250);

/// Per-engine state (kept per engine: `EngineShared::state`), each learnt once per engine.
#[derive(Default)]
pub struct State {
  /// The GPUs exclusive allocation hands out, once discovered.
  inventory: Mutex<Option<Vec<String>>>,
}

/// The allocation lock, held by this process.
pub struct Lock {
  engine: Engine,
  container_id: String,
}

impl Lock {
  /// Takes the engine's GPU lock, waiting while another process holds it (at most a little
  /// over `LOCK_STALE`: a lock older than that is broken).
  pub async fn take(engine: &Engine) -> Result<Lock> {
    crate::images::work::ensure_lease_image(engine).await?;
    // By id: Podman 4 files an image imported through the Docker API under `latest`, whatever
    // tag was asked for, where the name with its tag misses it.
    let name = crate::images::work::lease_image();
    let repo = name.split(':').next().unwrap_or(&name).to_string();
    let mut image = name.clone();
    for candidate in [name.clone(), repo] {
      if let Some(id) = crate::images::present(engine, &candidate)
        .await?
        .and_then(|i| i.id)
      {
        image = id;
        break;
      }
    }
    // Waiting is bounded per holder, not in all: a queue of creates behind us is progress.
    let patience = LOCK_STALE + Duration::from_secs(10);
    let mut give_up = Instant::now() + patience;
    let mut holder_seen: Option<String> = None;
    let mut pause = Duration::from_millis(20);
    loop {
      let body = ContainerCreateBody {
        image: Some(image.clone()),
        cmd: Some(vec!["/lock".into()]),
        labels: Some(HashMap::from([
          (labels::LABEL_MANAGED_BY.into(), labels::MANAGED_BY.into()),
          (LABEL_GPU_LOCK.into(), crate::util::ids::holder()),
          (
            LABEL_GPU_LOCK_AT.into(),
            crate::util::timestamps::now_ms().to_string(),
          ),
        ])),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
          network_mode: Some("none".into()),
          ..Default::default()
        }),
        ..Default::default()
      };
      // Not retried on a broken connection: a second create could find our own first one.
      if let Some(container_id) = engine
        .create_named("create the GPU allocation lock", LOCK_NAME, body)
        .await?
      {
        return Ok(Lock {
          engine: engine.clone(),
          container_id,
        });
      }
      // Held: break it if its holder is gone, else wait.
      match engine
        .inspect_container("inspect the GPU allocation lock", LOCK_NAME)
        .await?
      {
        Some(info) => {
          let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
          if !labels.contains_key(LABEL_GPU_LOCK) {
            return Err(SandboxError::Internal(format!(
              "a container named {LOCK_NAME} that is not our GPU allocation lock exists on the \
               engine; remove or rename it"
            )));
          }
          let at: u64 = labels
            .get(LABEL_GPU_LOCK_AT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
          if crate::util::timestamps::now_ms().saturating_sub(at) > LOCK_STALE.as_millis() as u64 {
            if let Some(id) = info.id {
              let _ = container::force_remove(engine, &id).await;
            }
            continue;
          }
          if info.id != holder_seen {
            holder_seen = info.id;
            give_up = Instant::now() + patience;
          }
        }
        None => continue,
      }
      if Instant::now() > give_up {
        return Err(SandboxError::Internal(format!(
          "the GPU allocation lock ({LOCK_NAME}) stayed with one holder for {} s; another \
           server process may be stuck",
          patience.as_secs()
        )));
      }
      let jitter = Duration::from_millis(u64::from(rand::random::<u8>() % 20));
      tokio::time::sleep(pause + jitter).await;
      pause = (pause * 2).min(Duration::from_millis(200));
    }
  }

  /// Gives the lock back. A failure is only logged: the lock goes stale on its own.
  pub async fn release(self, log: &Logger) {
    if let Err(e) = container::force_remove(&self.engine, &self.container_id).await {
      log.warn(
        "could not remove the GPU allocation lock; it expires by itself",
        json!({ "error": e.to_string() }),
      );
    }
  }
}

/// The GPUs our running sandboxes hold on this engine: GPU → the sandbox id holding it.
pub async fn held(engine: &Engine) -> Result<BTreeMap<String, String>> {
  // States are filtered here: Podman refuses a `restarting` status filter.
  let filters = HashMap::from([(
    "label".to_string(),
    vec![
      format!("{}={}", labels::LABEL_MANAGED_BY, labels::MANAGED_BY),
      LABEL_GPUS.to_string(),
    ],
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
    for g in labels
      .get(LABEL_GPUS)
      .map(String::as_str)
      .unwrap_or("")
      .split(',')
      .filter(|g| !g.is_empty())
    {
      out.insert(g.to_string(), who.clone());
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

/// The GPUs exclusive allocation hands out: `gpuDevices`, else what the engine host has (CDI
/// specs beside a local engine, else `nvidia-smi -L` in a throwaway container). Discovery runs
/// once per engine per process; `image` is asked for only when it has to run a container.
pub async fn inventory<F, Fut>(
  engine: &Engine,
  cfg: &ProviderConfig,
  image: F,
) -> Result<Vec<String>>
where
  F: FnOnce() -> Fut,
  Fut: std::future::Future<Output = Result<String>>,
{
  if !cfg.gpu_devices.is_empty() {
    return Ok(cfg.gpu_devices.clone());
  }
  let found = &engine.shared.state::<State>().inventory;
  if let Some(v) = found.lock().expect("found").as_ref() {
    return Ok(v.clone());
  }
  let mut devices = Vec::new();
  if engine.host.starts_with("unix://") {
    devices = local_cdi_devices(&["/etc/cdi", "/var/run/cdi"]);
  }
  let mut tried = "no CDI spec in /etc/cdi or /var/run/cdi".to_string();
  if devices.is_empty() {
    let (list, how) = nvidia_smi_in_container(engine, &image().await?).await?;
    devices = list;
    tried = format!("{tried}; `nvidia-smi -L` in a sandbox with every GPU: {how}");
  }
  if devices.is_empty() {
    return Err(SandboxError::GpuUnsupported {
      reason: format!(
        "exclusive GPUs need the list of GPUs, and none was found ({tried}); set the \
         `gpuDevices` option to the engine host's GPU indexes or UUIDs (`nvidia-smi -L` on the \
         host lists them)"
      ),
    });
  }
  *found.lock().expect("found") = Some(devices.clone());
  Ok(devices)
}

/// The GPU device names (`vendor/gpu=name`, "all" left out) of the CDI specs in `dirs`, JSON
/// or YAML, read line by line (a spec's `name:` keys are its devices'). Specs of other device
/// classes are not GPUs to hand out.
pub fn local_cdi_devices(dirs: &[&str]) -> Vec<String> {
  let mut out = Vec::new();
  for dir in dirs {
    let Ok(entries) = std::fs::read_dir(dir) else {
      continue;
    };
    let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    for f in files {
      let Ok(text) = std::fs::read_to_string(&f) else {
        continue;
      };
      out.extend(
        cdi_spec_devices(&text)
          .into_iter()
          .filter(|d| d.split('=').next().is_some_and(|k| k.ends_with("/gpu"))),
      );
    }
  }
  out.dedup();
  out
}

/// The devices one CDI spec names, as fully qualified names.
pub fn cdi_spec_devices(text: &str) -> Vec<String> {
  let value = |line: &str, key: &str| -> Option<String> {
    let l = line
      .trim()
      .trim_start_matches("- ")
      .trim_start_matches('{')
      .trim();
    let rest = l
      .strip_prefix(&format!("\"{key}\""))
      .or_else(|| l.strip_prefix(key))?
      .trim_start()
      .strip_prefix(':')?;
    let v = rest
      .trim()
      .trim_end_matches(',')
      .trim_end_matches('}')
      .trim()
      .trim_matches('"')
      .trim_matches('\'');
    (!v.is_empty()).then(|| v.to_string())
  };
  let mut kind = None;
  let mut names = Vec::new();
  // JSON specs may be on one line: split at commas and braces so each key starts a piece.
  for line in text.split(['\n', ',', '{']) {
    if let Some(k) = value(line, "kind") {
      kind.get_or_insert(k);
    } else if let Some(n) = value(line, "name") {
      if n != "all" {
        names.push(n);
      }
    }
  }
  match kind {
    Some(k) => names
      .into_iter()
      .map(|n| format!("{k}={n}"))
      .filter(|n| is_cdi_name(n))
      .collect(),
    None => Vec::new(),
  }
}

/// The GPU UUIDs `nvidia-smi -L` lists in a throwaway container given every GPU, with a word
/// on what happened.
async fn nvidia_smi_in_container(engine: &Engine, image: &str) -> Result<(Vec<String>, String)> {
  let body = ContainerCreateBody {
    image: Some(image.to_string()),
    entrypoint: Some(vec!["nvidia-smi".into(), "-L".into()]),
    cmd: Some(vec![]),
    env: Some(vec![format!(
      "NVIDIA_DRIVER_CAPABILITIES={DRIVER_CAPABILITIES}"
    )]),
    labels: Some(HashMap::from([(
      labels::LABEL_MANAGED_BY.to_string(),
      labels::MANAGED_BY.to_string(),
    )])),
    host_config: Some(HostConfig {
      device_requests: nvidia_requests(&Gpus::All),
      network_mode: Some("none".into()),
      ..Default::default()
    }),
    ..Default::default()
  };
  let id = engine
    .create_container("create the GPU discovery container", None, body)
    .await
    .map_err(|e| match e {
      // The caller pulls or builds the image and tries again, as for a sandbox.
      SandboxError::Engine {
        status: 404,
        detail,
        ..
      } if detail.contains("image") => SandboxError::ImageNotAvailable {
        image: image.to_string(),
        reason: detail,
      },
      other => other,
    })?;
  let run = async {
    engine
      .start_container("start the GPU discovery container", &id)
      .await?;
    let mut out = String::new();
    let logs = engine.logs(&id, true);
    futures_util::pin_mut!(logs);
    let read = async {
      while let Some(Ok(chunk)) = logs.next().await {
        out.push_str(&String::from_utf8_lossy(&chunk));
        if out.len() > 64 * 1024 {
          break;
        }
      }
    };
    if tokio::time::timeout(Duration::from_secs(60), read)
      .await
      .is_err()
    {
      out.push_str(" (timed out after 60 s)");
    }
    Ok::<_, SandboxError>(out)
  };
  let outcome = run.await;
  let _ = container::force_remove(engine, &id).await;
  match outcome {
    Ok(out) => {
      let uuids = parse_nvidia_smi_list(&out);
      let how = if uuids.is_empty() {
        format!(
          "it printed {:?}",
          out.trim().chars().take(300).collect::<String>()
        )
      } else {
        format!("{} GPU(s)", uuids.len())
      };
      Ok((uuids, how))
    }
    Err(e) => match explain(e, Some(&Gpus::All), None) {
      e @ SandboxError::GpuUnsupported { .. } => Err(e),
      SandboxError::CreateFailed { detail, .. } | SandboxError::Engine { detail, .. } => {
        Ok((Vec::new(), format!("it failed: {detail}")))
      }
      other => Err(other),
    },
  }
}

/// The UUIDs in `nvidia-smi -L` output (`GPU 0: NVIDIA H200 (UUID: GPU-…)`).
pub fn parse_nvidia_smi_list(out: &str) -> Vec<String> {
  out
    .lines()
    .filter(|l| l.trim_start().starts_with("GPU "))
    .filter_map(|l| {
      let at = l.find("(UUID: ")? + "(UUID: ".len();
      let rest = &l[at..];
      let uuid = &rest[..rest.find(')')?];
      is_device_id(uuid).then(|| uuid.to_string())
    })
    .collect()
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
  let inventory = inventory(engine, cfg, || async { Ok(image.to_string()) }).await?;
  let deadline = Instant::now() + Duration::from_millis(cfg.gpu_wait_ms);
  loop {
    let lock = Lock::take(engine).await?;
    let outcome = async {
      let held = held(engine).await?;
      match pick(&inventory, &held, n) {
        Some(ids) => container::create_with(engine, cfg, image, None, log, Some(&ids)).await,
        None => Err(unavailable(n, &inventory, &held, &inventory)),
      }
    }
    .await;
    lock.release(log).await;
    match outcome {
      Ok(t) => return Ok(t),
      Err(e @ SandboxError::GpusUnavailable { .. }) if Instant::now() < deadline => {
        log.debug(
          "no GPU free yet; waiting",
          json!({ "error": e.to_string() }),
        );
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
      }
      Err(e) => return Err(e),
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use serde_json::Value;

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

  #[test]
  fn discovery_parsers() {
    let smi = "GPU 0: NVIDIA H200 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n\
               GPU 1: NVIDIA H200 (UUID: GPU-aaaaaaaa-2222-3333-4444-555555555555)\n\
               No devices were found\n";
    assert_eq!(
      parse_nvidia_smi_list(smi),
      vec![
        "GPU-11111111-2222-3333-4444-555555555555".to_string(),
        "GPU-aaaaaaaa-2222-3333-4444-555555555555".to_string()
      ]
    );
    let yaml = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n- name: GPU-abc\n  containerEdits: {}\n- name: all\ncontainerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n";
    assert_eq!(
      cdi_spec_devices(yaml),
      vec![
        "nvidia.com/gpu=0".to_string(),
        "nvidia.com/gpu=GPU-abc".to_string()
      ]
    );
    let json_spec = r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}},{"name":"all","containerEdits":{}}]}"#;
    assert_eq!(
      cdi_spec_devices(json_spec),
      vec!["nvidia.com/gpu=0".to_string()]
    );
    assert!(cdi_spec_devices("not a spec").is_empty());
    // From files: GPU classes only.
    let dir = std::env::temp_dir().join(format!("cdi-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.yaml"), yaml).unwrap();
    std::fs::write(
      dir.join("b.json"),
      r#"{"cdiVersion":"0.5.0","kind":"vendor.example/fpga","devices":[{"name":"f0"}]}"#,
    )
    .unwrap();
    let found = local_cdi_devices(&[dir.to_str().unwrap(), "/nonexistent-cdi-dir"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
      found,
      vec![
        "nvidia.com/gpu=0".to_string(),
        "nvidia.com/gpu=GPU-abc".to_string()
      ]
    );
  }

  #[test]
  fn instructions_describe_the_gpus() {
    use crate::provider::gpu_instructions;
    assert_eq!(gpu_instructions(None), "No GPU is attached.");
    assert!(gpu_instructions(Some(&Gpus::Exclusive(2))).contains("yours alone"));
    assert!(gpu_instructions(Some(&Gpus::Exclusive(2))).contains("$TRUEFORGE_GPUS"));
    assert!(gpu_instructions(Some(&Gpus::Devices(vec!["3".into()]))).contains("GPUs 3"));
    assert!(
      gpu_instructions(Some(&Gpus::Cdi(vec!["nvidia.com/gpu=1".into()])))
        .contains("nvidia.com/gpu=1")
    );
    assert!(gpu_instructions(Some(&Gpus::All)).contains("nvidia-smi -L"));
  }
}
