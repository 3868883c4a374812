//! The two ways a call on a sandbox recovers before it gives up: with a running container (a
//! stopped one is started, one out of processes restarted once, a stale cache entry looked up
//! again), and after a 404 (a file missing, or the container replaced by a GPU move elsewhere).
//! A failure the error alone does not explain is explained by the container's standing: one
//! being removed is `SandboxNotAvailable`, one that stopped under the call is started again.

use std::future::Future;
use std::time::Duration;

use serde_json::json;

use crate::engine::Engine;
use crate::provider::Provider;
use crate::sandbox::container::{self, After404, Standing, Target};
use crate::sandbox::exec::{is_pid_exhaustion, StartError};
use crate::util::errors::{Result, SandboxError};
use crate::util::logging::Level;

pub(crate) fn not_available(sandbox_id: &str) -> SandboxError {
  SandboxError::SandboxNotAvailable {
    sandbox_id: sandbox_id.to_string(),
  }
}

/// Errors a container stopping or being removed under a call also produces (the engine's 500s,
/// a passwd that cannot be read, a path the engine cannot resolve), so its standing decides.
fn unclear(e: &SandboxError) -> bool {
  matches!(
    e,
    SandboxError::Engine { .. }
      | SandboxError::Internal(_)
      | SandboxError::CreateFailed { .. }
      | SandboxError::InvalidPath { .. }
  )
}

/// How long a container the engine still reports running, though an exec found it stopped, is
/// given to be seen stopped (its init was killed; the engine has not yet noticed).
const SETTLE: Duration = Duration::from_secs(3);

impl Provider {
  /// Runs `op` (which starts something in the container) until it starts: at most one start of
  /// a stopped container (through the placement; files kept) or one restart of one out of
  /// processes, and one new lookup of a stale cache entry. A container that is gone or being
  /// removed is `SandboxNotAvailable`; `never_started` says what a start that never ran means
  /// otherwise.
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
    let mut restarted = false;
    for attempt in 0..3 {
      let last = attempt == 2;
      let failure = match op(target.clone()).await {
        Ok(v) => return Ok(v),
        Err(f) => f,
      };
      // Boxed: what follows a failure is the larger future, and the rarer path; unboxed, every
      // call's future would carry its room.
      target =
        Box::pin(self.after_failure(engine, target, failure, last, &mut restarted, never_started))
          .await?;
    }
    unreachable!("the loop returns on its last attempt")
  }

  /// After `op` failed on `target`: the target to try again (started again, restarted or
  /// looked up anew), or the error to give.
  async fn after_failure(
    &self,
    engine: &Engine,
    mut target: Target,
    failure: StartError,
    last: bool,
    restarted: &mut bool,
    never_started: fn(String) -> SandboxError,
  ) -> Result<Target> {
    let id = target.sandbox_id.clone();
    let failure = self.explain(engine, &target, failure).await?;
    match failure {
      StartError::NotRunning if !last => {
        self.start_again(engine, &target).await?;
        // Cached, unless the start found it gone or moved it to other GPUs.
        target = container::resolve(engine, &self.scope, &id).await?;
      }
      StartError::Gone if !last => {
        container::forget(engine, &target.name);
        target = container::resolve(engine, &self.scope, &id).await?;
      }
      StartError::NeverStarted(text) if !last && !*restarted && is_pid_exhaustion(&text) => {
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
        *restarted = true;
        crate::sandbox::agent::link::ensure(target.agent.link.as_deref());
        if engine
          .restart_container(&target.container_id, 1, engine.control_timeout)
          .await
          .is_err()
        {
          // The runtime's words for a full process table and for a container going away
          // overlap; one being removed cannot be restarted, and is gone.
          return Err(
            match container::standing(engine, &self.scope, &target).await? {
              Standing::Removing | Standing::Gone => not_available(&id),
              Standing::Running | Standing::Stopped => SandboxError::Internal(format!(
                "the sandbox is out of processes and could not be restarted: {text}"
              )),
            },
          );
        }
      }
      StartError::NotRunning => {
        return Err(SandboxError::Internal(
          "the sandbox container stopped again right after it was started".into(),
        ))
      }
      StartError::Gone => return Err(not_available(&id)),
      StartError::NeverStarted(text) => return Err(never_started(text)),
      StartError::Other(e) => return Err(e),
    }
    Ok(target)
  }

  /// `failure` as the container's standing explains it, when the failure alone does not: an
  /// exec that never ran, or an unclear error, on a container stopped, gone or being removed.
  /// An exec that ended without a word in a container still reported running most likely saw
  /// the container's end before the engine did: that is waited out, briefly.
  async fn explain(
    &self,
    engine: &Engine,
    target: &Target,
    failure: StartError,
  ) -> Result<StartError> {
    let wait = match &failure {
      StartError::NeverStarted(text) if text.is_empty() => SETTLE,
      StartError::NeverStarted(_) => Duration::ZERO,
      StartError::Other(e) if unclear(e) => Duration::ZERO,
      StartError::Other(_) | StartError::NotRunning | StartError::Gone => return Ok(failure),
    };
    Ok(match self.settled(engine, target, wait).await? {
      Standing::Removing => return Err(not_available(&target.sandbox_id)),
      Standing::Gone => StartError::Gone,
      Standing::Stopped => StartError::NotRunning,
      Standing::Running => failure,
    })
  }

  /// The container's standing once it is no longer reported running, or after `wait`.
  async fn settled(&self, engine: &Engine, target: &Target, wait: Duration) -> Result<Standing> {
    let end = tokio::time::Instant::now() + wait;
    loop {
      match container::standing(engine, &self.scope, target).await? {
        Standing::Running if tokio::time::Instant::now() < end => {
          tokio::time::sleep(Duration::from_millis(50)).await
        }
        s => return Ok(s),
      }
    }
  }

  /// Starts the container again after a call found it not running. An engine that has not yet
  /// noticed that its init died still reports it running: that is waited out (briefly) first.
  /// A container being removed, or gone, is `SandboxNotAvailable` (or, moved to other GPUs,
  /// found again by the caller's next lookup).
  async fn start_again(&self, engine: &Engine, target: &Target) -> Result<()> {
    match self.settled(engine, target, SETTLE).await? {
      Standing::Removing | Standing::Gone => {
        container::forget(engine, &target.name);
        return container::resolve(engine, &self.scope, &target.sandbox_id)
          .await
          .map(|_| ());
      }
      Standing::Running | Standing::Stopped => {}
    }
    let started = self.ensure_started(engine, target).await;
    match started {
      Err(e) if unclear(&e) => match container::standing(engine, &self.scope, target).await? {
        Standing::Removing | Standing::Gone => Err(not_available(&target.sandbox_id)),
        Standing::Running | Standing::Stopped => Err(e),
      },
      other => other,
    }
  }

  /// `e` from a call that ran in the container, unless the container is gone or being removed
  /// (the call raced its removal): then `SandboxNotAvailable`.
  pub(crate) async fn unless_gone(
    &self,
    engine: &Engine,
    target: &Target,
    e: SandboxError,
  ) -> SandboxError {
    if !unclear(&e) {
      return e;
    }
    match container::standing(engine, &self.scope, target).await {
      Ok(Standing::Removing | Standing::Gone) => not_available(&target.sandbox_id),
      _ => e,
    }
  }

  /// Runs `op` on the container; after a `FileNotFound` tells a missing file (the error stands)
  /// from a missing container (`SandboxNotAvailable`) or a replaced one (tried once more). An
  /// unclear error on a container being removed, or gone, is `SandboxNotAvailable` too.
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
      let e = match op(target.clone()).await {
        Err(e @ SandboxError::FileNotFound { .. }) => e,
        Err(e) if unclear(&e) => match container::standing(engine, &self.scope, &target).await? {
          Standing::Removing => return Err(not_available(&id)),
          Standing::Gone => e,
          Standing::Running | Standing::Stopped => return Err(e),
        },
        other => return other,
      };
      match container::after_404(engine, &self.scope, &target).await? {
        After404::Same => return Err(e),
        After404::Replaced(t) if attempt == 0 => target = t,
        _ => return Err(not_available(&id)),
      }
    }
    Err(not_available(&id))
  }
}
