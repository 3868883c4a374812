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

use bollard::models::{
  ContainerCreateBody, ContainerInspectResponse, ContainerSummaryStateEnum, DeviceRequest,
  HostConfig,
};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::config::{Gpus, ProviderConfig};
use crate::engine::Engine;
use crate::sandbox::container::{self, Target};
use crate::util::errors::{Result, SandboxError};
use crate::util::labels;
use crate::util::labels::{LABEL_GPUS, LABEL_GPU_LOCK, LABEL_GPU_LOCK_AT};
use crate::util::logging::Logger;

/// The lock's container name: one per engine.
pub const LOCK_NAME: &str = "trueforge-gpu-lock";
/// A lock older than this belongs to a holder that died. A holder keeps it for one container
/// create and start (well under a second here), or one start.
pub const LOCK_STALE: Duration = Duration::from_secs(30);
/// The largest `gpuWaitMs` accepted: an hour.
pub const MAX_WAIT_MS: u64 = 3_600_000;
/// How often a waiting `createSandbox()` looks for free GPUs again.
pub const POLL: Duration = Duration::from_millis(250);
/// The variable naming a sandbox's GPUs for the agent (ids or CDI names).
pub const ENV_GPUS: &str = "TRUEFORGE_GPUS";
/// What the NVIDIA runtime mounts into a GPU sandbox by default: CUDA and nvidia-smi.
pub const DRIVER_CAPABILITIES: &str = "compute,utility";

/// Whether `s` is a fully qualified CDI device name, `vendor.com/class=name`.
pub fn is_cdi_name(s: &str) -> bool {
  let Some((kind, name)) = s.split_once('=') else {
    return false;
  };
  let Some((vendor, class)) = kind.split_once('/') else {
    return false;
  };
  let vendor_ok = !vendor.is_empty()
    && vendor
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    && vendor.starts_with(|c: char| c.is_ascii_alphanumeric());
  let class_ok = !class.is_empty()
    && class
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
  let name_ok = !name.is_empty()
    && name.len() <= 128
    && name
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
  s.len() <= 255 && vendor_ok && class_ok && name_ok
}

/// Whether `s` is a GPU index or UUID as `docker run --gpus device=…` takes them.
pub fn is_device_id(s: &str) -> bool {
  !s.is_empty()
    && s.len() <= 128
    && s
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c))
}

/// Parses `gpuDevices`: the GPUs exclusive allocation hands out, as ids or CDI names.
pub fn parse_devices(v: Option<Value>, gpus: Option<&Gpus>) -> Result<Vec<String>> {
  let bad = |reason: String| SandboxError::InvalidOption {
    option: "gpuDevices".into(),
    reason,
  };
  let Some(v) = v else { return Ok(Vec::new()) };
  let Value::Array(items) = v else {
    return Err(bad(format!(
      "expected a list of GPU ids or CDI names such as ['0', '1'], got {v}"
    )));
  };
  if !matches!(gpus, Some(Gpus::Exclusive(_))) {
    return Err(bad(
      "only exclusive allocation uses it; set gpus: { count: n, exclusive: true }".into(),
    ));
  }
  if items.is_empty() || items.len() > 256 {
    return Err(bad("expected 1 to 256 devices".into()));
  }
  let mut out: Vec<String> = Vec::new();
  for i in items {
    match i {
      Value::String(s) if (is_cdi_name(&s) || is_device_id(&s)) && !out.contains(&s) => out.push(s),
      Value::String(s) if out.contains(&s) => return Err(bad(format!("{s:?} is listed twice"))),
      other => {
        return Err(bad(format!(
          "{other} is not a GPU index, a GPU UUID or a CDI name (vendor/class=name)"
        )))
      }
    }
  }
  if let Some(Gpus::Exclusive(n)) = gpus {
    if out.len() < *n as usize {
      return Err(bad(format!(
        "lists {} device(s), fewer than the {n} each sandbox needs",
        out.len()
      )));
    }
  }
  Ok(out)
}

/// Whether a container for this configuration asks for CDI devices.
pub fn needs_cdi(cfg: &ProviderConfig, picked: Option<&[String]>) -> bool {
  matches!(cfg.gpus, Some(Gpus::Cdi(_))) || picked.is_some_and(|p| p.iter().any(|d| is_cdi_name(d)))
}

/// Per-engine state (kept per engine: `EngineShared::state`), each learnt once per engine.
#[derive(Default)]
pub struct State {
  /// `Some(None)`: asked, and the engine is not Podman.
  podman_version: Mutex<Option<Option<(u32, u32)>>>,
  /// The GPUs exclusive allocation hands out, once discovered.
  inventory: Mutex<Option<Vec<String>>>,
}

/// The engine's Podman version (major, minor) when it is Podman (its version lists a "Podman
/// Engine" component), else `None`. Asked once per engine address per process.
pub async fn podman_version(engine: &Engine) -> Result<Option<(u32, u32)>> {
  let seen = &engine.shared.state::<State>().podman_version;
  if let Some(p) = *seen.lock().expect("seen") {
    return Ok(p);
  }
  let v = engine.version().await?;
  let podman = v
    .components
    .unwrap_or_default()
    .iter()
    .find(|c| c.name.to_ascii_lowercase().contains("podman"))
    .map(|c| {
      let mut parts = c
        .version
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
      (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    });
  *seen.lock().expect("seen") = Some(podman);
  Ok(podman)
}

/// Refuses CDI devices on an engine that would drop them. Podman before 5 reads a Docker API
/// client's devices as host paths (`stat nvidia.com/gpu=all: no such file`) and ignores device
/// requests of the `cdi` driver, so a sandbox would start without its GPUs; Podman 5 passes
/// those requests on as CDI devices, as Docker 25 and later do.
pub async fn check_cdi_support(engine: &Engine, names: &[String]) -> Result<()> {
  match podman_version(engine).await? {
    Some((major, minor)) if major < 5 => Err(SandboxError::GpuUnsupported {
      reason: format!(
        "this engine is Podman {major}.{minor}, whose Docker-compatible API cannot pass CDI \
         devices ({}): it reads them as device paths and ignores device requests of the `cdi` \
         driver. Use Podman 5 or later, or Docker 25 or later with CDI enabled",
        names.join(", ")
      ),
    }),
    _ => Ok(()),
  }
}

fn nvidia_request(count: Option<i64>, ids: Option<Vec<String>>) -> DeviceRequest {
  DeviceRequest {
    count,
    device_ids: ids,
    capabilities: Some(vec![vec!["gpu".to_string()]]),
    ..Default::default()
  }
}

/// The engine's device requests for the NVIDIA forms of `gpus`, as `docker run --gpus` builds
/// them (CDI and exclusive forms are shaped by `shape`).
pub fn nvidia_requests(gpus: &Gpus) -> Option<Vec<DeviceRequest>> {
  match gpus {
    Gpus::All => Some(vec![nvidia_request(Some(-1), None)]),
    Gpus::Count(n) => Some(vec![nvidia_request(Some(i64::from(*n)), None)]),
    Gpus::Devices(ids) => Some(vec![nvidia_request(None, Some(ids.clone()))]),
    Gpus::Cdi(_) | Gpus::Exclusive(_) => None,
  }
}

/// CDI devices as a request to the `cdi` device driver: what Docker 25 and later (with CDI
/// enabled) and Podman 5 and later take through the Docker API.
fn cdi_devices(host: &mut HostConfig, names: &[String]) {
  host.device_requests = Some(vec![DeviceRequest {
    driver: Some("cdi".into()),
    device_ids: Some(names.to_vec()),
    ..Default::default()
  }]);
}

/// Adds to a container body what `gpus` asks for: device requests or CDI devices, the NVIDIA
/// runtime's variables (which `docker exec` would not see otherwise), `TRUEFORGE_GPUS` naming
/// the GPUs, and for an exclusive sandbox the label recording the GPUs it holds (`picked`).
pub fn shape(body: &mut ContainerCreateBody, gpus: Option<&Gpus>, picked: Option<&[String]>) {
  let Some(gpus) = gpus else { return };
  let host = body.host_config.get_or_insert_with(Default::default);
  let mut visible: Option<String> = None;
  let mut named: Option<String> = None;
  match gpus {
    Gpus::All => {
      host.device_requests = nvidia_requests(gpus);
      visible = Some("all".into());
    }
    Gpus::Count(_) => host.device_requests = nvidia_requests(gpus),
    Gpus::Devices(ids) => {
      host.device_requests = nvidia_requests(gpus);
      visible = Some(ids.join(","));
      named = visible.clone();
    }
    Gpus::Cdi(names) => {
      cdi_devices(host, names);
      named = Some(names.join(","));
    }
    Gpus::Exclusive(_) => {
      let Some(ids) = picked else { return };
      if ids.iter().all(|d| is_cdi_name(d)) {
        cdi_devices(host, ids);
      } else {
        host.device_requests = Some(vec![nvidia_request(None, Some(ids.to_vec()))]);
        visible = Some(ids.join(","));
      }
      named = Some(ids.join(","));
      body
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_GPUS.into(), ids.join(","));
    }
  }
  let env = body.env.get_or_insert_with(Vec::new);
  let user_caps = env
    .iter()
    .any(|e| e.starts_with("NVIDIA_DRIVER_CAPABILITIES="));
  // Ours win: a sandbox must not widen its own GPU set through its environment.
  env.retain(|e| {
    !e.starts_with("NVIDIA_VISIBLE_DEVICES=") && !e.starts_with(&format!("{ENV_GPUS}="))
  });
  if let Some(v) = visible {
    env.push(format!("NVIDIA_VISIBLE_DEVICES={v}"));
  }
  if !user_caps {
    env.push(format!("NVIDIA_DRIVER_CAPABILITIES={DRIVER_CAPABILITIES}"));
  }
  if let Some(n) = named {
    env.push(format!("{ENV_GPUS}={n}"));
  }
}

/// Rewrites an engine's refusal to give GPUs ("could not select device driver …", an unknown
/// CDI device) into `GpuUnsupported`, saying what to install. Other errors pass through.
pub fn explain(e: SandboxError, gpus: Option<&Gpus>, picked: Option<&[String]>) -> SandboxError {
  let Some(gpus) = gpus else { return e };
  let detail = match &e {
    SandboxError::CreateFailed { detail, .. } | SandboxError::Engine { detail, .. } => {
      detail.clone()
    }
    _ => return e,
  };
  let lower = detail.to_ascii_lowercase();
  let no_driver = lower.contains("could not select device driver");
  let cdi_failed = lower.contains("cdi") && (lower.contains("device") || lower.contains("spec"));
  if !no_driver && !cdi_failed {
    return e;
  }
  let cdi = match gpus {
    Gpus::Cdi(_) => true,
    Gpus::Exclusive(_) => picked.is_some_and(|p| p.iter().all(|d| is_cdi_name(d))),
    _ => false,
  };
  let reason = if cdi {
    format!(
      "the engine did not resolve the CDI device(s) {}. Docker needs version 25 or later with \
       CDI enabled (\"features\": {{\"cdi\": true}} in daemon.json) and a CDI spec naming them \
       in /etc/cdi or /var/run/cdi (the NVIDIA container toolkit writes one: `nvidia-ctk cdi \
       generate --output=/etc/cdi/nvidia.yaml`); Podman 5 or later reads the same specs. The \
       engine said: {detail}",
      match gpus {
        Gpus::Cdi(n) => n.join(", "),
        _ => picked.unwrap_or_default().join(", "),
      }
    )
  } else {
    format!(
      "it has no NVIDIA device driver. Install the NVIDIA container toolkit on the engine host \
       and restart the engine (`nvidia-ctk runtime configure --runtime=docker`), or write a CDI \
       spec for the GPUs and ask for them by CDI name (gpus: 'nvidia.com/gpu=all'). The engine \
       said: {detail}"
    )
  };
  SandboxError::GpuUnsupported { reason }
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

/// The GPUs an exclusive container holds while it runs (from its label), if any.
pub fn gpus_of(info: &ContainerInspectResponse) -> Option<Vec<String>> {
  let v = info.config.as_ref()?.labels.as_ref()?.get(LABEL_GPUS)?;
  let ids: Vec<String> = v
    .split(',')
    .filter(|g| !g.is_empty())
    .map(String::from)
    .collect();
  (!ids.is_empty()).then_some(ids)
}

#[cfg(test)]
mod tests {
  use super::*;

  fn cfg(v: Value) -> Result<ProviderConfig> {
    let mut o = json!({ "image": "x" });
    for (k, val) in v.as_object().expect("object") {
      o[k] = val.clone();
    }
    ProviderConfig::from_json(o)
  }

  fn option_of(r: Result<ProviderConfig>) -> String {
    match r {
      Err(SandboxError::InvalidOption { option, .. }) => option,
      other => panic!("expected InvalidOption, got {other:?}"),
    }
  }

  #[test]
  fn cdi_names() {
    for ok in [
      "nvidia.com/gpu=all",
      "nvidia.com/gpu=0",
      "nvidia.com/gpu=GPU-8d8e8f2c-1a2b-3c4d-5e6f-0123456789ab",
      "vendor.example/class_x=a:b",
    ] {
      assert!(is_cdi_name(ok), "{ok}");
    }
    for bad in [
      "all",
      "0",
      "nvidia.com/gpu",
      "nvidia.com=gpu",
      "/gpu=0",
      "nvidia.com/gpu=",
      "a/b=c;rm",
      "a/b=c d",
    ] {
      assert!(!is_cdi_name(bad), "{bad}");
    }
  }

  #[test]
  fn gpus_option_forms() {
    let g = |v: Value| cfg(json!({ "gpus": v })).expect("valid").gpus;
    assert_eq!(
      g(json!("nvidia.com/gpu=all")),
      Some(Gpus::Cdi(vec!["nvidia.com/gpu=all".into()]))
    );
    assert_eq!(
      g(json!(["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-abc"])),
      Some(Gpus::Cdi(vec![
        "nvidia.com/gpu=0".into(),
        "nvidia.com/gpu=GPU-abc".into()
      ]))
    );
    assert_eq!(
      g(json!({ "count": 2, "exclusive": true })),
      Some(Gpus::Exclusive(2))
    );
    assert_eq!(g(json!({ "count": 2 })), Some(Gpus::Count(2)));
    assert_eq!(
      g(json!({ "count": 2, "exclusive": false })),
      Some(Gpus::Count(2))
    );
    for bad in [
      json!(["nvidia.com/gpu=0", "1"]),
      json!({ "exclusive": true }),
      json!({ "count": 0, "exclusive": true }),
      json!({ "count": 1, "exclusive": "yes" }),
      json!({ "count": 1, "other": 1 }),
      json!("nvidia.com/gpu"),
    ] {
      assert_eq!(
        option_of(cfg(json!({ "gpus": bad.clone() }))),
        "gpus",
        "{bad}"
      );
    }
  }

  #[test]
  fn gpu_devices_and_wait_options() {
    let c = cfg(json!({ "gpus": { "count": 1, "exclusive": true }, "gpuDevices": ["0", "GPU-a"], "gpuWaitMs": 1500 }))
      .expect("valid");
    assert_eq!(c.gpu_devices, vec!["0".to_string(), "GPU-a".to_string()]);
    assert_eq!(c.gpu_wait_ms, 1500);
    assert_eq!(cfg(json!({})).expect("valid").gpu_wait_ms, 0);
    // Only with exclusive; enough of them; no duplicates; well-formed.
    assert_eq!(
      option_of(cfg(json!({ "gpus": 1, "gpuDevices": ["0"] }))),
      "gpuDevices"
    );
    let ex2 = json!({ "count": 2, "exclusive": true });
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex2, "gpuDevices": ["0"] }))),
      "gpuDevices"
    );
    let ex1 = json!({ "count": 1, "exclusive": true });
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "gpuDevices": ["0", "0"] }))),
      "gpuDevices"
    );
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "gpuDevices": ["0;rm"] }))),
      "gpuDevices"
    );
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "gpuDevices": "0" }))),
      "gpuDevices"
    );
    assert_eq!(option_of(cfg(json!({ "gpuWaitMs": -1 }))), "gpuWaitMs");
    assert_eq!(
      option_of(cfg(json!({ "gpuWaitMs": 3_600_001 }))),
      "gpuWaitMs"
    );
    // Idle pool members would hold exclusive GPUs.
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "warmPool": { "size": 1 } }))),
      "warmPool"
    );
  }

  fn body(gpus: Value, picked: Option<&[String]>, env: Value) -> ContainerCreateBody {
    let c = cfg(json!({ "gpus": gpus, "env": env })).expect("valid");
    crate::sandbox::container::container_body_with(&c, "/workspace/x", "img", None, picked)
  }

  fn env_of(b: &ContainerCreateBody) -> Vec<String> {
    b.env.clone().unwrap_or_default()
  }

  #[test]
  fn cdi_becomes_a_request_to_the_cdi_driver() {
    let b = body(json!("nvidia.com/gpu=all"), None, json!({}));
    let req = &b
      .host_config
      .as_ref()
      .unwrap()
      .device_requests
      .as_ref()
      .unwrap()[0];
    assert_eq!(req.driver.as_deref(), Some("cdi"));
    assert_eq!(req.device_ids, Some(vec!["nvidia.com/gpu=all".to_string()]));
    assert!(env_of(&b).contains(&"NVIDIA_DRIVER_CAPABILITIES=compute,utility".to_string()));
    assert!(env_of(&b).contains(&"TRUEFORGE_GPUS=nvidia.com/gpu=all".to_string()));
    assert!(b.host_config.as_ref().unwrap().devices.is_none());
  }

  #[test]
  fn exclusive_body_carries_the_picked_gpus_everywhere() {
    let picked = vec!["2".to_string(), "5".to_string()];
    // A user's NVIDIA_VISIBLE_DEVICES cannot widen the set.
    let b = body(
      json!({ "count": 2, "exclusive": true }),
      Some(&picked),
      json!({ "NVIDIA_VISIBLE_DEVICES": "all" }),
    );
    let req = &b
      .host_config
      .as_ref()
      .unwrap()
      .device_requests
      .as_ref()
      .unwrap()[0];
    assert_eq!(req.device_ids, Some(picked.clone()));
    assert_eq!(req.capabilities, Some(vec![vec!["gpu".to_string()]]));
    assert_eq!(
      b.labels
        .as_ref()
        .unwrap()
        .get(LABEL_GPUS)
        .map(String::as_str),
      Some("2,5")
    );
    let env = env_of(&b);
    assert!(
      env.contains(&"NVIDIA_VISIBLE_DEVICES=2,5".to_string()),
      "{env:?}"
    );
    assert!(
      !env.contains(&"NVIDIA_VISIBLE_DEVICES=all".to_string()),
      "{env:?}"
    );
    assert!(env.contains(&"TRUEFORGE_GPUS=2,5".to_string()));
    // A user's driver capabilities are kept.
    let b = body(
      json!("all"),
      None,
      json!({ "NVIDIA_DRIVER_CAPABILITIES": "all" }),
    );
    let env = env_of(&b);
    assert!(env.contains(&"NVIDIA_DRIVER_CAPABILITIES=all".to_string()));
    assert!(!env.iter().any(|e| e.ends_with("compute,utility")));
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=all".to_string()));
    // Exclusive CDI names become CDI requests.
    let cdi = vec!["nvidia.com/gpu=1".to_string()];
    let b = body(
      json!({ "count": 1, "exclusive": true }),
      Some(&cdi),
      json!({}),
    );
    let req = &b
      .host_config
      .as_ref()
      .unwrap()
      .device_requests
      .as_ref()
      .unwrap()[0];
    assert_eq!(req.driver.as_deref(), Some("cdi"));
    // No gpus: nothing at all.
    let c = cfg(json!({})).expect("valid");
    let b = crate::sandbox::container::container_body(&c, "/workspace/x", "img", None);
    assert!(b.host_config.unwrap().device_requests.is_none());
    assert!(!b.env.unwrap().iter().any(|e| e.starts_with("NVIDIA_")));
  }

  #[test]
  fn engine_refusals_become_gpu_unsupported_with_what_to_install() {
    let refusal = |d: &str| SandboxError::CreateFailed {
      step: "start the container".into(),
      detail: d.into(),
    };
    let e = explain(
      refusal("could not select device driver \"\" with capabilities: [[gpu]]"),
      Some(&Gpus::All),
      None,
    );
    match &e {
      SandboxError::GpuUnsupported { reason } => {
        assert!(reason.contains("NVIDIA container toolkit"), "{reason}");
        assert!(
          reason.contains("could not select device driver"),
          "{reason}"
        );
      }
      other => panic!("{other:?}"),
    }
    assert_eq!(e.code(), "GPU_UNSUPPORTED");
    let e = explain(
      refusal("could not select device driver \"cdi\" with capabilities: []"),
      Some(&Gpus::Cdi(vec!["nvidia.com/gpu=all".into()])),
      None,
    );
    assert!(
      matches!(&e, SandboxError::GpuUnsupported { reason } if reason.contains("CDI enabled") && reason.contains("nvidia.com/gpu=all")),
      "{e:?}"
    );
    // Other failures, and any failure without gpus, pass through.
    let other = refusal("no space left on device");
    assert_eq!(explain(other.clone(), Some(&Gpus::All), None), other);
    let unrelated = refusal("could not select device driver \"\"");
    assert_eq!(explain(unrelated.clone(), None, None), unrelated);
  }

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
