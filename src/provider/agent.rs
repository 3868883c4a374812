//! The provider's calls through the in-sandbox agent (`sandbox::agent`). Each returns `None`
//! when the agent cannot run in the sandbox (the option is off, no binary for its platform, no
//! safe place for it …): the caller then takes the engine's exec and archive endpoints, as
//! before the agent. A stopped container is started and a stale one looked up again as for an
//! engine exec (`retry::with_running`).

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::provider::retry::not_available;
use crate::provider::Provider;
use crate::sandbox::agent::{self, activity, ops, Conn, Failure};
use crate::sandbox::container::{self, Standing, Target};
use crate::sandbox::exec::{ExecOutput, ExecRequest};
use crate::util::errors::{Result, SandboxError};

/// How often an agent with a call in flight is pinged (and how long it has to answer).
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// An agent silent for longer than this (or the engine timeout, if longer) is given up.
const WEDGED: std::time::Duration = std::time::Duration::from_secs(30);

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
    if !self.agent.enabled {
      return Ok(None);
    }
    let op = &op;
    let out = self
      .with_running(engine, target, never_started, |t| async move {
        match agent::connect(engine, &t, &self.agent, &self.log).await {
          Ok(c) => Ok(Some(
            self.watched(engine, &t, c.clone(), op(c, t.clone())).await,
          )),
          Err(Failure::Start(e)) => Err(e),
          Err(Failure::Unavailable(_)) => Ok(None),
        }
      })
      .await?;
    out.transpose()
  }

  /// Runs one call on `conn`, watching the agent: while the call is in flight, an agent that
  /// does not answer a ping within a second is checked on (a paused container is unpaused, as
  /// an engine exec would find it), and one that answers nothing for `WEDGED` is closed, so the
  /// call fails instead of hanging and the next one starts a new agent. Calls end on their own
  /// deadlines inside the agent (a command's timeout) well before that.
  async fn watched<T>(
    &self,
    engine: &Engine,
    target: &Target,
    conn: Arc<Conn>,
    call: impl Future<Output = Result<T>>,
  ) -> Result<T> {
    tokio::pin!(call);
    let mut silent_since: Option<std::time::Instant> = None;
    loop {
      tokio::select! {
        out = &mut call => return match out {
          Err(SandboxError::AgentLost { detail }) => Err(self.lost(engine, target, detail).await),
          other => other,
        },
        _ = tokio::time::sleep(WATCH_EVERY) => {}
      }
      let answered = tokio::time::timeout(WATCH_EVERY, conn.client.ping()).await;
      if matches!(answered, Ok(Ok(_))) {
        silent_since = None;
        continue;
      }
      let since = *silent_since.get_or_insert_with(std::time::Instant::now);
      if since.elapsed() > engine.control_timeout.max(WEDGED) {
        conn.client.close();
        return Err(SandboxError::AgentLost {
          detail: format!(
            "the agent answered nothing for {} s and was closed",
            since.elapsed().as_secs()
          ),
        });
      }
      // A paused container answers nothing: unpause it. The engine's own state, read with one
      // inspect only while the agent is silent, and outside the start lock, so that calls on a
      // frozen engine each fail by their own deadline instead of queueing behind each other.
      let state = engine
        .inspect_container("inspect the sandbox container", &target.container_id)
        .await?
        .and_then(|i| i.state);
      if state.and_then(|s| s.paused) == Some(true) {
        crate::sandbox::container::ensure_started(
          engine,
          target,
          self.placement.as_ref(),
          &self.log,
        )
        .await?;
      }
    }
  }

  /// A command through the agent, the idle stop's activity refreshed as the sandbox needs.
  pub(crate) async fn exec_by_agent(
    &self,
    engine: &Engine,
    target: Target,
    req: &ExecRequest,
  ) -> Result<Option<ExecOutput>> {
    self
      .by_agent(engine, target, |c, t| async move {
        activity::around(engine, &t, Some(c.clone()), ops::exec(&c, &t, req)).await
      })
      .await
  }

  /// A file call through the agent, made once more on a new agent when the first one's stream
  /// ended under it (reads and replacing writes are safe to repeat).
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
    match self.by_agent(engine, target.clone(), once).await {
      Err(e) if ops::is_lost(&e) => self.by_agent(engine, target, once).await,
      other => other,
    }
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
  /// version, path, asUser }` or `{ mode: 'engine-exec', reason }`.
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
        }))
      })
      .await?;
    Ok(match status {
      Some(s) => s,
      None => {
        let reason = if self.agent.enabled {
          engine
            .shared
            .state::<agent::State>()
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
          break format!(
            "the container still runs on the engine at {}: the agent was killed or died",
            engine.host
          )
        }
        Ok(Standing::Running) => tokio::time::sleep(LOST_SETTLE / 6).await,
      }
    };
    SandboxError::AgentLost {
      detail: format!("{detail}; {why}"),
    }
  }
}
