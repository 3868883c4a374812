//! The agent's end of the protocol stream: the table of open streams, credit in both
//! directions, and the handle each request's task uses (`StreamIo`). Everything runs on the one
//! runtime thread, so state is `Rc`/`Cell` based.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Notify};
use trueforge_agent_proto::frame::{
  self, Frame, Kind, AGENT_STREAM, CREDIT_BATCH, MAX_DATA, WINDOW,
};
use trueforge_agent_proto::msg::Outcome;

/// Bytes a sender may still send on one stream, or how a waiter learns the stream is over.
pub struct Credit {
  avail: Cell<u64>,
  closed: Cell<bool>,
  notify: Notify,
}

impl Credit {
  fn new(window: u32) -> Rc<Credit> {
    Rc::new(Credit {
      avail: Cell::new(window as u64),
      closed: Cell::new(false),
      notify: Notify::new(),
    })
  }

  pub fn add(&self, n: u64) {
    self.avail.set(self.avail.get() + n);
    self.notify.notify_waiters();
  }

  pub fn close(&self) {
    self.closed.set(true);
    self.notify.notify_waiters();
  }

  pub fn is_closed(&self) -> bool {
    self.closed.get()
  }

  /// Waits until some credit is available; 0 once the stream is over.
  pub async fn wait(&self) -> u64 {
    loop {
      let n = self.notify.notified();
      if self.closed.get() {
        return 0;
      }
      if self.avail.get() > 0 {
        return self.avail.get();
      }
      n.await;
    }
  }

  pub fn take(&self, n: u64) {
    self.avail.set(self.avail.get().saturating_sub(n));
  }
}

/// What the host sends on a stream after opening it.
pub enum In {
  Data(Bytes),
  End,
  /// The host's answer to a stream the agent opened.
  Result(Bytes),
}

struct Entry {
  inbound: mpsc::UnboundedSender<In>,
  credit: Rc<Credit>,
  /// Host data not yet granted back; over `WINDOW` is a protocol violation.
  unacked: u64,
}

/// A pipe of our own that a download fills from its file (the file's pages, not copies).
pub struct Pipe {
  pub read: OwnedFd,
  pub write: OwnedFd,
  /// What it holds at most.
  pub capacity: usize,
}

/// What the writer puts on stdout, in order.
pub enum Out {
  Bytes(Bytes),
  /// A data frame whose payload is the `len` bytes waiting in `pipe`: its header is written,
  /// then the bytes are moved from pipe to pipe. `done` says whether they all went.
  Spliced {
    head: Bytes,
    pipe: Arc<Pipe>,
    len: usize,
    done: oneshot::Sender<bool>,
  },
  /// Answered once the reader at the other end of stdout has taken everything written before
  /// it: spliced bytes are the file's pages until then, not copies.
  Drained(oneshot::Sender<()>),
}

/// The connection: outgoing frames and the open streams.
pub struct Conn {
  out: mpsc::UnboundedSender<Out>,
  streams: RefCell<HashMap<u32, Entry>>,
  next_agent_id: Cell<u32>,
}

impl Conn {
  pub fn new(out: mpsc::UnboundedSender<Out>) -> Rc<Conn> {
    Rc::new(Conn {
      out,
      streams: RefCell::new(HashMap::new()),
      next_agent_id: Cell::new(0),
    })
  }

  pub fn send(&self, f: &Frame) {
    let _ = self.out.send(Out::Bytes(f.to_bytes()));
  }

  /// A data frame: its header, then its payload as it is (not copied here; the writer copies
  /// it into its reused batch, so no large buffer is allocated per frame).
  fn send_data_frame(&self, id: u32, data: Bytes) {
    let head = frame::header(Kind::Data, id, data.len());
    let _ = self.out.send(Out::Bytes(Bytes::copy_from_slice(&head)));
    let _ = self.out.send(Out::Bytes(data));
  }

  /// Registers a stream and returns its handle.
  pub fn register(self: &Rc<Self>, id: u32) -> Result<StreamIo, String> {
    self.register_with(id, WINDOW)
  }

  /// Registers a stream on which we send at most `window` bytes before the host grants more.
  fn register_with(self: &Rc<Self>, id: u32, window: u32) -> Result<StreamIo, String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let credit = Credit::new(window);
    let mut streams = self.streams.borrow_mut();
    if streams.contains_key(&id) {
      return Err(format!("the host reused stream {id}"));
    }
    streams.insert(
      id,
      Entry {
        inbound: tx,
        credit: credit.clone(),
        unacked: 0,
      },
    );
    Ok(StreamIo {
      conn: self.clone(),
      id,
      credit,
      inbound: rx,
      consumed: 0,
      done: false,
    })
  }

  /// Opens a stream of our own (a Code Mode call) with `open` as its request.
  pub fn open_agent_stream<T: serde::Serialize>(self: &Rc<Self>, open: &T) -> StreamIo {
    self.open_agent_stream_with(open, WINDOW)
  }

  /// `open_agent_stream` with a send window of `window` bytes instead of `WINDOW` (an egress
  /// connection: the host holds at most that much of it).
  pub fn open_agent_stream_with<T: serde::Serialize>(
    self: &Rc<Self>,
    open: &T,
    window: u32,
  ) -> StreamIo {
    let id = loop {
      let n = self.next_agent_id.get().wrapping_add(1) & !AGENT_STREAM;
      self.next_agent_id.set(n);
      let id = n | AGENT_STREAM;
      if !self.streams.borrow().contains_key(&id) {
        break id;
      }
    };
    let io = self.register_with(id, window).expect("a free id");
    self.send(&Frame::json(Kind::Open, id, open));
    io
  }

  /// Routes a frame for an open stream. An error is a protocol violation (the agent exits).
  pub fn route(&self, f: Frame) -> Result<(), String> {
    let mut streams = self.streams.borrow_mut();
    match f.kind {
      Kind::Data => {
        let Some(e) = streams.get_mut(&f.id) else {
          return Ok(()); // a stream already answered
        };
        e.unacked += f.payload.len() as u64;
        if e.unacked > WINDOW as u64 {
          return Err(format!("stream {} sent more data than its credit", f.id));
        }
        let _ = e.inbound.send(In::Data(f.payload));
      }
      Kind::End => {
        if let Some(e) = streams.get(&f.id) {
          let _ = e.inbound.send(In::End);
        }
      }
      Kind::Credit => {
        let n = f.credit_amount().ok_or("a malformed credit frame")?;
        if let Some(e) = streams.get(&f.id) {
          e.credit.add(n as u64);
        }
      }
      Kind::Cancel | Kind::Result => {
        // Cancel: the host gave the stream up. Result: the host answered our stream. Either
        // way it is over; the task sees its credit closed and its inbound end.
        if let Some(e) = streams.remove(&f.id) {
          e.credit.close();
          if f.kind == Kind::Result {
            let _ = e.inbound.send(In::Result(f.payload));
          }
        }
      }
      Kind::Hello | Kind::Head | Kind::Open => {
        return Err(format!("an unexpected {:?} frame", f.kind));
      }
    }
    Ok(())
  }

  fn forget(&self, id: u32) {
    if let Some(e) = self.streams.borrow_mut().remove(&id) {
      e.credit.close();
    }
  }

  fn acked(&self, id: u32, n: u64) -> bool {
    match self.streams.borrow_mut().get_mut(&id) {
      Some(e) => {
        e.unacked = e.unacked.saturating_sub(n);
        true
      }
      None => false,
    }
  }

  /// Every open stream is closed (the agent is exiting).
  pub fn close_all(&self) {
    for (_, e) in self.streams.borrow_mut().drain() {
      e.credit.close();
    }
  }
}

/// One stream as its task sees it.
pub struct StreamIo {
  conn: Rc<Conn>,
  pub id: u32,
  credit: Rc<Credit>,
  inbound: mpsc::UnboundedReceiver<In>,
  consumed: u64,
  done: bool,
}

impl StreamIo {
  /// Whether the host gave the stream up (or the connection is closing).
  pub fn cancelled(&self) -> bool {
    self.credit.is_closed()
  }

  /// Resolves once the stream is cancelled.
  pub async fn until_cancelled(&self) {
    while !self.credit.is_closed() {
      let n = self.credit.notify.notified();
      if self.credit.is_closed() {
        return;
      }
      n.await;
    }
  }

  /// Credit available now, waiting for some if there is none; 0 when cancelled.
  pub async fn credit(&self) -> u64 {
    self.credit.wait().await
  }

  /// A handle that sends on this stream while its inbound side is read elsewhere.
  pub fn sender(&self) -> Sender {
    Sender {
      conn: self.conn.clone(),
      id: self.id,
      credit: self.credit.clone(),
    }
  }

  /// Sends data the caller already has credit for (`credit` returned at least its length).
  pub fn send_now(&self, data: Bytes) {
    self.credit.take(data.len() as u64);
    self.conn.send_data_frame(self.id, data);
  }

  /// Sends the `len` bytes waiting in `pipe` as one data frame the caller has credit for. The
  /// answer comes once they are on stdout (false: they could not all be written); until then
  /// the pipe is the writer's.
  pub fn send_spliced(&self, pipe: Arc<Pipe>, len: usize) -> oneshot::Receiver<bool> {
    self.credit.take(len as u64);
    let (done, rx) = oneshot::channel();
    let head = Bytes::copy_from_slice(&frame::header(Kind::Data, self.id, len));
    let _ = self.conn.out.send(Out::Spliced {
      head,
      pipe,
      len,
      done,
    });
    rx
  }

  /// Resolves once everything sent before this call has left stdout's pipe.
  pub async fn drained(&self) {
    let (done, rx) = oneshot::channel();
    let _ = self.conn.out.send(Out::Drained(done));
    let _ = rx.await;
  }

  /// Sends `data` in chunks as credit allows. False when the stream was cancelled first.
  pub async fn send_data(&self, mut data: Bytes) -> bool {
    while !data.is_empty() {
      let avail = self.credit.wait().await;
      if avail == 0 {
        return false;
      }
      let n = data.len().min(avail as usize).min(MAX_DATA);
      self.send_now(data.split_to(n));
    }
    true
  }

  pub fn send_head<T: serde::Serialize>(&self, head: &T) {
    self.conn.send(&Frame::json(Kind::Head, self.id, head));
  }

  pub fn send_end(&self) {
    self.conn.send(&Frame::empty(Kind::End, self.id));
  }

  /// The stream's final answer; the stream is then forgotten.
  pub fn result<T: serde::Serialize>(&mut self, outcome: &Outcome<T>) {
    self.done = true;
    self.conn.forget(self.id);
    self.conn.send(&Frame::json(Kind::Result, self.id, outcome));
  }

  /// The next thing the host sent; `None` once the stream is cancelled or closed (the table
  /// drops its sender then, after anything routed before).
  pub async fn recv(&mut self) -> Option<In> {
    self.inbound.recv().await
  }

  /// Something the host already sent, without waiting.
  pub fn try_recv(&mut self) -> Option<In> {
    self.inbound.try_recv().ok()
  }

  /// Grants consumed host data back (in batches).
  pub fn consumed(&mut self, n: usize) {
    self.consumed += n as u64;
    if self.consumed >= CREDIT_BATCH as u64 {
      let n = std::mem::take(&mut self.consumed);
      if self.conn.acked(self.id, n) {
        self.conn.send(&Frame::credit(self.id, n as u32));
      }
    }
  }

  /// Gives up a stream we opened (the host is told).
  pub fn cancel(&mut self) {
    if !self.done {
      self.done = true;
      self.conn.forget(self.id);
      self.conn.send(&Frame::empty(Kind::Cancel, self.id));
    }
  }
}

/// The sending side of a stream, for a task that also waits on the stream's inbound side.
pub struct Sender {
  conn: Rc<Conn>,
  id: u32,
  credit: Rc<Credit>,
}

impl Sender {
  /// Credit available now, waiting for some if there is none; 0 once the stream is over.
  pub async fn credit(&self) -> u64 {
    self.credit.wait().await
  }

  /// Sends data the caller has credit for.
  pub fn send_now(&self, data: Bytes) {
    self.credit.take(data.len() as u64);
    self.conn.send_data_frame(self.id, data);
  }

  pub fn send_end(&self) {
    self.conn.send(&Frame::empty(Kind::End, self.id));
  }
}

impl Drop for StreamIo {
  fn drop(&mut self) {
    if !self.done {
      self.conn.forget(self.id);
    }
  }
}
