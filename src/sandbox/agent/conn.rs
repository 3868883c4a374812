//! Connections: one agent per container per process, started through an engine exec as root
//! (stdin, stdout and stderr attached, no TTY), its stdout frames read as one byte stream by the
//! protocol's `AgentClient`, its stderr kept (bounded) for messages. Concurrent first calls share
//! one start; a connection that ended (the agent died, the container stopped or restarted) is
//! dropped, and the next call starts a new agent. Where the container gives no capability to
//! switch users (Podman with a non-root user, whose capabilities are all dropped), the agent is
//! started as the sandbox's user instead and runs everything as itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::StartExecResults;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio_util::io::StreamReader;
use trueforge_agent_proto::client::{AgentClient, CallHandler, ClientError, ClientOptions};
use trueforge_agent_proto::msg::Hello;

use crate::engine::Engine;
use crate::sandbox::agent::binaries::Arch;
use crate::sandbox::agent::link;
use crate::sandbox::exec::{is_pid_exhaustion, StartError};
use crate::util::bounded::bounded_insert;
use crate::util::errors::SandboxError;
use crate::util::timestamps;

/// A container's connection slot: `None` while none is up.
pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;
/// Code Mode calls by relay socket: who takes them, and which `route` set it.
type Routes = Arc<Mutex<HashMap<String, (u64, CallHandler)>>>;

/// Stderr bytes kept per agent (its own diagnostics only).
const MAX_STDERR: usize = 16 * 1024;
/// How long the agent has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no agent serves a call.
#[derive(Debug)]
pub enum Failure {
  /// The container is not running, gone, or out of processes: the caller recovers as for an
  /// engine exec (`provider::retry`).
  Start(StartError),
  /// The agent cannot run in this container (no binary for its platform, an exec format
  /// error, the option is off …): calls take the engine's exec and archive endpoints.
  Unavailable(String),
}

/// One live agent in one container.
pub struct Conn {
  pub client: AgentClient,
  /// Started as the sandbox's user (the container gives no capability to switch users): it
  /// runs everything as itself, and cannot keep the idle stop's root-owned file.
  pub as_user: bool,
  /// The binary's path in the container.
  pub path: String,
  pub arch: Arch,
  stderr: Arc<Mutex<Vec<u8>>>,
  routes: Routes,
  /// When the connection was made, in ms since the epoch: a container started after that runs
  /// another agent (gVisor keeps the old agent's stream open across a restart).
  made_ms: u64,
  /// Linked: the agent's exec, kept until the connection goes.
  lifeline: Option<Lifeline>,
}

impl Conn {
  /// When the connection was made, in ms since the epoch.
  pub fn made_ms(&self) -> u64 {
    self.made_ms
  }

  /// Whether the agent is linked (`link`): its frames bypass the engine.
  pub fn linked(&self) -> bool {
    self.lifeline.is_some()
  }

  pub fn hello(&self) -> &Hello {
    self.client.hello()
  }

  /// What the agent said on stderr (bounded).
  pub fn stderr(&self) -> String {
    String::from_utf8_lossy(&self.stderr.lock().expect("stderr")).into_owned()
  }

  /// Code Mode calls to `socket` go to `handler` from now on (called on the connection's
  /// reader task: it must not block). The number names this route to `unroute`.
  pub fn route(&self, socket: &str, handler: CallHandler) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    self
      .routes
      .lock()
      .expect("routes")
      .insert(socket.to_string(), (id, handler));
    id
  }

  /// Stops routing `socket`'s calls by route `id` (a later `route` of the same socket stays).
  pub fn unroute(&self, socket: &str, id: u64) {
    let removed = {
      let mut routes = self.routes.lock().expect("routes");
      match routes.get(socket) {
        Some((current, _)) if *current == id => routes.remove(socket),
        _ => None,
      }
    };
    // The handler (and what it holds) goes outside the lock.
    drop(removed);
  }
}

/// The connections of one engine (kept per engine: `EngineShared::state`).
#[derive(Default)]
pub struct Conns {
  /// One connection slot per container, while it has a live agent or a start under way.
  conns: Mutex<HashMap<String, Slot>>,
}

impl Conns {
  /// Containers with a live agent connection (or one starting).
  pub fn connections(&self) -> usize {
    self.conns.lock().expect("agent conns").len()
  }

  /// Containers whose live agent is linked (`link`).
  pub fn linked(&self) -> usize {
    self
      .held()
      .iter()
      .filter(|c| c.linked() && !c.client.is_closed())
      .count()
  }

  /// The connections held now (those whose start is under way are left out).
  fn held(&self) -> Vec<Arc<Conn>> {
    let slots: Vec<Slot> = self
      .conns
      .lock()
      .expect("agent conns")
      .values()
      .cloned()
      .collect();
    slots
      .iter()
      .filter_map(|s| s.try_lock().ok().and_then(|g| g.clone()))
      .collect()
  }

  pub(crate) fn slot(&self, container: &str) -> Slot {
    let mut conns = self.conns.lock().expect("agent conns");
    if let Some(s) = conns.get(container) {
      return s.clone();
    }
    let s = Slot::default();
    bounded_insert(&mut conns, container.to_string(), s.clone());
    s
  }

  /// Forgets `container`'s slot if it is still `slot` and holds nothing (or holds `conn`).
  pub(crate) fn release(&self, container: &str, slot: &Slot, conn: Option<&Arc<Conn>>) {
    let mut conns = self.conns.lock().expect("agent conns");
    let Some(current) = conns.get(container) else {
      return;
    };
    if !Arc::ptr_eq(current, slot) {
      return;
    }
    let Ok(held) = current.try_lock() else {
      return;
    };
    let same = match (held.as_ref(), conn) {
      (None, _) => true,
      (Some(h), Some(c)) => Arc::ptr_eq(h, c),
      (Some(_), None) => false,
    };
    drop(held);
    if same {
      conns.remove(container);
    }
  }

  /// Closes `container`'s agent connection, if it has one (the next call starts a new agent).
  pub(crate) fn close_conn(&self, container: &str) {
    let slot = self
      .conns
      .lock()
      .expect("agent conns")
      .get(container)
      .cloned();
    if let Some(c) = slot.and_then(|s| s.try_lock().ok().and_then(|g| g.clone())) {
      c.client.close();
    }
  }

  /// Closes every agent connection (the engine's last provider was disposed): each agent
  /// exits, and the next call starts a new one.
  pub fn close_all(&self) {
    for c in self.held() {
      c.client.close();
    }
  }
}

/// Forgets the connection once it ends. Not one of the engine's background tasks: it is the
/// connection's own, and ends with it (`Conns::close_all` ends them all).
pub(crate) fn watch(engine: &Engine, container: &str, slot: Slot, conn: Arc<Conn>) {
  let (state, container) = (engine.shared.state::<Conns>(), container.to_string());
  tokio::spawn(async move {
    conn.client.closed().await;
    state.release(&container, &slot, Some(&conn));
  });
}

type Output = std::pin::Pin<
  Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
>;

/// The agent stream's first read buffer, kept small: it grows for a larger frame, and an idle
/// connection holds it for as long as its sandbox lives, so it is the host's cost per sandbox.
const OUTPUT_BUFFER: usize = 64 * 1024;

/// Starts the agent at `path` (as root, or as `user`) and waits for its hello: linked to a
/// socket in the sandbox's link directory `link` (on this machine) where it can reach one, else
/// on its exec stream.
pub(crate) async fn launch(
  engine: &Engine,
  container: &str,
  path: &str,
  arch: Arch,
  user: Option<&str>,
  link: Option<&str>,
) -> Result<Conn, Failure> {
  let start = |e| Failure::Start(StartError::from_engine(e));
  let runs_as = Some(user.unwrap_or("0:0").to_string());
  // An agent started as the sandbox's user cannot enter the directory (0700, the server's user's).
  let listening = link.filter(|_| user.is_none()).and_then(link::listen);
  let mut cmd = vec![path.to_string()];
  if let Some((_, socket)) = &listening {
    cmd.extend(["--link".to_string(), socket.inside.clone()]);
  }
  let opts = crate::engine::attached_exec(cmd, runs_as);
  let limit = engine.control_timeout;
  let op = "start the sandbox agent";
  let id = engine
    .create_exec(op, container, opts, limit)
    .await
    .map_err(start)?;
  let StartExecResults::Attached { output, input } = engine
    .start_exec(op, &id, Some(OUTPUT_BUFFER), limit)
    .await
    .map_err(start)?
  else {
    return Err(Failure::Start(StartError::Other(SandboxError::Internal(
      "the engine detached an attached exec".into(),
    ))));
  };
  let stderr = Arc::new(Mutex::new(Vec::new()));
  let mut reader = StreamReader::new(stdout_of(output, stderr.clone()));
  let opts = ClientOptions {
    expected_version: Some(trueforge_agent_proto::VERSION.to_string()),
    hello_timeout: HELLO_TIMEOUT.min(limit),
  };
  let socket = match listening {
    Some((listener, _file)) => match linked(listener, &mut reader, opts.hello_timeout).await {
      Linked::Socket(s) => Some(s),
      Linked::Stdout => {
        link::give_up(engine);
        None
      }
      Linked::Neither => None,
    },
    None => None,
  };
  let (connected, lifeline) = match socket {
    Some(socket) => {
      let (r, w) = socket.into_split();
      let connected = AgentClient::connect(r, w, opts).await;
      (connected, Some(Lifeline::hold(input, reader)))
    }
    None => (AgentClient::connect(reader, input, opts).await, None),
  };
  let client = match connected {
    Ok(c) => c,
    Err(e) => return Err(no_hello(engine, container, e, &stderr).await),
  };
  if client.hello().arch != arch.name() {
    client.close();
    return Err(Failure::Unavailable(format!(
      "the agent reports {} where {} was expected",
      client.hello().arch,
      arch.name()
    )));
  }
  let routes = Routes::default();
  serve_calls(&client, routes.clone());
  Ok(Conn {
    client,
    as_user: user.is_some(),
    path: path.to_string(),
    arch,
    stderr,
    routes,
    made_ms: timestamps::now_ms(),
    lifeline,
  })
}

/// Where an agent given a socket went.
enum Linked {
  Socket(tokio::net::UnixStream),
  /// It spoke on its exec's stdout: it could not reach the socket.
  Stdout,
  /// Neither within the limit, or its exec ended: the hello's wait says why.
  Neither,
}

/// Waits for the agent to connect to `listener`, or to say hello on its exec's stdout instead
/// (the hello then waits in `reader`).
async fn linked<R>(listener: tokio::net::UnixListener, reader: &mut R, limit: Duration) -> Linked
where
  R: tokio::io::AsyncBufRead + Unpin,
{
  use tokio::io::AsyncBufReadExt;
  let first = async {
    tokio::select! {
      biased;
      accepted = listener.accept() => match accepted {
        Ok((s, _)) => Linked::Socket(s),
        Err(_) => Linked::Neither,
      },
      said = reader.fill_buf() => match said {
        Ok(b) if !b.is_empty() => Linked::Stdout,
        _ => Linked::Neither,
      },
    }
  };
  tokio::time::timeout(limit, first)
    .await
    .unwrap_or(Linked::Neither)
}

/// A linked agent's exec: its stdin is held open (its end ends the agent) and its output read
/// to its end (stderr is kept for messages), until the connection is dropped.
struct Lifeline {
  _stop: tokio_util::sync::DropGuard,
}

impl Lifeline {
  fn hold<R>(mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>, mut output: R) -> Self
  where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
  {
    use tokio::io::AsyncWriteExt;
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
      let mut sink = tokio::io::sink();
      let drained = tokio::io::copy(&mut output, &mut sink);
      tokio::select! {
        _ = drained => {}
        _ = stopped.cancelled() => {
          let _ = tokio::time::timeout(HELLO_TIMEOUT, input.shutdown()).await;
        }
      }
    });
    Self {
      _stop: stop.drop_guard(),
    }
  }
}

/// The exec's stdout as bytes; stderr goes to `stderr` (bounded).
fn stdout_of(
  output: Output,
  stderr: Arc<Mutex<Vec<u8>>>,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static {
  output.filter_map(move |item| {
    futures_util::future::ready(match item {
      Ok(LogOutput::StdOut { message }) => Some(Ok(message)),
      Ok(LogOutput::StdErr { message }) => {
        let mut kept = stderr.lock().expect("stderr");
        let room = MAX_STDERR.saturating_sub(kept.len());
        kept.extend_from_slice(&message[..message.len().min(room)]);
        None
      }
      Ok(_) => None,
      Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
    })
  })
}

/// Hands each Code Mode call to the session that listens on its socket, as it arrives; a call
/// for no socket of ours is dropped, which fails it.
fn serve_calls(client: &AgentClient, routes: Routes) {
  client.on_code_mode_call(Arc::new(move |call| {
    let handler = routes
      .lock()
      .expect("routes")
      .get(&call.socket)
      .map(|(_, h)| h.clone());
    if let Some(h) = handler {
      h(call);
    }
  }));
}

/// What a start that never got the hello means: a container that stopped or went meanwhile, one
/// out of processes, or an agent that cannot run here (the text says why).
async fn no_hello(
  engine: &Engine,
  container: &str,
  e: ClientError,
  stderr: &Mutex<Vec<u8>>,
) -> Failure {
  let mut text = e.to_string();
  let err = String::from_utf8_lossy(&stderr.lock().expect("stderr")).into_owned();
  if !err.trim().is_empty() {
    text = format!("{text}; stderr: {}", err.trim());
  }
  if is_pid_exhaustion(&text) {
    return Failure::Start(StartError::NeverStarted(text));
  }
  match engine
    .inspect_container("inspect the sandbox container", container)
    .await
  {
    Ok(None) => Failure::Start(StartError::Gone),
    Ok(Some(info)) if info.state.as_ref().and_then(|s| s.running) != Some(true) => {
      Failure::Start(StartError::NotRunning)
    }
    Ok(Some(_)) => Failure::Unavailable(text),
    Err(e) => Failure::Start(StartError::Other(e)),
  }
}
