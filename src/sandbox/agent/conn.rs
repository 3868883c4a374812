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
use crate::sandbox::agent::binaries::{Arch, Binary};
use crate::sandbox::agent::down::Cause;
use crate::sandbox::agent::{bounded_insert, egress, ops, place, volume, Failure, Setup, State};
use crate::sandbox::body::non_root;
use crate::sandbox::container::Target;
use crate::sandbox::exec::{is_pid_exhaustion, StartError};
use crate::util::errors::SandboxError;
use crate::util::logging::Logger;
use crate::util::timestamps;

/// A container's connection slot: `None` while none is up.
pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;
/// Code Mode calls by relay socket: who takes them, and which `route` set it.
type Routes = Arc<Mutex<HashMap<String, (u64, CallHandler)>>>;

/// Stderr bytes kept per agent (its own diagnostics only).
const MAX_STDERR: usize = 16 * 1024;
/// How long the agent has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// CapEff bits: CAP_SETGID, CAP_SETUID.
const CAP_SETGID: u64 = 1 << 6;
const CAP_SETUID: u64 = 1 << 7;

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
}

impl Conn {
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

impl State {
  fn slot(&self, container: &str) -> Slot {
    let mut conns = self.conns.lock().expect("agent conns");
    if let Some(s) = conns.get(container) {
      return s.clone();
    }
    let s = Slot::default();
    bounded_insert(&mut conns, container.to_string(), s.clone());
    s
  }

  /// Forgets `container`'s slot if it is still `slot` and holds nothing (or holds `conn`).
  fn release(&self, container: &str, slot: &Slot, conn: Option<&Arc<Conn>>) {
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
    let slots: Vec<Slot> = self
      .conns
      .lock()
      .expect("agent conns")
      .values()
      .cloned()
      .collect();
    for slot in slots {
      if let Some(c) = slot.try_lock().ok().and_then(|g| g.clone()) {
        c.client.close();
      }
    }
  }
}

/// The container's agent, started (or replaced) when there is none alive.
pub async fn connect(
  engine: &Engine,
  target: &Target,
  setup: &Setup,
  log: &Logger,
) -> Result<Arc<Conn>, Failure> {
  if !setup.enabled {
    return Err(Failure::Unavailable("the `agent` option is false".into()));
  }
  let state = engine.shared.state::<State>();
  let container = target.container_id.as_str();
  if let Some(why) = state.down(container) {
    return Err(Failure::Unavailable(why));
  }
  let slot = state.slot(container);
  let mut held = slot.lock().await;
  if let Some(c) = held.as_ref().filter(|c| !c.client.is_closed()) {
    if c.client.silent_for() < PROBE_AFTER || still_there(engine, container, c).await? {
      return Ok(c.clone());
    }
    c.client.close();
  }
  *held = None;
  match start(engine, target, setup, log).await {
    Ok(c) => {
      *held = Some(c.clone());
      drop(held);
      watch(engine, container, slot, c.clone());
      Ok(c)
    }
    Err(e) => {
      drop(held);
      state.release(container, &slot, None);
      if let Failure::Unavailable(why) = &e {
        state.fall_back(target, Cause::Start, why, log);
      }
      Err(e)
    }
  }
}

/// A connection quiet for this long is pinged before a call is sent on it.
const PROBE_AFTER: Duration = Duration::from_millis(100);
/// How long that ping may take before the connection is used anyway.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// Whether a quiet agent still answers. Its container may have stopped (or the agent died)
/// while its engine has not closed the stream yet: a call sent then would be lost with no way
/// to know whether it ran, while a ping that fails proves nothing was sent, so a new agent can
/// take the call. A slow answer is not a failure while the container runs; once it stopped (or
/// started again), the agent is gone (gVisor's engine keeps the stream of a stopped sandbox's
/// exec open), and the caller starts the container (or a new agent) again.
async fn still_there(engine: &Engine, container: &str, c: &Conn) -> Result<bool, Failure> {
  match tokio::time::timeout(PROBE_WAIT, c.client.ping()).await {
    Ok(Ok(_)) => Ok(true),
    Ok(Err(_)) => Ok(false),
    Err(_) => {
      // An engine that does not answer either (frozen, say) tells nothing: the call goes on
      // the connection, under its own deadline, as it would have without the ping.
      let inspect = engine.inspect_container("inspect the sandbox container", container);
      let Ok(info) = tokio::time::timeout(PROBE_WAIT, inspect).await else {
        return Ok(true);
      };
      let info = info.map_err(|e| Failure::Start(StartError::Other(e)))?;
      let state = info.and_then(|i| i.state);
      let started = state
        .as_ref()
        .and_then(|s| s.started_at.as_deref())
        .and_then(timestamps::parse_time_ms);
      match state.and_then(|s| s.running) {
        // Started again since this connection was made: its agent is gone, whatever its
        // stream looks like.
        Some(true) if started.is_some_and(|t| t > c.made_ms) => Ok(false),
        Some(true) => Ok(true),
        _ => {
          c.client.close();
          Err(Failure::Start(StartError::NotRunning))
        }
      }
    }
  }
}

/// Forgets the connection once it ends. Not one of the engine's background tasks: it is the
/// connection's own, and ends with it (`State::close_all` ends them all).
fn watch(engine: &Engine, container: &str, slot: Slot, conn: Arc<Conn>) {
  let (state, container) = (engine.shared.state::<State>(), container.to_string());
  tokio::spawn(async move {
    conn.client.closed().await;
    state.release(&container, &slot, Some(&conn));
  });
}

async fn start(
  engine: &Engine,
  target: &Target,
  setup: &Setup,
  log: &Logger,
) -> Result<Arc<Conn>, Failure> {
  let bundle = setup
    .binaries
    .bundle()
    .await
    .map_err(Failure::Unavailable)?;
  let arch = image_arch(engine, &target.agent.image).await?;
  let binary = bundle.get(arch).ok_or_else(|| {
    Failure::Unavailable(format!(
      "its image is built for {} and this package carries no agent binary for that platform",
      arch.name()
    ))
  })?;
  let path = binary_path(engine, target, &bundle.tag, binary).await?;
  let user = target.user.as_deref();
  // Podman drops every capability of a sandbox whose user is not root (`body::podman_adjust`):
  // there the agent starts as that user at once.
  let first = (engine.podman && non_root(user)).then_some(user).flatten();
  let mut conn = launch(engine, &target.container_id, &path, arch, first).await?;
  let switch = CAP_SETUID | CAP_SETGID;
  if first.is_none() && conn.hello().cap_eff & switch != switch && non_root(user) {
    // No capability to switch users: the agent runs as the sandbox's user itself.
    conn.client.close();
    conn = launch(engine, &target.container_id, &path, arch, user).await?;
  }
  // The static `mcp-client` and its directories, in sandboxes made by an earlier version too.
  // Best effort: a workload that planted a link there only loses the static client.
  let _ = ops::lay_out(&conn, ops::code_mode_layout(&conn, target)).await;
  let conn = Arc::new(conn);
  // Under a policy the sandbox has no network but this: a port that cannot be opened leaves it
  // with none at all, which is safe, and says so.
  if let Err(why) = egress::attach(engine, &conn, target, log).await {
    log.warn(
      "the sandbox's egress port is not open: it reaches nothing outside",
      serde_json::json!({ "sandboxId": target.sandbox_id, "reason": why }),
    );
  }
  Ok(conn)
}

/// The platform of an image (cached per image id).
async fn image_arch(engine: &Engine, image: &str) -> Result<Arch, Failure> {
  let state = engine.shared.state::<State>();
  if let Some(a) = state.archs.lock().expect("archs").get(image) {
    return Ok(*a);
  }
  let info = engine
    .inspect_image(image)
    .await
    .map_err(|e| Failure::Start(StartError::Other(e)))?
    .ok_or_else(|| {
      Failure::Unavailable(format!(
        "its image {image} is no longer in the engine, so its platform is unknown"
      ))
    })?;
  let name = info.architecture.unwrap_or_default();
  let arch = Arch::of_image(&name).ok_or_else(|| {
    Failure::Unavailable(format!(
      "its image is built for {name:?}, a platform the agent is not built for"
    ))
  })?;
  bounded_insert(
    &mut state.archs.lock().expect("archs"),
    image.to_string(),
    arch,
  );
  Ok(arch)
}

/// The binary's path: in the container's agent volume when it mounts ours, else placed.
async fn binary_path(
  engine: &Engine,
  target: &Target,
  tag: &str,
  binary: &Binary,
) -> Result<String, Failure> {
  let mount = volume::mount_dir(tag);
  if target.agent.mounted.as_deref() == Some(mount.as_str()) {
    return Ok(format!("{mount}/{}", binary.arch.file_name()));
  }
  let placed = place::ensure(
    engine,
    &target.container_id,
    target.agent.read_only_root,
    tag,
    binary,
  )
  .await
  .map_err(|e| Failure::Start(StartError::from_engine(e)))?;
  placed.map_err(|why| Failure::Unavailable(format!("the agent cannot be placed: {why}")))
}

type Output = std::pin::Pin<
  Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
>;

/// The agent stream's first read buffer, kept small: it grows for a larger frame, and an idle
/// connection holds it for as long as its sandbox lives, so it is the host's cost per sandbox.
const OUTPUT_BUFFER: usize = 64 * 1024;

/// Starts the agent at `path` (as root, or as `user`) and waits for its hello.
async fn launch(
  engine: &Engine,
  container: &str,
  path: &str,
  arch: Arch,
  user: Option<&str>,
) -> Result<Conn, Failure> {
  let start = |e| Failure::Start(StartError::from_engine(e));
  let runs_as = Some(user.unwrap_or("0:0").to_string());
  let opts = crate::engine::attached_exec(vec![path.to_string()], runs_as);
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
  let reader = StreamReader::new(stdout_of(output, stderr.clone()));
  let opts = ClientOptions {
    expected_version: Some(trueforge_agent_proto::VERSION.to_string()),
    hello_timeout: HELLO_TIMEOUT.min(limit),
  };
  let client = match AgentClient::connect(reader, input, opts).await {
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
  })
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
