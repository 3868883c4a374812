//! The state one connection's handles, reader task and streams share: the outbox, the table of
//! open streams, who serves the streams the agent opens, and how the connection ended. One lock
//! guards the table and the handlers together, so that ending the connection and the arrival of
//! a stream cannot interleave.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::watch;

use super::call::{CallHandler, CodeModeCall};
use super::egress::EgressHandler;
use super::error::ClientError;
use super::outbox::Outbox;
use super::stream::{Carrier, Slot};
use crate::frame::{self, Frame, Kind};

/// State shared by the client handles, the reader task and the streams.
pub(super) struct Shared {
  pub out: Outbox,
  pub state: Mutex<State>,
  pub ended: watch::Sender<bool>,
  /// When the connection was made, and microseconds after that when the agent was last heard.
  pub born: Instant,
  pub heard: AtomicU64,
}

pub(super) struct State {
  pub streams: HashMap<u32, Slot>,
  /// Why the stream ended, once it has.
  pub ended: Option<String>,
  /// Where Code Mode calls go, once someone asked for them.
  pub calls: Option<CallHandler>,
  pub open_calls: usize,
  /// Small Code Mode calls whose request is still arriving: each is handed over whole, at its
  /// end, so that it can be answered without waiting on anything.
  pub held: HashMap<u32, CodeModeCall>,
  /// Where egress connections go, once someone asked for them.
  pub egress: Option<EgressHandler>,
  /// The largest `window` and `max_connections` any `egress_listen` asked for (0: none yet).
  /// The largest, so that connections the agent opened under an earlier listen still fit.
  pub egress_window: u32,
  pub egress_max: u32,
  /// Egress connections open now (their slots in `streams`).
  pub open_egress: usize,
}

impl State {
  /// Takes a stream out of the table.
  pub fn remove(&mut self, id: u32) -> Option<Slot> {
    let slot = self.streams.remove(&id)?;
    if slot.egress {
      self.open_egress = self.open_egress.saturating_sub(1);
    }
    Some(slot)
  }
}

impl Shared {
  /// A connection writing to `writer`, with no stream open yet.
  pub fn new<W: AsyncWrite + Send + 'static>(writer: W) -> Shared {
    let (ended, _) = watch::channel(false);
    Shared {
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
      born: Instant::now(),
      heard: AtomicU64::new(0),
    }
  }
}

impl Carrier for Shared {
  fn send(&self, f: &Frame) {
    self.send_bytes(f.to_bytes());
  }

  fn send_bytes(&self, b: Bytes) {
    // A closed writer means the stream is over; `end` reports that to everyone.
    self.out.send([b]);
  }

  /// A data frame: its header, then the caller's bytes as they are (not copied into a frame).
  fn send_data(&self, id: u32, data: Bytes) {
    let head = frame::header(Kind::Data, id, data.len());
    self.out.send([Bytes::copy_from_slice(&head), data]);
  }

  fn is_ended(&self) -> bool {
    self.state.lock().expect("state").ended.is_some()
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

  fn granted(&self, id: u32, n: u32) -> bool {
    let mut st = self.state.lock().expect("state");
    match st.streams.get_mut(&id) {
      Some(slot) => {
        slot.unacked = slot.unacked.saturating_sub(n as u64);
        true
      }
      None => false,
    }
  }

  fn release(&self, id: u32, counted: bool) {
    let mut st = self.state.lock().expect("state");
    if let Some(slot) = st.remove(id) {
      slot.credit.close();
    }
    if counted {
      st.open_calls = st.open_calls.saturating_sub(1);
    }
  }
}
