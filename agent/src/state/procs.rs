//! What the agent's commands share about processes, kept here rather than with the recovery
//! (`exec::recover`) because the server's context holds it and every command handler reads it.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// What a recovery did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
  /// Processes killed (left behind: no running command owned them).
  pub killed: usize,
  /// Live processes that running commands own, spared.
  pub owned: usize,
}

/// After a recovery found nothing to kill, how long until another may scan /proc (many
/// commands may be waiting at once).
const RECOVERY_GAP: Duration = Duration::from_millis(250);

/// What the agent's commands share about processes: the shepherds of those running (their
/// processes are spared), the reaping of children (a freed pid wakes a waiting command), and
/// the last recovery.
#[derive(Default)]
pub struct Pressure {
  shepherds: RefCell<HashSet<u32>>,
  reaped: Notify,
  last: Cell<Recovery>,
  fruitless_since: Cell<Option<Instant>>,
}

impl Pressure {
  /// `pid` is the shepherd of a command now running.
  pub fn running(&self, pid: u32) {
    self.shepherds.borrow_mut().insert(pid);
  }

  /// That command's call is over.
  pub fn ended(&self, pid: u32) {
    self.shepherds.borrow_mut().remove(&pid);
  }

  /// `n` children were reaped: as many waiting commands may try again.
  pub fn reaped(&self, n: usize) {
    for _ in 0..n {
      self.reaped.notify_one();
    }
  }

  /// Waits for a reaped child, at most `pause`.
  pub async fn until_reaped(&self, pause: Duration) {
    tokio::select! {
      _ = self.reaped.notified() => {}
      _ = tokio::time::sleep(pause) => {}
    }
  }

  /// What the last recovery found, when it found nothing to kill less than `RECOVERY_GAP` ago:
  /// another scan so soon would find no more.
  pub fn lately_fruitless(&self) -> Option<Recovery> {
    self
      .fruitless_since
      .get()
      .is_some_and(|t| t.elapsed() < RECOVERY_GAP)
      .then(|| Recovery {
        killed: 0,
        ..self.last.get()
      })
  }

  /// The shepherds of the commands running now.
  pub fn shepherds(&self) -> HashSet<u32> {
    self.shepherds.borrow().clone()
  }

  /// A recovery found `r`.
  pub fn recovered(&self, r: Recovery) {
    self.last.set(r);
    self.fruitless_since.set((r.killed == 0).then(Instant::now));
  }
}
