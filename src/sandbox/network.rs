//! The network sandboxes join unless the `network` option names another: one of ours per
//! namespace and tenant, so a sandbox reaches the outside but no sandbox of another tenant, and
//! on Docker no other sandbox at all (inter-container communication is off on it: the engine
//! drops traffic between its containers). Podman 4's networks cannot turn that off; there each
//! network is isolated from every other one (`isolate`), so tenants and namespaces still cannot
//! reach each other, while sandboxes of one tenant can (docs/podman.md).
//!
//! Docker before 20.10.27 (and 23) can deadlock with containers coming and going on one network
//! (libnetwork locks a network and its controller in opposite orders: moby issue 46661; the
//! whole daemon then stops answering). On such an engine sandboxes join the default bridge
//! unless the `network` option asks for ours (`'isolated'`), and the provider says so once;
//! `doctor` says so too. The bridge keeps no service records, so fewer of the locked paths run
//! there, but the race is in every container's leave: this project's CI has met it on the
//! default bridge too. Only a fixed engine removes it.
//!
//! Made on first use by whichever process needs it first and kept: removing it would break the
//! stopped sandboxes that still name it. Docker lets two networks share a name, so two
//! processes making it at once can make two: every process then takes the oldest (by creation
//! time, then id), removes the others, and containers name it by id. One that a sandbox of
//! another process already runs on cannot be removed; then the oldest goes instead.

use std::collections::HashMap;
use std::sync::Mutex;

use bollard::models::{Network, NetworkCreateRequest};
use sha2::{Digest, Sha256};

use crate::engine::runtime::KeyedLocks;
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};
use crate::util::labels::{self, LABEL_NAMESPACE, LABEL_TENANT};
use crate::util::logging::Logger;
use crate::util::timestamps::parse_time;

/// The `network` value that asks for ours even where the engine is not safe with it.
pub const ISOLATED: &str = "isolated";

/// Whether the engine's networks are safe to share among many sandboxes coming and going (see
/// above): Podman, and Docker 20.10.27 and later (23 and later in every line).
pub fn safe_on(engine: &Engine) -> bool {
  engine.podman || engine.docker_version.is_some_and(safe_version)
}

/// Docker versions with the libnetwork deadlock fixed.
pub fn safe_version(v: (u32, u32, u32)) -> bool {
  v >= (23, 0, 0) || (v.0 == 20 && v.1 == 10 && v.2 >= 27)
}

/// Which network a new sandbox of `cfg` joins, and whether it is ours: `None` means the
/// `network` option's value (or the default bridge) as the body has it.
pub fn wanted(engine: &Engine, option: Option<&str>, log: &Logger) -> bool {
  match option {
    Some(ISOLATED) => true,
    Some(_) => false,
    None if safe_on(engine) => true,
    None => {
      let state = engine.shared.state::<State>();
      if !state.warned.swap(true, std::sync::atomic::Ordering::SeqCst) {
        log.warn(
          "sandboxes join the default bridge, where they can reach each other: this Docker \
           engine has a known deadlock with many containers on one user-defined network \
           (moby issue 46661, fixed in 20.10.27 and 23); upgrade it, or set network: \
           'isolated' to take the risk",
          serde_json::json!({ "engineVersion": engine.docker_version.map(|(a, b, c)| format!("{a}.{b}.{c}")) }),
        );
      }
      false
    }
  }
}

/// Docker's bridge option that turns inter-container communication on or off.
pub const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";
/// Podman's (netavark's) option isolating a network from every other one.
pub const ISOLATE_OPTION: &str = "isolate";

/// The networks this process has settled on, name → id (kept per engine), and one ensure at a
/// time per name.
#[derive(Default)]
pub struct State {
  known: Mutex<HashMap<String, String>>,
  locks: KeyedLocks<String>,
  /// The engine-is-not-safe warning was logged.
  warned: std::sync::atomic::AtomicBool,
}

/// The name of the network for `namespace` and `tenant`: the same in every process.
pub fn name_for(namespace: &str, tenant: Option<&str>) -> String {
  match tenant {
    None => format!("trueforge-{namespace}"),
    Some(t) => {
      let d = Sha256::digest(t.as_bytes());
      let hex: String = d[..6].iter().map(|b| format!("{b:02x}")).collect();
      format!("trueforge-{namespace}-t{hex}")
    }
  }
}

/// The definition of a new network for `namespace` and `tenant` on this engine.
pub fn definition(
  name: &str,
  namespace: &str,
  tenant: Option<&str>,
  podman: bool,
) -> NetworkCreateRequest {
  let mut l = HashMap::from([
    (
      labels::LABEL_MANAGED_BY.to_string(),
      labels::MANAGED_BY.to_string(),
    ),
    (LABEL_NAMESPACE.to_string(), namespace.to_string()),
  ]);
  if let Some(t) = tenant {
    l.insert(LABEL_TENANT.to_string(), t.to_string());
  }
  let options = if podman {
    HashMap::from([(ISOLATE_OPTION.to_string(), "true".to_string())])
  } else {
    HashMap::from([(ICC_OPTION.to_string(), "false".to_string())])
  };
  NetworkCreateRequest {
    name: name.to_string(),
    driver: Some("bridge".into()),
    options: Some(options),
    labels: Some(l),
    ..Default::default()
  }
}

/// Whether an existing network is ours for this namespace and tenant, with the isolation on.
fn is_ours(n: &Network, namespace: &str, tenant: Option<&str>, podman: bool) -> bool {
  let l = n.labels.as_ref();
  let label = |k: &str| l.and_then(|l| l.get(k)).map(String::as_str);
  let opt = |k: &str| {
    n.options
      .as_ref()
      .and_then(|o| o.get(k))
      .map(String::as_str)
  };
  // Podman's Docker API takes `isolate` (and warns it does not know it, though netavark applies
  // it) but never shows it back: there the labels are all that can be checked.
  let isolated = podman || opt(ICC_OPTION) == Some("false");
  labels::managed(l)
    && label(LABEL_NAMESPACE) == Some(namespace)
    && label(LABEL_TENANT) == tenant
    && isolated
}

/// When a network was made, as (seconds, nanoseconds), for ordering: the engine writes
/// RFC 3339 with a fraction of varying length.
fn created_at(n: &Network) -> (u64, u32) {
  let s = n.created.as_deref().unwrap_or("");
  let secs = parse_time(s).unwrap_or(u64::MAX);
  let nanos = s
    .split_once('.')
    .map(|(_, f)| {
      let digits: String = f.chars().take_while(char::is_ascii_digit).take(9).collect();
      format!("{digits:0<9}").parse::<u32>().unwrap_or(0)
    })
    .unwrap_or(0);
  (secs, nanos)
}

/// The one every process takes among networks of one name: the oldest, then the smallest id.
fn canonical(found: &[Network]) -> Option<&Network> {
  found
    .iter()
    .min_by_key(|n| (created_at(n), n.id.clone().unwrap_or_default()))
}

/// The network for `namespace` and `tenant`, made when missing; its id.
pub async fn ensure(engine: &Engine, namespace: &str, tenant: Option<&str>) -> Result<String> {
  let name = name_for(namespace, tenant);
  let state = engine.shared.state::<State>();
  if let Some(id) = state.known.lock().expect("networks").get(&name) {
    return Ok(id.clone());
  }
  let _one_at_a_time = state.locks.lock(name.clone()).await;
  if let Some(id) = state.known.lock().expect("networks").get(&name) {
    return Ok(id.clone());
  }
  // Twice at most: list, make it when missing, list again.
  for _ in 0..2 {
    let found = engine.networks_named(&name).await?;
    let Some(first) = canonical(&found) else {
      engine
        .create_network(definition(&name, namespace, tenant, engine.podman))
        .await?;
      continue;
    };
    if !is_ours(first, namespace, tenant, engine.podman) {
      return Err(SandboxError::CreateFailed {
        step: "the sandboxes' network".into(),
        detail: format!(
          "a network named {name} exists that this package did not make (or whose \
           inter-container communication is on); remove it, or set the `network` option"
        ),
      });
    }
    let mut id = first.id.clone().unwrap_or_else(|| name.clone());
    // Twins made in a race go, whoever made them: while two share the name, a container naming
    // either cannot start ("ambiguous").
    let twins: Vec<String> = found
      .iter()
      .filter(|n| is_ours(n, namespace, tenant, engine.podman))
      .filter_map(|n| n.id.clone())
      .filter(|t| *t != id)
      .collect();
    for twin in twins {
      if matches!(engine.remove_network(&twin).await, Ok(true)) {
        continue;
      }
      // Still there, it is in use: another process listed before the older one showed (the
      // engine lists a network once it is set up, but dates it from the request) and started
      // a sandbox on this one. It cannot go while that sandbox runs, so the older one goes
      // instead, if nothing runs on it; a process that settled on it finds it gone and
      // settles again.
      let still = engine
        .networks_named(&name)
        .await?
        .iter()
        .any(|n| n.id.as_deref() == Some(twin.as_str()));
      if still && matches!(engine.remove_network(&id).await, Ok(true)) {
        id = twin;
      }
    }
    state
      .known
      .lock()
      .expect("networks")
      .insert(name, id.clone());
    return Ok(id);
  }
  Err(SandboxError::CreateFailed {
    step: "the sandboxes' network".into(),
    detail: format!("the network {name} was made and removed again while it was being checked"),
  })
}

/// Forgets a network that turned out to be gone (a create that named it failed).
pub fn forget(engine: &Engine, name: &str) {
  engine
    .shared
    .state::<State>()
    .known
    .lock()
    .expect("networks")
    .remove(name);
}

/// Whether an engine error says our network is missing, or has a twin for a moment (another
/// process made one too): both mean "settle on the network again and retry".
pub fn is_missing(e: &SandboxError) -> bool {
  match e {
    SandboxError::Engine { detail, .. } | SandboxError::CreateFailed { detail, .. } => {
      let d = detail.to_ascii_lowercase();
      d.contains("network") && (d.contains("not found") || d.contains("is ambiguous"))
    }
    _ => false,
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn names_are_per_namespace_and_tenant() {
    assert_eq!(name_for("default", None), "trueforge-default");
    let a = name_for("ns", Some("acme"));
    assert!(a.starts_with("trueforge-ns-t") && a.len() == "trueforge-ns-t".len() + 12);
    assert_ne!(a, name_for("ns", Some("other")));
    assert_eq!(a, name_for("ns", Some("acme")));
  }

  #[test]
  fn the_definition_turns_isolation_on_and_the_check_wants_it() {
    let d = definition("n", "ns", Some("acme"), false);
    assert_eq!(d.options.as_ref().unwrap()[ICC_OPTION], "false");
    let p = definition("n", "ns", None, true);
    assert_eq!(p.options.as_ref().unwrap()[ISOLATE_OPTION], "true");
    let seen = |d: &NetworkCreateRequest| Network {
      name: Some(d.name.clone()),
      options: d.options.clone(),
      labels: d.labels.clone(),
      ..Default::default()
    };
    assert!(is_ours(&seen(&d), "ns", Some("acme"), false));
    assert!(!is_ours(&seen(&d), "ns", None, false));
    assert!(!is_ours(&seen(&d), "other", Some("acme"), false));
    assert!(is_ours(&seen(&p), "ns", None, true));
    assert_eq!(ISOLATE_OPTION, "isolate");
    let mut open = seen(&d);
    open.options = Some(HashMap::from([(
      ICC_OPTION.to_string(),
      "true".to_string(),
    )]));
    assert!(!is_ours(&open, "ns", Some("acme"), false));
    assert!(!is_ours(&Network::default(), "ns", None, false));
  }

  #[test]
  fn the_oldest_twin_wins_everywhere() {
    let n = |id: &str, created: &str| Network {
      id: Some(id.into()),
      created: Some(created.into()),
      ..Default::default()
    };
    let found = vec![
      n("b", "2026-12-02T01:17:06.15599Z"),
      n("c", "2026-12-02T01:17:06.155990928Z"),
      n("a", "2026-12-02T01:17:06.2Z"),
    ];
    assert_eq!(canonical(&found).unwrap().id.as_deref(), Some("b"));
    let tie = vec![
      n("z", "2026-12-02T01:17:06Z"),
      n("y", "2026-12-02T01:17:06.0Z"),
    ];
    assert_eq!(canonical(&tie).unwrap().id.as_deref(), Some("y"));
    assert!(canonical(&[]).is_none());
  }

  #[test]
  fn only_fixed_docker_versions_share_a_network() {
    assert!(!safe_version((20, 10, 24)));
    assert!(!safe_version((20, 10, 26)));
    assert!(safe_version((20, 10, 27)));
    assert!(safe_version((23, 0, 0)));
    assert!(safe_version((27, 3, 1)));
    assert!(!safe_version((19, 3, 15)));
    assert_eq!(
      crate::engine::version_triple("20.10.24+dfsg1"),
      Some((20, 10, 24))
    );
    assert_eq!(crate::engine::version_triple("27.3.1"), Some((27, 3, 1)));
    assert_eq!(crate::engine::version_triple("28.0"), Some((28, 0, 0)));
    assert_eq!(crate::engine::version_triple("dev"), None);
  }

  #[test]
  fn missing_networks_are_recognised() {
    let e = SandboxError::Engine {
      operation: "x".into(),
      status: 404,
      detail: "network trueforge-ns not found".into(),
    };
    assert!(is_missing(&e));
    assert!(is_missing(&SandboxError::CreateFailed {
      step: "start the container".into(),
      detail: "network trueforge-ns is ambiguous (2 matches found on name)".into(),
    }));
    assert!(!is_missing(&SandboxError::Engine {
      operation: "x".into(),
      status: 404,
      detail: "No such image: x".into(),
    }));
  }
}
