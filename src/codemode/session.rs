//! One Code Mode transport's session: its socket name, and the relay serving it in the sandbox
//! it was last started for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;

use crate::codemode::by_agent::Served;
use crate::codemode::intake::{Intake, RequestSink};
#[cfg(unix)]
use crate::codemode::lane::Fed;
use crate::codemode::SOCKET_DIR;
use crate::util::errors::Result;

/// A request whose values take this much is worth a collection when its dispatcher is done:
/// its room comes back once they are collected, and other requests may be waiting for it.
const COLLECT_FROM: u64 = 1 << 20;
/// At most one collection asked for per this long, however many large requests end.
const COLLECT_EVERY: Duration = Duration::from_millis(100);

/// When a collection was last asked for.
static LAST_COLLECTION: Mutex<Option<std::time::Instant>> = Mutex::new(None);

/// Whether to ask for a collection now for a request of `heap` bytes of values.
fn collection_due(heap: u64) -> bool {
  if heap < COLLECT_FROM {
    return false;
  }
  let mut last = LAST_COLLECTION.lock().expect("last collection");
  let now = std::time::Instant::now();
  if last.is_some_and(|t| now.duration_since(t) < COLLECT_EVERY) {
    return false;
  }
  *last = Some(now);
  true
}

/// Past V8's allowance for external memory since its last collection (64 MiB), so that the
/// pressure starts one.
const COLLECTION_PRESSURE: i64 = 64 << 20;

/// Launches a relay for one sandbox; the provider supplies it (it knows how to resolve, start
/// and re-resolve a sandbox).
pub trait Launcher {
  fn launch_relay(
    &self,
    sandbox_id: &str,
    socket: &str,
    intake: Intake,
  ) -> impl std::future::Future<Output = Result<Served>> + Send;

  /// Whether the sandbox's container runs, and since when, as the engine says now.
  fn liveness(&self, sandbox_id: &str) -> impl std::future::Future<Output = Liveness> + Send;
}

/// A container's state, for telling a relay whose stream looks open from one that is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
  /// Running since this start (the engine's `StartedAt`).
  Running(String),
  Stopped,
  /// The engine did not say (it is busy or unreachable): trust the stream.
  Unknown,
}

/// A relay whose stream looks open is checked against its container when it was last checked
/// longer ago than this (one inspect, a few milliseconds; a turn's quick succession of starts is
/// spared it). Some runtimes (gVisor's runsc) keep an exec's stream open after the container
/// stopped or restarted: the relay would look alive while nothing serves its socket.
const VERIFY_EVERY: Duration = Duration::from_millis(100);

/// The relay serving a session, the sandbox it serves and the container start it serves in.
struct Current {
  sandbox_id: String,
  relay: Arc<Served>,
  started: Liveness,
  verified: std::time::Instant,
}

/// One transport's Code Mode session: its socket name, and the relay serving it in the sandbox
/// it was last started for. A transport is one agent turn; two transports on one sandbox (two
/// sub-agents with different tools) have their own sockets and relays.
pub struct Session {
  intake: Intake,
  socket: String,
  state: tokio::sync::Mutex<Option<Current>>,
  current: Mutex<Option<Arc<Served>>>,
}

impl Session {
  pub fn new(sink: RequestSink) -> Self {
    let token = format!("{:032x}", rand::rng().random::<u128>());
    Self {
      intake: Intake::new(sink),
      socket: format!("{SOCKET_DIR}/{token}.sock"),
      state: tokio::sync::Mutex::new(None),
      current: Mutex::new(None),
    }
  }

  /// The socket the client connects to (the same across relaunches).
  pub fn socket_path(&self) -> &str {
    &self.socket
  }

  /// Makes sure a live relay serves `sandbox_id`: nothing to do when one does; otherwise the
  /// old one (another sandbox, or dead) is stopped and a new one launched. Callers racing here
  /// wait for one launch. `request_timeout` (the turn's) applies to requests from now on.
  pub async fn start(
    &self,
    launcher: &impl Launcher,
    sandbox_id: &str,
    request_timeout: Option<Duration>,
  ) -> Result<()> {
    if let Some(t) = request_timeout {
      self.intake.set_timeout(t);
    }
    let mut state = self.state.lock().await;
    if let Some(c) = state.as_mut() {
      let same = c.sandbox_id == sandbox_id && c.relay.is_alive();
      if same && still_serving(launcher, sandbox_id, &c.started, &mut c.verified).await {
        return Ok(());
      }
    }
    if let Some(old) = state.take() {
      self.current.lock().expect("current").take();
      old.relay.stop().await;
    }
    let relay = Arc::new(
      launcher
        .launch_relay(sandbox_id, &self.socket, self.intake.clone())
        .await?,
    );
    *self.current.lock().expect("current") = Some(relay.clone());
    *state = Some(Current {
      sandbox_id: sandbox_id.to_string(),
      relay,
      started: launcher.liveness(sandbox_id).await,
      verified: std::time::Instant::now(),
    });
    Ok(())
  }

  /// Sends a reply to the relay generation that asked: the dispatcher is done with the
  /// request. Its room is given back now, unless the JavaScript side `watched` its values (a
  /// large request), whose room comes back when they are collected (`collected`). False when
  /// that relay is gone or no longer awaits it (it timed out).
  pub fn reply(&self, generation: u32, id: u32, payload: &[u8], watched: bool) -> bool {
    let relay = self.current.lock().expect("current").clone();
    let sent = match relay {
      Some(r) if r.generation() == generation => r.send(id, payload),
      _ => false,
    };
    if !watched {
      self.intake.holds.release(generation, id);
    }
    sent
  }

  /// The JavaScript side let go of a watched request's values (they are garbage unless the
  /// dispatcher kept them): how much external memory pressure to put on V8, for a collection
  /// that gives their room back, when one is worth it now.
  pub fn let_go(&self, generation: u32, id: u32) -> Option<i64> {
    let heap = self.intake.holds.heap_of(generation, id)?;
    collection_due(heap).then(|| {
      i64::try_from(heap)
        .unwrap_or(i64::MAX)
        .saturating_add(COLLECTION_PRESSURE)
    })
  }

  /// The values of request `id` of relay `generation` were collected (or the JavaScript side
  /// stopped waiting for that): its room is given back.
  pub fn collected(&self, generation: u32, id: u32) {
    self.intake.holds.release(generation, id);
  }

  /// The current relay when it is lane `generation`.
  #[cfg(unix)]
  fn lane(&self, generation: u32) -> Option<Arc<Served>> {
    let relay = self.current.lock().expect("current").clone()?;
    match &*relay {
      Served::Lane(l) if l.generation == generation => Some(relay.clone()),
      _ => None,
    }
  }

  /// The current relay's lane, for the JavaScript side to read (once per lane): its
  /// generation and the stream's descriptor.
  #[cfg(unix)]
  pub fn take_lane(&self) -> Option<(u32, std::os::fd::OwnedFd)> {
    let relay = self.current.lock().expect("current").clone()?;
    match &*relay {
      Served::Lane(l) => l.take_fd().map(|fd| (l.generation, fd)),
      _ => None,
    }
  }

  /// Bytes read from lane `generation`; `None` when it is not the current relay any more (the
  /// reader then stops).
  #[cfg(unix)]
  pub fn feed(&self, generation: u32, chunk: &[u8]) -> Option<std::result::Result<Fed, String>> {
    let relay = self.lane(generation)?;
    let Served::Lane(l) = &*relay else {
      return None;
    };
    Some(l.feed(chunk))
  }

  /// Waits until lane `generation` has room for the call that paused it.
  #[cfg(unix)]
  pub async fn room(&self, generation: u32) {
    if let Some(relay) = self.lane(generation) {
      if let Served::Lane(l) = &*relay {
        l.room().await;
      }
    }
  }

  /// Lane `generation`'s stream closed: the next `start` launches another.
  #[cfg(unix)]
  pub fn lane_ended(&self, generation: u32) {
    if let Some(relay) = self.lane(generation) {
      if let Served::Lane(l) = &*relay {
        l.end();
      }
    }
  }

  /// The live relay's pid, if any.
  pub fn relay_pid(&self) -> Option<u32> {
    let relay = self.current.lock().expect("current").clone();
    relay.filter(|r| r.is_alive()).map(|r| r.pid())
  }

  /// Stops the relay (if any) and waits until it has ended. Safe at any time.
  pub async fn stop(&self) {
    let mut state = self.state.lock().await;
    self.current.lock().expect("current").take();
    if let Some(c) = state.take() {
      c.relay.stop().await;
    }
  }
}

/// Whether a relay whose stream looks open still serves: its container runs the start it was
/// launched in (`started`), checked with the engine at most every `VERIFY_EVERY`.
async fn still_serving(
  launcher: &impl Launcher,
  sandbox_id: &str,
  started: &Liveness,
  verified: &mut std::time::Instant,
) -> bool {
  if verified.elapsed() < VERIFY_EVERY {
    return true;
  }
  let serving = match (launcher.liveness(sandbox_id).await, started) {
    (Liveness::Unknown, _) | (_, Liveness::Unknown) => true,
    (Liveness::Running(at), Liveness::Running(was)) => &at == was,
    _ => false,
  };
  if serving {
    *verified = std::time::Instant::now();
  }
  serving
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::codemode::intake::Request;

  #[test]
  fn sessions_have_distinct_owner_only_socket_paths() {
    let sink: RequestSink = Arc::new(|_, _, _: Request| {});
    let a = Session::new(sink.clone());
    let b = Session::new(sink);
    assert_ne!(a.socket_path(), b.socket_path());
    assert!(a.socket_path().starts_with(SOCKET_DIR));
    // sun_path holds 108 bytes.
    assert!(a.socket_path().len() < 108);
  }

  /// A launcher whose container is in the state `now` says.
  struct Engine(Liveness);

  impl Launcher for Engine {
    async fn launch_relay(&self, _: &str, _: &str, _: Intake) -> Result<Served> {
      unreachable!("not launched here")
    }
    async fn liveness(&self, _: &str) -> Liveness {
      self.0.clone()
    }
  }

  #[tokio::test]
  async fn a_relay_serves_while_its_container_runs_the_start_it_was_launched_in() {
    let was = Liveness::Running("2026-12-06T05:00:00Z".into());
    let long_ago = || std::time::Instant::now() - VERIFY_EVERY * 2;
    for (now, serving) in [
      (was.clone(), true),
      (Liveness::Running("2026-12-06T06:00:00Z".into()), false),
      (Liveness::Stopped, false),
      (Liveness::Unknown, true),
    ] {
      let mut verified = long_ago();
      let got = still_serving(&Engine(now.clone()), "id", &was, &mut verified).await;
      assert_eq!(got, serving, "{now:?}");
      assert_eq!(
        verified.elapsed() < VERIFY_EVERY,
        serving,
        "verified again only when serving"
      );
    }
    // Checked a moment ago: the engine is not asked again.
    let mut recent = std::time::Instant::now();
    assert!(still_serving(&Engine(Liveness::Stopped), "id", &was, &mut recent).await);
  }
}
