//! Code Mode on a lane of its own: the agent serves the session's socket in a process of its own
//! (`trueforge-agent codemode-lane`), on an exec whose stream we take over from the engine's
//! Unix socket ourselves, so that the JavaScript thread reads it directly. A call then reaches
//! the dispatcher with no thread of ours in between (a wake-up of another thread costs more on a
//! virtual machine than the rest of the call's way through the host), and its reply is written
//! from the JavaScript thread too. The frames are those of the Python relay (`frame`); what the
//! relay's reader does on a task (the budget, the timeouts, the stderr) is done here as the bytes
//! are fed in. Only for engines on a local Unix socket; elsewhere the agent's own connection
//! carries the calls (`by_agent`).

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use bytes::BytesMut;
use futures_util::StreamExt;
use serde_json::json;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use trueforge_agent_proto::client::outbox::Outbox;

use crate::codemode::budget::{self, Admission, Budget, Claim};
use crate::codemode::frame::{
  encode, Decoder, Event, Frame, Head, KIND_READY, KIND_REPLY, KIND_REQUEST,
};
use crate::codemode::intake::{Intake, Request};
use crate::codemode::meter::Unfit;
use crate::codemode::reader::{error_reply, Inflight};
use crate::codemode::relay::next_generation;
use crate::engine::Engine;
use crate::sandbox::agent::Conn;
use crate::sandbox::container::Target;
use crate::util::logging::{Level, Logger};

/// The largest response head the engine is expected to send before the stream.
const HEAD_MAX: usize = 16 * 1024;
/// The largest READY frame taken.
const READY_MAX: usize = 64 * 1024;
/// What the lane said on stderr before READY, kept for the message.
const STDERR_MAX: usize = 16 * 1024;

/// The engine's Unix socket, when a lane can be had there.
pub fn socket_of(engine: &Engine) -> Option<String> {
  engine.host.strip_prefix("unix://").map(str::to_string)
}

/// Calls fed in, for the JavaScript side to dispatch.
#[derive(Default)]
pub struct Fed {
  pub calls: Vec<(u32, Request)>,
  /// No room for the next call: stop reading until `room` returns.
  pub paused: bool,
}

/// What feeding keeps between chunks.
#[derive(Default)]
struct Feed {
  mux: Mux,
  frames: Decoder,
  /// A request's head waits for room for its payload.
  waiting: Option<Head>,
  claim: Option<Claim>,
  /// A request read and measured waits for room for its values.
  admitting: Option<Admitting>,
}

struct Admitting {
  frame: Frame,
  claim: Claim,
  room: usize,
  deadline: Instant,
  /// Its room is held: hand it on.
  fitted: bool,
}

/// One socket served on a lane.
pub struct Lane {
  pub(crate) generation: u32,
  out: Arc<Outbox>,
  feed: Mutex<Feed>,
  inflight: Arc<Inflight>,
  intake: Intake,
  budget: Budget,
  alive: Arc<AtomicBool>,
  closing: CancellationToken,
  /// The stream's descriptor for the JavaScript side, until taken.
  js: Mutex<Option<OwnedFd>>,
  /// The stream again, to see whether it has ended without reading it (the JavaScript side
  /// hears of that only when its thread is free).
  probe: OwnedFd,
  pid: u32,
  exec_id: String,
  container: String,
  /// The socket, and the user it belongs to (who removes it when the lane cannot).
  socket: String,
  user: Option<String>,
  /// Who the lane runs as (root, or the sandbox's user where the agent cannot switch users).
  runs_as: Option<String>,
  sandbox_id: String,
  engine: Engine,
  log: Logger,
}

impl Lane {
  pub fn is_alive(&self) -> bool {
    if !self.alive.load(Ordering::SeqCst) {
      return false;
    }
    // Nothing unread and the end of the stream: the lane is gone (its container stopped).
    let mut byte = 0u8;
    // SAFETY: one byte into a local, from a descriptor this lane owns.
    let n = unsafe {
      libc::recv(
        self.probe.as_raw_fd(),
        (&mut byte as *mut u8).cast(),
        1,
        libc::MSG_PEEK | libc::MSG_DONTWAIT,
      )
    };
    if n > 0 || (n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock)
    {
      return true;
    }
    self.end();
    false
  }

  pub fn pid(&self) -> u32 {
    self.pid
  }

  /// The stream's descriptor, once: the JavaScript side reads it and closes it.
  pub fn take_fd(&self) -> Option<OwnedFd> {
    self.js.lock().expect("lane fd").take()
  }

  /// Answers call `seq`, from the caller's thread when the stream takes it at once.
  pub(crate) fn send(&self, seq: u32, payload: &[u8]) -> bool {
    let Some(relay_id) = self.inflight.finish(seq) else {
      return false;
    };
    // Header and payload in one buffer: one write, one wake-up of the engine and the lane.
    self.out.send([encode(KIND_REPLY, relay_id, payload)]);
    true
  }

  /// Takes the bytes the JavaScript side read: the calls complete now, each held under the
  /// budget from before its payload is kept. `Err` when the lane has ended or the stream carries
  /// nonsense (the lane is then ended): the JavaScript side stops reading.
  pub fn feed(&self, chunk: &[u8]) -> Result<Fed, String> {
    if self.closing.is_cancelled() {
      return Err("the lane has ended".into());
    }
    let fed = self.feed_locked(chunk);
    if fed.is_err() {
      self.end();
    }
    fed
  }

  fn feed_locked(&self, chunk: &[u8]) -> Result<Fed, String> {
    let mut st = self.feed.lock().expect("lane feed");
    let Feed {
      mux,
      frames,
      waiting,
      claim,
      admitting,
    } = &mut *st;
    let mut stderr = Vec::new();
    mux.push(chunk, |stream, bytes| match stream {
      1 => frames.push(bytes),
      2 => stderr.extend_from_slice(bytes),
      _ => {}
    });
    if !stderr.is_empty() {
      self.log.sandbox_text(
        Level::Warn,
        "Code Mode lane stderr",
        &self.sandbox_id,
        "text",
        &stderr,
        json!({ "sandboxId": self.sandbox_id }),
      );
    }
    let mut fed = Fed::default();
    // A call that waited for room for its values goes first.
    if let Some(a) = admitting.take() {
      if !a.fitted {
        *admitting = Some(a);
        fed.paused = true;
        return Ok(fed);
      }
      self.hand_on(a.frame, a.claim, &mut fed);
    }
    if let Some(h) = *waiting {
      match claim.is_some() {
        true => {
          *waiting = None;
          frames.accept_measured();
        }
        false => match self.budget.try_claim(budget::reading(h.len)) {
          Some(c) => {
            *claim = Some(c);
            *waiting = None;
            frames.accept_measured();
          }
          None => {
            fed.paused = true;
            return Ok(fed);
          }
        },
      }
    }
    loop {
      match frames.next_event()? {
        Some(Event::Head(h)) if h.kind == KIND_REQUEST => {
          if let Some(why) = self.budget.refusal(h.len) {
            frames.skip();
            self.out.send([error_reply(h.id, &why, "caller")]);
            continue;
          }
          match self.budget.try_claim(budget::reading(h.len)) {
            Some(c) => {
              *claim = Some(c);
              frames.accept_measured();
            }
            None => {
              *waiting = Some(h);
              fed.paused = true;
              return Ok(fed);
            }
          }
        }
        Some(Event::Head(_)) => frames.skip(),
        Some(Event::Frame(f)) => {
          let Some(c) = claim.take() else { continue };
          let measured = f.measured.clone().unwrap_or(Err(Unfit::Malformed));
          match self.budget.admit(f.payload.len(), &measured, c) {
            Admission::Ready(c) => self.hand_on(f, c, &mut fed),
            Admission::Refused(why) => self.out.send([error_reply(f.id, &why, "caller")]),
            Admission::Wait(claim, room) => {
              let deadline = Instant::now() + self.intake.timeout();
              *admitting = Some(Admitting {
                frame: f,
                claim,
                room,
                deadline,
                fitted: false,
              });
              fed.paused = true;
              return Ok(fed);
            }
          }
        }
        None => return Ok(fed),
      }
    }
  }

  /// A measured call whose room is held, for the JavaScript side.
  fn hand_on(&self, f: Frame, claim: Claim, fed: &mut Fed) {
    let Some(Ok(measured)) = f.measured else {
      unreachable!("only measured calls are admitted")
    };
    let deadline = Instant::now() + self.intake.timeout();
    let seq = self.inflight.hold(f.id, deadline);
    self
      .intake
      .holds
      .hold(self.generation, seq, claim, measured.heap);
    let request = Request {
      payload: f.payload,
      measured,
    };
    fed.calls.push((seq, request));
  }

  /// Waits until the budget has room for the call that paused the feed (or the lane closes).
  pub async fn room(&self) {
    let admitting = {
      let mut st = self.feed.lock().expect("lane feed");
      st.admitting.take_if(|a| !a.fitted)
    };
    if let Some(a) = admitting {
      return self.fit(a).await;
    }
    let Some(head) = self.feed.lock().expect("lane feed").waiting else {
      return;
    };
    tokio::select! {
      c = self.budget.claim(budget::reading(head.len)) => {
        let mut st = self.feed.lock().expect("lane feed");
        // Only for the head it was made for (another wait may have been first).
        if st.waiting == Some(head) && st.claim.is_none() {
          st.claim = Some(c);
        }
      }
      _ = self.closing.cancelled() => {}
    }
  }

  /// Waits for the room a measured call needs, within its timeout; a call that finds none is
  /// answered so.
  async fn fit(&self, mut a: Admitting) {
    let fit = tokio::time::timeout_at(a.deadline, self.budget.fit(&mut a.claim, a.room));
    let fitted = tokio::select! {
      r = fit => r.is_ok(),
      _ = self.closing.cancelled() => return,
    };
    if !fitted {
      let why = budget::no_room(self.intake.timeout());
      self.out.send([error_reply(a.frame.id, &why, "transport")]);
      return;
    }
    a.fitted = true;
    self.feed.lock().expect("lane feed").admitting = Some(a);
  }

  /// The stream ended (the JavaScript side saw it close, or it carried nonsense): calls not
  /// answered yet are no longer awaited (their clients see the connection closed; their room
  /// stays held until the JavaScript side is done with them).
  pub fn end(&self) {
    self.alive.store(false, Ordering::SeqCst);
    self.closing.cancel();
    self.out.close();
    self.inflight.clear();
    // A request cut off mid-payload gives its room and its bytes back.
    *self.feed.lock().expect("lane feed") = Feed::default();
  }

  /// Closes the stream (the lane then removes its socket and exits) and waits for the exec to
  /// end; one that outlives that is killed.
  pub async fn stop(&self) {
    self.end();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
      if !self.exec_running().await {
        return;
      }
      tokio::time::sleep(Duration::from_millis(25)).await;
    }
    if self.pid == 0 {
      return;
    }
    // Killed as whoever it runs as; its socket, which a killed lane cannot remove, is removed as
    // its user, in the user's own directory.
    let kill = format!("kill -KILL {} 2>/dev/null", self.pid);
    let runs_as = self.runs_as.clone();
    self.sh("kill the Code Mode lane", &kill, runs_as).await;
    let rm = "rm -f \"$1\"";
    self
      .sh("remove the Code Mode lane's socket", rm, self.user.clone())
      .await;
  }

  /// Runs `script` (`$1`: the socket) in the container and waits for it, within the deadline.
  async fn sh(&self, op: &str, script: &str, user: Option<String>) {
    let opts = CreateExecOptions {
      cmd: Some(vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "trueforge-codemode-stop".to_string(),
        self.socket.clone(),
      ]),
      user,
      attach_stdout: Some(true),
      attach_stderr: Some(true),
      working_dir: Some("/".to_string()),
      ..Default::default()
    };
    let engine = &self.engine;
    let limit = engine.control_timeout;
    let run = async {
      let id = engine.create_exec(op, &self.container, opts, limit).await?;
      // Its output's end is its end.
      if let StartExecResults::Attached { mut output, .. } =
        engine.start_exec(op, &id, None, limit).await?
      {
        while output.next().await.is_some() {}
      }
      Ok(())
    };
    let _ = engine.bounded(limit, op, run).await;
  }

  async fn exec_running(&self) -> bool {
    let engine = &self.engine;
    match engine
      .inspect_exec(
        "inspect the Code Mode lane",
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

impl Drop for Lane {
  fn drop(&mut self) {
    // Closing the stream ends the lane in the sandbox.
    self.end();
  }
}

/// Opens a lane for `socket` in `target`, with the agent binary of `conn`. `Err` says why none
/// could be had (the caller then serves the socket through the agent's connection).
pub async fn open(
  engine: &Engine,
  conn: &Conn,
  target: &Target,
  socket: &str,
  intake: Intake,
  budget: Budget,
  log: &Logger,
) -> Result<Lane, String> {
  let engine_socket = socket_of(engine).ok_or("the engine is not on a local Unix socket")?;
  let mut cmd = vec![
    conn.path.clone(),
    "codemode-lane".to_string(),
    socket.to_string(),
  ];
  cmd.extend(target.user.clone());
  let user = match conn.as_user {
    true => target.user.clone(),
    false => Some("0:0".to_string()),
  };
  let opts = crate::engine::attached_exec(cmd, user.clone());
  let limit = engine.control_timeout;
  let exec_id = engine
    .create_exec(
      "create the Code Mode lane exec",
      &target.container_id,
      opts,
      limit,
    )
    .await
    .map_err(|e| e.to_string())?;
  let started = tokio::time::timeout(limit, async {
    let (stream, rest) = hijack(&engine_socket, &exec_id).await?;
    let mut feed = Feed::default();
    let pid = await_ready(stream, rest, &mut feed).await?;
    Ok::<_, String>((pid, feed))
  })
  .await
  .map_err(|_| format!("the lane did not start within {} s", limit.as_secs_f64()))?;
  let ((stream, pid), feed) = started?;
  let stream = stream
    .into_std()
    .map_err(|e| format!("cannot take the lane's stream: {e}"))?;
  let share = || {
    stream
      .as_fd()
      .try_clone_to_owned()
      .map_err(|e| format!("cannot share the lane's stream: {e}"))
  };
  let (js, probe) = (share()?, share()?);
  let out = Arc::new(Outbox::new(Unpolled::new(stream)));
  let alive = Arc::new(AtomicBool::new(true));
  let closing = CancellationToken::new();
  let inflight = Arc::new(Inflight::default());
  spawn_flusher(engine, &out, &alive);
  watch(engine, &intake, &inflight, &out, &closing);
  log.debug(
    "Code Mode served on a lane of the sandbox agent",
    json!({ "sandboxId": target.sandbox_id, "socket": socket, "pid": pid }),
  );
  Ok(Lane {
    generation: next_generation(),
    out,
    feed: Mutex::new(feed),
    inflight,
    intake,
    budget,
    alive,
    closing,
    js: Mutex::new(Some(js)),
    probe,
    pid,
    exec_id,
    container: target.container_id.clone(),
    socket: socket.to_string(),
    user: target.user.clone(),
    runs_as: user,
    sandbox_id: target.sandbox_id.clone(),
    engine: engine.clone(),
    log: log.clone(),
  })
}

/// The lane's stream for writing, kept out of the runtime's poller: registered there, every
/// frame that comes in (read by the JavaScript side) and every write the engine takes would wake
/// a runtime thread for nothing. Only a write the stream cannot take waits there, registered
/// for room alone, and only until the stream takes writes again.
struct Unpolled {
  /// `None` only while moving between the two states.
  stream: Option<Stream>,
  runtime: tokio::runtime::Handle,
}

enum Stream {
  Plain(std::os::unix::net::UnixStream),
  /// Registered with the poller, waiting for room.
  Waiting(AsyncFd<std::os::unix::net::UnixStream>),
}

impl Unpolled {
  /// Needs the runtime's context: it keeps the runtime to wait for room from any thread.
  fn new(stream: std::os::unix::net::UnixStream) -> Unpolled {
    Unpolled {
      stream: Some(Stream::Plain(stream)),
      runtime: tokio::runtime::Handle::current(),
    }
  }

  fn get(&self) -> &std::os::unix::net::UnixStream {
    match self.stream.as_ref().expect("a stream") {
      Stream::Plain(s) => s,
      Stream::Waiting(w) => w.get_ref(),
    }
  }
}

impl AsyncWrite for Unpolled {
  fn poll_write(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &[u8],
  ) -> Poll<std::io::Result<usize>> {
    let me = &mut *self;
    loop {
      match me.get().write(buf) {
        Ok(n) => {
          // The stream takes writes again: out of the poller, no more wake-ups for room.
          let waiting = me.stream.take_if(|s| matches!(s, Stream::Waiting(_)));
          if let Some(Stream::Waiting(w)) = waiting {
            me.stream = Some(Stream::Plain(w.into_inner()));
          }
          return Poll::Ready(Ok(n));
        }
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
          let plain = me.stream.take_if(|s| matches!(s, Stream::Plain(_)));
          if let Some(Stream::Plain(s)) = plain {
            let _in = me.runtime.enter();
            // SAFETY: the registration owns the stream, so its descriptor stays open and the
            // same while registered. Registered after the full write: the poller reports room
            // that came since.
            match unsafe { AsyncFd::register_with_interest(s, Interest::WRITABLE) } {
              Ok(w) => me.stream = Some(Stream::Waiting(w)),
              Err(e) => {
                let (s, e) = e.into_parts();
                me.stream = Some(Stream::Plain(s));
                return Poll::Ready(Err(e));
              }
            }
          }
          let Some(Stream::Waiting(w)) = me.stream.as_ref() else {
            unreachable!("registered above");
          };
          match w.poll_write_ready(cx) {
            Poll::Ready(Ok(mut ready)) => ready.clear_ready(),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
          }
        }
        Err(e) => return Poll::Ready(Err(e)),
      }
    }
  }

  fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Poll::Ready(Ok(()))
  }

  fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Poll::Ready(self.get().shutdown(std::net::Shutdown::Write))
  }
}

/// Starts exec `exec_id` on a connection of our own to the engine and takes the connection over
/// (as the engine's own clients do for an attached exec). Returns it and any bytes of the stream
/// that came with the response head.
async fn hijack(engine_socket: &str, exec_id: &str) -> Result<(UnixStream, BytesMut), String> {
  if exec_id.is_empty() || !exec_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
    return Err(format!("the engine named the exec {exec_id:?}"));
  }
  let mut stream = UnixStream::connect(engine_socket)
    .await
    .map_err(|e| format!("cannot connect to {engine_socket}: {e}"))?;
  let body = r#"{"Detach":false,"Tty":false}"#;
  let request = format!(
    "POST /exec/{exec_id}/start HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n\
     Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {}\r\n\r\n{body}",
    body.len()
  );
  stream
    .write_all(request.as_bytes())
    .await
    .map_err(|e| format!("cannot start the lane: {e}"))?;
  let mut buf = BytesMut::with_capacity(4096);
  loop {
    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
      let head = buf.split_to(end + 4);
      let head: &[u8] = &head;
      let status = head.split(|b| *b == b' ').nth(1).unwrap_or_default();
      if status != b"101" {
        let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
        return Err(format!(
          "the engine answered the lane's start with {:?}",
          String::from_utf8_lossy(line)
        ));
      }
      return Ok((stream, buf));
    }
    if buf.len() > HEAD_MAX {
      return Err("the engine's answer to the lane's start has no end".into());
    }
    match stream.read_buf(&mut buf).await {
      Ok(0) => return Err("the engine closed the lane's connection".into()),
      Ok(_) => {}
      Err(e) => return Err(format!("cannot read the engine's answer: {e}")),
    }
  }
}

/// Reads until READY (the lane listens); returns the stream and the lane's pid. What comes after
/// READY stays in `feed`.
async fn await_ready(
  mut stream: UnixStream,
  first: BytesMut,
  feed: &mut Feed,
) -> Result<(UnixStream, u32), String> {
  let mut stderr = Vec::new();
  let mut buf = first;
  loop {
    let Feed { mux, frames, .. } = feed;
    mux.push(&buf, |s, b| match s {
      1 => frames.push(b),
      2 if stderr.len() < STDERR_MAX => stderr.extend_from_slice(b),
      _ => {}
    });
    buf.clear();
    loop {
      match frames.next_event()? {
        Some(Event::Head(h)) if h.kind == KIND_READY && h.len <= READY_MAX => frames.accept(),
        Some(Event::Head(_)) => frames.skip(),
        Some(Event::Frame(f)) => {
          let pid = serde_json::from_slice::<serde_json::Value>(&f.payload)
            .ok()
            .and_then(|v| v["pid"].as_u64())
            .unwrap_or(0) as u32;
          return Ok((stream, pid));
        }
        None => break,
      }
    }
    buf.reserve(64 * 1024);
    match stream.read_buf(&mut buf).await {
      Ok(0) => {
        let said = String::from_utf8_lossy(&stderr).trim().to_string();
        return Err(match said.is_empty() {
          true => "the lane ended before it listened".into(),
          false => format!("the lane ended before it listened: {said}"),
        });
      }
      Ok(_) => {}
      Err(e) => return Err(format!("cannot read the lane's stream: {e}")),
    }
  }
}

/// Writes what the caller's thread could not; a failed stream ends the lane.
fn spawn_flusher(engine: &Engine, out: &Arc<Outbox>, alive: &Arc<AtomicBool>) {
  let (out, alive) = (out.clone(), alive.clone());
  engine.shared.background.spawn(|stop| async move {
    tokio::select! {
      _ = out.flusher() => {}
      _ = stop.cancelled() => out.close(),
    }
    alive.store(false, Ordering::SeqCst);
  });
}

/// Answers the calls whose time is up, until the lane ends: it sleeps until the first deadline,
/// or for one timeout when nothing waits, woken early when the timeout is shortened.
fn watch(
  engine: &Engine,
  intake: &Intake,
  inflight: &Arc<Inflight>,
  out: &Arc<Outbox>,
  closing: &CancellationToken,
) {
  let (intake, inflight, out, closing) = (
    intake.clone(),
    inflight.clone(),
    out.clone(),
    closing.clone(),
  );
  engine.shared.background.spawn(|stop| async move {
    loop {
      let shortened = intake.shortened();
      tokio::pin!(shortened);
      shortened.as_mut().enable();
      let timeout = intake.timeout();
      let wake = inflight
        .next_deadline()
        .unwrap_or_else(|| Instant::now() + timeout);
      tokio::select! {
        _ = closing.cancelled() => break,
        _ = stop.cancelled() => break,
        _ = &mut shortened => continue,
        _ = tokio::time::sleep_until(wake) => {}
      }
      let message = format!(
        "Code Mode request got no reply from the host within {} s",
        timeout.as_secs_f64()
      );
      for relay_id in inflight.expire(Instant::now()) {
        out.send([error_reply(relay_id, &message, "transport")]);
      }
    }
    inflight.clear();
  });
}

/// The engine's stream of an exec without a TTY: frames of an 8-byte header (stream u8, three
/// zero bytes, length u32 big endian) and that many bytes of the stream named.
#[derive(Default)]
struct Mux {
  head: [u8; 8],
  have: usize,
  stream: u8,
  left: usize,
}

impl Mux {
  fn push(&mut self, mut chunk: &[u8], mut to: impl FnMut(u8, &[u8])) {
    while !chunk.is_empty() {
      if self.left == 0 {
        let n = (8 - self.have).min(chunk.len());
        self.head[self.have..self.have + n].copy_from_slice(&chunk[..n]);
        self.have += n;
        chunk = &chunk[n..];
        if self.have == 8 {
          self.have = 0;
          self.stream = self.head[0];
          self.left =
            u32::from_be_bytes([self.head[4], self.head[5], self.head[6], self.head[7]]) as usize;
        }
        continue;
      }
      let n = self.left.min(chunk.len());
      to(self.stream, &chunk[..n]);
      self.left -= n;
      chunk = &chunk[n..];
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn the_engines_stream_frames_are_taken_apart_at_any_boundary() {
    let mut wire = Vec::new();
    for (s, text) in [(1u8, &b"hello"[..]), (2, b"oops"), (1, b""), (1, b" world")] {
      wire.extend_from_slice(&[s, 0, 0, 0]);
      wire.extend_from_slice(&(text.len() as u32).to_be_bytes());
      wire.extend_from_slice(text);
    }
    for cut in 1..wire.len() {
      let mut mux = Mux::default();
      let (mut out, mut err) = (Vec::new(), Vec::new());
      for part in wire.chunks(cut) {
        mux.push(part, |s, b| match s {
          1 => out.extend_from_slice(b),
          _ => err.extend_from_slice(b),
        });
      }
      assert_eq!(out, b"hello world", "cut {cut}");
      assert_eq!(err, b"oops", "cut {cut}");
    }
  }

  #[tokio::test]
  async fn a_write_the_stream_cannot_take_waits_for_room_then_leaves_the_poller() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let mut w = Unpolled::new(a);
    w.write_all(b"small").await.unwrap();
    assert!(
      matches!(w.stream, Some(Stream::Plain(_))),
      "a write taken at once registers nothing"
    );
    // Far more than the socket holds, read slowly by another thread.
    let data: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
    let reader = std::thread::spawn(move || {
      let mut got = Vec::new();
      let mut buf = [0u8; 64 * 1024];
      loop {
        std::thread::sleep(Duration::from_millis(1));
        match std::io::Read::read(&mut &b, &mut buf).unwrap() {
          0 => return got,
          n => got.extend_from_slice(&buf[..n]),
        }
      }
    });
    tokio::time::timeout(Duration::from_secs(30), w.write_all(&data))
      .await
      .expect("room comes as the reader reads")
      .unwrap();
    assert!(
      matches!(w.stream, Some(Stream::Plain(_))),
      "out of the poller once written"
    );
    w.shutdown().await.unwrap();
    let got = reader.join().unwrap();
    assert_eq!(&got[..5], b"small");
    assert!(got[5..] == data[..], "every byte, in order");
  }
}
