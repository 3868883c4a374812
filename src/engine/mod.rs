//! One bollard client per Docker host per process, created on first use with the API version
//! negotiated once, with the engine's shared state (`runtime::EngineShared`). This folder is the
//! only code that calls bollard: `Engine` offers one typed method per operation, which names the
//! operation in its errors, turns "no such container" into a value where callers expect it, and
//! bounds control-plane calls by a deadline so a hung engine cannot hang a caller.
//!
//! The typed operations sit one group to a module (`containers`, `exec`, `archive`, `images`,
//! `networks`, `volumes`, `system`), each an `impl Engine` on top of `request`: each names itself
//! in its errors and keeps the deadlines there. Creates, renames and starts of an exec are never
//! retried, since a repeat could act twice.

mod archive;
pub mod claim;
mod connect;
pub mod connector;
mod containers;
pub mod credentials;
pub mod endpoint;
mod exec;
mod images;
mod networks;
mod request;
pub mod runtime;
pub mod ssh;
mod system;
pub mod tls;
pub mod unix;
mod volumes;

use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;

use crate::engine::runtime::EngineShared;

pub use connect::{connected, effective_endpoint, engine_for, version_triple};
pub use exec::attached_exec;

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
