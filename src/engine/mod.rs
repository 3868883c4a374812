//! One bollard client per Docker host per process, created on first use with the API version
//! negotiated once, with the engine's shared state (`runtime::EngineShared`). This is the only
//! module that calls bollard: `Engine` offers one typed method per operation, which names the
//! operation in its errors, turns "no such container" into a value where callers expect it, and
//! bounds control-plane calls by a deadline so a hung engine cannot hang a caller.

pub mod claim;
pub mod connector;
pub mod credentials;
pub mod endpoint;
pub mod runtime;
pub mod ssh;
pub mod tls;
mod volumes;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bollard::auth::DockerCredentials;
use bollard::container::LogOutput;
use bollard::container::PathStatResponse;
use bollard::errors::Error as BollardError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
  BuildInfo, ContainerCreateBody, ContainerInspectResponse, ContainerSummary, CreateImageInfo,
  ExecInspectResponse, ImageInspect, ImageSummary, Network, NetworkCreateRequest, NetworkInspect,
  SystemInfo, SystemVersion,
};
use bollard::query_parameters::{
  BuildImageOptions, CommitContainerOptions, ContainerArchiveInfoOptions, CreateContainerOptions,
  CreateImageOptions, DownloadFromContainerOptions, ListContainersOptions, ListImagesOptions,
  ListNetworksOptions, LogsOptions, RemoveContainerOptions, RemoveImageOptions,
  RemoveVolumeOptions, RenameContainerOptions, RestartContainerOptions, UploadToContainerOptions,
};
use bollard::{Docker, API_DEFAULT_VERSION};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::OnceCell;

use crate::engine::endpoint::Endpoint;
use crate::engine::runtime::EngineShared;
use crate::util::errors::{Result, SandboxError};

/// The socket used when neither `dockerHost` nor `DOCKER_HOST` nor a context says otherwise.
pub const DEFAULT_DOCKER_HOST: &str = crate::engine::endpoint::DEFAULT_DOCKER_HOST;
/// Default deadline for one control-plane request (inspect, create, start, archive stat …).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// A connected engine: the client, the address it was made for (for error messages) and the
/// state every provider on it shares. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
  docker: Docker,
  pub host: Arc<str>,
  /// The engine is Podman (its Docker-compatible API differs in places; see docs/podman.md).
  pub podman: bool,
  /// Podman's version (major, minor), when the engine is Podman.
  pub podman_version: Option<(u32, u32)>,
  /// Docker's own version (major, minor, patch), when the engine is Docker and said it.
  pub docker_version: Option<(u32, u32, u32)>,
  /// A TLS client certificate in use (TLS errors then say whether one was missing).
  pub client_cert: bool,
  /// Deadline for one control-plane request; a provider sets its own (`engineTimeoutMs`).
  pub control_timeout: Duration,
  /// Caches, locks and background tasks of this engine, shared by every clone.
  pub shared: Arc<EngineShared>,
}

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

impl Engine {
  /// Runs one idempotent control-plane request under `CONTROL_TIMEOUT`, mapping its error. A
  /// connection that broke before any answer (an engine restart drops pooled connections) is
  /// retried once on a fresh one.
  async fn control<T, F, Fut>(&self, operation: &str, request: F) -> Result<T>
  where
    F: Fn() -> Fut,
    Fut: Future<Output = std::result::Result<T, BollardError>>,
  {
    self
      .control_within(self.control_timeout, operation, request)
      .await
  }

  /// `control` with a shorter limit (a caller's own deadline).
  async fn control_within<T, F, Fut>(
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
  async fn within<T>(
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

  /// Runs several requests under one `limit` (their errors already mapped).
  pub async fn bounded<T>(
    &self,
    limit: Duration,
    operation: &str,
    fut: impl Future<Output = Result<T>>,
  ) -> Result<T> {
    tokio::time::timeout(limit, fut)
      .await
      .unwrap_or_else(|_| Err(self.timeout(operation, limit)))
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
    if let Some(r) = connector::reply_too_large(&e) {
      return SandboxError::EngineReplyTooLarge {
        host: self.host.to_string(),
        operation: operation.to_string(),
        limit: r.limit,
      };
    }
    if let Some(tls) = crate::engine::tls::classify(&self.host, self.client_cert, &e) {
      return tls;
    }
    if let Some(ssh) = crate::engine::ssh::classify(&self.host, &e) {
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
fn status_of(e: &SandboxError) -> Option<u16> {
  match e {
    SandboxError::Engine { status, .. } => Some(*status),
    _ => None,
  }
}

/// `Ok(None)` for the statuses listed, so callers match values, not errors.
fn absent_on<T>(r: Result<T>, statuses: &[u16]) -> Result<Option<T>> {
  match r {
    Ok(v) => Ok(Some(v)),
    Err(e) if status_of(&e).is_some_and(|s| statuses.contains(&s)) => Ok(None),
    Err(e) => Err(e),
  }
}

/// An upload's 404 (the directory, or the container, is missing) as `FileNotFound`.
fn missing_dir(r: Result<()>, dir: String) -> Result<()> {
  match r {
    Err(e) if status_of(&e) == Some(404) => Err(SandboxError::FileNotFound { path: dir }),
    other => other,
  }
}

/// The engine already connected for `endpoint` in this process, if any (connects nothing).
pub fn connected(endpoint: &Endpoint) -> Option<Engine> {
  let reg = registry().lock().expect("engine registry poisoned");
  reg
    .get(&endpoint.key())
    .and_then(|slot| slot.get().cloned())
}

/// Typed operations: each names itself in its errors and keeps the deadlines above. Creates,
/// renames and starts of an exec are never retried, since a repeat could act twice.
impl Engine {
  /// The API version negotiated with the engine.
  pub fn api_version(&self) -> String {
    self.docker.client_version().to_string()
  }

  pub async fn version(&self) -> Result<SystemVersion> {
    self
      .control("read the engine version", || self.docker.version())
      .await
  }

  pub async fn info(&self) -> Result<SystemInfo> {
    self
      .control("read the engine info", || self.docker.info())
      .await
  }

  /// A container's inspect data; `None` when there is no such container.
  pub async fn inspect_container(
    &self,
    operation: &str,
    container: &str,
  ) -> Result<Option<ContainerInspectResponse>> {
    let r = self
      .control(operation, || self.docker.inspect_container(container, None))
      .await;
    match absent_on(r, &[404]) {
      // Podman answers for a container it is removing with a 500 "no such container".
      Err(SandboxError::Engine {
        status: 500,
        ref detail,
        ..
      }) if detail.contains("no such container") => Ok(None),
      other => other,
    }
  }

  /// Creates a container (named when `name` is given); returns its id.
  pub async fn create_container(
    &self,
    operation: &str,
    name: Option<&str>,
    body: ContainerCreateBody,
  ) -> Result<String> {
    let opts = name.map(|n| CreateContainerOptions {
      name: Some(n.to_string()),
      ..Default::default()
    });
    self
      .within(
        self.control_timeout,
        operation,
        self.docker.create_container(opts, body),
      )
      .await
      .map(|c| c.id)
  }

  /// Creates a container under `name`; `None` when that name is taken.
  pub async fn create_named(
    &self,
    operation: &str,
    name: &str,
    body: ContainerCreateBody,
  ) -> Result<Option<String>> {
    match self.create_container(operation, Some(name), body).await {
      // Podman 4 says so with a 500 ("that name is already in use") rather than Docker's 409.
      Err(SandboxError::Engine {
        status: 500,
        detail,
        ..
      }) if detail
        .to_ascii_lowercase()
        .contains("name is already in use") =>
      {
        Ok(None)
      }
      r => absent_on(r, &[409]),
    }
  }

  /// Starts a container; `false` when there is no such container. Another 404 (a network the
  /// container names is gone) is an error.
  pub async fn start_container(&self, operation: &str, container: &str) -> Result<bool> {
    let r = self
      .control(operation, || self.docker.start_container(container, None))
      .await;
    match r {
      Err(SandboxError::Engine {
        status: 404,
        ref detail,
        ..
      }) if !detail.to_ascii_lowercase().contains("no such container") => r.map(|_| true),
      r => absent_on(r, &[404]).map(|r| r.is_some()),
    }
  }

  pub async fn unpause_container(&self, operation: &str, container: &str) -> Result<()> {
    self
      .control(operation, || self.docker.unpause_container(container))
      .await
  }

  /// Restarts a container with `grace_secs` before the kill, within `limit`.
  pub async fn restart_container(
    &self,
    container: &str,
    grace_secs: i32,
    limit: Duration,
  ) -> Result<()> {
    let opts = RestartContainerOptions {
      t: Some(grace_secs),
      ..Default::default()
    };
    self
      .within(
        limit,
        "restart the sandbox",
        self.docker.restart_container(container, Some(opts)),
      )
      .await
  }

  pub async fn rename_container(&self, operation: &str, container: &str, name: &str) -> Result<()> {
    let opts = RenameContainerOptions {
      name: name.to_string(),
    };
    self
      .within(
        self.control_timeout,
        operation,
        self.docker.rename_container(container, opts),
      )
      .await
  }

  /// Removes a container (and its anonymous volumes) whatever its state. `false` when it was
  /// already gone or another removal of it is under way.
  pub async fn force_remove(&self, container: &str) -> Result<bool> {
    let opts = RemoveContainerOptions {
      force: true,
      v: true,
      ..Default::default()
    };
    match self
      .control("remove the sandbox container", || {
        self.docker.remove_container(container, Some(opts.clone()))
      })
      .await
    {
      Ok(()) => Ok(true),
      Err(e) if status_of(&e) == Some(404) => Ok(false),
      Err(e) if status_of(&e) == Some(409) && e.to_string().contains("already in progress") => {
        Ok(false)
      }
      Err(e) => Err(e),
    }
  }

  /// Removes a container whatever its state but keeps its volumes: another container of the
  /// same sandbox mounts them now. `false` when it was already gone.
  pub async fn remove_keeping_volumes(&self, operation: &str, container: &str) -> Result<bool> {
    let opts = RemoveContainerOptions {
      force: true,
      v: false,
      ..Default::default()
    };
    let r = self
      .control(operation, || {
        self.docker.remove_container(container, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404]).map(|r| r.is_some())
  }

  /// Saves a container's filesystem as a new untagged image carrying `labels`; its id. Commit
  /// copies the whole writable layer, so it gets the transfer deadline, not the control one.
  pub async fn commit_container(
    &self,
    container: &str,
    labels: HashMap<String, String>,
    limit: Duration,
  ) -> Result<String> {
    let opts = CommitContainerOptions {
      container: Some(container.to_string()),
      pause: false,
      ..Default::default()
    };
    let config = bollard::models::ContainerConfig {
      labels: Some(labels),
      ..Default::default()
    };
    self
      .within(
        limit,
        "save the sandbox's files as an image",
        self.docker.commit_container(opts, config),
      )
      .await
      .map(|r| r.id)
  }

  /// Untagged images carrying every label in `labels` (`key` or `key=value`).
  pub async fn list_dangling_images(&self, labels: Vec<String>) -> Result<Vec<ImageSummary>> {
    let opts = ListImagesOptions {
      filters: Some(HashMap::from([
        ("dangling".to_string(), vec!["true".to_string()]),
        ("label".to_string(), labels),
      ])),
      ..Default::default()
    };
    self
      .control("list saved sandbox images", || {
        self.docker.list_images(Some(opts.clone()))
      })
      .await
  }

  /// Removes an image nothing uses (never forced); `false` when it is gone or still in use.
  pub async fn remove_unused_image(&self, image: &str) -> Result<bool> {
    let opts = RemoveImageOptions {
      force: false,
      noprune: false,
      ..Default::default()
    };
    let r = self
      .control("remove a saved sandbox image", || {
        self.docker.remove_image(image, Some(opts.clone()), None)
      })
      .await;
    absent_on(r, &[404, 409]).map(|r| r.is_some())
  }

  /// Removes a volume nothing mounts (never forced); `false` when it is gone or in use.
  pub async fn remove_unused_volume(&self, volume: &str) -> Result<bool> {
    let opts = RemoveVolumeOptions { force: false };
    let r = self
      .control("remove a sandbox volume", || {
        self.docker.remove_volume(volume, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404, 409]).map(|r| r.is_some())
  }

  /// Removes a stopped container (and its anonymous volumes). `false` when it is gone, or
  /// running again: the engine refuses to remove a running container unforced.
  pub async fn remove_stopped(&self, operation: &str, container: &str) -> Result<bool> {
    self.remove_unforced(operation, container, true).await
  }

  /// As `remove_stopped`, but keeping its volumes: another container mounts them now.
  pub async fn remove_stopped_keeping_volumes(
    &self,
    operation: &str,
    container: &str,
  ) -> Result<bool> {
    self.remove_unforced(operation, container, false).await
  }

  async fn remove_unforced(&self, operation: &str, container: &str, volumes: bool) -> Result<bool> {
    let opts = RemoveContainerOptions {
      force: false,
      v: volumes,
      ..Default::default()
    };
    let r = self
      .control(operation, || {
        self.docker.remove_container(container, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404, 409]).map(|r| r.is_some())
  }

  /// Containers (stopped ones too with `all`) matching the engine's list `filters`.
  pub async fn list_containers(
    &self,
    operation: &str,
    all: bool,
    size: bool,
    filters: HashMap<String, Vec<String>>,
  ) -> Result<Vec<ContainerSummary>> {
    let opts = ListContainersOptions {
      all,
      size,
      filters: Some(filters),
      ..Default::default()
    };
    self
      .control(operation, || {
        self.docker.list_containers(Some(opts.clone()))
      })
      .await
  }

  /// Containers carrying every label in `labels` (`key=value` or just `key`), in any state.
  pub async fn list_labelled(
    &self,
    operation: &str,
    labels: Vec<String>,
  ) -> Result<Vec<ContainerSummary>> {
    let filters = HashMap::from([("label".to_string(), labels)]);
    self.list_containers(operation, true, false, filters).await
  }

  /// A container's output so far (or, with `follow`, until it exits), as raw bytes.
  pub fn logs(&self, container: &str, follow: bool) -> impl Stream<Item = Result<Bytes>> + '_ {
    let opts = LogsOptions {
      follow,
      stdout: true,
      stderr: true,
      tail: "all".into(),
      ..Default::default()
    };
    self.docker.logs(container, Some(opts)).map(|r| {
      r.map(LogOutput::into_bytes)
        .map_err(|e| self.map_error("read container logs", e))
    })
  }

  /// Waits up to `limit` for a container to exit; whether it did.
  pub async fn wait_exit(&self, container: &str, limit: Duration) -> bool {
    let mut wait = self.docker.wait_container(container, None);
    matches!(tokio::time::timeout(limit, wait.next()).await, Ok(Some(_)))
  }

  /// Creates an exec within `limit`; returns its id.
  pub async fn create_exec(
    &self,
    operation: &str,
    container: &str,
    opts: CreateExecOptions<String>,
    limit: Duration,
  ) -> Result<String> {
    self
      .control_within(limit, operation, || {
        self.docker.create_exec(container, opts.clone())
      })
      .await
      .map(|c| c.id)
  }

  /// Starts an exec with its streams attached (`capacity`: the output buffer), within `limit`.
  pub async fn start_exec(
    &self,
    operation: &str,
    exec_id: &str,
    capacity: Option<usize>,
    limit: Duration,
  ) -> Result<StartExecResults> {
    let opts = StartExecOptions {
      detach: false,
      tty: false,
      output_capacity: capacity,
    };
    self
      .within(
        limit,
        operation,
        self.docker.start_exec(exec_id, Some(opts)),
      )
      .await
  }

  pub async fn inspect_exec(
    &self,
    operation: &str,
    exec_id: &str,
    limit: Duration,
  ) -> Result<ExecInspectResponse> {
    self
      .control_within(limit, operation, || self.docker.inspect_exec(exec_id))
      .await
  }

  /// The archive stat of `path` in a container; `None` on 404 (the path or the container is
  /// missing: the caller tells which).
  pub async fn archive_stat(
    &self,
    operation: &str,
    container: &str,
    path: &str,
  ) -> Result<Option<PathStatResponse>> {
    let opts = ContainerArchiveInfoOptions {
      path: path.to_string(),
    };
    let r = self
      .control(operation, || {
        self
          .docker
          .get_container_archive_info(container, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404])
  }

  /// A tar of `path` in a container, streamed. A missing path (or container) arrives as the
  /// stream's first item, `FileNotFound`.
  pub fn download_tar(
    &self,
    operation: &'static str,
    container: &str,
    path: &str,
  ) -> impl Stream<Item = Result<Bytes>> + '_ {
    let opts = DownloadFromContainerOptions {
      path: path.to_string(),
    };
    let path = path.to_string();
    self
      .docker
      .download_from_container(container, Some(opts))
      .map(move |r| {
        r.map_err(|e| match self.map_error(operation, e) {
          SandboxError::Engine { status: 404, .. } => {
            SandboxError::FileNotFound { path: path.clone() }
          }
          other => other,
        })
      })
  }

  /// Extracts a tar held in memory into `opts.path`, within `limit`; with `retry`, a connection
  /// that broke before any answer is retried once (extracting twice is harmless).
  pub async fn upload_tar(
    &self,
    operation: &str,
    container: &str,
    opts: UploadToContainerOptions,
    tar: Bytes,
    limit: Duration,
    retry: bool,
  ) -> Result<()> {
    let dir = opts.path.clone();
    let request = || {
      self.docker.upload_to_container(
        container,
        Some(opts.clone()),
        bollard::body_full(tar.clone()),
      )
    };
    let r = if retry {
      self.control_within(limit, operation, request).await
    } else {
      self.within(limit, operation, request()).await
    };
    missing_dir(r, dir)
  }

  /// Extracts a streamed tar into `opts.path`, within `limit` (the whole body included).
  pub async fn upload_tar_stream(
    &self,
    operation: &str,
    container: &str,
    opts: UploadToContainerOptions,
    tar: impl Stream<Item = Bytes> + Send + 'static,
    limit: Duration,
  ) -> Result<()> {
    let dir = opts.path.clone();
    let r = self
      .within(
        limit,
        operation,
        self
          .docker
          .upload_to_container(container, Some(opts), bollard::body_stream(tar)),
      )
      .await;
    missing_dir(r, dir)
  }

  /// A network's inspect data; `None` when there is no such network.
  pub async fn inspect_network(&self, name: &str) -> Result<Option<NetworkInspect>> {
    let r = self
      .control("inspect the sandboxes' network", || {
        self.docker.inspect_network(name, None)
      })
      .await;
    absent_on(r, &[404])
  }

  /// The networks named exactly `name` (Docker allows several of one name).
  pub async fn networks_named(&self, name: &str) -> Result<Vec<Network>> {
    let opts = ListNetworksOptions {
      filters: Some(HashMap::from([(
        "name".to_string(),
        vec![name.to_string()],
      )])),
    };
    let all = self
      .control("list the sandboxes' networks", || {
        self.docker.list_networks(Some(opts.clone()))
      })
      .await?;
    Ok(
      all
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .collect(),
    )
  }

  /// Creates a network; its id, or `None` when one of that name exists (another process made it
  /// first). Not retried: a repeat could find our own first one.
  pub async fn create_network(&self, body: NetworkCreateRequest) -> Result<Option<String>> {
    let r = self
      .within(
        self.control_timeout,
        "create the sandboxes' network",
        self.docker.create_network(body),
      )
      .await
      .map(|n| n.id);
    // Podman says so with a 500 rather than Docker's 409.
    let r = match r {
      Err(SandboxError::Engine {
        status: 500,
        detail,
        ..
      }) if detail.to_ascii_lowercase().contains("already exists") => {
        return Ok(None);
      }
      other => other,
    };
    absent_on(r, &[409])
  }

  /// Removes a network; `false` when it was gone or still has containers.
  pub async fn remove_network(&self, name: &str) -> Result<bool> {
    let r = self
      .control("remove the sandboxes' network", || {
        self.docker.remove_network(name)
      })
      .await;
    absent_on(r, &[403, 404, 409]).map(|r| r.is_some())
  }

  /// An image's inspect data; `None` when the engine does not have it.
  pub async fn inspect_image(&self, image: &str) -> Result<Option<ImageInspect>> {
    let r = self
      .control("inspect the image", || self.docker.inspect_image(image))
      .await;
    absent_on(r, &[404])
  }

  /// Pulls (or, with a `root_fs` tar, imports) an image; the engine's progress, streamed.
  pub fn create_image(
    &self,
    operation: &'static str,
    opts: CreateImageOptions,
    root_fs: Option<Bytes>,
    credentials: Option<DockerCredentials>,
  ) -> impl Stream<Item = Result<CreateImageInfo>> + '_ {
    self
      .docker
      .create_image(Some(opts), root_fs.map(bollard::body_full), credentials)
      .map(move |r| r.map_err(|e| self.map_error(operation, e)))
  }

  /// Builds an image from a context tar; the engine's progress, streamed.
  pub fn build_image(
    &self,
    opts: BuildImageOptions,
    context: Bytes,
  ) -> impl Stream<Item = Result<BuildInfo>> + '_ {
    self
      .docker
      .build_image(opts, None, Some(bollard::body_full(context)))
      .map(move |r| r.map_err(|e| self.map_error("build the image", e)))
  }
}

/// Options of an exec started with stdin, stdout and stderr attached and no TTY (a stream the
/// caller speaks a protocol on), in `/`, as `user` (the container's own when `None`).
pub fn attached_exec(cmd: Vec<String>, user: Option<String>) -> CreateExecOptions<String> {
  CreateExecOptions {
    cmd: Some(cmd),
    user,
    attach_stdin: Some(true),
    attach_stdout: Some(true),
    attach_stderr: Some(true),
    tty: Some(false),
    working_dir: Some("/".to_string()),
    ..Default::default()
  }
}
