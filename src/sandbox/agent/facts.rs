//! What the host knows of a sandbox's agent from the container's inspect data alone: whom its
//! calls run as, which agent directory it mounts, how its init was made. Read by the container
//! lookup below the agent's own modules, so it depends on none of them.

use bollard::models::ContainerInspectResponse;

/// Agent volumes (and their claim containers) are named this followed by the tag.
pub const VOLUME_PREFIX: &str = "trueforge-agent-";
/// Where agent directories live in a sandbox: mounted volumes and placed copies alike.
pub const MOUNT_ROOT: &str = "/.trueforge-agent";

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
  /// Runs under runc or crun, where an exec's stream ends when its process (the agent) dies or
  /// the container stops. Other runtimes may keep it open (gVisor does).
  pub runc_family: bool,
  /// The link directory it mounts, on the engine's machine (`link`).
  pub link: Option<String>,
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
      mounted: mounted_dir(info),
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
      runc_family: matches!(
        info.host_config.as_ref().and_then(|h| h.runtime.as_deref()),
        Some("runc" | "crun" | "io.containerd.runc.v2")
      ),
      link: crate::sandbox::agent::link::mounted(info),
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

/// The agent directory a container has mounted from an agent volume, if any.
pub fn mounted_dir(info: &ContainerInspectResponse) -> Option<String> {
  let from_mounts = info.mounts.iter().flatten().find_map(|m| {
    let name = m.name.as_deref()?;
    let dest = m.destination.as_deref()?;
    (name.starts_with(VOLUME_PREFIX) && dest.starts_with(MOUNT_ROOT)).then(|| dest.to_string())
  });
  from_mounts.or_else(|| {
    let hc = info.host_config.as_ref()?;
    hc.mounts.iter().flatten().find_map(|m| {
      let source = m.source.as_deref()?;
      let target = m.target.as_deref()?;
      (source.starts_with(VOLUME_PREFIX) && target.starts_with(MOUNT_ROOT))
        .then(|| target.to_string())
    })
  })
}

/// Whether a volume is an agent volume (shared by every sandbox: mounted, never carried or
/// removed with one).
pub fn is_agent_volume(name: &str) -> bool {
  name.starts_with(VOLUME_PREFIX)
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
        runtime: Some("runc".into()),
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
        runc_family: true,
        link: None,
      }
    );
    // gVisor (and any runtime not known to end an exec's stream with its process).
    let mut gvisor = info.clone();
    gvisor.host_config.as_mut().unwrap().runtime = Some("runsc".into());
    assert!(!Facts::of(&gvisor).runc_family);
    gvisor.host_config.as_mut().unwrap().runtime = None;
    assert!(!Facts::of(&gvisor).runc_family);
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
}
