//! The in-sandbox agent, host side: the binaries the package ships (`binaries`), the engine's
//! read-only volume holding them and their placement in sandboxes made without it (`volume`,
//! `place`), one connection per container per process (`conn`), what is asked of it (`ops`),
//! and the activity the idle stop must see when the agent cannot record it (`activity`).
//! The agent itself and its protocol are `agent/` and `agent-proto/` in this workspace.

pub mod activity;
pub mod binaries;
pub mod conn;
pub mod down;
pub mod egress;
pub mod ops;
pub mod place;
pub mod volume;

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bollard::models::ContainerInspectResponse;

pub use binaries::{Arch, Binaries};
pub use conn::{connect, Conn};

use crate::config::ProviderConfig;
use crate::sandbox::exec::StartError;

/// Whether, and with which binaries, a provider uses the agent.
#[derive(Clone)]
pub struct Setup {
  /// The `agent` option.
  pub enabled: bool,
  pub binaries: Arc<Binaries>,
}

impl Setup {
  pub fn of(cfg: &ProviderConfig) -> Self {
    Self {
      enabled: cfg.agent,
      binaries: Binaries::of(cfg.agent_bin_dir.as_deref()),
    }
  }
}

/// Why no agent serves a call.
#[derive(Debug)]
pub enum Failure {
  /// The container is not running, gone, or out of processes: the caller recovers as for an
  /// engine exec (`provider::retry`).
  Start(StartError),
  /// The agent cannot run in this container (no binary for its platform, an exec format
  /// error, the option is off …): calls take the engine's exec and archive endpoints.
  Unavailable(String),
}

/// What the agent needs to know about a sandbox's container, read from its inspect data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
  /// What the sandbox may reach, as recorded on it (`None`: made before the record existed, on
  /// a network of its own). Under a policy its agent carries the connections (`egress`).
  pub egress: Option<crate::config::egress::Egress>,
  /// The image id: its platform picks the binary.
  pub image: String,
  /// The agent directory mounted read-only (`/.trueforge-agent/<tag>`), when there is one.
  pub mounted: Option<String>,
  /// Made with the agent-mode init, which trusts only the agent's root-owned activity file.
  pub agent_init: bool,
  /// Idle seconds before the container stops itself; 0 = never.
  pub idle_secs: u64,
  /// The root filesystem is read-only (a placed binary goes under /tmp).
  pub read_only_root: bool,
}

impl Facts {
  pub fn of(info: &ContainerInspectResponse) -> Self {
    let entrypoint = info
      .config
      .as_ref()
      .and_then(|c| c.entrypoint.clone())
      .unwrap_or_default();
    let init = entrypoint.get(3).map(String::as_str) == Some(crate::sandbox::body::INIT_NAME);
    let egress = info
      .config
      .as_ref()
      .and_then(|c| c.labels.as_ref())
      .and_then(|l| l.get(crate::util::labels::LABEL_EGRESS))
      .and_then(|r| crate::config::egress::Egress::of_record(r));
    Self {
      egress,
      image: info.image.clone().unwrap_or_default(),
      mounted: volume::mounted_dir(info),
      agent_init: init
        && matches!(
          entrypoint.get(2).map(String::as_str),
          Some(
            crate::sandbox::body::AGENT_INIT_SCRIPT | crate::sandbox::body::AGENT_INIT_SCRIPT_V1
          )
        ),
      idle_secs: if init {
        entrypoint.get(4).and_then(|s| s.parse().ok()).unwrap_or(0)
      } else {
        0
      },
      read_only_root: info
        .host_config
        .as_ref()
        .and_then(|h| h.readonly_rootfs)
        .unwrap_or(false),
    }
  }
}

/// Whom a sandbox's commands and files run as: `LABEL_USER` on a sandbox made to run the agent
/// on Docker (its main process is root's), else the container's `Config.User`. `None`: root.
pub fn sandbox_user(info: &ContainerInspectResponse) -> Option<String> {
  let config = info.config.as_ref()?;
  let label = config
    .labels
    .as_ref()
    .and_then(|l| l.get(crate::util::labels::LABEL_USER));
  match label {
    Some(u) => Some(u.clone()),
    None => config.user.clone(),
  }
  .filter(|u| !u.is_empty())
}

/// Per-engine state (kept per engine: `EngineShared::state`).
#[derive(Default)]
pub struct State {
  /// One connection slot per container, while it has a live agent or a start under way.
  conns: Mutex<HashMap<String, conn::Slot>>,
  /// Image id → its platform.
  archs: Mutex<HashMap<String, Arch>>,
  /// Containers the agent cannot run in, or cannot keep running in, and why (`down`).
  down: Mutex<HashMap<String, down::Down>>,
  /// When each container's agent was last lost while its container ran (`down`).
  losses: Mutex<HashMap<String, Vec<Instant>>>,
  /// The agent volume of each binaries tag, once made (or why not).
  volumes: tokio::sync::Mutex<HashMap<String, volume::Made>>,
  /// When the idle stop's activity was last refreshed for a container (`activity`).
  touched: Mutex<HashMap<String, Instant>>,
}

impl State {
  /// Containers with a live agent connection (or one starting).
  pub fn connections(&self) -> usize {
    self.conns.lock().expect("agent conns").len()
  }
}

/// Per-container and per-image maps are bounded: past this many entries they start over (an
/// entry lost costs one lookup or one start again).
const MAX_ENTRIES: usize = 4096;

fn bounded_insert<K: Eq + Hash, V>(map: &mut HashMap<K, V>, k: K, v: V) {
  if map.len() >= MAX_ENTRIES && !map.contains_key(&k) {
    map.clear();
  }
  map.insert(k, v);
}

/// Whether a volume is an agent volume (shared by every sandbox: mounted, never carried or
/// removed with one).
pub fn is_agent_volume(name: &str) -> bool {
  name.starts_with(volume::VOLUME_PREFIX)
}

#[cfg(test)]
mod tests {
  use super::*;
  use bollard::models::{ContainerConfig, HostConfig, MountPoint};

  #[test]
  fn facts_come_from_the_inspect_data() {
    let info = ContainerInspectResponse {
      image: Some("sha256:abc".into()),
      config: Some(ContainerConfig {
        entrypoint: Some(vec![
          "/bin/sh".into(),
          "-c".into(),
          crate::sandbox::body::AGENT_INIT_SCRIPT.into(),
          crate::sandbox::body::INIT_NAME.into(),
          "900".into(),
          "30".into(),
        ]),
        ..Default::default()
      }),
      host_config: Some(HostConfig {
        readonly_rootfs: Some(true),
        ..Default::default()
      }),
      mounts: Some(vec![MountPoint {
        typ: Some("volume".into()),
        name: Some("trueforge-agent-0.1.0-0123456789ab".into()),
        destination: Some("/.trueforge-agent/0.1.0-0123456789ab".into()),
        rw: Some(false),
        ..Default::default()
      }]),
      ..Default::default()
    };
    let f = Facts::of(&info);
    assert_eq!(
      f,
      Facts {
        egress: None,
        image: "sha256:abc".into(),
        mounted: Some("/.trueforge-agent/0.1.0-0123456789ab".into()),
        agent_init: true,
        idle_secs: 900,
        read_only_root: true,
      }
    );
    let mut legacy = info.clone();
    legacy.config.as_mut().unwrap().entrypoint.as_mut().unwrap()[2] =
      crate::sandbox::body::INIT_SCRIPT.into();
    legacy.mounts = None;
    let f = Facts::of(&legacy);
    assert!(!f.agent_init && f.mounted.is_none());
    assert_eq!(f.idle_secs, 900);
    assert!(crate::sandbox::body::AGENT_INIT_SCRIPT.contains(&format!(
      "act={}\n",
      trueforge_agent_proto::msg::ACTIVITY_FILE
    )));
    assert!(is_agent_volume("trueforge-agent-0.1.0-0123456789ab"));
    assert!(!is_agent_volume("a3f0c1"));
  }

  #[test]
  fn maps_stay_bounded() {
    let mut m = HashMap::new();
    for i in 0..(MAX_ENTRIES * 2) {
      bounded_insert(&mut m, i, ());
    }
    assert!(m.len() <= MAX_ENTRIES);
  }
}
