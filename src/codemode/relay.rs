//! One relay process in a sandbox and its attached stream: launching it, the tasks that carry
//! requests out and replies in, stopping it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::codemode::budget::Budget;
use crate::codemode::frame::{encode, Decoder, Event, KIND_READY, KIND_REPLY};
use crate::codemode::intake::Intake;
use crate::codemode::reader::{self, Inflight, Output, Reader};
use crate::codemode::{LAUNCHER, RELAY_PATH, RELAY_SOURCE};
use crate::engine::Engine;
use crate::sandbox::container::Target;
use crate::sandbox::exec::StartError;
use crate::sandbox::transfer;
use crate::util::errors::SandboxError;
use crate::util::logging::Logger;

/// One running relay process and its attached stream.
pub struct Relay {
  pub(crate) generation: u32,
  frames: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
  inflight: Arc<Inflight>,
  alive: Arc<AtomicBool>,
  ended: watch::Receiver<bool>,
  closing: CancellationToken,
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

  /// Answers request `seq` (the number the sink was given), giving its bytes back. False when
  /// it is not awaited any more or the relay is gone.
  pub(crate) fn send(&self, seq: u32, payload: &[u8]) -> bool {
    let Some(relay_id) = self.inflight.finish(seq) else {
      return false;
    };
    match self.frames.lock().expect("frames").as_ref() {
      Some(tx) => tx.send(encode(KIND_REPLY, relay_id, payload)).is_ok(),
      None => false,
    }
  }

  /// Closes the stream (the relay then removes its socket and exits) and waits for the exec
  /// to end; a relay that outlives that is killed.
  pub async fn stop(&self) {
    self.closing.cancel();
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

/// The next relay generation (Python relays and agent-served sockets share the numbers).
pub(crate) fn next_generation() -> u32 {
  GENERATION.fetch_add(1, Ordering::SeqCst).wrapping_add(1)
}

/// Uploads the relay and starts it in `target`, listening on `socket`. Returns once it
/// listens. Its requests go to `intake`, held under `budget`. Errors before the relay ran are
/// `StartError`s so the caller can start a stopped container or re-resolve a stale one.
pub async fn launch(
  engine: &Engine,
  target: &Target,
  socket: &str,
  read_only: bool,
  intake: Intake,
  budget: Budget,
  log: &Logger,
) -> std::result::Result<Relay, StartError> {
  upload(engine, target, read_only).await?;
  let (exec_id, mut output, input) = attach(engine, target, socket).await?;
  let mut decoder = Decoder::default();
  let pid = await_ready(engine, &exec_id, &mut output, &mut decoder).await?;
  let generation = next_generation();
  let alive = Arc::new(AtomicBool::new(true));
  let (ended_tx, ended) = watch::channel(false);
  let frames = spawn_writer(engine, input);
  let inflight = Arc::new(Inflight::default());
  let closing = CancellationToken::new();
  reader::spawn(
    engine,
    Reader {
      output,
      decoder,
      intake,
      budget,
      inflight: inflight.clone(),
      replies: frames.downgrade(),
      generation,
      alive: alive.clone(),
      ended: ended_tx,
      closing: closing.clone(),
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
    inflight,
    alive,
    ended,
    closing,
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
    Err(SandboxError::Engine { detail, .. }) if detail.contains("no space left on device") => {
      Err(StartError::Other(SandboxError::CodeModeStartFailed {
        detail: format!("the relay could not be written into the sandbox: {detail}"),
      }))
    }
    Err(e) => Err(StartError::Other(e)),
  }
}

type Input = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// Starts the relay's exec with its streams attached.
async fn attach(
  engine: &Engine,
  target: &Target,
  socket: &str,
) -> std::result::Result<(String, Output, Input), StartError> {
  let container = target.container_id.as_str();
  let cmd = vec![
    "/bin/sh".to_string(),
    "-c".to_string(),
    LAUNCHER.to_string(),
    "trueforge-codemode".to_string(),
    socket.to_string(),
  ];
  // As the sandbox's user, who must own the socket (the container's may be root's).
  let opts = crate::engine::attached_exec(cmd, target.user.clone());
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

/// The largest READY frame taken (its payload is a little JSON).
const READY_MAX: usize = 64 * 1024;

/// Waits for READY (its pid), keeping what the relay says on stderr in case it fails instead.
async fn await_ready(
  engine: &Engine,
  exec_id: &str,
  output: &mut Output,
  decoder: &mut Decoder,
) -> std::result::Result<u32, StartError> {
  let mut stderr = Vec::new();
  let ready = tokio::time::timeout(engine.control_timeout, async {
    while let Some(item) = output.next().await {
      match item {
        Ok(LogOutput::StdOut { message }) => {
          decoder.push(&message);
          loop {
            match decoder.next_event() {
              // READY is small; anything before it is not for us.
              Ok(Some(Event::Head(h))) if h.kind == KIND_READY && h.len <= READY_MAX => {
                decoder.accept()
              }
              Ok(Some(Event::Head(_))) => decoder.skip(),
              Ok(Some(Event::Frame(f))) => return Ok(Some(f.payload)),
              Ok(None) => break,
              Err(e) => return Err(SandboxError::Internal(e)),
            }
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
      let text = String::from_utf8_lossy(&stderr).into_owned();
      let exit = exit_code(engine, exec_id).await;
      return Err(StartError::never_started(ended_before_ready(&text, exit)));
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

/// What the launcher prints, and exits 127 with, when the image has no python3 (`LAUNCHER`):
/// the one failure that means Code Mode cannot run in this image.
pub const NO_PYTHON: &str =
  "python3 is not on PATH in this sandbox image; Code Mode needs Python 3.9 or later";
const NO_PYTHON_EXIT: i64 = 127;

/// The relay exec's exit code, once the engine reports it ended (it may lag the stream's end).
async fn exit_code(engine: &Engine, exec_id: &str) -> Option<i64> {
  for _ in 0..20 {
    let info = engine
      .inspect_exec(
        "inspect the Code Mode relay",
        exec_id,
        engine.control_timeout,
      )
      .await
      .ok()?;
    if info.running != Some(true) {
      return info.exit_code;
    }
    tokio::time::sleep(Duration::from_millis(25)).await;
  }
  None
}

/// What a relay that ended before it listened said: exactly `NO_PYTHON` for the launcher's
/// own failure; nothing when it said nothing (killed, as by its container's end: the caller
/// then asks the container); else its last lines of stderr and its exit status (a full disk).
fn ended_before_ready(stderr: &str, exit: Option<i64>) -> String {
  if exit == Some(NO_PYTHON_EXIT) && stderr.contains(NO_PYTHON) {
    return NO_PYTHON.to_string();
  }
  let lines: Vec<&str> = stderr
    .lines()
    .map(str::trim)
    .filter(|l| !l.is_empty())
    .collect();
  if lines.is_empty() {
    return String::new();
  }
  let said: String = lines[lines.len().saturating_sub(3)..]
    .join(" | ")
    .chars()
    .take(800)
    .collect();
  let status = exit.map_or("an unknown status".to_string(), |c| format!("status {c}"));
  format!("the relay exited with {status} before it listened: {said}")
}

/// The error for a relay that never listened (after `with_running` tried what it could):
/// `CodeModeUnavailable` only for an image without python3, else `CodeModeStartFailed`.
pub fn never_listened(text: String) -> SandboxError {
  match text.as_str() {
    NO_PYTHON => SandboxError::CodeModeUnavailable { reason: text },
    "" => SandboxError::CodeModeStartFailed {
      detail: "the relay ended before it listened, without a word".into(),
    },
    _ => SandboxError::CodeModeStartFailed { detail: text },
  }
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

impl Drop for Relay {
  fn drop(&mut self) {
    // Closing the stream ends the relay.
    self.closing.cancel();
    self.frames.lock().expect("frames").take();
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn only_the_launchers_own_failure_means_no_python() {
    assert!(crate::codemode::LAUNCHER.contains(NO_PYTHON));
    assert!(crate::codemode::LAUNCHER.contains(&format!("exit {NO_PYTHON_EXIT}")));
    let no_python = ended_before_ready(&format!("{NO_PYTHON}\n"), Some(127));
    assert_eq!(
      never_listened(no_python),
      SandboxError::CodeModeUnavailable {
        reason: NO_PYTHON.into()
      }
    );
    // The same words with another status are not the launcher's.
    let other = ended_before_ready(NO_PYTHON, Some(1));
    assert!(matches!(
      never_listened(other),
      SandboxError::CodeModeStartFailed { .. }
    ));
    // A full disk: Python's traceback, its last lines kept.
    let traceback = "Traceback (most recent call last):\n  File \"/trueforge/codemode/relay.py\", line 199, in <module>\n    main()\n  File \"/trueforge/codemode/relay.py\", line 162, in main\n    os.makedirs(directory, mode=0o700, exist_ok=True)\nOSError: [Errno 28] No space left on device: '/trueforge/codemode/run'\n";
    let e = never_listened(ended_before_ready(traceback, Some(1)));
    let SandboxError::CodeModeStartFailed { detail } = &e else {
      panic!("{e:?}")
    };
    assert!(detail.starts_with("the relay exited with status 1 before it listened: "));
    assert!(
      detail.ends_with("OSError: [Errno 28] No space left on device: '/trueforge/codemode/run'")
    );
    assert!(!detail.contains("Traceback"));
    assert_eq!(e.code(), "CODE_MODE_START_FAILED");
    assert!(e.to_string().contains("free disk space"));
    assert_eq!(ended_before_ready(" \n", None), "");
    assert!(matches!(
      never_listened(String::new()),
      SandboxError::CodeModeStartFailed { .. }
    ));
    assert_eq!(
      ended_before_ready("boom\n", None),
      "the relay exited with an unknown status before it listened: boom"
    );
  }
}
