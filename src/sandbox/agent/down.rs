//! Sandboxes whose agent cannot start, or cannot keep running: their calls take the engine's exec
//! and archive endpoints instead, and the provider says why (one warning per sandbox and reason,
//! `agentStatus`, `doctor`). Never a reason to fail a call that the engine can serve.
//!
//! What puts a sandbox there:
//! - `Cause::Start`: the agent did not start (no binary for its platform, none can be placed,
//!   the runtime cannot execute it, it exited or wrote something other than its hello);
//! - `Cause::Create`: it started but was lost while it laid out the new sandbox (an agent that
//!   cannot do its first file work, as the one before issue 32 under gVisor);
//! - `Cause::CrashLoop`: it was lost `LOSSES` times within `LOSS_WINDOW` while its container
//!   ran (killed by a root workload, or dying on its own). The call a loss interrupts fails as it
//!   always has (a command may or may not have run); later ones take the engine's endpoints.
//!
//! When the agent is tried again: on the first call `FIRST_RETRY` after it was given up, then
//! after twice as long each time the same reason recurs, up to `MAX_RETRY`; and at once after the
//! provider restarts the sandbox's stopped container (a fresh container may well run it). An
//! agent that fails to start costs its call nothing (the call then takes the engine's
//! endpoints); one given up for dying may lose the call it was retried on, and a single loss
//! then gives it up again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::sandbox::container::Target;
use crate::util::bounded::bounded_insert;
use crate::util::logging::Logger;

/// How long an agent is given up for the first time.
pub const FIRST_RETRY: Duration = Duration::from_secs(60);
/// The longest it is given up for.
pub const MAX_RETRY: Duration = Duration::from_secs(30 * 60);
/// Losses within `LOSS_WINDOW` that make a crash loop.
pub const LOSSES: usize = 3;
pub const LOSS_WINDOW: Duration = Duration::from_secs(60);

/// Why the agent was given up (one warning per sandbox and cause, per reason for `Start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
  Start,
  Create,
  CrashLoop,
}

/// A sandbox's agent, given up.
#[derive(Debug, Clone)]
pub struct Down {
  why: String,
  cause: Cause,
  at: Instant,
  /// How long from `at` before it is tried again (zero: at once).
  wait: Duration,
}

impl Down {
  fn same_reason(&self, cause: Cause, why: &str) -> bool {
    self.cause == cause && (cause != Cause::Start || self.why == why)
  }
}

/// The sandboxes of one engine whose agent was given up, or lost (kept per engine:
/// `EngineShared::state`).
#[derive(Default)]
pub struct Downs {
  /// Containers the agent cannot run in, or cannot keep running in, and why.
  down: Mutex<HashMap<String, Down>>,
  /// When each container's agent was last lost while its container ran.
  losses: Mutex<HashMap<String, Vec<Instant>>>,
}

impl Downs {
  /// Why the agent is given up in `container` now, when it is.
  pub(crate) fn down(&self, container: &str) -> Option<String> {
    let down = self.down.lock().expect("agent down");
    down
      .get(container)
      .filter(|d| d.at.elapsed() < d.wait)
      .map(|d| d.why.clone())
  }

  /// Why the agent could not run, or keep running, in `container` the last time it failed.
  pub fn down_reason(&self, container: &str) -> Option<String> {
    let down = self.down.lock().expect("agent down");
    down.get(container).map(|d| d.why.clone())
  }

  /// Gives the agent of `target`'s container up for `cause`: its calls take the engine's
  /// endpoints until it is tried again. Warns once per sandbox and reason.
  pub fn fall_back(&self, target: &Target, cause: Cause, why: &str, log: &Logger) {
    let (news, wait) = {
      let mut down = self.down.lock().expect("agent down");
      let prev = down.get(&target.container_id);
      let again = prev.filter(|d| d.same_reason(cause, why));
      let wait = match again {
        Some(d) if !d.wait.is_zero() => (d.wait * 2).min(MAX_RETRY),
        _ => FIRST_RETRY,
      };
      let news = again.is_none();
      let entry = Down {
        why: why.to_string(),
        cause,
        at: Instant::now(),
        wait,
      };
      bounded_insert(&mut down, target.container_id.clone(), entry);
      (news, wait)
    };
    if news {
      let message = match cause {
        Cause::Start => "the sandbox agent cannot run here; commands and files use the engine's exec and archive endpoints",
        Cause::Create => "the sandbox agent died while it laid out the new sandbox; commands and files use the engine's exec and archive endpoints",
        Cause::CrashLoop => "the sandbox agent keeps dying here; commands and files use the engine's exec and archive endpoints",
      };
      log.warn(
        message,
        json!({
          "sandboxId": target.sandbox_id,
          "reason": why,
          "retryInSeconds": wait.as_secs(),
        }),
      );
    }
  }

  /// Records that `target`'s agent was lost while its container ran (`detail`: how). True when
  /// that gave the agent up: the `LOSSES`th loss within `LOSS_WINDOW`, or the first since it
  /// was tried again after such a loop.
  pub fn lost_agent(&self, target: &Target, detail: &str, log: &Logger) -> bool {
    let container = target.container_id.as_str();
    let relapse = self
      .down
      .lock()
      .expect("agent down")
      .get(container)
      .is_some_and(|d| d.cause == Cause::CrashLoop && !d.wait.is_zero());
    let count = {
      let mut losses = self.losses.lock().expect("agent losses");
      let mut times = losses.remove(container).unwrap_or_default();
      times.retain(|t| t.elapsed() < LOSS_WINDOW);
      times.push(Instant::now());
      let n = times.len();
      bounded_insert(&mut losses, container.to_string(), times);
      n
    };
    if !relapse && count < LOSSES {
      return false;
    }
    self.losses.lock().expect("agent losses").remove(container);
    let why = if relapse {
      format!("the agent died again when it was tried again after dying repeatedly (the last time: {detail})")
    } else {
      format!(
        "the agent died {count} times within {} s while the container ran (the last time: {detail})",
        LOSS_WINDOW.as_secs()
      )
    };
    self.fall_back(target, Cause::CrashLoop, &why, log);
    true
  }

  /// The provider restarted `container`: its agent is tried again on the next call (a warning
  /// already given is not given again for the same reason), and its losses start over.
  pub fn restarted(&self, container: &str) {
    if let Some(d) = self.down.lock().expect("agent down").get_mut(container) {
      d.wait = Duration::ZERO;
    }
    self.losses.lock().expect("agent losses").remove(container);
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::util::logging::Logger;

  fn target() -> Target {
    Target {
      sandbox_id: "/workspace/01ABC".into(),
      name: "n".into(),
      container_id: "c1".into(),
      owner: None,
      tenant: None,
      exclusive_gpus: false,
      saved: Default::default(),
      agent: Default::default(),
      user: None,
    }
  }

  #[test]
  fn a_crash_loop_gives_the_agent_up_and_a_relapse_at_once() {
    let s = Downs::default();
    let (t, log) = (target(), Logger::default());
    assert!(!s.lost_agent(&t, "killed", &log));
    assert!(!s.lost_agent(&t, "killed", &log));
    assert!(s.down("c1").is_none());
    assert!(s.lost_agent(&t, "killed", &log));
    let why = s.down("c1").expect("given up");
    assert!(why.contains("died 3 times within 60 s"), "{why}");
    // Tried again after a while: one more loss gives it up at once, for twice as long.
    s.down.lock().unwrap().get_mut("c1").unwrap().at -= FIRST_RETRY;
    assert!(s.down("c1").is_none());
    assert!(s.lost_agent(&t, "killed", &log));
    assert_eq!(s.down.lock().unwrap()["c1"].wait, FIRST_RETRY * 2);
    // A restart: tried at once, and a single loss is not a loop any more.
    s.restarted("c1");
    assert!(s.down("c1").is_none());
    assert!(!s.lost_agent(&t, "killed", &log));
  }

  #[test]
  fn one_warning_per_sandbox_and_reason() {
    let s = Downs::default();
    let t = target();
    let warned = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let w = warned.clone();
    let log = Logger::new(Some(std::sync::Arc::new(
      move |_, m: &str, meta: &serde_json::Value| {
        w.lock()
          .unwrap()
          .push((m.to_string(), meta["reason"].clone()))
      },
    )));
    for _ in 0..3 {
      s.fall_back(&t, Cause::Start, "exec format error", &log);
    }
    s.fall_back(&t, Cause::Start, "no hello", &log);
    for _ in 0..4 {
      s.lost_agent(&t, "killed", &log);
    }
    // The crash loop's text changes with each loss; it is one reason all the same.
    s.down.lock().unwrap().get_mut("c1").unwrap().at -= MAX_RETRY;
    s.lost_agent(&t, "killed again", &log);
    let warned = warned.lock().unwrap();
    assert_eq!(warned.len(), 3, "{warned:?}");
    assert!(warned[0].0.contains("cannot run here") && warned[0].1 == "exec format error");
    assert_eq!(warned[1].1, "no hello");
    assert!(warned[2].0.contains("keeps dying"));
  }

  #[test]
  fn the_wait_doubles_for_the_same_reason_up_to_the_cap() {
    let s = Downs::default();
    let (t, log) = (target(), Logger::default());
    let mut waits = Vec::new();
    for _ in 0..8 {
      s.fall_back(&t, Cause::Start, "no binary", &log);
      waits.push(s.down.lock().unwrap()["c1"].wait);
    }
    assert_eq!(waits[0], FIRST_RETRY);
    assert_eq!(waits[1], FIRST_RETRY * 2);
    assert_eq!(*waits.last().unwrap(), MAX_RETRY);
    // Another reason starts over.
    s.fall_back(&t, Cause::Start, "another", &log);
    assert_eq!(s.down.lock().unwrap()["c1"].wait, FIRST_RETRY);
    assert_eq!(s.down("c1").as_deref(), Some("another"));
  }
}
