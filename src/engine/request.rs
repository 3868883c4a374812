//! How one engine request runs: under a deadline, retried once when the connection broke before
//! any answer, its error mapped to ours; and the engine's answers that callers take as values.

use std::future::Future;
use std::time::Duration;

use bollard::errors::Error as BollardError;

use crate::engine::{connector, Engine};
use crate::util::errors::{Result, SandboxError};

impl Engine {
  /// Runs one idempotent control-plane request under `CONTROL_TIMEOUT`, mapping its error. A
  /// connection that broke before any answer (an engine restart drops pooled connections) is
  /// retried once on a fresh one.
  pub(super) async fn control<T, F, Fut>(&self, operation: &str, request: F) -> Result<T>
  where
    F: Fn() -> Fut,
    Fut: Future<Output = std::result::Result<T, BollardError>>,
  {
    self
      .control_within(self.control_timeout, operation, request)
      .await
  }

  /// `control` with a shorter limit (a caller's own deadline).
  pub(super) async fn control_within<T, F, Fut>(
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
  pub(super) async fn within<T>(
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
pub(super) fn status_of(e: &SandboxError) -> Option<u16> {
  match e {
    SandboxError::Engine { status, .. } => Some(*status),
    _ => None,
  }
}

/// `Ok(None)` for the statuses listed, so callers match values, not errors.
pub(super) fn absent_on<T>(r: Result<T>, statuses: &[u16]) -> Result<Option<T>> {
  match r {
    Ok(v) => Ok(Some(v)),
    Err(e) if status_of(&e).is_some_and(|s| statuses.contains(&s)) => Ok(None),
    Err(e) => Err(e),
  }
}
