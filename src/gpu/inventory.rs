//! The GPUs exclusive allocation hands out: `gpuDevices`, else what the engine host has (CDI
//! specs beside a local engine, else `nvidia-smi -L` in a throwaway container).

use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;

use crate::config::gpus::{is_cdi_name, is_device_id};
use crate::config::Gpus;
use crate::engine::{claim, Engine};
use crate::sandbox::devices::{explain, nvidia_requests, DRIVER_CAPABILITIES};
use crate::util::errors::{Result, SandboxError};

/// Per-engine state (kept per engine: `EngineShared::state`), each learnt once per engine.
#[derive(Default)]
pub struct State {
  /// The GPUs exclusive allocation hands out, once discovered.
  inventory: Mutex<Option<Vec<String>>>,
}

/// The GPUs exclusive allocation hands out: `gpuDevices`, else what the engine host has (CDI
/// specs beside a local engine, else `nvidia-smi -L` in a throwaway container of `namespace`).
/// Discovery runs once per engine per process; `image` is asked for only when it has to run a
/// container.
pub async fn inventory<F, Fut>(
  engine: &Engine,
  configured: &[String],
  namespace: &str,
  image: F,
) -> Result<Vec<String>>
where
  F: FnOnce() -> Fut,
  Fut: std::future::Future<Output = Result<String>>,
{
  if !configured.is_empty() {
    return Ok(configured.to_vec());
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
    let (list, how) = nvidia_smi_in_container(engine, &image().await?, namespace).await?;
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
async fn nvidia_smi_in_container(
  engine: &Engine,
  image: &str,
  namespace: &str,
) -> Result<(Vec<String>, String)> {
  // A probe of the provider's namespace, so its reaper finds it if this process dies first.
  let (name, mut body) = claim::probe_body(image, namespace);
  body.entrypoint = Some(vec!["nvidia-smi".into(), "-L".into()]);
  body.cmd = Some(vec![]);
  body.env = Some(vec![format!(
    "NVIDIA_DRIVER_CAPABILITIES={DRIVER_CAPABILITIES}"
  )]);
  if let Some(host) = body.host_config.as_mut() {
    host.device_requests = nvidia_requests(&Gpus::All);
  }
  let id = engine
    .create_container("create the GPU discovery container", Some(&name), body)
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
  let _ = engine.force_remove(&id).await;
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

#[cfg(test)]
mod tests {
  use super::*;

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
}
