//! Frames: the unit on the wire. A 9-byte header (payload length u32, kind u8, stream id u32,
//! all big endian) and the payload. Every frame names the stream it belongs to, so many
//! requests share the one byte stream; the payload cap bounds how long one frame can hold the
//! stream, and data moves in chunks of at most `MAX_DATA` under per-stream credit.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Header bytes before every payload.
pub const HEADER_LEN: usize = 9;
/// Largest payload a frame may carry. Control messages (JSON) must fit in it; data is chunked.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Largest `Data` payload a sender produces.
pub const MAX_DATA: usize = 256 * 1024;
/// Bytes of data each side may send on a stream before the receiver grants more.
pub const WINDOW: u32 = 2 * 1024 * 1024;
/// A receiver grants credit back once it has consumed at least this much.
pub const CREDIT_BATCH: u32 = 256 * 1024;
/// Streams the agent opens (Code Mode calls) have this bit set; the host's never do.
pub const AGENT_STREAM: u32 = 1 << 31;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
  /// Agent → host, stream 0, first frame: JSON `Hello`.
  Hello = 1,
  /// Opens a stream: JSON request (`msg::Request` from the host, `msg::AgentRequest` from the
  /// agent).
  Open = 2,
  /// The responder's JSON preamble before its data (a download's size and mode).
  Head = 3,
  /// Raw bytes of the stream, in the sender's direction; spends the sender's credit.
  Data = 4,
  /// The sender has no more data for the stream.
  End = 5,
  /// Payload: u32 big endian, bytes the receiver grants the sender on this stream.
  Credit = 6,
  /// The responder's final JSON answer (`msg::Outcome`); the stream is over.
  Result = 7,
  /// The opener gives the stream up; the responder stops (a command is killed) and sends
  /// nothing more for it.
  Cancel = 8,
}

impl Kind {
  fn from_u8(b: u8) -> Option<Kind> {
    Some(match b {
      1 => Kind::Hello,
      2 => Kind::Open,
      3 => Kind::Head,
      4 => Kind::Data,
      5 => Kind::End,
      6 => Kind::Credit,
      7 => Kind::Result,
      8 => Kind::Cancel,
      _ => return None,
    })
  }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
  pub kind: Kind,
  pub id: u32,
  pub payload: Bytes,
}

/// Why a byte stream cannot be read as frames. The stream is unusable after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
  #[error("a frame announces {len} bytes, over the limit of {MAX_PAYLOAD}")]
  TooLarge { len: usize },
  #[error("unknown frame kind {0}")]
  UnknownKind(u8),
}

impl Frame {
  pub fn new(kind: Kind, id: u32, payload: impl Into<Bytes>) -> Self {
    Self {
      kind,
      id,
      payload: payload.into(),
    }
  }

  /// A frame with no payload.
  pub fn empty(kind: Kind, id: u32) -> Self {
    Self::new(kind, id, Bytes::new())
  }

  /// A `Credit` frame granting `n` bytes.
  pub fn credit(id: u32, n: u32) -> Self {
    Self::new(Kind::Credit, id, Bytes::copy_from_slice(&n.to_be_bytes()))
  }

  /// The grant of a `Credit` frame; `None` for a malformed one.
  pub fn credit_amount(&self) -> Option<u32> {
    let b: [u8; 4] = self.payload.as_ref().try_into().ok()?;
    Some(u32::from_be_bytes(b))
  }

  /// A JSON frame of `value`.
  pub fn json<T: serde::Serialize>(kind: Kind, id: u32, value: &T) -> Self {
    // Serialising our own message types cannot fail (no maps with non-string keys).
    let body = serde_json::to_vec(value).unwrap_or_default();
    Self::new(kind, id, body)
  }

  /// Appends the encoded frame to `out`. Callers keep payloads within `MAX_PAYLOAD`; the
  /// receiver refuses larger ones.
  pub fn encode(&self, out: &mut BytesMut) {
    out.reserve(HEADER_LEN + self.payload.len());
    out.put_slice(&header(self.kind, self.id, self.payload.len()));
    out.extend_from_slice(&self.payload);
  }

  /// The encoded frame on its own.
  pub fn to_bytes(&self) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
    self.encode(&mut b);
    b.freeze()
  }
}

/// The header of a frame of `kind` on stream `id` carrying `len` payload bytes: a sender that
/// writes a large payload from its own buffer sends this before it, rather than copy both into
/// one frame.
pub fn header(kind: Kind, id: u32, len: usize) -> [u8; HEADER_LEN] {
  let mut h = [0u8; HEADER_LEN];
  h[..4].copy_from_slice(&(len as u32).to_be_bytes());
  h[4] = kind as u8;
  h[5..].copy_from_slice(&id.to_be_bytes());
  h
}

/// Takes the next complete frame off the front of `buf`, or `None` when more bytes are needed
/// (room for the rest of an announced frame is reserved). Payloads share `buf`'s memory.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
  if buf.len() < HEADER_LEN {
    return Ok(None);
  }
  let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
  if len > MAX_PAYLOAD {
    return Err(FrameError::TooLarge { len });
  }
  let kind = Kind::from_u8(buf[4]).ok_or(FrameError::UnknownKind(buf[4]))?;
  if buf.len() < HEADER_LEN + len {
    buf.reserve(HEADER_LEN + len - buf.len());
    return Ok(None);
  }
  let id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]);
  buf.advance(HEADER_LEN);
  let payload = buf.split_to(len).freeze();
  Ok(Some(Frame { kind, id, payload }))
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn header_layout_is_fixed() {
    let f = Frame::new(Kind::Data, 0x0102_0304, &b"xy"[..]);
    assert_eq!(&f.to_bytes()[..], b"\0\0\0\x02\x04\x01\x02\x03\x04xy");
    assert_eq!(Frame::credit(7, 65536).credit_amount(), Some(65536));
    assert_eq!(Frame::empty(Kind::Credit, 7).credit_amount(), None);
  }

  #[test]
  fn oversized_and_unknown_frames_are_refused_from_the_header() {
    let mut b = BytesMut::new();
    b.put_u32(MAX_PAYLOAD as u32 + 1);
    b.put_u8(Kind::Data as u8);
    b.put_u32(1);
    assert_eq!(
      decode(&mut b),
      Err(FrameError::TooLarge {
        len: MAX_PAYLOAD + 1
      })
    );
    let mut b = BytesMut::from(&b"\0\0\0\0\x63\0\0\0\0"[..]);
    assert_eq!(decode(&mut b), Err(FrameError::UnknownKind(0x63)));
  }

  #[test]
  fn a_frame_at_the_cap_passes() {
    let f = Frame::new(Kind::Open, 3, vec![7u8; MAX_PAYLOAD]);
    let mut b = BytesMut::from(&f.to_bytes()[..]);
    assert_eq!(decode(&mut b).unwrap(), Some(f));
    assert!(b.is_empty());
  }
}
