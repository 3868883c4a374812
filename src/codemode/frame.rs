//! The relay stream's frames: a 9-byte header (kind u8, request id u32, payload length u32,
//! big endian) and a payload, reassembled from chunks whatever their boundaries.

use bytes::{Buf, Bytes, BytesMut};

use crate::codemode::MAX_MESSAGE_BYTES;

pub const HEADER_LEN: usize = 9;

pub const KIND_READY: u8 = 1;

pub const KIND_REQUEST: u8 = 2;

pub const KIND_REPLY: u8 = 3;

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
}
