//! One stream's two ends inside the client: the `Slot` the reader task routes frames into, and
//! the `Stream` a request (or a Code Mode call) reads them from and sends data on, with credit
//! both ways. A stream reaches its connection only through `Carrier`, so that the connection's
//! state (which holds the streams' slots, and the calls made of streams) can sit above it.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::{mpsc, Semaphore};

use super::error::ClientError;
use crate::frame::{self, Frame, Kind, CREDIT_BATCH, HEADER_LEN, MAX_DATA, WINDOW};
use crate::msg::{AgentError, ErrorKind, Outcome};

/// What a stream needs of the connection that carries it (the connection's `Shared` state).
pub(super) trait Carrier: Send + Sync {
  /// Writes one frame.
  fn send(&self, f: &Frame);
  /// Writes encoded frames, together.
  fn send_bytes(&self, b: Bytes);
  /// Writes a data frame with the caller's bytes as they are.
  fn send_data(&self, id: u32, data: Bytes);
  /// Ends the connection: every stream's waiter wakes with `StreamEnded`.
  fn end(&self, reason: String);
  /// Whether the connection has ended.
  fn is_ended(&self) -> bool;
  /// The `StreamEnded` error, with why the connection ended.
  fn ended_error(&self) -> ClientError;
  /// Takes `n` bytes granted back off stream `id`'s count; `false` when the stream is no longer
  /// routed (then there is nothing to grant).
  fn granted(&self, id: u32, n: u32) -> bool;
  /// Stops routing stream `id` and closes its credit; `counted`: it was one of the open Code Mode
  /// calls, one fewer now.
  fn release(&self, id: u32, counted: bool);
}

/// What arrives on a stream.
pub(super) enum Inbound {
  Head(Bytes),
  Data(Bytes),
  End,
  Result(Bytes),
}

/// The reader task's end of a stream.
pub(super) struct Slot {
  pub tx: mpsc::UnboundedSender<Inbound>,
  /// Our send window on this stream; closed when the stream or the connection ends.
  pub credit: Arc<Semaphore>,
  /// Bytes the agent sent that we have not yet granted back. Bounded by `limit`, which bounds
  /// what `tx` can hold.
  pub unacked: u64,
  /// The agent's window on this stream: `WINDOW`, or an egress listen's smaller one.
  pub limit: u64,
  /// An egress connection (counted in `State::open_egress` while its slot is in the table).
  pub egress: bool,
}

/// Who opened a stream, which says what dropping it unanswered does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
  /// A request of ours: dropped, it is cancelled.
  Host,
  /// A Code Mode call (counted in `State::open_calls`): dropped, it is failed.
  CodeMode,
  /// An egress connection: dropped, it is failed (the agent resets the socket).
  Egress,
}

/// The caller's end of a stream.
pub(super) struct Stream {
  carrier: Arc<dyn Carrier>,
  id: u32,
  rx: mpsc::UnboundedReceiver<Inbound>,
  credit: Arc<Semaphore>,
  /// Consumed but not yet granted back.
  consumed: u32,
  /// Credit goes back once this much is consumed: below the agent's window, or it would wait
  /// for a grant that never comes.
  batch: u32,
  /// A frame that arrived while we were sending, delivered by the next `next`.
  early: Option<Inbound>,
  /// The stream is over for us: nothing to cancel or answer on drop.
  finished: bool,
  origin: Origin,
  /// Still counted among the open Code Mode calls.
  counted: bool,
}

impl Stream {
  pub fn new(carrier: Arc<dyn Carrier>, id: u32, origin: Origin) -> (Slot, Stream) {
    Self::with_window(carrier, id, origin, WINDOW)
  }

  /// A stream on which the agent sends at most `window` bytes before we grant more.
  pub fn with_window(
    carrier: Arc<dyn Carrier>,
    id: u32,
    origin: Origin,
    window: u32,
  ) -> (Slot, Stream) {
    let (tx, rx) = mpsc::unbounded_channel();
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    let slot = Slot {
      tx,
      credit: credit.clone(),
      unacked: 0,
      limit: window as u64,
      egress: origin == Origin::Egress,
    };
    let stream = Stream {
      carrier,
      id,
      rx,
      credit,
      consumed: 0,
      batch: (window / 2).clamp(1, CREDIT_BATCH),
      early: None,
      finished: false,
      origin,
      counted: origin == Origin::CodeMode,
    };
    (slot, stream)
  }

  /// The next frame of this stream; `StreamEnded` once the connection is gone.
  pub async fn next(&mut self) -> Result<Inbound, ClientError> {
    let msg = match self.early.take() {
      Some(m) => Some(m),
      None => self.rx.recv().await,
    };
    match msg {
      Some(Inbound::Result(b)) => {
        self.finished = true;
        Ok(Inbound::Result(b))
      }
      Some(m) => Ok(m),
      None => {
        self.finished = true;
        Err(self.carrier.ended_error())
      }
    }
  }

  /// `next` for a poller: `None` once the stream is over for us (the agent cancelled it, or the
  /// connection ended: `Carrier::is_ended` says which).
  pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Inbound>> {
    if let Some(m) = self.early.take() {
      return Poll::Ready(Some(m));
    }
    let msg = std::task::ready!(self.rx.poll_recv(cx));
    if !matches!(
      msg,
      Some(Inbound::Data(_) | Inbound::Head(_) | Inbound::End)
    ) {
      self.finished = true;
    }
    Poll::Ready(msg)
  }

  /// What has already arrived on this stream, without waiting.
  pub fn try_next(&mut self) -> Option<Inbound> {
    let msg = self.early.take().or_else(|| self.rx.try_recv().ok())?;
    if matches!(msg, Inbound::Result(_)) {
      self.finished = true;
    }
    Some(msg)
  }

  /// Grants `n` consumed bytes back to the agent (in batches).
  pub fn consumed(&mut self, n: usize) {
    self.consumed += n as u32;
    if self.consumed < self.batch {
      return;
    }
    let n = std::mem::take(&mut self.consumed);
    if self.carrier.granted(self.id, n) {
      self.carrier.send(&Frame::credit(self.id, n));
    }
  }

  /// Sends `data` in chunks, each once the agent has granted room for it. `Ok(false)` when the
  /// agent answered before taking it all (an error in its `Result`, read by `next`).
  pub async fn send_data(&mut self, mut data: Bytes) -> Result<bool, ClientError> {
    if self.early.is_some() {
      return Ok(false);
    }
    while !data.is_empty() {
      let chunk = data.split_to(data.len().min(MAX_DATA));
      tokio::select! {
        biased;
        msg = self.rx.recv() => {
          match msg {
            Some(m) => {
              self.early = Some(m);
              return Ok(false);
            }
            None => {
              self.finished = true;
              return Err(self.carrier.ended_error());
            }
          }
        }
        permit = self.credit.acquire_many(chunk.len() as u32) => {
          match permit {
            Ok(p) => p.forget(),
            Err(_) => {
              // Closed: the stream is over (a result is waiting, or the connection ended).
              if self.early.is_none() {
                self.early = self.rx.recv().await;
              }
              return match self.early {
                Some(_) => Ok(false),
                None => {
                  self.finished = true;
                  Err(self.carrier.ended_error())
                }
              };
            }
          }
        }
      }
      self.carrier.send_data(self.id, chunk);
    }
    Ok(true)
  }

  /// Our send window on this stream (closed once the stream is over).
  pub fn credit(&self) -> &Arc<Semaphore> {
    &self.credit
  }

  /// Sends a copy of `data` (at most `MAX_DATA`, credit already taken) as one frame: one copy,
  /// and one part for the outbox, which would copy header and data again to join them.
  pub fn send_data_copy(&self, data: &[u8]) {
    let mut b = BytesMut::with_capacity(HEADER_LEN + data.len());
    b.put_slice(&frame::header(Kind::Data, self.id, data.len()));
    b.put_slice(data);
    self.carrier.send_bytes(b.freeze());
  }

  /// Whether the stream is over for us (answered, or given up by the agent).
  pub fn is_finished(&self) -> bool {
    self.finished
  }

  /// The connection this stream is on.
  pub fn carrier(&self) -> &dyn Carrier {
    &*self.carrier
  }

  /// No more data from us.
  pub fn send_end(&self) {
    self.carrier.send(&Frame::empty(Kind::End, self.id));
  }

  /// Answers an agent-opened stream and forgets it.
  pub fn finish_with<T: serde::Serialize>(&mut self, outcome: &Outcome<T>) {
    self.finished = true;
    self.release();
    self
      .carrier
      .send(&Frame::json(Kind::Result, self.id, outcome));
  }

  /// Sends `data` and then the answer in one write, when the data fits in one frame and the
  /// agent's credit covers it now; `false` (nothing sent) otherwise. A small answer then costs
  /// one pass through the engine's stream rather than two.
  pub fn try_finish_with_data<T: serde::Serialize>(
    &mut self,
    data: &Bytes,
    outcome: &Outcome<T>,
  ) -> bool {
    if self.early.is_some() || data.len() > MAX_DATA {
      return false;
    }
    match self.credit.try_acquire_many(data.len() as u32) {
      Ok(p) => p.forget(),
      Err(_) => return false,
    }
    self.finished = true;
    self.release();
    let mut both = BytesMut::new();
    Frame::new(Kind::Data, self.id, data.clone()).encode(&mut both);
    Frame::json(Kind::Result, self.id, outcome).encode(&mut both);
    self.carrier.send_bytes(both.freeze());
    true
  }

  /// A protocol violation on this stream: the connection cannot be trusted, so it ends.
  pub fn violation(&mut self, what: &str) -> ClientError {
    self.finished = true;
    let reason = format!("protocol error: {what}");
    self.carrier.end(reason.clone());
    ClientError::Protocol(what.to_string())
  }

  fn release(&mut self) {
    let counted = std::mem::take(&mut self.counted);
    self.carrier.release(self.id, counted);
  }
}

impl Drop for Stream {
  fn drop(&mut self) {
    if self.finished {
      self.release();
      return;
    }
    let dropped = match self.origin {
      Origin::CodeMode => "the host dropped the Code Mode call",
      Origin::Egress => "the host dropped the egress connection",
      Origin::Host => {
        // Abandoned: the agent stops (a running command is killed, a partial upload removed).
        self.release();
        self.carrier.send(&Frame::empty(Kind::Cancel, self.id));
        return;
      }
    };
    self.finish_with(&Outcome::<()>::Err(AgentError::new(ErrorKind::Io, dropped)));
  }
}
