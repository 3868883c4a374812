//! Connecting: one engine per connection identity per process, kept in a registry, connected
//! and negotiated on first use, and what the engine says it is (Docker or Podman, and which
//! version).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bollard::models::SystemVersion;
use bollard::API_DEFAULT_VERSION;
use tokio::sync::OnceCell;

use crate::engine::connector;
use crate::engine::endpoint::Endpoint;
use crate::engine::runtime::EngineShared;
use crate::engine::{Engine, CONTROL_TIMEOUT};
use crate::util::errors::{Result, SandboxError};

type Slot = Arc<OnceCell<Engine>>;

fn registry() -> &'static Mutex<HashMap<String, Slot>> {
  static REG: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
  REG.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The engine an option-less provider talks to, as the Docker CLI picks it (see `endpoint`).
pub fn effective_endpoint(
  configured: Option<&str>,
  tls: Option<&crate::engine::endpoint::TlsChoice>,
) -> Result<Endpoint> {
  crate::engine::endpoint::resolve(configured, tls, &crate::engine::endpoint::ProcessEnv)
}

/// The shared engine for `endpoint` (one per connection identity, `Endpoint::key`, so state of
/// two engines is never mixed), connecting (and negotiating) on first use. A failed
/// attempt is not cached: the next call tries again, so an engine that comes back is picked up.
pub async fn engine_for(endpoint: &Endpoint, limit: Duration) -> Result<Engine> {
  let slot = {
    let mut reg = registry().lock().expect("engine registry poisoned");
    reg.entry(endpoint.key()).or_default().clone()
  };
  slot
    .get_or_try_init(|| connect(endpoint, limit))
    .await
    .cloned()
}

async fn connect(endpoint: &Endpoint, limit: Duration) -> Result<Engine> {
  let host = endpoint.host.as_str();
  let unreachable = |detail: String| SandboxError::EngineUnreachable {
    host: host.to_string(),
    detail,
  };
  // Every request is wrapped in our own deadline (`within`); bollard's own limit (which covers
  // a whole upload body) must never cut in first.
  let timeout = 86_400;
  let docker = if let (Some(tls), true) = (&endpoint.tls, host.starts_with("tcp://")) {
    crate::engine::tls::connect(host, tls, timeout, API_DEFAULT_VERSION)?
  } else if host.starts_with("ssh://") {
    crate::engine::ssh::connect(host, timeout, API_DEFAULT_VERSION)?
  } else if let Some(path) = host.strip_prefix("unix://") {
    if !std::path::Path::new(path).exists() {
      return Err(unreachable(format!("Socket not found: {path}")));
    }
    // A connection per request, as bollard's own unix client: nothing pooled goes stale.
    let socket = connector::UnixConnector(Arc::new(path.into()));
    connector::docker(
      socket,
      "http://localhost",
      false,
      timeout,
      API_DEFAULT_VERSION,
    )
    .map_err(|e| unreachable(e.to_string()))?
  } else if let Some(hp) = host.strip_prefix("tcp://") {
    let http = hyper_util::client::legacy::connect::HttpConnector::new();
    connector::docker(
      http,
      &format!("http://{hp}"),
      false,
      timeout,
      API_DEFAULT_VERSION,
    )
    .map_err(|e| unreachable(e.to_string()))?
  } else {
    return Err(unreachable("unsupported address".into()));
  };
  let client_cert = endpoint.tls.as_ref().is_some_and(|t| t.cert.is_some());
  let shared = Arc::new(EngineShared::default());
  let engine = Engine {
    docker: docker.clone(),
    host: host.into(),
    podman: false,
    podman_version: None,
    docker_version: None,
    client_cert,
    control_timeout: limit,
    shared: shared.clone(),
  };
  let negotiated = engine
    .within(
      limit,
      "negotiate the API version",
      docker.negotiate_version(),
    )
    .await?;
  // An engine that does not say what it is is taken as Docker.
  let version = engine
    .within(limit, "read the engine version", negotiated.version())
    .await
    .ok();
  let podman_version = version.as_ref().and_then(podman_of);
  let docker_version = match podman_version {
    Some(_) => None,
    None => version
      .as_ref()
      .and_then(|v| v.version.as_deref())
      .and_then(version_triple),
  };
  Ok(Engine {
    docker: negotiated,
    host: host.into(),
    podman: podman_version.is_some(),
    podman_version,
    docker_version,
    client_cert,
    control_timeout: CONTROL_TIMEOUT,
    shared,
  })
}

/// `20.10.24+dfsg1` as (20, 10, 24).
pub fn version_triple(v: &str) -> Option<(u32, u32, u32)> {
  let mut parts = v.split(['.', '-', '+', '~']);
  let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
  Some((next()?, next()?, next().unwrap_or(0)))
}

/// Podman's version (major, minor) when `v` lists a Podman component.
fn podman_of(v: &SystemVersion) -> Option<(u32, u32)> {
  v.components
    .as_ref()?
    .iter()
    .find(|c| c.name.to_ascii_lowercase().contains("podman"))
    .map(|c| {
      let mut parts = c
        .version
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
      (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    })
}

/// The engine already connected for `endpoint` in this process, if any (connects nothing).
pub fn connected(endpoint: &Endpoint) -> Option<Engine> {
  let reg = registry().lock().expect("engine registry poisoned");
  reg
    .get(&endpoint.key())
    .and_then(|slot| slot.get().cloned())
}
