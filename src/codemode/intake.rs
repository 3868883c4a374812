//! What a relay hands its requests to, whichever relay it is: the session's intake (where
//! requests go, how long each waits for its reply) and the rooms of the requests handed over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use crate::codemode::budget::Claim;
use crate::codemode::meter::Measured;

/// One request for the JavaScript side: its JSON text, checked and measured.
pub struct Request {
  pub payload: Vec<u8>,
  pub measured: Measured,
}

/// Receives each request: the relay's generation, the request's number and the request. The
/// answer goes back through `Session::reply` with the same generation and number.
pub type RequestSink = Arc<dyn Fn(u32, u32, Request) + Send + Sync>;

/// The room of the requests handed to the JavaScript side, held until the dispatcher is done
/// with them, whatever became of their relays or their callers meanwhile: until its reply is
/// handed back, or, for a large request whose values the JavaScript side watches, until they
/// are collected (`Session::collected`).
#[derive(Default)]
pub struct Holds(Mutex<HashMap<(u32, u32), Hold>>);

struct Hold {
  _claim: Claim,
  heap: u64,
}

impl Holds {
  /// Request `seq` of relay `generation` is handed over, holding `claim` for values of `heap`
  /// bytes.
  pub fn hold(&self, generation: u32, seq: u32, claim: Claim, heap: u64) {
    let mut held = self.0.lock().expect("holds");
    held.insert(
      (generation, seq),
      Hold {
        _claim: claim,
        heap,
      },
    );
  }

  pub(crate) fn release(&self, generation: u32, seq: u32) {
    let hold = self.0.lock().expect("holds").remove(&(generation, seq));
    drop(hold);
  }

  pub(crate) fn heap_of(&self, generation: u32, seq: u32) -> Option<u64> {
    let held = self.0.lock().expect("holds");
    held.get(&(generation, seq)).map(|h| h.heap)
  }
}

/// How long a request waits for its reply when `start` was given no timeout: the client's own
/// default (`DEFAULT_TIMEOUT_SECONDS` in mcp_client.py), after which nobody waits for it.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// What a relay needs from its session: where requests go, and how long each waits for its
/// reply before the caller is told it timed out and its bytes are given back.
#[derive(Clone)]
pub struct Intake {
  pub sink: RequestSink,
  pub holds: Arc<Holds>,
  timeout_ms: Arc<AtomicU64>,
  /// Told when the timeout gets shorter: a relay waiting out the old one looks again.
  shorter: Arc<Notify>,
}

impl Intake {
  pub fn new(sink: RequestSink) -> Self {
    Self {
      sink,
      holds: Arc::default(),
      timeout_ms: Arc::new(AtomicU64::new(DEFAULT_REQUEST_TIMEOUT.as_millis() as u64)),
      shorter: Arc::new(Notify::new()),
    }
  }

  pub fn timeout(&self) -> Duration {
    Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
  }

  /// Hands request `seq` of relay `generation` to the sink, its room held until the
  /// dispatcher is done with it.
  pub fn deliver(&self, generation: u32, seq: u32, request: Request, claim: Claim) {
    self
      .holds
      .hold(generation, seq, claim, request.measured.heap);
    (self.sink)(generation, seq, request);
  }

  /// Completes once the timeout is set shorter than it was.
  pub fn shortened(&self) -> Notified<'_> {
    self.shorter.notified()
  }

  pub(crate) fn set_timeout(&self, t: Duration) {
    let ms = t.as_millis().clamp(1, u64::MAX as u128) as u64;
    if self.timeout_ms.swap(ms, Ordering::Relaxed) > ms {
      self.shorter.notify_waiters();
    }
  }
}
