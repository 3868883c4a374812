//! The activity a sandbox's idle stop must see when the agent does not record it itself. A
//! sandbox made for the agent counts only the agent's root-owned file; the agent refreshes it
//! on each call and while commands run, except when it runs as the sandbox's user (it cannot
//! own a file of root's then) or cannot run at all (calls take the engine's endpoints): the host
//! then refreshes it with an exec as root. A sandbox made by an earlier version keeps its old
//! init, which counts `/trueforge/.activity`: calls through the agent refresh that file through
//! the agent. Refreshes are throttled per container and never delay the call.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecResults};
use bytes::Bytes;
use futures_util::StreamExt;
use trueforge_agent_proto::msg::UploadSpec;

use crate::engine::Engine;
use crate::sandbox::agent::conn::Conn;
use crate::sandbox::container::Target;
use crate::sandbox::layout;
use crate::util::bounded::bounded_insert;

/// Refreshes the agent's activity file as root, never following or trusting what the workload
/// put there: a file that is not root's regular file with one link is replaced.
const TOUCH_AS_ROOT: &str = r#"f=/tmp/.trueforge-agent-activity
if [ -f "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %u:%h "$f" 2>/dev/null)" = 0:1 ]; then touch -c "$f"; exit 0; fi
rm -rf "$f" 2>/dev/null
t=$(mktemp /tmp/.trueforge-agent-activity.XXXXXX) && chmod 644 "$t" && mv -f "$t" "$f""#;

/// When the idle stop's activity was last refreshed for each container, per engine.
#[derive(Default)]
struct Touched(Mutex<HashMap<String, Instant>>);

/// How a container's activity must be refreshed on top of what the call itself records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
  /// Nothing: the agent records it, or the engine-exec path's own wrapper does (an old init).
  Nothing,
  /// `/trueforge/.activity` (an old init) through the agent.
  ThroughAgent,
  /// The agent's file, by an exec as root.
  AsRoot,
}

pub fn keep_of(target: &Target, conn: Option<&Conn>) -> Keep {
  if target.agent.idle_secs == 0 {
    return Keep::Nothing;
  }
  match (target.agent.agent_init, conn) {
    (false, Some(_)) => Keep::ThroughAgent,
    (false, None) => Keep::Nothing,
    (true, Some(c)) if !c.as_user => Keep::Nothing,
    (true, _) => Keep::AsRoot,
  }
}

/// How often a container's activity is refreshed at most (and while a command runs): a quarter
/// of its idle interval, between 1 s and a minute.
fn period(target: &Target) -> Duration {
  Duration::from_secs((target.agent.idle_secs / 4).clamp(1, 60))
}

/// Runs `call`, refreshing the container's activity before, while and after it as needed.
pub async fn around<T>(
  engine: &Engine,
  target: &Target,
  conn: Option<Arc<Conn>>,
  call: impl Future<Output = T>,
) -> T {
  let keep = keep_of(target, conn.as_deref());
  if keep == Keep::Nothing {
    return call.await;
  }
  touch(engine, target, conn.clone(), keep);
  tokio::pin!(call);
  loop {
    tokio::select! {
      out = &mut call => {
        touch(engine, target, conn, keep);
        return out;
      }
      _ = tokio::time::sleep(period(target)) => touch(engine, target, conn.clone(), keep),
    }
  }
}

/// Refreshes the activity in the background, at most once per `period`.
pub fn touch(engine: &Engine, target: &Target, conn: Option<Arc<Conn>>, keep: Keep) {
  if keep == Keep::Nothing {
    return;
  }
  {
    let state = engine.shared.state::<Touched>();
    let mut touched = state.0.lock().expect("touched");
    let key = &target.container_id;
    if touched
      .get(key)
      .is_some_and(|t| t.elapsed() < period(target))
    {
      return;
    }
    bounded_insert(&mut touched, key.clone(), Instant::now());
  }
  let (task_engine, container, user) = (
    engine.clone(),
    target.container_id.clone(),
    target.user.clone(),
  );
  engine.shared.background.spawn_cancellable(async move {
    match (keep, conn) {
      (Keep::ThroughAgent, Some(c)) => {
        let spec = UploadSpec {
          path: layout::ACTIVITY_FILE.to_string(),
          user,
          mode: 0o644,
          max_bytes: Some(0),
          parents: false,
        };
        let _ = c.client.upload_bytes(spec, Bytes::new()).await;
      }
      _ => {
        let _ = as_root(&task_engine, &container).await;
      }
    }
  });
}

/// A call that takes the engine's endpoints: the activity it needs recorded beyond what those
/// record themselves.
pub fn by_engine(engine: &Engine, target: &Target) {
  touch(engine, target, None, keep_of(target, None));
}

/// Runs `TOUCH_AS_ROOT` in the container; whether it ran to the end within 10 s.
async fn as_root(engine: &Engine, container: &str) -> bool {
  let limit = Duration::from_secs(10).min(engine.control_timeout);
  let opts = CreateExecOptions {
    cmd: Some(vec![
      "/bin/sh".to_string(),
      "-c".to_string(),
      TOUCH_AS_ROOT.to_string(),
      "trueforge-activity".to_string(),
    ]),
    user: Some("0:0".to_string()),
    attach_stdout: Some(true),
    attach_stderr: Some(true),
    working_dir: Some("/".to_string()),
    ..Default::default()
  };
  let run = async {
    let id = engine
      .create_exec("record activity", container, opts, limit)
      .await?;
    if let StartExecResults::Attached { mut output, .. } = engine
      .start_exec("record activity", &id, None, limit)
      .await?
    {
      while let Some(Ok(_)) = output.next().await {}
    }
    Ok::<_, crate::util::errors::SandboxError>(())
  };
  matches!(tokio::time::timeout(limit, run).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::sandbox::agent::facts::Facts;

  fn target(agent_init: bool, idle_secs: u64) -> Target {
    Target {
      sandbox_id: "/workspace/x".into(),
      name: "n".into(),
      container_id: "c".into(),
      owner: None,
      tenant: None,
      exclusive_gpus: false,
      saved: Default::default(),
      user: None,
      agent: Facts {
        agent_init,
        idle_secs,
        ..Default::default()
      }
      .into(),
    }
  }

  #[test]
  fn who_refreshes_what() {
    assert_eq!(keep_of(&target(true, 0), None), Keep::Nothing);
    assert_eq!(keep_of(&target(true, 60), None), Keep::AsRoot);
    assert_eq!(keep_of(&target(false, 60), None), Keep::Nothing);
    assert_eq!(period(&target(true, 2)), Duration::from_secs(1));
    assert_eq!(period(&target(true, 900)), Duration::from_secs(60));
    assert!(TOUCH_AS_ROOT.starts_with(&format!(
      "f={}\n",
      trueforge_agent_proto::msg::ACTIVITY_FILE
    )));
  }
}
