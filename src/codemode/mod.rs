//! Code Mode: MCP tools callable from inside a sandbox. A small relay (`codemode/relay.py`)
//! runs in the container, started through the engine's exec API with stdin and stdout
//! attached; it listens on an owner-only Unix socket under `/trueforge/codemode/run` and
//! carries each connection's request to us over the attached stream, and our reply back, in
//! frames of a 9-byte header (kind u8, request id u32, payload length u32, big endian) and a
//! payload. No host path is mounted and no port is opened, so it works on remote engines, with
//! `network: 'none'`, a read-only root and any user. The relay is not a command: it is not run
//! through the exec wrapper, is not killed by command timeouts and does not count as activity.
//! It ends when its stream closes; a dead relay is relaunched by the next `Session::start`.
//! No napi types here.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bytes::{Buf, Bytes, BytesMut};
use futures_util::StreamExt;
use rand::Rng;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

use crate::engine::Engine;
use crate::sandbox::container::Target;
use crate::sandbox::exec::StartError;
use crate::sandbox::transfer;
use crate::util::errors::{Result, SandboxError};
use crate::util::logging::Logger;

/// Where everything Code Mode puts in a sandbox lives.
pub const DIR: &str = "/trueforge/codemode";
/// The client module TrueForge installs (its name is fixed: `from mcp_client import call_tool`).
pub const CLIENT_PATH: &str = "/trueforge/codemode/mcp_client.py";
/// `<dir>/bin`, where TrueForge links `mcp-client`; every exec has it first on `PATH`.
pub const BIN_DIR: &str = crate::sandbox::layout::CODE_MODE_BIN_DIR;
/// The relay, uploaded before each launch.
pub const RELAY_PATH: &str = "/trueforge/codemode/relay.py";
/// The relays' sockets (mode 0700, each socket 0600).
pub const SOCKET_DIR: &str = "/trueforge/codemode/run";

pub const RELAY_SOURCE: &str = include_str!("../../codemode/relay.py");
pub const CLIENT_SOURCE: &str = include_str!("../../codemode/mcp_client.py");

/// Largest request or reply, as TrueForge's own transports allow.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
const HEADER_LEN: usize = 9;
const KIND_READY: u8 = 1;
const KIND_REQUEST: u8 = 2;
const KIND_REPLY: u8 = 3;

/// $1 = the socket path. Fails fast (exit 127, a message on stderr) without python3.
const LAUNCHER: &str = r#"if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 is not on PATH in this sandbox image; Code Mode needs Python 3.9 or later" >&2
  exit 127
fi
exec python3 -I -S /trueforge/codemode/relay.py "$1""#;

/// One frame of the relay stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
  pub kind: u8,
  pub id: u32,
  pub payload: Bytes,
}

/// Encodes one frame.
pub fn encode(kind: u8, id: u32, payload: &[u8]) -> Bytes {
  let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
  out.extend_from_slice(&[kind]);
  out.extend_from_slice(&id.to_be_bytes());
  out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
  out.extend_from_slice(payload);
  out.freeze()
}

/// Reassembles frames from the stream's chunks, whatever their boundaries.
#[derive(Default)]
pub struct Decoder {
  buf: BytesMut,
}

impl Decoder {
  pub fn push(&mut self, chunk: &[u8]) {
    self.buf.extend_from_slice(chunk);
  }

  /// The next complete frame; `Err` when a header announces more than the limit (the stream
  /// cannot be trusted after that).
  pub fn next_frame(&mut self) -> std::result::Result<Option<Frame>, String> {
    if self.buf.len() < HEADER_LEN {
      return Ok(None);
    }
    let kind = self.buf[0];
    let id = u32::from_be_bytes(self.buf[1..5].try_into().expect("4 bytes"));
    let len = u32::from_be_bytes(self.buf[5..9].try_into().expect("4 bytes")) as usize;
    if len > MAX_MESSAGE_BYTES {
      return Err(format!(
        "the relay sent a frame of {len} bytes, over the limit of {MAX_MESSAGE_BYTES}"
      ));
    }
    if self.buf.len() < HEADER_LEN + len {
      self.buf.reserve(HEADER_LEN + len - self.buf.len());
      return Ok(None);
    }
    self.buf.advance(HEADER_LEN);
    let payload = self.buf.split_to(len).freeze();
    Ok(Some(Frame { kind, id, payload }))
  }
}

/// Receives each request: the relay's generation, the request id and the raw JSON bytes. The
/// answer goes back through `Session::reply` with the same generation and id.
pub type RequestSink = Arc<dyn Fn(u32, u32, Bytes) + Send + Sync>;

/// One running relay process and its attached stream.
pub struct Relay {
  generation: u32,
  frames: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
  alive: Arc<AtomicBool>,
  ended: watch::Receiver<bool>,
  pid: u32,
  exec_id: String,
  container: String,
  socket: String,
  engine: Engine,
}

impl Relay {
  pub fn is_alive(&self) -> bool {
    self.alive.load(Ordering::SeqCst)
  }

  /// The relay's pid inside the container.
  pub fn pid(&self) -> u32 {
    self.pid
  }

  fn send(&self, id: u32, payload: &[u8]) -> bool {
    match self.frames.lock().expect("frames").as_ref() {
      Some(tx) => tx.send(encode(KIND_REPLY, id, payload)).is_ok(),
      None => false,
    }
  }

  /// Closes the stream (the relay then removes its socket and exits) and waits for the exec
  /// to end; a relay that outlives that is killed.
  pub async fn stop(&self) {
    self.frames.lock().expect("frames").take();
    let mut ended = self.ended.clone();
    let closed = tokio::time::timeout(Duration::from_secs(3), ended.wait_for(|e| *e))
      .await
      .is_ok();
    if (closed && !self.exec_running().await) || self.pid == 0 {
      return;
    }
    let opts = CreateExecOptions {
      // The shell's builtin kill (images need not have a kill binary); a killed relay cannot
      // remove its socket, so this does.
      cmd: Some(vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "kill -KILL \"$1\" 2>/dev/null; rm -f \"$2\"".to_string(),
        "trueforge-codemode-stop".to_string(),
        self.pid.to_string(),
        self.socket.clone(),
      ]),
      working_dir: Some("/".to_string()),
      ..Default::default()
    };
    let engine = &self.engine;
    let limit = engine.control_timeout;
    let kill = async {
      let created = engine
        .create_exec("kill the Code Mode relay", &self.container, opts, limit)
        .await?;
      engine
        .start_exec("kill the Code Mode relay", &created, None, limit)
        .await
        .map(|_| ())
    };
    let _ = engine
      .bounded(limit, "kill the Code Mode relay", kill)
      .await;
    for _ in 0..20 {
      if !self.exec_running().await {
        break;
      }
      tokio::time::sleep(Duration::from_millis(50)).await;
    }
  }

  async fn exec_running(&self) -> bool {
    let engine = &self.engine;
    match engine
      .inspect_exec(
        "inspect the Code Mode relay",
        &self.exec_id,
        engine.control_timeout,
      )
      .await
    {
      Ok(info) => info.running == Some(true),
      Err(_) => false,
    }
  }
}

impl Drop for Relay {
  fn drop(&mut self) {
    // Closing the stream ends the relay.
    self.frames.lock().expect("frames").take();
  }
}

/// Process-wide, not per engine: a generation names one relay to the JavaScript side, which
/// sees relays of every engine through one callback, so numbers must never repeat across them.
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// Uploads the relay and starts it in `target`, listening on `socket`. Returns once it
/// listens. Errors before the relay ran are `StartError`s so the caller can start a stopped
/// container or re-resolve a stale one.
pub async fn launch(
  engine: &Engine,
  target: &Target,
  socket: &str,
  read_only: bool,
  sink: RequestSink,
  log: &Logger,
) -> std::result::Result<Relay, StartError> {
  let container = target.container_id.as_str();
  let uploaded = transfer::upload(
    engine,
    container,
    RELAY_PATH,
    RELAY_PATH,
    Bytes::from_static(RELAY_SOURCE.as_bytes()),
    target.owner,
    read_only,
  )
  .await;
  match uploaded {
    Ok(()) => {}
    Err(SandboxError::Engine { status: 404, .. }) => return Err(StartError::Gone),
    Err(e) => return Err(StartError::Other(e)),
  }
  let opts = CreateExecOptions {
    cmd: Some(vec![
      "/bin/sh".to_string(),
      "-c".to_string(),
      LAUNCHER.to_string(),
      "trueforge-codemode".to_string(),
      socket.to_string(),
    ]),
    attach_stdin: Some(true),
    attach_stdout: Some(true),
    attach_stderr: Some(true),
    tty: Some(false),
    working_dir: Some("/".to_string()),
    ..Default::default()
  };
  let created = engine
    .create_exec(
      "create the Code Mode relay exec",
      container,
      opts,
      engine.control_timeout,
    )
    .await
    .map_err(StartError::from_engine)?;
  let started = engine
    .start_exec(
      "start the Code Mode relay",
      &created,
      Some(1024 * 1024),
      engine.control_timeout,
    )
    .await
    .map_err(StartError::from_engine)?;
  let StartExecResults::Attached { mut output, input } = started else {
    return Err(StartError::Other(SandboxError::Internal(
      "the engine detached an attached exec".into(),
    )));
  };
  // Wait for READY, keeping what the relay says on stderr in case it fails instead.
  let mut decoder = Decoder::default();
  let mut stderr = Vec::new();
  let ready = tokio::time::timeout(engine.control_timeout, async {
    while let Some(item) = output.next().await {
      match item {
        Ok(LogOutput::StdOut { message }) => {
          decoder.push(&message);
          match decoder.next_frame() {
            Ok(Some(f)) if f.kind == KIND_READY => return Ok(Some(f.payload)),
            Ok(Some(_)) | Ok(None) => {}
            Err(e) => return Err(SandboxError::Internal(e)),
          }
        }
        Ok(LogOutput::StdErr { message }) => {
          if stderr.len() < 16 * 1024 {
            stderr.extend_from_slice(&message);
          }
        }
        Ok(_) => {}
        Err(e) => return Err(engine.map_error("read the Code Mode relay stream", e)),
      }
    }
    Ok(None)
  })
  .await;
  let payload = match ready {
    Err(_) => {
      return Err(StartError::Other(engine.timeout(
        "start the Code Mode relay (it never reported ready)",
        engine.control_timeout,
      )))
    }
    Ok(Err(e)) => return Err(StartError::Other(e)),
    Ok(Ok(None)) => {
      let text = String::from_utf8_lossy(&stderr).trim().to_string();
      return Err(StartError::NeverStarted(if text.is_empty() {
        "the Code Mode relay exited before it listened".to_string()
      } else {
        text
      }));
    }
    Ok(Ok(Some(p))) => p,
  };
  let pid = serde_json::from_slice::<serde_json::Value>(&payload)
    .ok()
    .and_then(|v| v["pid"].as_u64())
    .unwrap_or(0) as u32;
  let generation = GENERATION.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
  let alive = Arc::new(AtomicBool::new(true));
  let (ended_tx, ended_rx) = watch::channel(false);
  let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();

  // Writer: replies into the relay's stdin; closing the channel closes the stream. Both tasks
  // end with the engine's background work: a closed stream ends the relay in the sandbox.
  engine.shared.background.spawn_cancellable(async move {
    let mut input = input;
    while let Some(frame) = rx.recv().await {
      if input.write_all(&frame).await.is_err() {
        break;
      }
      if input.flush().await.is_err() {
        break;
      }
    }
    let _ = input.shutdown().await;
  });

  // Reader: requests out of the relay's stdout, handed to the sink in arrival order.
  {
    let alive = alive.clone();
    let log = log.clone();
    let sandbox_id = target.sandbox_id.clone();
    engine.shared.background.spawn(|stop| async move {
      let mut why = "the stream closed".to_string();
      // Hands on every complete frame; false when the stream cannot be trusted any more.
      let drain = |decoder: &mut Decoder, why: &mut String| loop {
        match decoder.next_frame() {
          Ok(Some(f)) if f.kind == KIND_REQUEST => sink(generation, f.id, f.payload),
          Ok(Some(_)) => {}
          Ok(None) => return true,
          Err(e) => {
            *why = e;
            return false;
          }
        }
      };
      // Requests that came in the same chunk as READY are already in the decoder.
      let mut ok = drain(&mut decoder, &mut why);
      while ok {
        // A stop still ends the relay as a closed stream does, so its session sees it gone.
        let next = tokio::select! {
          next = output.next() => next,
          _ = stop.cancelled() => {
            why = "the engine's last provider was disposed".to_string();
            break;
          }
        };
        let Some(item) = next else {
          break;
        };
        match item {
          Ok(LogOutput::StdOut { message }) => {
            decoder.push(&message);
            ok = drain(&mut decoder, &mut why);
          }
          Ok(LogOutput::StdErr { message }) => log.warn(
            "Code Mode relay stderr",
            json!({ "sandboxId": sandbox_id, "text": String::from_utf8_lossy(&message) }),
          ),
          Ok(_) => {}
          Err(e) => {
            why = e.to_string();
            break;
          }
        }
      }
      alive.store(false, Ordering::SeqCst);
      let _ = ended_tx.send(true);
      log.debug(
        "Code Mode relay ended",
        json!({ "sandboxId": sandbox_id, "reason": why }),
      );
    });
  }
  log.debug(
    "Code Mode relay started",
    json!({ "sandboxId": target.sandbox_id, "pid": pid, "socket": socket }),
  );
  Ok(Relay {
    generation,
    frames: Mutex::new(Some(tx)),
    alive,
    ended: ended_rx,
    pid,
    exec_id: created,
    container: container.to_string(),
    socket: socket.to_string(),
    engine: engine.clone(),
  })
}

/// Launches a relay for one sandbox; the provider supplies it (it knows how to resolve, start
/// and re-resolve a sandbox).
pub trait Launcher {
  fn launch_relay(
    &self,
    sandbox_id: &str,
    socket: &str,
    sink: RequestSink,
  ) -> impl std::future::Future<Output = Result<Relay>> + Send;
}

/// One transport's Code Mode session: its socket name, and the relay serving it in the sandbox
/// it was last started for. A transport is one agent turn; two transports on one sandbox (two
/// sub-agents with different tools) have their own sockets and relays.
pub struct Session {
  sink: RequestSink,
  socket: String,
  state: tokio::sync::Mutex<Option<(String, Arc<Relay>)>>,
  current: Mutex<Option<Arc<Relay>>>,
}

impl Session {
  pub fn new(sink: RequestSink) -> Self {
    let token = format!("{:032x}", rand::rng().random::<u128>());
    Self {
      sink,
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
  /// wait for one launch.
  pub async fn start(&self, launcher: &impl Launcher, sandbox_id: &str) -> Result<()> {
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
        .launch_relay(sandbox_id, &self.socket, self.sink.clone())
        .await?,
    );
    *self.current.lock().expect("current") = Some(relay.clone());
    *state = Some((sandbox_id.to_string(), relay));
    Ok(())
  }

  /// Sends a reply to the relay generation that asked. False when that relay is gone.
  pub fn reply(&self, generation: u32, id: u32, payload: &[u8]) -> bool {
    let relay = self.current.lock().expect("current").clone();
    match relay {
      Some(r) if r.generation == generation => r.send(id, payload),
      _ => false,
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
  fn frames_round_trip_across_any_split() {
    let mut wire = Vec::new();
    wire.extend_from_slice(&encode(KIND_READY, 0, b"{\"pid\":7}"));
    wire.extend_from_slice(&encode(KIND_REQUEST, 42, b""));
    wire.extend_from_slice(&encode(KIND_REQUEST, u32::MAX, &[0xff; 3000]));
    for step in [1, 2, 5, 9, 10, 4096] {
      let mut d = Decoder::default();
      let mut got = Vec::new();
      for chunk in wire.chunks(step) {
        d.push(chunk);
        while let Some(f) = d.next_frame().unwrap() {
          got.push(f);
        }
      }
      assert_eq!(got.len(), 3, "split {step}");
      assert_eq!(got[0].kind, KIND_READY);
      assert_eq!(&got[0].payload[..], b"{\"pid\":7}");
      assert_eq!((got[1].kind, got[1].id, got[1].payload.len()), (2, 42, 0));
      assert_eq!((got[2].id, got[2].payload.len()), (u32::MAX, 3000));
    }
  }

  #[test]
  fn oversized_frames_are_refused() {
    let mut d = Decoder::default();
    let mut header = vec![KIND_REQUEST];
    header.extend_from_slice(&1u32.to_be_bytes());
    header.extend_from_slice(&((MAX_MESSAGE_BYTES as u32) + 1).to_be_bytes());
    d.push(&header);
    assert!(d.next_frame().is_err());
  }

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

  #[test]
  fn relay_script_matches_the_paths() {
    assert!(RELAY_SOURCE.contains("MAX_MESSAGE_BYTES = 64 * 1024 * 1024"));
    assert!(LAUNCHER.contains(RELAY_PATH));
    assert!(CLIENT_PATH.ends_with("/mcp_client.py"));
    assert_eq!(format!("{DIR}/bin"), BIN_DIR);
  }
}
