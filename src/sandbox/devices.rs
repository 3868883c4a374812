//! The container fields a `gpus` option becomes (NVIDIA device requests, CDI devices, the
//! environment the NVIDIA runtime reads, the label recording an exclusive sandbox's GPUs), and
//! the errors an engine without GPU support gives, rewritten to say what to install.

use bollard::models::{ContainerCreateBody, ContainerInspectResponse, DeviceRequest, HostConfig};

use crate::config::gpus::is_cdi_name;
use crate::config::{Gpus, ProviderConfig};
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};
use crate::util::labels::LABEL_GPUS;

/// The variable naming a sandbox's GPUs for the agent (ids or CDI names).
pub const ENV_GPUS: &str = "TRUEFORGE_GPUS";

/// What the NVIDIA runtime mounts into a GPU sandbox by default: CUDA and nvidia-smi.
pub const DRIVER_CAPABILITIES: &str = "compute,utility";

/// Whether a container for this configuration asks for CDI devices.
pub fn needs_cdi(cfg: &ProviderConfig, picked: Option<&[String]>) -> bool {
  matches!(cfg.gpus, Some(Gpus::Cdi(_))) || picked.is_some_and(|p| p.iter().any(|d| is_cdi_name(d)))
}

/// Refuses CDI devices on an engine that would drop them. Podman before 5 reads a Docker API
/// client's devices as host paths (`stat nvidia.com/gpu=all: no such file`) and ignores device
/// requests of the `cdi` driver, so a sandbox would start without its GPUs; Podman 5 passes
/// those requests on as CDI devices, as Docker 25 and later do.
pub fn check_cdi_support(engine: &Engine, names: &[String]) -> Result<()> {
  match engine.podman_version {
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

/// The GPUs a `trueforge.sandbox.gpus` label value names.
pub fn gpus_in(label: &str) -> Vec<String> {
  label
    .split(',')
    .filter(|g| !g.is_empty())
    .map(String::from)
    .collect()
}

/// The GPUs an exclusive container holds while it runs (from its label), if any.
pub fn gpus_of(info: &ContainerInspectResponse) -> Option<Vec<String>> {
  let ids = gpus_in(info.config.as_ref()?.labels.as_ref()?.get(LABEL_GPUS)?);
  (!ids.is_empty()).then_some(ids)
}

#[cfg(test)]
mod tests {
  use super::*;
  use serde_json::{json, Value};

  fn cfg(v: Value) -> Result<ProviderConfig> {
    ProviderConfig::with_image(v)
  }

  #[test]
  fn gpu_requests_match_the_cli() {
    let all = &nvidia_requests(&Gpus::All).unwrap()[0];
    assert_eq!(all.count, Some(-1));
    assert_eq!(all.capabilities, Some(vec![vec!["gpu".to_string()]]));
    assert_eq!(nvidia_requests(&Gpus::Count(2)).unwrap()[0].count, Some(2));
    let d = &nvidia_requests(&Gpus::Devices(vec!["0".into(), "3".into()])).unwrap()[0];
    assert_eq!(d.device_ids, Some(vec!["0".to_string(), "3".to_string()]));
    assert_eq!(d.count, None);
  }

  fn body(gpus: Value, picked: Option<&[String]>, env: Value) -> ContainerCreateBody {
    let c = cfg(json!({ "gpus": gpus, "env": env })).expect("valid");
    crate::sandbox::body::container_body_with(&c, "/workspace/x", "img", None, picked)
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
    let b = crate::sandbox::body::container_body(&c, "/workspace/x", "img", None);
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
}
