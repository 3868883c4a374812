//! The provider's calls through the in-sandbox agent (`sandbox::agent`). Each returns `None`
//! when the agent cannot run in the sandbox (the option is off, no binary for its platform, no
//! safe place for it …): the caller then takes the engine's exec and archive endpoints, as
//! before the agent. A stopped container is started and a stale one looked up again as for an
//! engine exec (`retry::with_running`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::provider::retry::not_available;
use crate::provider::Provider;
use crate::sandbox::agent::{self, activity, ops, Conn, Failure};
use crate::sandbox::container::{self, Standing, Target};
use crate::sandbox::exec::{ExecOutput, ExecRequest, ENGINE_GRACE};
use crate::util::errors::{Result, SandboxError};

/// How often an agent with a call in flight is pinged (and how long it has to answer).
pub(crate) const WATCH_EVERY: Duration = Duration::from_secs(1);
/// An agent silent for longer than this (or the engine timeout, if longer) is given up.
const WEDGED: Duration = Duration::from_secs(30);
/// How long past its timeout a command waits for an agent that answers nothing before the agent
/// is given up. The command's supervisor kills it at the timeout without the agent's help, so an
/// agent that can answer reports well within this.
const SILENT_GRACE: Duration = Duration::from_secs(2);
/// How long past its timeout a command waits for an agent that still answers pings: its
/// supervisor takes up to 5 s to kill what the command started before it reports the kill
/// unverified, and the report must then travel.
const ANSWERING_GRACE: Duration = Duration::from_secs(8);

/// A command's deadline, for the watch on its call: its own timeout, from the call's start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Due {
  timeout: Duration,
  start: Instant,
}

impl Due {
  pub(crate) fn after(timeout: Duration) -> Self {
    Self {
      timeout,
      start: Instant::now(),
    }
  }

  /// How long past the command's timeout it is now (zero before it).
  fn past(&self) -> Duration {
    self.start.elapsed().saturating_sub(self.timeout)
  }

  /// How long the engine may take to answer the watch now: until `ENGINE_GRACE` past the
  /// timeout (at least one watch period, at most the engine timeout).
  fn engine_budget(&self, control_timeout: Duration) -> Duration {
    (self.timeout + ENGINE_GRACE)
      .saturating_sub(self.start.elapsed())
      .max(WATCH_EVERY)
      .min(control_timeout)
  }
}

/// What is not known about a command whose call ended without its result.
fn unverified(timeout: Duration) -> String {
  format!(
    "the command's supervisor in the sandbox kills it at its {} s timeout by itself, but that is not verified: it may still be running",
    timeout.as_secs_f64()
  )
}

fn never_started(text: String) -> SandboxError {
  SandboxError::Internal(format!("the sandbox agent could not be started: {text}"))
}

impl Provider {
  /// Runs `op` with the sandbox's agent, starting a stopped container (or the agent) first.
  /// `Ok(None)`: no agent can serve this sandbox.
  pub(crate) async fn by_agent<T, F, Fut>(
    &self,
    engine: &Engine,
    target: Target,
    op: F,
  ) -> Result<Option<T>>
  where
    F: Fn(Arc<Conn>, Target) -> Fut,
    Fut: Future<Output = Result<T>>,
  {
    self.by_agent_until(engine, target, None, op).await
  }

  /// `by_agent` for a call that must end by `due` (a command's timeout) plus a few seconds,
  /// whether the agent or the engine answers or not.
  async fn by_agent_until<T, F, Fut>(
    &self,
    engine: &Engine,
    target: Target,
    due: Option<Due>,
    op: F,
  ) -> Result<Option<T>>
  where
    F: Fn(Arc<Conn>, Target) -> Fut,
    Fut: Future<Output = Result<T>>,
  {
    if !self.agent.enabled {
      return Ok(None);
    }
    let op = &op;
    let out = self
      .with_running(engine, target, never_started, |t| async move {
        match agent::connect(engine, &t, &self.agent, &self.log).await {
          Ok(c) => Ok(Some(
            self
              .watched(engine, &t, c.clone(), due, op(c, t.clone()))
              .await,
          )),
          Err(Failure::Start(e)) => Err(e),
          Err(Failure::Unavailable(_)) => Ok(None),
        }
      })
      .await?;
    out.transpose()
  }

  /// Runs one call on `conn`, watching the agent: while the call is in flight, an agent that
  /// does not answer a ping within a second is checked on (`on_silence`), and one that answers
  /// nothing for `WEDGED` is closed, so the call fails instead of hanging and the next one
  /// starts a new agent. Calls end on their own deadlines inside the agent (a command's
  /// timeout); one with a `due` ends by it plus a few seconds even when nothing answers.
  async fn watched<T>(
    &self,
    engine: &Engine,
    target: &Target,
    conn: Arc<Conn>,
    due: Option<Due>,
    call: impl Future<Output = Result<T>>,
  ) -> Result<T> {
    tokio::pin!(call);
    let sent = Instant::now();
    let mut silent_since: Option<Instant> = None;
    loop {
      tokio::select! {
        out = &mut call => return match out {
          Err(SandboxError::AgentLost { detail }) => Err(self.lost(engine, target, detail).await),
          other => other,
        },
        _ = tokio::time::sleep(WATCH_EVERY) => {}
      }
      if let Some(d) = due.filter(|d| sent.elapsed() > d.timeout + ANSWERING_GRACE) {
        // Dropping the call cancels it, which tells the command's supervisor to kill it.
        return Err(SandboxError::Internal(format!(
          "the sandbox's agent still answers but has not reported how the command ended, {} s past its {} s timeout (a workload running as root may have stopped the command's supervisor); the call was given up and the command cancelled, but its end is not verified: it may still be running",
          ANSWERING_GRACE.as_secs(),
          d.timeout.as_secs_f64(),
        )));
      }
      if answers(&conn).await {
        silent_since = None;
        continue;
      }
      let since = *silent_since.get_or_insert_with(Instant::now);
      if since.elapsed() > engine.control_timeout.max(WEDGED) {
        conn.client.close();
        return Err(SandboxError::AgentLost {
          detail: format!(
            "the agent answered nothing for {} s and was closed",
            since.elapsed().as_secs()
          ),
        });
      }
      self.on_silence(engine, target, &conn, due, since).await?;
    }
  }

  /// The agent answered nothing for a second. The engine's view of its container is read, only
  /// now and outside the start lock, so that calls on a frozen engine each end by their own
  /// deadline instead of queueing behind each other: a paused container is unpaused (as an
  /// engine exec would find it). A command `SILENT_GRACE` past its timeout is then given up: an
  /// engine that does not answer is named (the agent is reached through it), otherwise the
  /// agent is closed (stopped by a root workload, or starved), and the next call starts a new
  /// one. `Ok`: keep watching.
  async fn on_silence(
    &self,
    engine: &Engine,
    target: &Target,
    conn: &Conn,
    due: Option<Due>,
    since: Instant,
  ) -> Result<()> {
    let mut bounded = engine.clone();
    if let Some(d) = due {
      bounded.control_timeout = d.engine_budget(engine.control_timeout);
    }
    let state = match bounded
      .inspect_container("inspect the sandbox container", &target.container_id)
      .await
    {
      Ok(info) => info.and_then(|i| i.state),
      Err(e) => {
        return Err(match due {
          Some(d) if engine_silent(&e) => unreached(engine, d),
          _ => e,
        })
      }
    };
    if state.as_ref().and_then(|s| s.paused) == Some(true) {
      return self.ensure_started(engine, target).await;
    }
    // Three seconds without a word at least (a ping's second, then this grace), so one slow
    // answer on a loaded machine never costs the agent and the calls it serves.
    let given_up = |d: &Due| d.past() >= SILENT_GRACE && since.elapsed() >= SILENT_GRACE;
    let Some(d) = due.filter(given_up) else {
      return Ok(());
    };
    conn.client.close();
    let runs = state.and_then(|s| s.running) == Some(true);
    let why = if runs {
      format!(
        ", while the engine at {} answers and the container runs: a workload running as root may have stopped it (SIGSTOP), or it is starved",
        engine.host
      )
    } else {
      String::new()
    };
    let detail = format!(
      "it answered nothing for {} s, past the command's {} s timeout{why}. It was closed, and the next call starts a new agent; {}",
      since.elapsed().as_secs().max(1),
      d.timeout.as_secs_f64(),
      unverified(d.timeout)
    );
    Err(if runs {
      SandboxError::AgentLost { detail }
    } else {
      self.lost(engine, target, detail).await
    })
  }

  /// A command through the agent, the idle stop's activity refreshed as the sandbox needs.
  pub(crate) async fn exec_by_agent(
    &self,
    engine: &Engine,
    target: Target,
    req: &ExecRequest,
  ) -> Result<Option<ExecOutput>> {
    let due = Some(Due::after(req.timeout));
    self
      .by_agent_until(engine, target, due, |c, t| async move {
        activity::around(engine, &t, Some(c.clone()), ops::exec(&c, &t, req)).await
      })
      .await
  }

  /// A call through the agent that is safe to repeat, made again on a new agent when the
  /// stream ended under it, until the agent is given up for dying repeatedly (`agent::down`):
  /// then `Ok(None)`, and the engine's endpoints serve it.
  pub(crate) async fn repeatable_by_agent<T, F, Fut>(
    &self,
    engine: &Engine,
    target: Target,
    op: F,
  ) -> Result<Option<T>>
  where
    F: Fn(Arc<Conn>, Target) -> Fut,
    Fut: Future<Output = Result<T>>,
  {
    let mut tries = 1;
    loop {
      match self.by_agent(engine, target.clone(), &op).await {
        Err(e) if ops::is_lost(&e) && tries <= agent::down::LOSSES => tries += 1,
        other => return other,
      }
    }
  }

  /// A file call through the agent (reads and replacing writes are safe to repeat), the idle
  /// stop's activity refreshed as the sandbox needs.
  pub(crate) async fn file_by_agent<T, F, Fut>(
    &self,
    engine: &Engine,
    target: Target,
    op: F,
  ) -> Result<Option<T>>
  where
    F: Fn(Arc<Conn>, Target) -> Fut,
    Fut: Future<Output = Result<T>>,
  {
    let op = &op;
    let once = |c: Arc<Conn>, t: Target| async move {
      activity::around(engine, &t, Some(c.clone()), op(c, t.clone())).await
    };
    self.repeatable_by_agent(engine, target, once).await
  }

  pub(crate) async fn upload_by_agent(
    &self,
    engine: &Engine,
    target: Target,
    shown: &str,
    path: &str,
    content: Bytes,
  ) -> Result<Option<()>> {
    let max = self.cfg.upload_max_bytes;
    let staged = self.cfg.staged_uploads.then_some(engine);
    self
      .file_by_agent(engine, target, |c, t| {
        let content = content.clone();
        async move { ops::upload(staged, &c, &t, shown, path, content, max).await }
      })
      .await
  }

  pub(crate) async fn download_by_agent(
    &self,
    engine: &Engine,
    target: Target,
    shown: &str,
    path: &str,
  ) -> Result<Option<Vec<u8>>> {
    // /dev, /proc and /sys are the kernel's: nothing there is a file worth downloading.
    if let Some(tree) = crate::sandbox::layout::kernel_tree(path) {
      return Err(SandboxError::NotRegularFile {
        path: shown.to_string(),
        kind: format!("a file under {tree}"),
      });
    }
    let max = self.cfg.file_max_bytes;
    self
      .file_by_agent(engine, target, |c, t| async move {
        ops::download(&c, &t, shown, path, max).await
      })
      .await
  }

  /// What serves a sandbox's calls, for `doctor` and the tests: `{ mode: 'agent', uid, arch,
  /// version, path, asUser, openat2, subreaper, sessionGuard, fsIds, linked }` or `{ mode:
  /// 'engine-exec', reason }` (the agent is off, cannot start here, or was given up for dying:
  /// `agent::down`).
  pub async fn agent_status(&self, sandbox_id: &str) -> Result<Value> {
    let (engine, target) = self.target(sandbox_id).await?;
    let container = target.container_id.clone();
    let status = self
      .by_agent(&engine, target, |c, _| async move {
        let h = c.hello();
        Ok(json!({
          "mode": "agent",
          "version": h.version,
          "arch": h.arch,
          "uid": h.uid,
          "pid": h.pid,
          "path": c.path,
          "asUser": c.as_user,
          "openat2": h.openat2,
          "subreaper": h.subreaper,
          "sessionGuard": h.session_guard,
          "fsIds": h.fs_ids,
          "linked": c.linked(),
        }))
      })
      .await?;
    Ok(match status {
      Some(s) => s,
      None => {
        let reason = if self.agent.enabled {
          engine
            .shared
            .state::<agent::down::Downs>()
            .down_reason(&container)
            .unwrap_or_else(|| "the agent cannot run in this sandbox".into())
        } else {
          "the `agent` option is false".into()
        };
        json!({ "mode": "engine-exec", "reason": reason })
      }
    })
  }
}

impl Provider {
  /// What a sandbox may reach, and under a policy what its connections did in this process.
  pub async fn egress_stats(&self, sandbox_id: &str) -> Result<Value> {
    let (engine, target) = self.target(sandbox_id).await?;
    Ok(agent::egress::report(&engine, &target))
  }
}

/// Whether the agent answered a ping within a watch period, or sent anything meanwhile (a
/// stream busy with output may delay a ping's answer without being silent).
async fn answers(conn: &Conn) -> bool {
  let pinged = tokio::time::timeout(WATCH_EVERY, conn.client.ping()).await;
  matches!(pinged, Ok(Ok(_))) || conn.client.silent_for() < WATCH_EVERY
}

/// An engine error that means the engine gave no answer at all.
fn engine_silent(e: &SandboxError) -> bool {
  matches!(
    e,
    SandboxError::EngineTimeout { .. } | SandboxError::EngineUnreachable { .. }
  )
}

/// A command whose agent went silent on an engine that answers nothing either: the agent is
/// reached through the engine, so how the command ended is not known. The connection is kept:
/// the agent itself may be fine, and its answers arrive once the engine does.
fn unreached(engine: &Engine, due: Due) -> SandboxError {
  let waited = due.start.elapsed();
  SandboxError::EngineTimeout {
    host: engine.host.to_string(),
    operation: format!(
      "with the command's result, which the sandbox's agent sends through it ({})",
      unverified(due.timeout)
    ),
    seconds: waited.as_secs().max(1),
  }
}

/// How long a container that still runs after its agent was lost is watched for a removal or a
/// stop that killed the agent (the engine marks either only a moment after its processes die).
const LOST_SETTLE: std::time::Duration = std::time::Duration::from_millis(300);

impl Provider {
  /// An agent lost under a call, told by what became of its container: one removed (or being
  /// removed) under the call is `SandboxNotAvailable`, as any call racing a removal; otherwise
  /// the call is lost, and the message says whether the container stopped or still runs.
  async fn lost(&self, engine: &Engine, target: &Target, detail: String) -> SandboxError {
    let deadline = std::time::Instant::now() + LOST_SETTLE;
    let why = loop {
      match container::standing(engine, &self.scope, target).await {
        Err(e) => break format!("the engine at {} does not answer: {e}", engine.host),
        Ok(Standing::Gone | Standing::Removing) => return not_available(&target.sandbox_id),
        Ok(Standing::Stopped) => break "the sandbox's container stopped".to_string(),
        Ok(Standing::Running) if std::time::Instant::now() >= deadline => {
          let state = engine.shared.state::<agent::down::Downs>();
          let gave_up = state.lost_agent(target, &detail, &self.log);
          break format!(
            "the container still runs on the engine at {}: the agent was killed or died{}",
            engine.host,
            if gave_up {
              " (again: the sandbox's next calls take the engine's exec and archive endpoints)"
            } else {
              ""
            }
          );
        }
        Ok(Standing::Running) => tokio::time::sleep(LOST_SETTLE / 6).await,
      }
    };
    SandboxError::AgentLost {
      detail: format!("{detail}; {why}"),
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn started_ago(timeout: Duration, ago: Duration) -> Due {
    Due {
      timeout,
      start: Instant::now() - ago,
    }
  }

  #[test]
  fn the_engine_gets_until_a_few_seconds_past_the_timeout() {
    let control = Duration::from_secs(30);
    let fresh = started_ago(Duration::from_secs(3), Duration::ZERO);
    let budget = fresh.engine_budget(control);
    assert!(budget <= Duration::from_secs(8) && budget > Duration::from_secs(7));
    assert_eq!(fresh.past(), Duration::ZERO);
    // Past that point it still gets one watch period, and never more than its own timeout.
    let late = started_ago(Duration::from_secs(3), Duration::from_secs(20));
    assert_eq!(late.engine_budget(control), WATCH_EVERY);
    assert!(late.past() >= Duration::from_secs(17));
    let long = started_ago(Duration::from_secs(600), Duration::ZERO);
    assert_eq!(
      long.engine_budget(Duration::from_secs(3)),
      Duration::from_secs(3)
    );
  }

  #[test]
  fn a_command_without_its_result_is_not_claimed_killed() {
    let text = unverified(Duration::from_millis(1500));
    assert!(text.contains("1.5 s timeout"), "{text}");
    assert!(
      text.contains("not verified: it may still be running"),
      "{text}"
    );
  }
}
