//! The reader task: it reads the agent's frames and routes each to its stream, with credit
//! checked, and serves the streams the agent opens (Code Mode calls and egress connections). It
//! never waits on a caller, so one slow stream cannot stall the others.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::call::CodeModeCall;
use super::egress::EgressConn;
use super::shared::Shared;
use super::stream::{Carrier, Inbound, Origin, Stream};
use crate::codemode::MAX_MESSAGE_BYTES;
use crate::frame::{self, Frame, Kind, AGENT_STREAM};
use crate::msg::{AgentError, AgentRequest, ErrorKind, Outcome, MAX_CODE_MODE_CALLS};

/// A Code Mode call announcing at most this many bytes is handed over once all of them have
/// arrived (they fit in the credit the agent starts with); a larger one at once, so that room
/// can be made before its bytes are read.
const HELD_CALL_BYTES: usize = 64 * 1024;

/// Reads frames and routes them until the stream ends or breaks the protocol.
pub(super) async fn read_loop<R: AsyncRead + Unpin>(
  mut reader: R,
  mut buf: BytesMut,
  shared: Arc<Shared>,
) {
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
      Ok(_) => shared
        .heard
        .store(shared.born.elapsed().as_micros() as u64, Ordering::Relaxed),
      Err(e) => break format!("reading the agent's output failed: {e}"),
    }
  };
  shared.end(reason);
}

impl Shared {
  /// Answers an agent stream with an error at once (the agent gives it up).
  fn refuse(&self, id: u32, why: &str) {
    self.send(&Frame::json(
      Kind::Result,
      id,
      &Outcome::<()>::Err(AgentError::new(ErrorKind::Io, why)),
    ));
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
    let call = CodeModeCall::new(socket, size, stream);
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
