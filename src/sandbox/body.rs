//! The container definition of a new sandbox: least privilege by default (see
//! docs/security.md), the init that stops an idle sandbox by itself, and what Podman needs
//! changed.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig};

use crate::config::ProviderConfig;
use crate::sandbox::{devices, layout, network};
use crate::util::errors::{Result, SandboxError};
use crate::util::ids;
use crate::util::labels::{self, LABEL_POOL, LABEL_TENANT};

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
  m=$(stat -c %Y "$act" 2>/dev/null || find "$act" -maxdepth 0 -printf %T@ 2>/dev/null) && m=${m%%.*} && [ "$m" -gt "$last" ] && last=$m
  if [ $((now - last)) -ge "$1" ]; then exit 0; fi
done
"#;

/// The init's `$0`: how a container's entrypoint is known as ours (`agent::facts::Facts`).
pub const INIT_NAME: &str = "trueforge-init";

/// `INIT_SCRIPT` for sandboxes made to run the in-sandbox agent (`find` reads the file where GNU
/// `stat` cannot: gVisor answers its `statx` with EINVAL): activity is only the mtime of
/// the agent's activity file, and only while that file is a regular file of root's with one
/// link (`agent-proto`'s `ACTIVITY_FILE`, in the sticky /tmp). A sandbox user who is not root
/// can neither write it, nor remove it, nor put a file of root's in its place, so touching
/// `/trueforge/.activity` or naming a process `trueforge-exec` keeps nothing alive. The agent
/// refreshes it on every host call and while commands run; where the agent cannot, the host does
/// with an exec as root (`agent::activity`).
pub const AGENT_INIT_SCRIPT: &str = r#"trap 'exit 0' TERM INT
act=/tmp/.trueforge-agent-activity
last=$(date +%s 2>/dev/null || echo 0)
if [ "$1" = 0 ]; then while :; do sleep 3600 & wait $!; done; fi
while :; do
  sleep "$2" & wait $!
  now=$(date +%s)
  if [ -f "$act" ] && [ ! -L "$act" ]; then
    s=$(stat -c '%u:%h:%Y' "$act" 2>/dev/null || find "$act" -maxdepth 0 -printf %U:%n:%T@ 2>/dev/null)
    case "$s" in 0:1:*) m=${s#0:1:}; m=${m%%.*}; [ "$m" -gt "$last" ] 2>/dev/null && last=$m;; esac
  fi
  if [ $((now - last)) -ge "$1" ]; then exit 0; fi
done
"#;

/// `AGENT_INIT_SCRIPT` as sandboxes made before issue 32 carry it (without the `find` fallback
/// for GNU `stat`, which gVisor answers with EINVAL): still known as the agent-mode init.
pub const AGENT_INIT_SCRIPT_V1: &str = r#"trap 'exit 0' TERM INT
act=/tmp/.trueforge-agent-activity
last=$(date +%s 2>/dev/null || echo 0)
if [ "$1" = 0 ]; then while :; do sleep 3600 & wait $!; done; fi
while :; do
  sleep "$2" & wait $!
  now=$(date +%s)
  if [ -f "$act" ] && [ ! -L "$act" ]; then
    s=$(stat -c '%u:%h:%Y' "$act" 2>/dev/null)
    case "$s" in 0:1:*) m=${s#0:1:}; [ "$m" -gt "$last" ] 2>/dev/null && last=$m;; esac
  fi
  if [ $((now - last)) -ge "$1" ]; then exit 0; fi
done
"#;

/// How often the init checks for idleness: often enough for short test intervals, at most
/// every 30 s.
pub fn idle_check_secs(idle: u64) -> u64 {
  (idle / 6).clamp(1, 30)
}

/// Whether `user` (an image's `USER` or the `user` option: `name`, `uid`, `name:group` …) is
/// someone other than root. No user at all means root.
pub(crate) fn non_root(user: Option<&str>) -> bool {
  user.is_some_and(|u| {
    let user = u.split(':').next().unwrap_or("");
    !user.is_empty() && user != "root" && user != "0"
  })
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

/// The network a sandbox of `cfg` joins: the `network` option, else ours for its namespace and
/// tenant.
pub fn network_of(cfg: &ProviderConfig) -> String {
  if cfg.egress.no_network() {
    return "none".to_string();
  }
  match cfg.network.as_deref() {
    None | Some(network::ISOLATED) => network::name_for(&cfg.namespace, cfg.tenant.as_deref()),
    Some(n) => n.to_string(),
  }
}

/// Where a sandbox under an egress policy finds the proxy: its agent's port on its own loopback.
pub const EGRESS_PROXY: &str = "127.0.0.1:3128";

/// The container's environment: under an egress policy the proxy variables (each spelling tools
/// read), then the `env` option, which may override them.
fn environment(cfg: &ProviderConfig) -> Vec<String> {
  let mut env = Vec::new();
  if cfg.egress.is_policy() {
    let http = format!("http://{EGRESS_PROXY}");
    let socks = format!("socks5h://{EGRESS_PROXY}");
    for (name, value) in [
      ("HTTP_PROXY", http.as_str()),
      ("HTTPS_PROXY", http.as_str()),
      ("ALL_PROXY", socks.as_str()),
      ("NO_PROXY", "localhost,127.0.0.1,::1"),
    ] {
      if !cfg.env.contains_key(name) && !cfg.env.contains_key(&name.to_lowercase()) {
        env.push(format!("{name}={value}"));
        env.push(format!("{}={value}", name.to_lowercase()));
      }
    }
  }
  env.extend(cfg.env.iter().map(|(k, v)| format!("{k}={v}")));
  env
}

/// The container definition for a new sandbox: least privilege by default (see docs/security.md).
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
  labels.insert(labels::LABEL_EGRESS.into(), cfg.egress.record());
  let env = environment(cfg);
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
      if cfg.agent {
        AGENT_INIT_SCRIPT
      } else {
        INIT_SCRIPT
      }
      .into(),
      INIT_NAME.into(),
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
      network_mode: Some(network_of(cfg)),
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

#[cfg(test)]
mod tests {
  use super::*;

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
    // The default egress policy: no network but loopback, the proxy in the environment.
    assert_eq!(hc.network_mode.as_deref(), Some("none"));
    assert_eq!(l[labels::LABEL_EGRESS], cfg.egress.record());
    assert!(
      hc.binds.is_none() && hc.mounts.is_none() && hc.pid_mode.is_none() && hc.ipc_mode.is_none()
    );
    assert!(b.volumes.is_none());
    let env = b.env.unwrap();
    assert_eq!(env.last().map(String::as_str), Some("A=1"));
    for v in [
      "HTTPS_PROXY=http://127.0.0.1:3128",
      "all_proxy=socks5h://127.0.0.1:3128",
    ] {
      assert!(env.contains(&v.to_string()), "{v} in {env:?}");
    }
  }

  #[test]
  fn open_egress_joins_the_network_and_sets_no_proxy_and_env_overrides_the_proxy() {
    let open =
      ProviderConfig::with_image(serde_json::json!({ "namespace": "ns1", "egress": "open" }))
        .unwrap();
    let b = container_body(
      &open,
      "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV",
      "img:1",
      None,
    );
    assert_eq!(
      b.host_config.unwrap().network_mode.as_deref(),
      Some("trueforge-ns1")
    );
    assert_eq!(b.env.unwrap(), Vec::<String>::new());
    let own =
      ProviderConfig::with_image(serde_json::json!({ "env": { "no_proxy": "x.internal" } }))
        .unwrap();
    let env = container_body(&own, "/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV", "img:1", None)
      .env
      .unwrap();
    assert!(env.contains(&"no_proxy=x.internal".to_string()));
    assert!(!env.iter().any(|e| e.starts_with("NO_PROXY=")), "{env:?}");
  }
}
