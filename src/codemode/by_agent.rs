//! Code Mode through the sandbox's agent: the agent listens on the session's socket as the
//! sandbox's user (no Python needed for the transport) and carries each client's request to us
//! as a stream of its own; the static `mcp-client` (the agent binary under that name) and
//! TrueForge's Python `mcp_client` both speak to that socket. A call arrives with its size before
//! its bytes, so room for it can be made before they are read; until then they wait in the agent
//! under flow control. The relay process of the Python transport (`relay`) stays the fallback.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::json;
use tokio::sync::{mpsc, Notify};
use trueforge_agent_proto::client::CodeModeCall;
use trueforge_agent_proto::msg::CodeModeListenSpec;

use crate::codemode::budget::{Budget, Claim};
use crate::codemode::relay::{next_generation, Relay};
use crate::codemode::session::Intake;
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
}

impl Served {
  pub fn is_alive(&self) -> bool {
    match self {
      Served::Python(r) => r.is_alive(),
      Served::Agent(r) => r.is_alive(),
    }
  }

  /// Names this relay to the JavaScript side, which answers through `send`.
  pub fn generation(&self) -> u32 {
    match self {
      Served::Python(r) => r.generation,
      Served::Agent(r) => r.generation,
    }
  }

  pub fn send(&self, id: u32, payload: &[u8]) -> bool {
    match self {
      Served::Python(r) => r.send(id, payload),
      Served::Agent(r) => r.send(id, payload),
    }
  }

  /// The pid of what serves the socket inside the container (the relay, or the agent).
  pub fn pid(&self) -> u32 {
    match self {
      Served::Python(r) => r.pid(),
      Served::Agent(r) => r.conn.hello().pid,
    }
  }

  pub async fn stop(&self) {
    match self {
      Served::Python(r) => r.stop().await,
      Served::Agent(r) => r.stop().await,
    }
  }
}

/// Calls handed to the JavaScript side and not answered yet, by id, with the room they hold.
type Pending = Arc<Mutex<HashMap<u32, (CodeModeCall, Claim)>>>;

/// One session's socket, served by the sandbox's agent.
pub struct AgentRelay {
  pub(crate) generation: u32,
  conn: Arc<Conn>,
  socket: String,
  /// Where the agent's calls for `socket` go (kept to unroute exactly this relay).
  route: mpsc::UnboundedSender<CodeModeCall>,
  pending: Pending,
  /// Where a reply that must wait for the agent's credit is sent from.
  runtime: tokio::runtime::Handle,
  stopped: Arc<AtomicBool>,
  /// Ends the serving task (and its hold on the budget) at `stop`.
  stop_serving: Arc<Notify>,
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
    let Some((mut call, room)) = self.pending.lock().expect("pending").remove(&id) else {
      return true; // answered already, or timed out
    };
    let bytes = Bytes::copy_from_slice(payload);
    if !call.reply_now(&bytes) {
      self.runtime.spawn(async move {
        let _ = call.reply(bytes).await;
        drop(room);
      });
    }
    true
  }

  /// Closes the socket (the agent removes it); calls not answered yet fail.
  pub async fn stop(&self) {
    if self.stopped.swap(true, Ordering::SeqCst) {
      return;
    }
    self.stop_serving.notify_one();
    self.conn.unroute(&self.socket, &self.route);
    let _ = self.conn.client.code_mode_close(&self.socket).await;
  }
}

impl Drop for AgentRelay {
  fn drop(&mut self) {
    // Not stopped (its transport was collected): the serving task, which ends with this
    // relay, closes the socket.
    self.conn.unroute(&self.socket, &self.route);
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
  let (route, calls) = mpsc::unbounded_channel();
  conn.route(socket, route.clone());
  let spec = CodeModeListenSpec {
    socket: socket.to_string(),
    user: target.user.clone(),
  };
  if let Err(e) = conn.client.code_mode_listen(spec).await {
    conn.unroute(socket, &route);
    // The agent needs no python3: anything that stops it is a start failure.
    return Err(SandboxError::CodeModeStartFailed {
      detail: format!("the sandbox agent could not open the Code Mode socket {socket}: {e}"),
    });
  }
  let generation = next_generation();
  let stopped = Arc::new(AtomicBool::new(false));
  let stop_serving = Arc::new(Notify::new());
  let pending = Pending::default();
  let served = Serve {
    stop: stop_serving.clone(),
    generation,
    intake,
    budget,
    pending: pending.clone(),
    stopped: stopped.clone(),
  };
  serve(engine, &conn, socket, calls, served);
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
    runtime: tokio::runtime::Handle::current(),
    stopped,
    stop_serving,
  })
}

/// What a relay's serving task hands each call.
struct Serve {
  generation: u32,
  intake: Intake,
  budget: Budget,
  /// Shared with the relay, which answers from it.
  pending: Pending,
  stopped: Arc<AtomicBool>,
  stop: Arc<Notify>,
}

/// Carries calls to the sink until the relay is gone (or the engine's background work stops);
/// a relay dropped without `stop` has its socket closed here.
fn serve(
  engine: &Engine,
  conn: &Arc<Conn>,
  socket: &str,
  mut calls: mpsc::UnboundedReceiver<CodeModeCall>,
  s: Serve,
) {
  let (conn, socket) = (conn.clone(), socket.to_string());
  engine.shared.background.spawn_cancellable(async move {
    let mut next_id: u32 = 0;
    loop {
      let call = tokio::select! {
        call = calls.recv() => call,
        _ = s.stop.notified() => None,
      };
      let Some(call) = call else { break };
      next_id = next_id.wrapping_add(1);
      let (intake, budget, pending) = (s.intake.clone(), s.budget.clone(), s.pending.clone());
      tokio::spawn(hand_over(
        call,
        s.generation,
        next_id,
        intake,
        budget,
        pending,
      ));
    }
    // Calls nobody will answer now fail (dropping one fails it) and give their room back.
    s.pending.lock().expect("pending").clear();
    if !s.stopped.load(Ordering::SeqCst) && !conn.client.is_closed() {
      let _ = conn.client.code_mode_close(&socket).await;
    }
  });
}

/// The reply a caller in the sandbox receives for an error of ours, shaped as its client reads
/// it.
fn error_reply(message: &str, source: &str) -> Bytes {
  Bytes::from(json!({ "ok": false, "error": message, "source": source }).to_string())
}

/// Takes room for one call (its size is announced before its bytes; an agent that does not say
/// is taken at the largest size), reads its request, hands it to the sink, and answers it with a
/// timeout error when no reply came in time. A call over a bound is refused at once.
async fn hand_over(
  mut call: CodeModeCall,
  generation: u32,
  id: u32,
  intake: Intake,
  budget: Budget,
  pending: Pending,
) {
  let size = call.size.map_or(MAX_MESSAGE_BYTES, |s| {
    usize::try_from(s).unwrap_or(usize::MAX)
  });
  if let Some(why) = budget.refusal(size) {
    let _ = call.reply(error_reply(&why, "caller")).await;
    return;
  }
  // Until there is room, the call's bytes wait in the agent under flow control.
  let room = budget.claim(size).await;
  // The claim holds the bytes; the sandbox's pool itself must not outlive its relays (the
  // next relay there sizes a new one).
  drop(budget);
  let Ok(request) = call.read_request().await else {
    return;
  };
  let timeout = intake.timeout();
  pending.lock().expect("pending").insert(id, (call, room));
  (intake.sink)(generation, id, Vec::from(request));
  tokio::time::sleep(timeout).await;
  let late = pending.lock().expect("pending").remove(&id);
  if let Some((call, _room)) = late {
    let message = format!(
      "Code Mode request got no reply from the host within {} s",
      timeout.as_secs_f64()
    );
    let _ = call.reply(error_reply(&message, "transport")).await;
  }
}
