//! One bollard client per Docker host per process, created on first use with the API version
//! negotiated once. Every engine call goes through `Engine`, which names the operation in its
//! errors and bounds control-plane calls by a deadline so a hung engine cannot hang a caller.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::{Docker, API_DEFAULT_VERSION};
use tokio::sync::OnceCell;

use crate::endpoint::Endpoint;
use crate::errors::{Result, SandboxError};

/// The socket used when neither `dockerHost` nor `DOCKER_HOST` nor a context says otherwise.
pub const DEFAULT_DOCKER_HOST: &str = crate::endpoint::DEFAULT_DOCKER_HOST;
/// Default deadline for one control-plane request (inspect, create, start, archive stat …).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// A connected engine: the client plus the address it was made for (for error messages).
#[derive(Clone)]
pub struct Engine {
  pub docker: Docker,
  pub host: Arc<str>,
  /// The connection's identity (address plus TLS identity, `Endpoint::key`): what caches and
  /// process-wide maps key by, so two engines are never confused.
  pub key: Arc<str>,
  /// The engine is Podman (its Docker-compatible API differs in places; see docs/podman.md).
  pub podman: bool,
  /// A TLS client certificate in use (TLS errors then say whether one was missing).
  pub client_cert: bool,
  /// Deadline for one control-plane request; a provider sets its own (`engineTimeoutMs`).
  pub control_timeout: Duration,
}

type Slot = Arc<OnceCell<Engine>>;

fn registry() -> &'static Mutex<HashMap<String, Slot>> {
  static REG: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
  REG.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The engine an option-less provider talks to, as the Docker CLI picks it (see `endpoint`).
pub fn effective_endpoint(
  configured: Option<&str>,
  tls: Option<&crate::endpoint::TlsChoice>,
) -> Result<Endpoint> {
  crate::endpoint::resolve(configured, tls, &crate::endpoint::ProcessEnv)
}

/// The shared engine for `endpoint`, connecting (and negotiating) on first use. A failed
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
    crate::tls::connect(host, tls, timeout, API_DEFAULT_VERSION)?
  } else if host.starts_with("ssh://") {
    crate::ssh::connect(host, timeout, API_DEFAULT_VERSION)?
  } else if let Some(path) = host.strip_prefix("unix://") {
    Docker::connect_with_unix(path, timeout, API_DEFAULT_VERSION)
      .map_err(|e| unreachable(e.to_string()))?
  } else if let Some(hp) = host.strip_prefix("tcp://") {
    Docker::connect_with_http(&format!("http://{hp}"), timeout, API_DEFAULT_VERSION)
      .map_err(|e| unreachable(e.to_string()))?
  } else {
    return Err(unreachable("unsupported address".into()));
  };
  let key: Arc<str> = endpoint.key().into();
  let client_cert = endpoint.tls.as_ref().is_some_and(|t| t.cert.is_some());
  let engine = Engine {
    docker: docker.clone(),
    host: host.into(),
    key: key.clone(),
    podman: false,
    client_cert,
    control_timeout: limit,
  };
  let negotiated = engine
    .within(
      limit,
      "negotiate the API version",
      docker.negotiate_version(),
    )
    .await?;
  let podman = engine
    .within(limit, "read the engine version", negotiated.version())
    .await
    .map(|v| {
      v.components
        .unwrap_or_default()
        .iter()
        .any(|c| c.name.contains("Podman"))
    })
    .unwrap_or(false);
  Ok(Engine {
    docker: negotiated,
    host: host.into(),
    key,
    podman,
    client_cert,
    control_timeout: CONTROL_TIMEOUT,
  })
}

impl Engine {
  /// Runs one idempotent control-plane request under `CONTROL_TIMEOUT`, mapping its error. A
  /// connection that broke before any answer (an engine restart drops pooled connections) is
  /// retried once on a fresh one.
  pub async fn control<T, F, Fut>(&self, operation: &str, request: F) -> Result<T>
  where
    F: Fn() -> Fut,
    Fut: Future<Output = std::result::Result<T, BollardError>>,
  {
    self
      .control_within(self.control_timeout, operation, request)
      .await
  }

  /// `control` with a shorter limit (a caller's own deadline).
  pub async fn control_within<T, F, Fut>(
    &self,
    limit: Duration,
    operation: &str,
    request: F,
  ) -> Result<T>
  where
    F: Fn() -> Fut,
    Fut: Future<Output = std::result::Result<T, BollardError>>,
  {
    let started = std::time::Instant::now();
    match self.within(limit, operation, request()).await {
      Err(SandboxError::EngineUnreachable { .. }) if started.elapsed() < limit / 2 => {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self
          .within(
            limit.saturating_sub(started.elapsed()),
            operation,
            request(),
          )
          .await
      }
      other => other,
    }
  }

  /// Runs one request under `limit`, mapping its error.
  pub async fn within<T>(
    &self,
    limit: Duration,
    operation: &str,
    fut: impl Future<Output = std::result::Result<T, BollardError>>,
  ) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
      Ok(r) => r.map_err(|e| self.map_error(operation, e)),
      Err(_) => Err(self.timeout(operation, limit)),
    }
  }

  pub fn timeout(&self, operation: &str, limit: Duration) -> SandboxError {
    SandboxError::EngineTimeout {
      host: self.host.to_string(),
      operation: operation.to_string(),
      seconds: limit.as_secs().max(1),
    }
  }

  /// Server answers become `Engine` errors with their status; anything else means we never got
  /// an answer, so the engine is unreachable.
  pub fn map_error(&self, operation: &str, e: BollardError) -> SandboxError {
    if let Some(tls) = crate::tls::classify(&self.host, self.client_cert, &e) {
      return tls;
    }
    if let Some(ssh) = crate::ssh::classify(&self.host, &e) {
      return ssh;
    }
    match e {
      BollardError::DockerResponseServerError {
        status_code,
        message,
      } => SandboxError::Engine {
        operation: operation.to_string(),
        status: status_code,
        detail: message,
      },
      BollardError::RequestTimeoutError => self.timeout(operation, self.control_timeout),
      other => SandboxError::EngineUnreachable {
        host: self.host.to_string(),
        detail: format!("{operation}: {other}"),
      },
    }
  }
}

/// The HTTP status of an engine error, when the engine answered.
pub fn status_of(e: &SandboxError) -> Option<u16> {
  match e {
    SandboxError::Engine { status, .. } => Some(*status),
    _ => None,
  }
}
