//! Code Mode through the sandbox's agent: the agent listens on the session's socket as the
//! sandbox's user (no Python needed for the transport) and carries each client's request to us
//! as a stream of its own; the static `mcp-client` (the agent binary under that name) and
//! TrueForge's Python `mcp_client` both speak to that socket. A call arrives with its size before
//! its bytes, so room for it can be made before they are read; until then they wait in the agent
//! under flow control. The relay process of the Python transport (`relay`) stays the fallback.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use trueforge_agent_proto::client::{CallHandler, ClientError, CodeModeCall};
use trueforge_agent_proto::msg::CodeModeListenSpec;

use crate::codemode::budget::{self, Admission, Budget, Claim};
use crate::codemode::intake::{Intake, Request};
use crate::codemode::meter::{self, Measured, Unfit};
use crate::codemode::relay::{next_generation, Relay};
use crate::codemode::MAX_MESSAGE_BYTES;
use crate::engine::Engine;
use crate::sandbox::agent::Conn;
use crate::sandbox::container::Target;
use crate::util::errors::{Result, SandboxError};
use crate::util::logging::Logger;

/// What serves a session's socket: the agent, or (without it) the Python relay.
pub enum Served {
  Python(Box<Relay>),
  Agent(AgentRelay),
  /// The agent, on a stream the JavaScript thread reads itself (`lane`).
  #[cfg(unix)]
  Lane(Box<crate::codemode::lane::Lane>),
}

impl Served {
  pub fn is_alive(&self) -> bool {
    match self {
      Served::Python(r) => r.is_alive(),
      Served::Agent(r) => r.is_alive(),
      #[cfg(unix)]
      Served::Lane(r) => r.is_alive(),
    }
  }

  /// Names this relay to the JavaScript side, which answers through `send`.
  pub fn generation(&self) -> u32 {
    match self {
      Served::Python(r) => r.generation,
      Served::Agent(r) => r.generation,
      #[cfg(unix)]
      Served::Lane(r) => r.generation,
    }
  }

  pub fn send(&self, id: u32, payload: &[u8]) -> bool {
    match self {
      Served::Python(r) => r.send(id, payload),
      Served::Agent(r) => r.send(id, payload),
      #[cfg(unix)]
      Served::Lane(r) => r.send(id, payload),
    }
  }

  /// The pid of what serves the socket inside the container (the relay, or the agent).
  pub fn pid(&self) -> u32 {
    match self {
      Served::Python(r) => r.pid(),
      Served::Agent(r) => r.conn.hello().pid,
      #[cfg(unix)]
      Served::Lane(r) => r.pid(),
    }
  }

  pub async fn stop(&self) {
    match self {
      Served::Python(r) => r.stop().await,
      Served::Agent(r) => r.stop().await,
      #[cfg(unix)]
      Served::Lane(r) => r.stop().await,
    }
  }
}

/// Calls handed to the JavaScript side and not answered yet, by id, with when they time out
/// (their room is held by the session until the JavaScript side is done with them). One task per relay answers the late ones (`watch`): a timer task per call
/// would outlive its call by the whole timeout (five minutes by default), so a busy turn would
/// pile up hundreds of thousands of sleeping tasks.
type Pending = Arc<Mutex<Waiting>>;

#[derive(Default)]
struct Waiting {
  calls: HashMap<u32, Held>,
  deadlines: BTreeSet<(Instant, u32)>,
}

struct Held {
  call: CodeModeCall,
  deadline: Instant,
}

impl Waiting {
  fn insert(&mut self, id: u32, call: CodeModeCall, deadline: Instant) {
    self.deadlines.insert((deadline, id));
    let old = self.calls.insert(id, Held { call, deadline });
    if let Some(old) = old {
      self.deadlines.remove(&(old.deadline, id));
    }
  }

  fn remove(&mut self, id: u32) -> Option<Held> {
    let held = self.calls.remove(&id)?;
    self.deadlines.remove(&(held.deadline, id));
    Some(held)
  }

  /// The calls whose time is up at `now`.
  fn due(&mut self, now: Instant) -> Vec<Held> {
    let mut out = Vec::new();
    while let Some(&(d, id)) = self.deadlines.first() {
      if d > now {
        break;
      }
      self.deadlines.pop_first();
      out.extend(self.calls.remove(&id));
    }
    out
  }

  fn clear(&mut self) {
    self.calls.clear();
    self.deadlines.clear();
  }
}

/// One session's socket, served by the sandbox's agent.
pub struct AgentRelay {
  pub(crate) generation: u32,
  conn: Arc<Conn>,
  socket: String,
  /// The route that sends the agent's calls for `socket` here (kept to unroute exactly it).
  route: u64,
  pending: Pending,
  /// Where a reply that must wait for the agent's credit is sent from.
  runtime: tokio::runtime::Handle,
  stopped: Arc<AtomicBool>,
  /// Wakes the watcher, which fails the calls not answered yet (and closes the socket when the
  /// relay was dropped without `stop`).
  ended: Arc<Notify>,
}

impl AgentRelay {
  pub fn is_alive(&self) -> bool {
    !self.stopped.load(Ordering::SeqCst) && !self.conn.client.is_closed()
  }

  /// Answers call `id`: a small reply goes out from the caller's thread at once (no task in
  /// between, which is most of a round trip's cost); a large one is streamed by a task.
  pub(crate) fn send(&self, id: u32, payload: &[u8]) -> bool {
    if !self.is_alive() {
      return false;
    }
    let Some(held) = self.pending.lock().expect("pending").remove(id) else {
      return true; // answered already, or timed out
    };
    let Held { mut call, .. } = held;
    let bytes = Bytes::copy_from_slice(payload);
    if !call.reply_now(&bytes) {
      self.runtime.spawn(async move {
        let _ = call.reply(bytes).await;
      });
    }
    true
  }

  /// Closes the socket (the agent removes it); calls not answered yet fail.
  pub async fn stop(&self) {
    if self.stopped.swap(true, Ordering::SeqCst) {
      return;
    }
    self.conn.unroute(&self.socket, self.route);
    self.ended.notify_one();
    close_socket(&self.conn, &self.socket).await;
  }
}

impl Drop for AgentRelay {
  fn drop(&mut self) {
    // Not stopped (its transport was collected): the watcher closes the socket.
    self.conn.unroute(&self.socket, self.route);
    self.ended.notify_one();
  }
}

/// Opens `socket` in `target` through its agent, as the sandbox's user, and hands its calls to
/// the session's sink, each once `budget` has room for it.
pub async fn listen(
  engine: &Engine,
  conn: Arc<Conn>,
  target: &Target,
  socket: &str,
  intake: Intake,
  budget: Budget,
  log: &Logger,
) -> Result<AgentRelay> {
  let generation = next_generation();
  let pending = Pending::default();
  let runtime = tokio::runtime::Handle::current();
  let route = conn.route(
    socket,
    call_handler(
      generation,
      intake.clone(),
      budget,
      pending.clone(),
      runtime.clone(),
    ),
  );
  let spec = CodeModeListenSpec {
    socket: socket.to_string(),
    user: target.user.clone(),
  };
  if let Err(e) = conn.client.code_mode_listen(spec).await {
    conn.unroute(socket, route);
    return Err(match e {
      // The agent went under the request (Podman resets a stream as it restarts a container):
      // the caller opens the socket again on a new agent.
      ClientError::StreamEnded { .. } => SandboxError::AgentLost {
        detail: e.to_string(),
      },
      // The agent needs no python3: anything else that stops it is a start failure.
      e => SandboxError::CodeModeStartFailed {
        detail: format!("the sandbox agent could not open the Code Mode socket {socket}: {e}"),
      },
    });
  }
  let stopped = Arc::new(AtomicBool::new(false));
  let ended = Arc::new(Notify::new());
  watch(engine, &conn, socket, &intake, &pending, &stopped, &ended);
  log.debug(
    "Code Mode served by the sandbox agent",
    json!({ "sandboxId": target.sandbox_id, "socket": socket }),
  );
  Ok(AgentRelay {
    generation,
    conn,
    socket: socket.to_string(),
    route,
    pending,
    runtime,
    stopped,
    ended,
  })
}

/// What takes the socket's calls on the connection's reader task. A small call that arrived
/// whole and fits the budget now goes to the sink right here (a task switch costs more than
/// the rest of its way through the host); any other goes to a task of its own, which waits for
/// room and then for its bytes.
fn call_handler(
  generation: u32,
  intake: Intake,
  budget: Budget,
  pending: Pending,
  runtime: tokio::runtime::Handle,
) -> CallHandler {
  let next_id = AtomicU32::new(0);
  let turn = Turn::default();
  Arc::new(move |mut call: CodeModeCall| {
    let id = next_id.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    let size = announced(&call);
    let on = Handed {
      generation,
      id,
      intake: intake.clone(),
      budget: budget.clone(),
      pending: pending.clone(),
      turn: turn.clone(),
    };
    if budget.refusal(size).is_none() {
      if let Ok(turn) = on.turn.clone().try_lock_owned() {
        if let Some(room) = budget.try_claim(budget::reading(size)) {
          if let Some(request) = call.take_request() {
            let Ok(request) = request else { return };
            let measured = meter::measure(&request);
            match budget.admit(request.len(), &measured, room) {
              Admission::Ready(room) => on.deliver(call, room, request, measured),
              other => {
                runtime.spawn(on.settle(call, request, measured, other, turn));
              }
            }
            return;
          }
        }
      }
    }
    runtime.spawn(on.hand_over(call));
  })
}

/// Answers the calls whose time is up, until the relay ends; then calls nobody will answer now
/// fail (dropping one fails it), and a relay dropped without `stop` has its socket closed here.
/// It sleeps until the first deadline, or for one timeout when nothing waits (a call made
/// meanwhile is due after that), woken early when the timeout is shortened: no wake-up per
/// call.
fn watch(
  engine: &Engine,
  conn: &Arc<Conn>,
  socket: &str,
  intake: &Intake,
  pending: &Pending,
  stopped: &Arc<AtomicBool>,
  ended: &Arc<Notify>,
) {
  let (conn, socket, intake, pending, stopped, ended) = (
    conn.clone(),
    socket.to_string(),
    intake.clone(),
    pending.clone(),
    stopped.clone(),
    ended.clone(),
  );
  engine.shared.background.spawn_cancellable(async move {
    let end = ended.notified();
    tokio::pin!(end);
    loop {
      let shortened = intake.shortened();
      tokio::pin!(shortened);
      shortened.as_mut().enable();
      let timeout = intake.timeout();
      let first = pending
        .lock()
        .expect("pending")
        .deadlines
        .first()
        .map(|d| d.0);
      let wake = first.unwrap_or_else(|| Instant::now() + timeout);
      tokio::select! {
        _ = &mut end => break,
        _ = shortened => continue,
        _ = tokio::time::sleep_until(wake) => {}
      }
      let late = pending.lock().expect("pending").due(Instant::now());
      if late.is_empty() {
        continue;
      }
      let message = format!(
        "Code Mode request got no reply from the host within {} s",
        timeout.as_secs_f64()
      );
      for held in late {
        let reply = error_reply(&message, "transport");
        tokio::spawn(async move {
          let _ = held.call.reply(reply).await;
        });
      }
    }
    pending.lock().expect("pending").clear();
    if !stopped.load(Ordering::SeqCst) && !conn.client.is_closed() {
      close_socket(&conn, &socket).await;
    }
  });
}

/// How long the agent has to close a socket. An agent whose container stopped under a runtime
/// that keeps the exec's stream open (gVisor's runsc) never answers: the next relay's start
/// must not wait for it.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Asks the agent to close `socket`, within `CLOSE_WAIT`.
async fn close_socket(conn: &Conn, socket: &str) {
  let _ = tokio::time::timeout(CLOSE_WAIT, conn.client.code_mode_close(socket)).await;
}

/// The reply a caller in the sandbox receives for an error of ours, shaped as its client reads
/// it.
fn error_reply(message: &str, source: &str) -> Bytes {
  Bytes::from(json!({ "ok": false, "error": message, "source": source }).to_string())
}

/// A call's size for the budget: as announced (an agent that does not say is taken at the
/// largest size).
fn announced(call: &CodeModeCall) -> usize {
  call.size.map_or(MAX_MESSAGE_BYTES, |s| {
    usize::try_from(s).unwrap_or(usize::MAX)
  })
}

/// Requests from this size on are measured on a blocking thread, not on the runtime's.
const MEASURE_APART: usize = 1 << 20;

/// A relay's turn to wait for room: one call at a time, in the order they came, as a lane
/// reads them. Two calls each holding part of the room while they wait for the rest would wait
/// for each other until their timeout.
type Turn = Arc<tokio::sync::Mutex<()>>;

/// One call on its way to the sink.
struct Handed {
  generation: u32,
  id: u32,
  intake: Intake,
  budget: Budget,
  pending: Pending,
  turn: Turn,
}

impl Handed {
  /// Takes room for the call, reads and measures its request, and delivers it. A call over a
  /// bound is refused at once.
  async fn hand_over(self, mut call: CodeModeCall) {
    let size = announced(&call);
    if let Some(why) = self.budget.refusal(size) {
      let _ = call.reply(error_reply(&why, "caller")).await;
      return;
    }
    // Until its turn and then room come, the call's bytes wait in the agent under flow control.
    let turn = self.turn.clone().lock_owned().await;
    let room = self.budget.claim(budget::reading(size)).await;
    let Ok(request) = call.read_request().await else {
      return;
    };
    let measured = match request.len() < MEASURE_APART {
      true => meter::measure(&request),
      false => {
        let bytes = request.clone();
        let apart = tokio::task::spawn_blocking(move || meter::measure(&bytes));
        apart.await.unwrap_or(Err(Unfit::Malformed))
      }
    };
    let admission = self.budget.admit(request.len(), &measured, room);
    self.settle(call, request, measured, admission, turn).await;
  }

  /// Delivers an admitted call, or answers why it cannot be, waiting for room within the
  /// timeout when it needs more than is free. The relay's turn is given up once it is settled.
  async fn settle(
    self,
    call: CodeModeCall,
    request: Bytes,
    measured: Result<Measured, Unfit>,
    admission: Admission,
    turn: tokio::sync::OwnedMutexGuard<()>,
  ) {
    let room = match admission {
      Admission::Ready(room) => room,
      Admission::Refused(why) => {
        let _ = call.reply(error_reply(&why, "caller")).await;
        return;
      }
      Admission::Wait(mut room, need) => {
        let timeout = self.intake.timeout();
        let fit = tokio::time::timeout(timeout, self.budget.fit(&mut room, need));
        if fit.await.is_err() {
          let why = budget::no_room(timeout);
          let _ = call.reply(error_reply(&why, "transport")).await;
          return;
        }
        room
      }
    };
    drop(turn);
    self.deliver(call, room, request, measured);
  }

  /// Hands the request to the sink, to be answered within the session's timeout.
  fn deliver(
    self,
    call: CodeModeCall,
    room: Claim,
    request: Bytes,
    measured: Result<Measured, Unfit>,
  ) {
    let Ok(measured) = measured else {
      unreachable!("only measured calls are admitted")
    };
    let deadline = Instant::now() + self.intake.timeout();
    self
      .pending
      .lock()
      .expect("pending")
      .insert(self.id, call, deadline);
    let request = Request {
      payload: Vec::from(request),
      measured,
    };
    self.intake.deliver(self.generation, self.id, request, room);
  }
}
