//! The engine's GPU allocation lock: a claim (`engine::claim`) named the same in every process,
//! so choosing GPUs and starting a container on them is serialised across processes. It is
//! removed by its id when done and broken by anyone once it is older than `LOCK_STALE` (its
//! holder died), only while it is our claim: created and never started.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::engine::{claim, Engine};
use crate::util::errors::{Result, SandboxError};
use crate::util::labels::{self, LABEL_GPU_LOCK, LABEL_GPU_LOCK_AT};
use crate::util::logging::Logger;

/// The lock's container name: one per engine.
pub const LOCK_NAME: &str = "trueforge-gpu-lock";

/// A lock older than this belongs to a holder that died. A holder keeps it for one container
/// create and start (well under a second here), or one start.
pub const LOCK_STALE: Duration = Duration::from_secs(30);

/// How often a waiting `createSandbox()` looks for free GPUs again.
pub const POLL: Duration = Duration::from_millis(250);

/// The allocation lock, held by this process.
pub struct Lock {
  engine: Engine,
  container_id: String,
}

impl Lock {
  /// Takes the engine's GPU lock, waiting while another process holds it (at most a little
  /// over `LOCK_STALE`: a lock older than that is broken).
  pub async fn take(engine: &Engine) -> Result<Lock> {
    // Waiting is bounded per holder, not in all: a queue of creates behind us is progress.
    let patience = LOCK_STALE + Duration::from_secs(10);
    let mut give_up = Instant::now() + patience;
    let mut holder_seen: Option<String> = None;
    let mut pause = Duration::from_millis(20);
    loop {
      let labels = [
        (LABEL_GPU_LOCK.to_string(), crate::util::ids::holder()),
        (
          LABEL_GPU_LOCK_AT.to_string(),
          crate::util::timestamps::now_ms().to_string(),
        ),
      ];
      if let Some(container_id) =
        claim::create(engine, "create the GPU allocation lock", LOCK_NAME, labels).await?
      {
        return Ok(Lock {
          engine: engine.clone(),
          container_id,
        });
      }
      // Held: break it if its holder is gone, else wait.
      match engine
        .inspect_container("inspect the GPU allocation lock", LOCK_NAME)
        .await?
      {
        Some(info) => {
          let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
          // Only our claim, created and never started, is the lock: anything else under the
          // name is somebody's container, never removed here.
          if !labels::managed(Some(&labels))
            || !labels.contains_key(LABEL_GPU_LOCK)
            || !claim::never_started(&info)
          {
            return Err(SandboxError::Internal(format!(
              "a container named {LOCK_NAME} that is not our GPU allocation lock (a container \
               of ours created and never started) exists on the engine; remove or rename it"
            )));
          }
          let at: u64 = labels
            .get(LABEL_GPU_LOCK_AT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
          if crate::util::timestamps::now_ms().saturating_sub(at) > LOCK_STALE.as_millis() as u64 {
            // Not forced: should it have been started meanwhile, it stays (and the next
            // look refuses it).
            if let Some(id) = info.id {
              let _ = engine
                .remove_stopped("break a stale GPU allocation lock", &id)
                .await;
            }
            continue;
          }
          if info.id != holder_seen {
            holder_seen = info.id;
            give_up = Instant::now() + patience;
          }
        }
        None => continue,
      }
      if Instant::now() > give_up {
        return Err(SandboxError::Internal(format!(
          "the GPU allocation lock ({LOCK_NAME}) stayed with one holder for {} s; another \
           server process may be stuck",
          patience.as_secs()
        )));
      }
      let jitter = Duration::from_millis(u64::from(rand::random::<u8>() % 20));
      tokio::time::sleep(pause + jitter).await;
      pause = (pause * 2).min(Duration::from_millis(200));
    }
  }

  /// Gives the lock back. A failure is only logged: the lock goes stale on its own.
  pub async fn release(self, log: &Logger) {
    if let Err(e) = self.engine.force_remove(&self.container_id).await {
      log.warn(
        "could not remove the GPU allocation lock; it expires by itself",
        json!({ "error": e.to_string() }),
      );
    }
  }
}

/// Runs `step` under the GPU lock until it is not `GpusUnavailable`, looking again every `POLL`
/// until `deadline`; the lock is let go between tries, so others can free GPUs meanwhile.
pub async fn until_free<T, F, Fut>(
  engine: &Engine,
  deadline: Instant,
  log: &Logger,
  mut step: F,
) -> Result<T>
where
  F: FnMut() -> Fut,
  Fut: std::future::Future<Output = Result<T>>,
{
  loop {
    let lock = Lock::take(engine).await?;
    let outcome = step().await;
    lock.release(log).await;
    match outcome {
      Err(e @ SandboxError::GpusUnavailable { .. }) if Instant::now() < deadline => {
        log.debug(
          "no GPU free yet; waiting",
          json!({ "error": e.to_string() }),
        );
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
      }
      other => return other,
    }
  }
}
