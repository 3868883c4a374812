//! One Code Mode transport's session: its socket name, and the relay serving it in the sandbox
//! it was last started for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use crate::codemode::by_agent::Served;
#[cfg(unix)]
use crate::codemode::lane::Fed;
use crate::codemode::SOCKET_DIR;
use crate::util::errors::Result;

/// Receives each request: the relay's generation, the request's number and the raw JSON bytes.
/// The answer goes back through `Session::reply` with the same generation and number.
pub type RequestSink = Arc<dyn Fn(u32, u32, Vec<u8>) + Send + Sync>;

/// How long a request waits for its reply when `start` was given no timeout: the client's own
/// default (`DEFAULT_TIMEOUT_SECONDS` in mcp_client.py), after which nobody waits for it.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// What a relay needs from its session: where requests go, and how long each waits for its
/// reply before the caller is told it timed out and its bytes are given back.
#[derive(Clone)]
pub struct Intake {
  pub sink: RequestSink,
  timeout_ms: Arc<AtomicU64>,
  /// Told when the timeout gets shorter: a relay waiting out the old one looks again.
  shorter: Arc<Notify>,
}

impl Intake {
  pub fn new(sink: RequestSink) -> Self {
    Self {
      sink,
      timeout_ms: Arc::new(AtomicU64::new(DEFAULT_REQUEST_TIMEOUT.as_millis() as u64)),
      shorter: Arc::new(Notify::new()),
    }
  }

  pub fn timeout(&self) -> Duration {
    Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
  }

  /// Completes once the timeout is set shorter than it was.
  pub fn shortened(&self) -> Notified<'_> {
    self.shorter.notified()
  }

  fn set_timeout(&self, t: Duration) {
    let ms = t.as_millis().clamp(1, u64::MAX as u128) as u64;
    if self.timeout_ms.swap(ms, Ordering::Relaxed) > ms {
      self.shorter.notify_waiters();
    }
  }
}

/// Launches a relay for one sandbox; the provider supplies it (it knows how to resolve, start
/// and re-resolve a sandbox).
pub trait Launcher {
  fn launch_relay(
    &self,
    sandbox_id: &str,
    socket: &str,
    intake: Intake,
  ) -> impl std::future::Future<Output = Result<Served>> + Send;
}

/// One transport's Code Mode session: its socket name, and the relay serving it in the sandbox
/// it was last started for. A transport is one agent turn; two transports on one sandbox (two
/// sub-agents with different tools) have their own sockets and relays.
pub struct Session {
  intake: Intake,
  socket: String,
  state: tokio::sync::Mutex<Option<(String, Arc<Served>)>>,
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
    if let Some((id, relay)) = state.as_ref() {
      if id == sandbox_id && relay.is_alive() {
        return Ok(());
      }
    }
    if let Some((_, old)) = state.take() {
      self.current.lock().expect("current").take();
      old.stop().await;
    }
    let relay = Arc::new(
      launcher
        .launch_relay(sandbox_id, &self.socket, self.intake.clone())
        .await?,
    );
    *self.current.lock().expect("current") = Some(relay.clone());
    *state = Some((sandbox_id.to_string(), relay));
    Ok(())
  }

  /// Sends a reply to the relay generation that asked. False when that relay is gone or no
  /// longer awaits it (it timed out).
  pub fn reply(&self, generation: u32, id: u32, payload: &[u8]) -> bool {
    let relay = self.current.lock().expect("current").clone();
    match relay {
      Some(r) if r.generation() == generation => r.send(id, payload),
      _ => false,
    }
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
    if let Some((_, relay)) = state.take() {
      relay.stop().await;
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn sessions_have_distinct_owner_only_socket_paths() {
    let sink: RequestSink = Arc::new(|_, _, _| {});
    let a = Session::new(sink.clone());
    let b = Session::new(sink);
    assert_ne!(a.socket_path(), b.socket_path());
    assert!(a.socket_path().starts_with(SOCKET_DIR));
    // sun_path holds 108 bytes.
    assert!(a.socket_path().len() < 108);
  }
}
