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
use tokio::sync::mpsc;
use trueforge_agent_proto::client::CodeModeCall;
use trueforge_agent_proto::msg::CodeModeListenSpec;

use crate::codemode::relay::{next_generation, Relay};
use crate::codemode::session::RequestSink;
use crate::engine::Engine;
use crate::sandbox::agent::Conn;
use crate::sandbox::container::Target;
use crate::util::errors::{Result, SandboxError};
use crate::util::logging::Logger;

/// What serves a session's socket: the agent, or (without it) the Python relay.
pub enum Served {
  Python(Relay),
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

/// Calls handed to the JavaScript side and not answered yet, by id.
type Pending = Arc<Mutex<HashMap<u32, CodeModeCall>>>;

/// One session's socket, served by the sandbox's agent.
pub struct AgentRelay {
  pub(crate) generation: u32,
  conn: Arc<Conn>,
  socket: String,
  /// Where the agent's calls for `socket` go (kept to unroute exactly this relay).
  route: mpsc::UnboundedSender<CodeModeCall>,
  replies: mpsc::UnboundedSender<(u32, Bytes)>,
  stopped: Arc<AtomicBool>,
}

impl AgentRelay {
  pub fn is_alive(&self) -> bool {
    !self.stopped.load(Ordering::SeqCst) && !self.conn.client.is_closed()
  }

  pub(crate) fn send(&self, id: u32, payload: &[u8]) -> bool {
    self.is_alive()
      && self
        .replies
        .send((id, Bytes::copy_from_slice(payload)))
        .is_ok()
  }

  /// Closes the socket (the agent removes it); calls not answered yet fail.
  pub async fn stop(&self) {
    if self.stopped.swap(true, Ordering::SeqCst) {
      return;
    }
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
/// `sink`.
pub async fn listen(
  engine: &Engine,
  conn: Arc<Conn>,
  target: &Target,
  socket: &str,
  sink: RequestSink,
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
    return Err(SandboxError::CodeModeUnavailable {
      reason: format!("the sandbox agent could not open the Code Mode socket: {e}"),
    });
  }
  let generation = next_generation();
  let (replies, replies_rx) = mpsc::unbounded_channel();
  let stopped = Arc::new(AtomicBool::new(false));
  let channels = Channels {
    calls,
    replies: replies_rx,
  };
  serve(
    engine,
    &conn,
    socket,
    channels,
    generation,
    sink,
    stopped.clone(),
  );
  log.debug(
    "Code Mode served by the sandbox agent",
    json!({ "sandboxId": target.sandbox_id, "socket": socket }),
  );
  Ok(AgentRelay {
    generation,
    conn,
    socket: socket.to_string(),
    route,
    replies,
    stopped,
  })
}

/// What a relay's serving task receives: the agent's calls, the JavaScript side's replies.
struct Channels {
  calls: mpsc::UnboundedReceiver<CodeModeCall>,
  replies: mpsc::UnboundedReceiver<(u32, Bytes)>,
}

/// Carries calls to the sink and replies back until the relay is gone (or the engine's
/// background work stops); a relay dropped without `stop` has its socket closed here.
fn serve(
  engine: &Engine,
  conn: &Arc<Conn>,
  socket: &str,
  mut ch: Channels,
  generation: u32,
  sink: RequestSink,
  stopped: Arc<AtomicBool>,
) {
  let (conn, socket) = (conn.clone(), socket.to_string());
  engine.shared.background.spawn_cancellable(async move {
    let pending = Pending::default();
    let mut next_id: u32 = 0;
    loop {
      tokio::select! {
        call = ch.calls.recv() => {
          let Some(call) = call else { break };
          next_id = next_id.wrapping_add(1);
          tokio::spawn(hand_over(call, generation, next_id, sink.clone(), pending.clone()));
        }
        reply = ch.replies.recv() => {
          let Some((id, bytes)) = reply else { break };
          let call = pending.lock().expect("pending").remove(&id);
          if let Some(call) = call {
            tokio::spawn(async move {
              let _ = call.reply(bytes).await;
            });
          }
        }
      }
    }
    // Calls nobody will answer now fail (dropping one fails it).
    pending.lock().expect("pending").clear();
    if !stopped.load(Ordering::SeqCst) && !conn.client.is_closed() {
      let _ = conn.client.code_mode_close(&socket).await;
    }
  });
}

/// Reads one call's request and hands it to the sink. Its size is known before its bytes are
/// read: this is where the host's room for in-flight requests is taken.
async fn hand_over(
  mut call: CodeModeCall,
  generation: u32,
  id: u32,
  sink: RequestSink,
  pending: Pending,
) {
  let Ok(request) = call.read_request().await else {
    return;
  };
  pending.lock().expect("pending").insert(id, call);
  sink(generation, id, request);
}
