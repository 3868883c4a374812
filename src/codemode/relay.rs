//! One relay process in a sandbox and its attached stream: launching it, the tasks that carry
//! requests out and replies in, stopping it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

use crate::codemode::frame::{encode, Decoder, KIND_READY, KIND_REPLY, KIND_REQUEST};
use crate::codemode::session::RequestSink;
use crate::codemode::{LAUNCHER, RELAY_PATH, RELAY_SOURCE};
use crate::engine::Engine;
use crate::sandbox::container::Target;
use crate::sandbox::exec::StartError;
use crate::sandbox::transfer;
use crate::util::errors::SandboxError;
use crate::util::logging::{Level, Logger};

/// One running relay process and its attached stream.
pub struct Relay {
  pub(crate) generation: u32,
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

  pub(crate) fn send(&self, id: u32, payload: &[u8]) -> bool {
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
  upload(engine, target, read_only).await?;
  let (exec_id, mut output, input) = attach(engine, &target.container_id, socket).await?;
  let mut decoder = Decoder::default();
  let pid = await_ready(engine, &mut output, &mut decoder).await?;
  let generation = GENERATION.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
  let alive = Arc::new(AtomicBool::new(true));
  let (ended_tx, ended) = watch::channel(false);
  let frames = spawn_writer(engine, input);
  spawn_reader(
    engine,
    Reader {
      output,
      decoder,
      sink,
      generation,
      alive: alive.clone(),
      ended: ended_tx,
      sandbox_id: target.sandbox_id.clone(),
      log: log.clone(),
    },
  );
  log.debug(
    "Code Mode relay started",
    json!({ "sandboxId": target.sandbox_id, "pid": pid, "socket": socket }),
  );
  Ok(Relay {
    generation,
    frames: Mutex::new(Some(frames)),
    alive,
    ended,
    pid,
    exec_id,
    container: target.container_id.clone(),
    socket: socket.to_string(),
    engine: engine.clone(),
  })
}

/// Puts the relay's script in the sandbox (before each launch: a sandbox may be older).
async fn upload(
  engine: &Engine,
  target: &Target,
  read_only: bool,
) -> std::result::Result<(), StartError> {
  let uploaded = transfer::upload(
    engine,
    &target.container_id,
    RELAY_PATH,
    RELAY_PATH,
    Bytes::from_static(RELAY_SOURCE.as_bytes()),
    target.owner,
    read_only,
  )
  .await;
  match uploaded {
    Ok(()) => Ok(()),
    Err(SandboxError::Engine { status: 404, .. }) => Err(StartError::Gone),
    Err(e) => Err(StartError::Other(e)),
  }
}

type Output = std::pin::Pin<
  Box<dyn futures_util::Stream<Item = std::result::Result<LogOutput, BollardError>> + Send>,
>;
type Input = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// Starts the relay's exec with its streams attached.
async fn attach(
  engine: &Engine,
  container: &str,
  socket: &str,
) -> std::result::Result<(String, Output, Input), StartError> {
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
  let limit = engine.control_timeout;
  let created = engine
    .create_exec("create the Code Mode relay exec", container, opts, limit)
    .await
    .map_err(StartError::from_engine)?;
  let started = engine
    .start_exec(
      "start the Code Mode relay",
      &created,
      Some(1024 * 1024),
      limit,
    )
    .await
    .map_err(StartError::from_engine)?;
  match started {
    StartExecResults::Attached { output, input } => Ok((created, output, input)),
    StartExecResults::Detached => Err(StartError::Other(SandboxError::Internal(
      "the engine detached an attached exec".into(),
    ))),
  }
}

/// Waits for READY (its pid), keeping what the relay says on stderr in case it fails instead.
async fn await_ready(
  engine: &Engine,
  output: &mut Output,
  decoder: &mut Decoder,
) -> std::result::Result<u32, StartError> {
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
  Ok(
    serde_json::from_slice::<serde_json::Value>(&payload)
      .ok()
      .and_then(|v| v["pid"].as_u64())
      .unwrap_or(0) as u32,
  )
}

/// Writes replies into the relay's stdin; closing the channel closes the stream. It ends with
/// the engine's background work: a closed stream ends the relay in the sandbox.
fn spawn_writer(engine: &Engine, mut input: Input) -> mpsc::UnboundedSender<Bytes> {
  let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
  engine.shared.background.spawn_cancellable(async move {
    while let Some(frame) = rx.recv().await {
      if input.write_all(&frame).await.is_err() || input.flush().await.is_err() {
        break;
      }
    }
    let _ = input.shutdown().await;
  });
  tx
}

/// What the reader task owns.
struct Reader {
  output: Output,
  decoder: Decoder,
  sink: RequestSink,
  pub(crate) generation: u32,
  alive: Arc<AtomicBool>,
  ended: watch::Sender<bool>,
  sandbox_id: String,
  log: Logger,
}

impl Reader {
  /// Hands on every complete request; `Err` (why) when the stream cannot be trusted any more.
  fn drain(&mut self) -> std::result::Result<(), String> {
    loop {
      match self.decoder.next_frame()? {
        Some(f) if f.kind == KIND_REQUEST => (self.sink)(self.generation, f.id, f.payload),
        Some(_) => {}
        None => return Ok(()),
      }
    }
  }
}

/// Reads requests out of the relay's stdout, handing them to the sink in arrival order, until
/// the stream ends or the engine's background work is stopped (which also ends the relay, so
/// its session sees it gone).
fn spawn_reader(engine: &Engine, mut r: Reader) {
  engine.shared.background.spawn(|stop| async move {
    // Requests that came in the same chunk as READY are already in the decoder.
    let mut outcome = r.drain();
    while outcome.is_ok() {
      let next = tokio::select! {
        next = r.output.next() => next,
        _ = stop.cancelled() => {
          outcome = Err("the engine's last provider was disposed".to_string());
          break;
        }
      };
      match next {
        None => break,
        Some(Ok(LogOutput::StdOut { message })) => {
          r.decoder.push(&message);
          outcome = r.drain();
        }
        Some(Ok(LogOutput::StdErr { message })) => r.log.sandbox_text(
          Level::Warn,
          "Code Mode relay stderr",
          &r.sandbox_id,
          "text",
          &message,
          json!({ "sandboxId": r.sandbox_id }),
        ),
        Some(Ok(_)) => {}
        Some(Err(e)) => outcome = Err(e.to_string()),
      }
    }
    r.alive.store(false, Ordering::SeqCst);
    let _ = r.ended.send(true);
    Logger::sandbox_text_ended(&r.sandbox_id);
    let why = outcome
      .err()
      .unwrap_or_else(|| "the stream closed".to_string());
    r.log.debug(
      "Code Mode relay ended",
      json!({ "sandboxId": r.sandbox_id, "reason": why }),
    );
  });
}

impl Drop for Relay {
  fn drop(&mut self) {
    // Closing the stream ends the relay.
    self.frames.lock().expect("frames").take();
  }
}
