//! The two ways a call on a sandbox recovers before it gives up: with a running container (a
//! stopped one is started, one out of processes restarted once, a stale cache entry looked up
//! again), and after a 404 (a file missing, or the container replaced by a GPU move elsewhere).

use std::future::Future;

use serde_json::json;

use crate::engine::Engine;
use crate::provider::Provider;
use crate::sandbox::container::{self, After404, Target};
use crate::sandbox::exec::{is_pid_exhaustion, StartError};
use crate::util::errors::{Result, SandboxError};
use crate::util::logging::Level;

pub(crate) fn not_available(sandbox_id: &str) -> SandboxError {
  SandboxError::SandboxNotAvailable {
    sandbox_id: sandbox_id.to_string(),
  }
}

impl Provider {
  /// Runs `op` (which starts something in the container) until it starts: at most one start of
  /// a stopped container (through the placement; files kept) or one restart of one out of
  /// processes, and one new lookup of a stale cache entry. A container that is gone is
  /// `SandboxNotAvailable`; `never_started` says what a start that never ran means otherwise.
  pub(crate) async fn with_running<T, F, Fut>(
    &self,
    engine: &Engine,
    mut target: Target,
    never_started: fn(String) -> SandboxError,
    mut op: F,
  ) -> Result<T>
  where
    F: FnMut(Target) -> Fut,
    Fut: Future<Output = std::result::Result<T, StartError>>,
  {
    let id = target.sandbox_id.clone();
    let mut restarted = false;
    for attempt in 0..3 {
      let last = attempt == 2;
      match op(target.clone()).await {
        Ok(v) => return Ok(v),
        Err(StartError::NotRunning) if !last => {
          container::ensure_started(engine, &target, self.placement.as_ref(), &self.log).await?;
          // Cached, unless the start found it gone or moved it to other GPUs.
          target = container::resolve(engine, &self.scope, &id).await?;
        }
        Err(StartError::Gone) if !last => {
          container::forget(engine, &target.name);
          target = container::resolve(engine, &self.scope, &id).await?;
        }
        Err(StartError::NeverStarted(text)) if !last && !restarted && is_pid_exhaustion(&text) => {
          // Something (a fork bomb) holds every process the sandbox may have: nothing can run
          // until it is gone. Restarting kills it; files are kept.
          self.log.sandbox_text(
            Level::Warn,
            "sandbox out of processes; restarting it",
            &id,
            "engine",
            text.as_bytes(),
            json!({ "sandboxId": id }),
          );
          restarted = true;
          if engine
            .restart_container(&target.container_id, 1, engine.control_timeout)
            .await
            .is_err()
          {
            return Err(SandboxError::Internal(format!(
              "the sandbox is out of processes and could not be restarted: {text}"
            )));
          }
        }
        Err(StartError::NotRunning) => {
          return Err(SandboxError::Internal(
            "the sandbox container stopped again right after it was started".into(),
          ))
        }
        Err(StartError::Gone) => return Err(not_available(&id)),
        Err(StartError::NeverStarted(text)) => return Err(never_started(text)),
        Err(StartError::Other(e)) => return Err(e),
      }
    }
    unreachable!("the loop returns on its last attempt")
  }

  /// Runs `op` on the container; after a `FileNotFound` tells a missing file (the error stands)
  /// from a missing container (`SandboxNotAvailable`) or a replaced one (tried once more).
  pub(crate) async fn after_404<T, F, Fut>(
    &self,
    engine: &Engine,
    mut target: Target,
    mut op: F,
  ) -> Result<T>
  where
    F: FnMut(Target) -> Fut,
    Fut: Future<Output = Result<T>>,
  {
    let id = target.sandbox_id.clone();
    for attempt in 0..2 {
      match op(target.clone()).await {
        Err(e @ SandboxError::FileNotFound { .. }) => {
          match container::after_404(engine, &self.scope, &target).await? {
            After404::Same => return Err(e),
            After404::Replaced(t) if attempt == 0 => target = t,
            _ => return Err(not_available(&id)),
          }
        }
        other => return other,
      }
    }
    Err(not_available(&id))
  }
}
