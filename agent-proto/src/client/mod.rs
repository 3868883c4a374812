//! The host's side of the agent protocol: one `AgentClient` per agent stream, cheap to clone,
//! carrying any number of concurrent requests. A reader task splits incoming frames by stream
//! and never waits on a caller (each stream's backlog is bounded by its credit window); a
//! writer task batches outgoing frames. When the stream ends, every request in flight fails
//! with `ClientError::StreamEnded` (an agent's commands cannot be re-attached), and so does
//! every later one: the caller starts a new agent.

mod egress;
pub mod outbox;
mod stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, watch};

use crate::codemode::{MAX_MESSAGE_BYTES, MAX_REPLY_BYTES};
use crate::frame::{self, Frame, Kind, AGENT_STREAM, MAX_DATA, MAX_PAYLOAD, WINDOW};
use crate::msg::{
  ActivityInfo, AgentError, AgentRequest, CodeModeListenSpec, DownloadDone, DownloadHead,
  DownloadSpec, EgressListenSpec, ExecDone, ExecSpec, Hello, LayoutSpec, Outcome, PingInfo,
  Request, StagedDone, StagedHead, StagedUploadSpec, StatInfo, StatSpec, UploadDone, UploadSpec,
  MAX_CODE_MODE_CALLS, TIMEOUT_EXIT_CODE,
};
use crate::output::{timed_out_text, CappedOutput};
pub use egress::{EgressConn, EgressHandler};
use outbox::{Ended, Outbox};
use stream::{Inbound, Origin, Slot, Stream};

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
  /// The version the agent must report (else `VersionMismatch`). Default `crate::VERSION`;
  /// `None` accepts any.
  pub expected_version: Option<String>,
  /// How long to wait for the agent's hello. Default 10 s.
  pub hello_timeout: Duration,
}

impl Default for ClientOptions {
  fn default() -> Self {
    Self {
      expected_version: Some(crate::VERSION.to_string()),
      hello_timeout: Duration::from_secs(10),
    }
  }
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
  /// The agent's stream ended (the agent died, was killed, or its exec was closed). A request
  /// in flight is lost: a command may have run, and its result cannot be recovered.
  #[error("the sandbox agent's stream ended ({reason}); a request in flight is lost and the agent must be started again")]
  StreamEnded { reason: String },
  /// The agent is another version (or protocol revision): replace it.
  #[error("the sandbox agent is version {agent} (protocol {protocol}), expected {expected}")]
  VersionMismatch {
    agent: String,
    protocol: u32,
    expected: String,
  },
  /// The agent never said hello: it could not start, or something else answered.
  #[error("the sandbox agent did not start: {0}")]
  Handshake(String),
  /// The agent broke the protocol; the connection is closed.
  #[error("the sandbox agent broke the protocol: {0}")]
  Protocol(String),
  /// The agent refused or failed this request.
  #[error(transparent)]
  Agent(#[from] AgentError),
  /// A request that does not fit in one frame (a huge command or environment).
  #[error("the request is {bytes} bytes, over the protocol's limit of {max}")]
  RequestTooLarge { bytes: usize, max: usize },
  /// Reading the caller's upload source failed.
  #[error("reading the upload's data failed: {0}")]
  Source(String),
}

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
  pub command: String,
  /// Absolute working directory.
  pub cwd: String,
  /// Added to the container's environment, in order (later wins).
  pub env: Vec<(String, String)>,
  /// `docker exec -u` syntax; `None` runs as root.
  pub user: Option<String>,
  /// `None`: no timeout.
  pub timeout: Option<Duration>,
  /// Output bytes kept (head and tail).
  pub max_output: usize,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
  pub exit_code: i32,
  /// Merged stdout and stderr, capped (see `CappedOutput`), with the timeout line if any.
  pub output: String,
  /// Killed by its timeout, every process verified gone (`exit_code` is 124).
  pub timed_out: bool,
  /// Output bytes left out of `output`.
  pub omitted: u64,
  /// The sandbox was out of processes and the agent killed the workload first: what it did.
  pub recovered: Option<String>,
}

/// A download in progress: its size up front, then its bytes in chunks.
pub struct Download {
  pub head: DownloadHead,
  stream: Stream,
  received: u64,
}

impl Download {
  /// The next chunk, or `None` once the whole file has arrived and the agent confirmed it
  /// did not change while it was read.
  pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
    loop {
      match self.stream.next().await? {
        Inbound::Data(b) => {
          self.received += b.len() as u64;
          if self.received > self.head.size {
            return Err(
              self
                .stream
                .violation("a download sent more bytes than its size"),
            );
          }
          self.stream.consumed(b.len());
          return Ok(Some(b));
        }
        Inbound::Result(body) => {
          let done: DownloadDone = outcome(&body)?;
          if done.size != self.received {
            return Err(
              self
                .stream
                .violation("a download's size does not match its data"),
            );
          }
          return Ok(None);
        }
        Inbound::Head(_) | Inbound::End => {}
      }
    }
  }
}

/// The agent's answer to `upload_staged`.
pub enum Staging {
  /// Put the bytes there, then `commit`.
  Ready(StagedUpload),
  /// Why the agent will not stage this write.
  Declined(String),
}

/// A staged write waiting for its bytes. Dropping it cancels it: the agent removes what was
/// staged and the temporary file it made.
pub struct StagedUpload {
  pub head: StagedHead,
  stream: Stream,
}

impl StagedUpload {
  /// Tells the agent the bytes are in place; it checks them and moves them into place. `None`:
  /// the agent could not see them after all (a runtime whose root file system is its own) and
  /// declines; send the bytes with `upload`.
  pub async fn commit(mut self) -> Result<Option<UploadDone>, ClientError> {
    self.stream.send_end();
    loop {
      match self.stream.next().await? {
        Inbound::Result(body) => {
          let done: StagedDone = outcome(&body)?;
          return Ok(
            done
              .declined
              .is_none()
              .then_some(UploadDone { size: done.size }),
          );
        }
        Inbound::Data(_) => return Err(self.stream.violation("data on a staged upload")),
        Inbound::Head(_) | Inbound::End => {}
      }
    }
  }
}

/// One Code Mode request from a client in the sandbox, delivered before its bytes are read:
/// `size` says how many there are, so the host can make room for them first (until
/// `read_request`, the agent waits under flow control and the host holds at most one credit
/// window of them). Answer it with `reply` (the bytes the client receives) or `fail`; dropping
/// it fails it.
pub struct CodeModeCall {
  /// The relay socket the client used (the one given to `code_mode_listen`).
  pub socket: String,
  /// The request's length as the agent announced it (an older agent does not say).
  pub size: Option<u64>,
  stream: Stream,
  /// All of the request had arrived when the call was handed over (`take_request`).
  complete: bool,
}

impl CodeModeCall {
  /// The client's request bytes (JSON, at most 64 MiB, exactly `size` when it was given), read
  /// under credit. Call it once.
  pub async fn read_request(&mut self) -> Result<Bytes, ClientError> {
    let mut body = self.body_buffer();
    loop {
      let item = self.stream.next().await?;
      if self.absorb(item, &mut body)? {
        break;
      }
    }
    self.check_size(body)
  }

  /// The whole request without waiting, when all of it had arrived before the call was handed
  /// over (a small one: its bytes come with the call); `None` otherwise, and then
  /// `read_request` reads it.
  pub fn take_request(&mut self) -> Option<Result<Bytes, ClientError>> {
    if !std::mem::take(&mut self.complete) {
      return None;
    }
    let mut body = self.body_buffer();
    loop {
      let Some(item) = self.stream.try_next() else {
        // Its end was routed before the call was handed over: this cannot be.
        return Some(Err(
          self.stream.violation("a Code Mode request is incomplete"),
        ));
      };
      match self.absorb(item, &mut body) {
        Ok(true) => return Some(self.check_size(body)),
        Ok(false) => {}
        Err(e) => return Some(Err(e)),
      }
    }
  }

  fn limit(&self) -> u64 {
    let most = MAX_REPLY_BYTES as u64;
    self.size.unwrap_or(most).min(most)
  }

  fn body_buffer(&self) -> BytesMut {
    BytesMut::with_capacity(self.size.unwrap_or(0).min(self.limit()) as usize)
  }

  /// Takes one inbound item into `body`; `true` at the request's end.
  fn absorb(&mut self, item: Inbound, body: &mut BytesMut) -> Result<bool, ClientError> {
    match item {
      Inbound::Data(b) => {
        if (body.len() + b.len()) as u64 > self.limit() {
          return Err(
            self
              .stream
              .violation("a Code Mode request is longer than announced"),
          );
        }
        self.stream.consumed(b.len());
        body.extend_from_slice(&b);
        Ok(false)
      }
      Inbound::End => Ok(true),
      Inbound::Head(_) => Ok(false),
      Inbound::Result(_) => Err(ClientError::StreamEnded {
        reason: "the agent gave up the Code Mode call".into(),
      }),
    }
  }

  fn check_size(&mut self, body: BytesMut) -> Result<Bytes, ClientError> {
    if self.size.is_some_and(|n| n != body.len() as u64) {
      return Err(
        self
          .stream
          .violation("a Code Mode request is shorter than announced"),
      );
    }
    Ok(body.freeze())
  }

  /// Sends a small `reply` at once, without waiting, when the agent's credit allows: `true`,
  /// and the call is answered. `false`: nothing was sent; answer it with `reply`.
  pub fn reply_now(&mut self, reply: &Bytes) -> bool {
    self.stream.try_finish_with_data(reply, &Outcome::Ok(()))
  }

  /// Sends `reply` to the client, streamed under the agent's credit.
  pub async fn reply(mut self, reply: Bytes) -> Result<(), ClientError> {
    if reply.len() > MAX_REPLY_BYTES {
      let msg = format!(
        "Code Mode reply of {} bytes exceeds the limit of {} bytes",
        reply.len(),
        MAX_MESSAGE_BYTES
      );
      self.stream.finish_with(&Outcome::<()>::Err(AgentError::new(
        crate::msg::ErrorKind::TooLarge,
        msg,
      )));
      return Ok(());
    }
    if !self.stream.send_data(reply).await? {
      return Err(ClientError::StreamEnded {
        reason: "the agent gave up the Code Mode call".into(),
      });
    }
    self.stream.finish_with(&Outcome::Ok(()));
    Ok(())
  }

  /// Fails the call: the client receives a Code Mode transport error with `message`.
  pub fn fail(mut self, message: &str) {
    self.stream.finish_with(&Outcome::<()>::Err(AgentError::new(
      crate::msg::ErrorKind::Io,
      message,
    )));
  }
}

/// A Code Mode call announcing at most this many bytes is handed over once all of them have
/// arrived (they fit in the credit the agent starts with); a larger one at once, so that room
/// can be made before its bytes are read.
const HELD_CALL_BYTES: usize = 64 * 1024;

/// Takes each Code Mode call as it arrives, on the reader task: it must not block (hand the call
/// to a task, or drop it to fail it).
pub type CallHandler = Arc<dyn Fn(CodeModeCall) + Send + Sync>;

/// State shared by the client handles, the reader task and the streams.
struct Shared {
  out: Outbox,
  state: Mutex<State>,
  ended: watch::Sender<bool>,
  /// When the connection was made, and microseconds after that when the agent was last heard.
  born: std::time::Instant,
  heard: std::sync::atomic::AtomicU64,
}

struct State {
  streams: HashMap<u32, Slot>,
  /// Why the stream ended, once it has.
  ended: Option<String>,
  /// Where Code Mode calls go, once someone asked for them.
  calls: Option<CallHandler>,
  open_calls: usize,
  /// Small Code Mode calls whose request is still arriving: each is handed over whole, at its
  /// end, so that it can be answered without waiting on anything.
  held: HashMap<u32, CodeModeCall>,
  /// Where egress connections go, once someone asked for them.
  egress: Option<EgressHandler>,
  /// The largest `window` and `max_connections` any `egress_listen` asked for (0: none yet).
  /// The largest, so that connections the agent opened under an earlier listen still fit.
  egress_window: u32,
  egress_max: u32,
  /// Egress connections open now (their slots in `streams`).
  open_egress: usize,
}

impl State {
  /// Takes a stream out of the table.
  fn remove(&mut self, id: u32) -> Option<Slot> {
    let slot = self.streams.remove(&id)?;
    if slot.egress {
      self.open_egress = self.open_egress.saturating_sub(1);
    }
    Some(slot)
  }
}

impl Shared {
  fn send(&self, f: &Frame) {
    self.send_bytes(f.to_bytes());
  }

  /// Encoded frames, written together.
  fn send_bytes(&self, b: Bytes) {
    // A closed writer means the stream is over; `end` reports that to everyone.
    self.out.send([b]);
  }

  /// A data frame: its header, then the caller's bytes as they are (not copied into a frame).
  fn send_data(&self, id: u32, data: Bytes) {
    let head = frame::header(Kind::Data, id, data.len());
    self.out.send([Bytes::copy_from_slice(&head), data]);
  }

  /// Whether the connection has ended.
  fn is_ended(&self) -> bool {
    self.state.lock().expect("state").ended.is_some()
  }

  /// Answers an agent stream with an error at once (the agent gives it up).
  fn refuse(&self, id: u32, why: &str) {
    self.send(&Frame::json(
      Kind::Result,
      id,
      &Outcome::<()>::Err(AgentError::new(crate::msg::ErrorKind::Io, why)),
    ));
  }

  fn ended_error(&self) -> ClientError {
    let st = self.state.lock().expect("state");
    ClientError::StreamEnded {
      reason: st
        .ended
        .clone()
        .unwrap_or_else(|| "the connection was closed".into()),
    }
  }

  /// Ends the connection: every stream's waiter wakes with `StreamEnded`.
  fn end(&self, reason: String) {
    let (slots, held) = {
      let mut st = self.state.lock().expect("state");
      if st.ended.is_none() {
        st.ended = Some(reason);
      }
      st.calls = None;
      st.egress = None;
      (
        std::mem::take(&mut st.streams),
        std::mem::take(&mut st.held),
      )
    };
    // Dropped here, outside the lock: a dropped call answers (and so locks) itself.
    drop(held);
    for (_, slot) in slots {
      slot.credit.close();
    }
    self.out.close();
    self.ended.send_replace(true);
  }

  /// Routes one incoming frame. An error ends the connection.
  fn dispatch(self: &Arc<Self>, f: Frame) -> Result<(), String> {
    match f.kind {
      Kind::Hello => Err("a second hello".into()),
      Kind::Open => self.incoming_call(f),
      Kind::Cancel => {
        // The agent gave up a Code Mode call or an egress connection (its client went away).
        let (slot, held) = {
          let mut st = self.state.lock().expect("state");
          (st.remove(f.id), st.held.remove(&f.id))
        };
        if let Some(s) = slot {
          s.credit.close();
        }
        drop(held);
        Ok(())
      }
      Kind::Credit => {
        let n = f.credit_amount().ok_or("a malformed credit frame")?;
        let st = self.state.lock().expect("state");
        if let Some(slot) = st.streams.get(&f.id) {
          slot.credit.add_permits(n as usize);
        }
        Ok(())
      }
      Kind::Data => {
        let mut st = self.state.lock().expect("state");
        let Some(slot) = st.streams.get_mut(&f.id) else {
          return Ok(()); // a stream we cancelled
        };
        slot.unacked += f.payload.len() as u64;
        if slot.unacked > slot.limit {
          return Err(format!("stream {} sent more data than its credit", f.id));
        }
        let _ = slot.tx.send(Inbound::Data(f.payload));
        Ok(())
      }
      Kind::Head | Kind::End => {
        let mut st = self.state.lock().expect("state");
        if let Some(slot) = st.streams.get(&f.id) {
          let _ = slot.tx.send(if f.kind == Kind::Head {
            Inbound::Head(f.payload)
          } else {
            Inbound::End
          });
        }
        if f.kind == Kind::End {
          if let Some(mut call) = st.held.remove(&f.id) {
            call.complete = true;
            let handler = st.calls.clone();
            drop(st);
            // Without a handler now, the dropped call fails.
            if let Some(h) = handler {
              h(call);
            }
          }
        }
        Ok(())
      }
      Kind::Result => {
        let slot = self.state.lock().expect("state").remove(f.id);
        if let Some(slot) = slot {
          slot.credit.close();
          let _ = slot.tx.send(Inbound::Result(f.payload));
        }
        Ok(())
      }
    }
  }

  /// A stream the agent opened: a Code Mode call or an egress connection.
  fn incoming_call(self: &Arc<Self>, f: Frame) -> Result<(), String> {
    if f.id & AGENT_STREAM == 0 {
      return Err(format!(
        "the agent opened stream {} in the host's range",
        f.id
      ));
    }
    let req: AgentRequest = serde_json::from_slice(&f.payload)
      .map_err(|e| format!("an unreadable request from the agent: {e}"))?;
    match req {
      AgentRequest::CodeModeCall { socket, size } => self.incoming_code_mode(f.id, socket, size),
      AgentRequest::EgressConnect { port, peer } => self.incoming_egress(f.id, port, peer),
    }
  }

  fn incoming_code_mode(
    self: &Arc<Self>,
    id: u32,
    socket: String,
    size: Option<u64>,
  ) -> Result<(), String> {
    let refuse = |why: &str| self.refuse(id, why);
    let mut st = self.state.lock().expect("state");
    let Some(calls) = st.calls.clone() else {
      drop(st);
      refuse("Code Mode is not served by this host");
      return Ok(());
    };
    if st.open_calls >= MAX_CODE_MODE_CALLS {
      drop(st);
      refuse("too many Code Mode calls at once");
      return Ok(());
    }
    if size.is_some_and(|n| n > MAX_MESSAGE_BYTES as u64) {
      drop(st);
      refuse("Code Mode request over the limit");
      return Ok(());
    }
    if st.streams.contains_key(&id) {
      return Err(format!("the agent reused stream {id}"));
    }
    st.open_calls += 1;
    let (slot, stream) = Stream::new(self.clone(), id, Origin::CodeMode);
    st.streams.insert(id, slot);
    let call = CodeModeCall {
      socket,
      size,
      stream,
      complete: false,
    };
    if size.is_some_and(|n| n <= HELD_CALL_BYTES as u64) {
      st.held.insert(id, call);
      return Ok(());
    }
    drop(st);
    calls(call);
    Ok(())
  }

  /// A connection accepted on the egress port, handed to the egress handler.
  fn incoming_egress(self: &Arc<Self>, id: u32, port: u16, peer: String) -> Result<(), String> {
    let mut st = self.state.lock().expect("state");
    if st.streams.contains_key(&id) {
      return Err(format!("the agent reused stream {id}"));
    }
    let refusal = match &st.egress {
      None => Some("egress is not served by this host"),
      Some(_) if st.egress_window == 0 => Some("the host never asked the agent for egress"),
      Some(_) if st.open_egress >= st.egress_max as usize => {
        Some("too many egress connections at once")
      }
      Some(_) => None,
    };
    if let Some(why) = refusal {
      drop(st);
      self.refuse(id, why);
      return Ok(());
    }
    let handler = st.egress.clone();
    st.open_egress += 1;
    let (slot, stream) = Stream::with_window(self.clone(), id, Origin::Egress, st.egress_window);
    st.streams.insert(id, slot);
    drop(st);
    let conn = EgressConn::new(port, peer, stream);
    // Checked above; a dropped connection is failed, as with no handler.
    if let Some(h) = handler {
      h(conn);
    }
    Ok(())
  }
}

/// A connection to one agent. Clones share it; dropping the last one closes the agent's
/// stdin, and the agent exits (killing any command still running).
#[derive(Clone)]
pub struct AgentClient {
  inner: Arc<Inner>,
}

struct Inner {
  shared: Arc<Shared>,
  hello: Hello,
  next_id: AtomicU32,
}

impl Drop for Inner {
  fn drop(&mut self) {
    // Closes the agent's stdin once what is queued is written.
    self.shared.out.close();
  }
}

impl AgentClient {
  /// Waits for the agent's hello on `reader`, checks its version, and starts the reader and
  /// writer tasks (on the current tokio runtime). On error the halves are dropped, which
  /// closes the agent's stdin.
  pub async fn connect<R, W>(
    mut reader: R,
    writer: W,
    opts: ClientOptions,
  ) -> Result<AgentClient, ClientError>
  where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
  {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let hello = tokio::time::timeout(opts.hello_timeout, read_hello(&mut reader, &mut buf))
      .await
      .map_err(|_| {
        ClientError::Handshake(format!(
          "no hello within {} ms{}",
          opts.hello_timeout.as_millis(),
          preview(&buf)
        ))
      })??;
    if let Some(expected) = &opts.expected_version {
      if &hello.version != expected || hello.protocol != crate::PROTOCOL {
        return Err(ClientError::VersionMismatch {
          agent: hello.version,
          protocol: hello.protocol,
          expected: expected.clone(),
        });
      }
    }
    let (ended, _) = watch::channel(false);
    let shared = Arc::new(Shared {
      out: Outbox::new(writer),
      state: Mutex::new(State {
        streams: HashMap::new(),
        ended: None,
        calls: None,
        open_calls: 0,
        held: HashMap::new(),
        egress: None,
        egress_window: 0,
        egress_max: 0,
        open_egress: 0,
      }),
      ended,
      born: std::time::Instant::now(),
      heard: std::sync::atomic::AtomicU64::new(0),
    });
    tokio::spawn(flush_loop(shared.clone()));
    tokio::spawn(read_loop(reader, buf, shared.clone()));
    Ok(AgentClient {
      inner: Arc::new(Inner {
        shared,
        hello,
        next_id: AtomicU32::new(1),
      }),
    })
  }

  /// What the agent said when it started.
  pub fn hello(&self) -> &Hello {
    &self.inner.hello
  }

  /// Whether the stream has ended (every request now fails).
  pub fn is_closed(&self) -> bool {
    *self.inner.shared.ended.borrow()
  }

  /// How long since the agent last sent anything.
  pub fn silent_for(&self) -> std::time::Duration {
    let sh = &self.inner.shared;
    let heard =
      std::time::Duration::from_micros(sh.heard.load(std::sync::atomic::Ordering::Relaxed));
    sh.born.elapsed().saturating_sub(heard)
  }

  /// Waits until the stream ends; the error says why.
  pub async fn closed(&self) -> ClientError {
    let mut rx = self.inner.shared.ended.subscribe();
    let _ = rx.wait_for(|e| *e).await;
    self.inner.shared.ended_error()
  }

  /// Closes the agent's stdin: it exits, killing commands still running. Requests in flight
  /// fail with `StreamEnded`, and each is cancelled first: an agent that was only stopped
  /// (SIGSTOP) reads everything sent before the end when it continues, and then starts none of
  /// them late.
  pub fn close(&self) {
    let shared = &self.inner.shared;
    let open: Vec<u32> = {
      let st = shared.state.lock().expect("state");
      st.streams
        .keys()
        .copied()
        .filter(|id| id & AGENT_STREAM == 0)
        .collect()
    };
    for id in open {
      shared.send(&Frame::empty(Kind::Cancel, id));
    }
    shared.end("the host closed the connection".into());
  }

  /// Opens a stream for `req`.
  fn open(&self, req: &Request) -> Result<Stream, ClientError> {
    let body = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
    if body.len() > MAX_PAYLOAD {
      return Err(ClientError::RequestTooLarge {
        bytes: body.len(),
        max: MAX_PAYLOAD,
      });
    }
    let id = loop {
      let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed) & !AGENT_STREAM;
      if id != 0 {
        break id;
      }
    };
    let shared = &self.inner.shared;
    let stream = {
      let mut st = shared.state.lock().expect("state");
      if st.ended.is_some() {
        drop(st);
        return Err(shared.ended_error());
      }
      let (slot, stream) = Stream::new(shared.clone(), id, Origin::Host);
      st.streams.insert(id, slot);
      stream
    };
    shared.send(&Frame::new(Kind::Open, id, body));
    Ok(stream)
  }

  /// Sends `req` and waits for its `Result`, skipping anything else.
  async fn call<T: serde::de::DeserializeOwned>(&self, req: &Request) -> Result<T, ClientError> {
    let mut s = self.open(req)?;
    loop {
      if let Inbound::Result(body) = s.next().await? {
        return outcome(&body);
      }
    }
  }

  /// A round trip that does nothing (not counted as activity).
  pub async fn ping(&self) -> Result<PingInfo, ClientError> {
    self.call(&Request::Ping).await
  }

  /// When the host last called (anything but ping and activity) and how many commands run.
  pub async fn activity(&self) -> Result<ActivityInfo, ClientError> {
    self.call(&Request::Activity).await
  }

  /// Runs a command; its output is kept under `req.max_output` (head and tail).
  pub async fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ClientError> {
    self.exec_with(req, |_| {}).await
  }

  /// `exec`, also handing each output chunk to `on_output` as it arrives.
  pub async fn exec_with<F>(
    &self,
    req: &ExecRequest,
    mut on_output: F,
  ) -> Result<ExecOutput, ClientError>
  where
    F: FnMut(&[u8]) + Send,
  {
    let spec = ExecSpec {
      command: req.command.clone(),
      cwd: req.cwd.clone(),
      env: req.env.clone(),
      user: req.user.clone(),
      timeout_ms: req
        .timeout
        .map(|t| (t.as_millis() as u64).max(1))
        .unwrap_or(0),
    };
    let mut s = self.open(&Request::Exec(spec))?;
    let mut kept = CappedOutput::new(req.max_output);
    let done: ExecDone = loop {
      match s.next().await? {
        Inbound::Data(b) => {
          on_output(&b);
          kept.push(&b);
          s.consumed(b.len());
        }
        Inbound::Result(body) => break outcome(&body)?,
        Inbound::Head(_) | Inbound::End => {}
      }
    };
    let omitted = kept.omitted();
    let output = if done.timed_out {
      timed_out_text(kept, req.timeout.unwrap_or_default())
    } else {
      kept.into_text()
    };
    Ok(ExecOutput {
      exit_code: if done.timed_out {
        TIMEOUT_EXIT_CODE
      } else {
        done.exit_code
      },
      output,
      timed_out: done.timed_out,
      omitted,
      recovered: done.recovered,
    })
  }

  /// Writes a file from `source`, streamed in chunks under the agent's credit. Nothing is
  /// left behind when it fails (the agent writes a temporary file and renames it into place).
  pub async fn upload<R>(&self, spec: UploadSpec, mut source: R) -> Result<UploadDone, ClientError>
  where
    R: AsyncRead + Unpin,
  {
    let mut s = self.open(&Request::Upload(spec))?;
    let mut buf = BytesMut::new();
    loop {
      buf.reserve(MAX_DATA);
      let n = (&mut source)
        .take(MAX_DATA as u64)
        .read_buf(&mut buf)
        .await
        .map_err(|e| ClientError::Source(e.to_string()))?;
      if n == 0 {
        break;
      }
      if !s.send_data(buf.split().freeze()).await? {
        break; // the agent answered early (an error)
      }
    }
    s.send_end();
    loop {
      if let Inbound::Result(body) = s.next().await? {
        return outcome(&body);
      }
    }
  }

  /// `upload` from bytes in memory (sent without copying).
  pub async fn upload_bytes(
    &self,
    spec: UploadSpec,
    data: Bytes,
  ) -> Result<UploadDone, ClientError> {
    let mut s = self.open(&Request::Upload(spec))?;
    s.send_data(data).await?;
    s.send_end();
    loop {
      if let Inbound::Result(body) = s.next().await? {
        return outcome(&body);
      }
    }
  }

  /// Asks the agent to stage a write of `spec.size` bytes that the caller then puts through the
  /// engine's archive endpoint (`Staging::Ready`), or learns why it will not
  /// (`Staging::Declined`: send the bytes with `upload`).
  pub async fn upload_staged(&self, spec: StagedUploadSpec) -> Result<Staging, ClientError> {
    let mut s = self.open(&Request::UploadStaged(spec))?;
    loop {
      match s.next().await? {
        Inbound::Head(body) => {
          let head: StagedHead = serde_json::from_slice(&body)
            .map_err(|e| s.violation(&format!("an unreadable staged head: {e}")))?;
          return Ok(Staging::Ready(StagedUpload { head, stream: s }));
        }
        Inbound::Result(body) => {
          let done: StagedDone = outcome(&body)?;
          return match done.declined {
            Some(why) => Ok(Staging::Declined(why)),
            None => Err(s.violation("a staged upload ended before it was staged")),
          };
        }
        Inbound::Data(_) => return Err(s.violation("data on a staged upload")),
        Inbound::End => {}
      }
    }
  }

  /// Starts a download: the file's size first (a file over `spec.max_bytes` is refused before
  /// any byte is sent), then its bytes through `Download::chunk`.
  pub async fn download(&self, spec: DownloadSpec) -> Result<Download, ClientError> {
    let mut s = self.open(&Request::Download(spec))?;
    loop {
      match s.next().await? {
        Inbound::Head(body) => {
          let head: DownloadHead = serde_json::from_slice(&body)
            .map_err(|e| s.violation(&format!("an unreadable download head: {e}")))?;
          return Ok(Download {
            head,
            stream: s,
            received: 0,
          });
        }
        Inbound::Result(body) => {
          // Only an error may come without a head.
          outcome::<DownloadDone>(&body)?;
          return Err(s.violation("a download ended without its head"));
        }
        Inbound::Data(_) => return Err(s.violation("download data before its head")),
        Inbound::End => {}
      }
    }
  }

  /// A whole file in memory (at most `spec.max_bytes`).
  pub async fn download_bytes(&self, spec: DownloadSpec) -> Result<Vec<u8>, ClientError> {
    let mut d = self.download(spec).await?;
    let mut out = Vec::with_capacity(d.head.size as usize);
    while let Some(chunk) = d.chunk().await? {
      out.extend_from_slice(&chunk);
    }
    Ok(out)
  }

  /// What is at a path (`None` when nothing is).
  pub async fn stat(&self, spec: StatSpec) -> Result<Option<StatInfo>, ClientError> {
    self.call(&Request::Stat(spec)).await
  }

  /// Makes the layout directories with their owners and modes (and the activity file).
  pub async fn layout(&self, spec: LayoutSpec) -> Result<(), ClientError> {
    self.call(&Request::Layout(spec)).await
  }

  /// Opens a Code Mode relay socket in the sandbox. Its calls arrive on `code_mode_calls`.
  pub async fn code_mode_listen(&self, spec: CodeModeListenSpec) -> Result<(), ClientError> {
    self.call(&Request::CodeModeListen(spec)).await
  }

  /// Closes a relay socket (and removes it).
  pub async fn code_mode_close(&self, socket: &str) -> Result<(), ClientError> {
    self
      .call(&Request::CodeModeClose {
        socket: socket.to_string(),
      })
      .await
  }

  /// The Code Mode calls of every relay socket of this agent. Until this is called, and
  /// after the receiver is dropped, calls fail at once with a transport error.
  pub fn code_mode_calls(&self) -> mpsc::UnboundedReceiver<CodeModeCall> {
    let (tx, rx) = mpsc::unbounded_channel();
    // A dropped receiver drops the call, which fails it.
    self.on_code_mode_call(Arc::new(move |call| {
      let _ = tx.send(call);
    }));
    rx
  }

  /// Hands every Code Mode call to `handler` as it arrives, on the reader task, with no task
  /// switch in between (a round trip's cost is mostly such switches). Replaces any earlier one.
  pub fn on_code_mode_call(&self, handler: CallHandler) {
    self.inner.shared.state.lock().expect("state").calls = Some(handler);
  }

  /// Has the agent listen on `127.0.0.1:port` (and `[::1]:port` where the sandbox has IPv6)
  /// for the sandbox's outbound connections; each arrives at the `on_egress` handler. Again with
  /// the same spec: nothing changes; with another: it replaces the first (connections in
  /// flight go on). `AddressInUse`: something in the sandbox listens on that port.
  pub async fn egress_listen(&self, spec: EgressListenSpec) -> Result<(), ClientError> {
    {
      // Before the request leaves: a connection may be opened as soon as the agent listens.
      let mut st = self.inner.shared.state.lock().expect("state");
      st.egress_window = st.egress_window.max(spec.window.min(WINDOW));
      st.egress_max = st.egress_max.max(spec.max_connections);
    }
    self.call(&Request::EgressListen(spec)).await
  }

  /// Stops listening for egress; connections in flight go on.
  pub async fn egress_close(&self) -> Result<(), ClientError> {
    self.call(&Request::EgressClose).await
  }

  /// Hands every egress connection to `handler` as it arrives, on the reader task: it must not
  /// block (spawn a task for the connection). Until this is called, connections are refused
  /// (the agent resets them). Replaces any earlier one.
  pub fn on_egress(&self, handler: EgressHandler) {
    self.inner.shared.state.lock().expect("state").egress = Some(handler);
  }
}

/// Reads frames until the hello. Anything else first means this is not (a working) agent.
async fn read_hello<R: AsyncRead + Unpin>(
  reader: &mut R,
  buf: &mut BytesMut,
) -> Result<Hello, ClientError> {
  loop {
    match frame::decode(buf) {
      Ok(Some(f)) if f.kind == Kind::Hello => {
        return serde_json::from_slice(&f.payload)
          .map_err(|e| ClientError::Handshake(format!("an unreadable hello: {e}")));
      }
      Ok(Some(f)) => {
        return Err(ClientError::Handshake(format!(
          "a {:?} frame came before the hello",
          f.kind
        )))
      }
      Ok(None) => {}
      Err(e) => {
        return Err(ClientError::Handshake(format!(
          "the output is not the agent protocol ({e}){}",
          preview(buf)
        )))
      }
    }
    buf.reserve(4096);
    let n = reader
      .read_buf(buf)
      .await
      .map_err(|e| ClientError::Handshake(format!("reading its output failed: {e}")))?;
    if n == 0 {
      return Err(ClientError::Handshake(format!(
        "its output ended before the hello{}",
        preview(buf)
      )));
    }
  }
}

/// What the stream held, for a message (a shell's "not found" …).
fn preview(buf: &[u8]) -> String {
  if buf.is_empty() {
    return String::new();
  }
  let text = String::from_utf8_lossy(&buf[..buf.len().min(300)]);
  format!(": {:?}", text.trim())
}

/// Reads frames and routes them until the stream ends or breaks the protocol.
async fn read_loop<R: AsyncRead + Unpin>(mut reader: R, mut buf: BytesMut, shared: Arc<Shared>) {
  let reason = 'outer: loop {
    loop {
      match frame::decode(&mut buf) {
        Ok(Some(f)) => {
          if let Err(e) = shared.dispatch(f) {
            break 'outer format!("protocol error: {e}");
          }
        }
        Ok(None) => break,
        Err(e) => break 'outer format!("protocol error: {e}"),
      }
    }
    buf.reserve(64 * 1024);
    match reader.read_buf(&mut buf).await {
      Ok(0) => break "the agent's output ended".to_string(),
      Ok(_) => shared.heard.store(
        shared.born.elapsed().as_micros() as u64,
        std::sync::atomic::Ordering::Relaxed,
      ),
      Err(e) => break format!("reading the agent's output failed: {e}"),
    }
  };
  shared.end(reason);
}

/// Writes what senders could not write themselves, until the stream closes or fails.
async fn flush_loop(shared: Arc<Shared>) {
  let reason = match shared.out.flusher().await {
    Ended::Closed => "the host closed the connection".to_string(),
    Ended::Failed(e) => format!("writing to the agent failed: {e}"),
  };
  shared.end(reason);
}

/// Decodes a `Result` payload.
fn outcome<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ClientError> {
  let o: Outcome<T> = serde_json::from_slice(body)
    .map_err(|e| ClientError::Protocol(format!("an unreadable result: {e}")))?;
  Ok(Result::from(o)?)
}

#[cfg(test)]
mod tests;
