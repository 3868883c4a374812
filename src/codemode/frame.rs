//! The relay stream's frames (`trueforge_agent_proto::codemode` defines them), reassembled from
//! chunks whatever their boundaries.

use bytes::{Buf, BytesMut};
pub use trueforge_agent_proto::codemode::{
  encode, Head, HEADER_LEN, KIND_READY, KIND_REPLY, KIND_REQUEST,
};

use crate::codemode::meter::{Measured, Meter, Unfit};
use crate::codemode::MAX_MESSAGE_BYTES;

/// One frame of the relay stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
  pub kind: u8,
  pub id: u32,
  pub payload: Vec<u8>,
  /// What the payload holds, when it was accepted to be measured.
  pub measured: Option<Result<Measured, Unfit>>,
}

/// What the decoder has next.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
  /// A header: `accept` (its payload is then read into memory) or `skip` it (the payload is
  /// discarded as it arrives) before asking for the next event.
  Head(Head),
  /// An accepted frame, whole.
  Frame(Frame),
}

#[derive(Default)]
enum State {
  #[default]
  Header,
  Decide(Head),
  Body(Head, Vec<u8>, Option<Box<Meter>>),
  Skip(usize),
}

/// Reassembles frames from the stream's chunks, whatever their boundaries. Apart from an
/// accepted payload it holds at most the chunk it was last given.
#[derive(Default)]
pub struct Decoder {
  buf: BytesMut,
  state: State,
}

impl Decoder {
  pub fn push(&mut self, mut chunk: &[u8]) {
    // Payload bytes go straight where they belong, not through the buffer.
    if self.buf.is_empty() {
      match &mut self.state {
        State::Body(h, payload, meter) => {
          let n = (h.len - payload.len()).min(chunk.len());
          take(payload, meter, &chunk[..n]);
          chunk = &chunk[n..];
        }
        State::Skip(left) => {
          let n = (*left).min(chunk.len());
          *left -= n;
          chunk = &chunk[n..];
        }
        _ => {}
      }
    }
    self.buf.extend_from_slice(chunk);
  }

  /// The next event, `None` until more bytes come; `Err` when a header announces more than
  /// the limit (the stream cannot be trusted after that).
  pub fn next_event(&mut self) -> std::result::Result<Option<Event>, String> {
    loop {
      match &mut self.state {
        State::Header => {
          let Some(head) = Head::parse(&self.buf) else {
            return Ok(None);
          };
          let len = head.len;
          if len > MAX_MESSAGE_BYTES {
            return Err(format!(
              "the relay sent a frame of {len} bytes, over the limit of {MAX_MESSAGE_BYTES}"
            ));
          }
          self.buf.advance(HEADER_LEN);
          self.state = State::Decide(head);
          return Ok(Some(Event::Head(head)));
        }
        State::Decide(_) => return Err("a frame header was neither accepted nor skipped".into()),
        State::Body(h, payload, meter) => {
          let n = (h.len - payload.len()).min(self.buf.len());
          take(payload, meter, &self.buf[..n]);
          self.buf.advance(n);
          if payload.len() < h.len {
            return Ok(None);
          }
          let State::Body(h, payload, meter) = std::mem::take(&mut self.state) else {
            unreachable!("matched above")
          };
          return Ok(Some(Event::Frame(Frame {
            kind: h.kind,
            id: h.id,
            payload,
            measured: meter.map(|m| m.finish()),
          })));
        }
        State::Skip(left) => {
          let n = (*left).min(self.buf.len());
          self.buf.advance(n);
          *left -= n;
          if *left > 0 {
            return Ok(None);
          }
          self.state = State::Header;
        }
      }
    }
  }

  /// Reads the payload of the header just given into memory (all of it at once: room for it
  /// was found before).
  pub fn accept(&mut self) {
    if let State::Decide(h) = self.state {
      self.state = State::Body(h, Vec::with_capacity(h.len), None);
    }
  }

  /// As `accept`, measuring the payload (a request) as it arrives (`meter`).
  pub fn accept_measured(&mut self) {
    if let State::Decide(h) = self.state {
      self.state = State::Body(h, Vec::with_capacity(h.len), Some(Box::default()));
    }
  }

  /// Discards the payload of the header just given.
  pub fn skip(&mut self) {
    if let State::Decide(h) = self.state {
      self.state = State::Skip(h.len);
    }
  }
}

/// Payload bytes arrived: kept, and measured when asked.
fn take(payload: &mut Vec<u8>, meter: &mut Option<Box<Meter>>, bytes: &[u8]) {
  payload.extend_from_slice(bytes);
  if let Some(m) = meter {
    m.push(bytes);
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  /// Every frame, each accepted, or each skipped when `skip` says so.
  fn decode(d: &mut Decoder, skip: impl Fn(&Head) -> bool, out: &mut Vec<Frame>) {
    while let Some(e) = d.next_event().unwrap() {
      match e {
        Event::Head(h) if skip(&h) => d.skip(),
        Event::Head(_) => d.accept(),
        Event::Frame(f) => out.push(f),
      }
    }
  }

  #[test]
  fn frames_round_trip_across_any_split() {
    let mut wire = Vec::new();
    wire.extend_from_slice(&encode(KIND_READY, 0, b"{\"pid\":7}"));
    wire.extend_from_slice(&encode(KIND_REQUEST, 42, b""));
    wire.extend_from_slice(&encode(KIND_REQUEST, u32::MAX, &[0xff; 3000]));
    wire.extend_from_slice(&encode(KIND_REQUEST, 9, &[1; 700]));
    wire.extend_from_slice(&encode(KIND_REPLY, 5, b"tail"));
    for step in [1, 2, 5, 9, 10, 4096] {
      let mut d = Decoder::default();
      let mut got = Vec::new();
      for chunk in wire.chunks(step) {
        d.push(chunk);
        decode(&mut d, |h| h.id == 9, &mut got);
      }
      assert_eq!(got.len(), 4, "split {step}");
      assert_eq!(got[0].kind, KIND_READY);
      assert_eq!(&got[0].payload[..], b"{\"pid\":7}");
      assert_eq!((got[1].kind, got[1].id, got[1].payload.len()), (2, 42, 0));
      assert_eq!((got[2].id, got[2].payload.len()), (u32::MAX, 3000));
      assert_eq!(
        (got[3].kind, &got[3].payload[..]),
        (KIND_REPLY, &b"tail"[..]),
        "after a skip"
      );
    }
  }

  #[test]
  fn a_header_comes_before_its_payload_is_held() {
    let mut d = Decoder::default();
    let wire = encode(KIND_REQUEST, 3, &[7; 100_000]);
    d.push(&wire[..HEADER_LEN + 10]);
    let Some(Event::Head(h)) = d.next_event().unwrap() else {
      panic!("a header first")
    };
    assert_eq!((h.id, h.len), (3, 100_000));
    assert!(d.next_event().is_err(), "a header must be decided first");
  }

  #[test]
  fn measured_payloads_are_measured_across_any_split() {
    let wire = encode(KIND_REQUEST, 1, br#"{"op":"list_tools","server":"s"}"#);
    let bad = encode(KIND_REQUEST, 2, b"{\"op\":");
    let all: Vec<u8> = [&wire[..], &bad[..]].concat();
    for step in [1, 3, 10, 4096] {
      let mut d = Decoder::default();
      let mut got = Vec::new();
      for chunk in all.chunks(step) {
        d.push(chunk);
        while let Some(e) = d.next_event().unwrap() {
          match e {
            Event::Head(_) => d.accept_measured(),
            Event::Frame(f) => got.push(f.measured),
          }
        }
      }
      assert!(
        matches!(&got[0], Some(Ok(m)) if m.values == 3),
        "split {step}"
      );
      assert_eq!(got[1], Some(Err(Unfit::Malformed)), "split {step}");
    }
  }

  #[test]
  fn oversized_frames_are_refused() {
    let mut d = Decoder::default();
    let mut header = vec![KIND_REQUEST];
    header.extend_from_slice(&1u32.to_be_bytes());
    header.extend_from_slice(&((MAX_MESSAGE_BYTES as u32) + 1).to_be_bytes());
    d.push(&header);
    assert!(d.next_event().is_err());
  }
}
