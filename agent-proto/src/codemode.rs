//! Code Mode's relay stream, spoken by the host with `codemode/relay.py` and with the agent's
//! `codemode-lane`: frames of a 9-byte header (kind u8, request id u32, payload length u32, big
//! endian) and a payload. Relay to host: READY (`{"pid": …}`), then REQUEST; host to relay:
//! REPLY. The limits here are the ones every side enforces; `codemode/relay.py` and
//! `codemode/mcp_client.py` carry the same values, which the addon's tests hold them to.

use bytes::{Bytes, BytesMut};

/// Largest Code Mode request or reply payload, as TrueForge's own transports allow.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Room a reply may take beyond `MAX_MESSAGE_BYTES`: the envelope (`ok`, `source`, an error's
/// words) around a result of the largest size.
pub const REPLY_ENVELOPE_BYTES: usize = 4096;
/// Largest reply any side accepts.
pub const MAX_REPLY_BYTES: usize = MAX_MESSAGE_BYTES + REPLY_ENVELOPE_BYTES;

pub const HEADER_LEN: usize = 9;
pub const KIND_READY: u8 = 1;
pub const KIND_REQUEST: u8 = 2;
pub const KIND_REPLY: u8 = 3;

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
  pub kind: u8,
  pub id: u32,
  pub len: usize,
}

impl Head {
  /// The header at the start of `buf`, when it holds one whole.
  pub fn parse(buf: &[u8]) -> Option<Head> {
    let h: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
    Some(Head {
      kind: h[0],
      id: u32::from_be_bytes([h[1], h[2], h[3], h[4]]),
      len: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize,
    })
  }
}

/// One frame, header and payload.
pub fn encode(kind: u8, id: u32, payload: &[u8]) -> Bytes {
  let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
  out.extend_from_slice(&[kind]);
  out.extend_from_slice(&id.to_be_bytes());
  out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
  out.extend_from_slice(payload);
  out.freeze()
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn a_frame_reads_back() {
    let f = encode(KIND_REPLY, 0x0102_0304, b"{}");
    assert_eq!(&f[..HEADER_LEN], &[3, 1, 2, 3, 4, 0, 0, 0, 2]);
    let h = Head::parse(&f).expect("whole header");
    assert_eq!(
      h,
      Head {
        kind: KIND_REPLY,
        id: 0x0102_0304,
        len: 2
      }
    );
    assert_eq!(&f[HEADER_LEN..], b"{}");
    assert_eq!(Head::parse(&f[..HEADER_LEN - 1]), None);
  }
}
