//! SOCKS5 (RFC 1928) as `ALL_PROXY=socks5h://` clients speak it: no authentication, CONNECT
//! only, to a domain, an IPv4 or an IPv6 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::intake::{Intake, Short};
use super::target::Target;

pub(super) const SUCCEEDED: u8 = 0x00;
pub(super) const GENERAL_FAILURE: u8 = 0x01;
pub(super) const COMMAND_NOT_SUPPORTED: u8 = 0x07;
pub(super) const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;

/// A greeting and a request fit in this many bytes (each at most 262).
pub(super) const CAP: usize = 1024;

/// SOCKS4's "request rejected or failed", the whole reply a SOCKS4 client gets.
pub(super) const SOCKS4_REJECTED: [u8; 8] = [0, 0x5b, 0, 0, 0, 0, 0, 0];

/// A handshake that ended without a target: the reply code to send, if any, and why.
#[derive(Debug)]
pub(super) struct Refused {
  pub reply: Option<u8>,
  pub why: String,
}

fn refused(reply: Option<u8>, why: impl Into<String>) -> Refused {
  Refused {
    reply,
    why: why.into(),
  }
}

impl From<Short> for Refused {
  fn from(s: Short) -> Refused {
    match s {
      Short::Full => refused(None, "SOCKS5 handshake too long"),
      Short::Eof => refused(None, "the client closed during the SOCKS5 handshake"),
      Short::Io(e) => refused(None, format!("reading the SOCKS5 handshake: {e}")),
    }
  }
}

/// The greeting (answered with "no authentication") and the request, up to its target.
pub(super) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
  io: &mut S,
  intake: &mut Intake,
) -> Result<Target, Refused> {
  intake.need(io, 2, CAP).await?;
  let methods = intake.unread()[1] as usize;
  intake.need(io, 2 + methods, CAP).await?;
  let no_auth = intake.unread()[2..2 + methods].contains(&0);
  intake.consume(2 + methods);
  if !no_auth {
    let _ = io.write_all(&[5, 0xff]).await;
    return Err(refused(
      None,
      "the SOCKS5 client offers no method without authentication",
    ));
  }
  io.write_all(&[5, 0])
    .await
    .map_err(|e| refused(None, format!("answering the SOCKS5 greeting: {e}")))?;
  intake.need(io, 4, CAP).await?;
  let &[ver, cmd, _, atyp] = &intake.unread()[..4] else {
    unreachable!("four bytes are held")
  };
  if ver != 5 {
    return Err(refused(
      None,
      format!("SOCKS version {ver} in a SOCKS5 request"),
    ));
  }
  if cmd != 1 {
    return Err(refused(
      Some(COMMAND_NOT_SUPPORTED),
      format!("SOCKS5 command {cmd} is not supported; only CONNECT (1) is"),
    ));
  }
  let len = match atyp {
    1 => 4,
    4 => 16,
    3 => {
      intake.need(io, 5, CAP).await?;
      1 + intake.unread()[4] as usize
    }
    _ => {
      return Err(refused(
        Some(ADDRESS_TYPE_NOT_SUPPORTED),
        format!("SOCKS5 address type {atyp} is not supported"),
      ))
    }
  };
  intake.need(io, 4 + len + 2, CAP).await?;
  let req = &intake.unread()[..4 + len + 2];
  let target = target(
    atyp,
    &req[4..4 + len],
    u16::from_be_bytes([req[4 + len], req[5 + len]]),
  );
  intake.consume(4 + len + 2);
  target.map_err(|e| refused(Some(GENERAL_FAILURE), e))
}

fn target(atyp: u8, addr: &[u8], port: u16) -> Result<Target, String> {
  if port == 0 {
    return Err("SOCKS5 request for port 0".into());
  }
  let ip = match atyp {
    1 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(addr).expect("4 bytes"))),
    4 => IpAddr::V6(Ipv6Addr::from(
      <[u8; 16]>::try_from(addr).expect("16 bytes"),
    )),
    _ => {
      let name =
        std::str::from_utf8(&addr[1..]).map_err(|_| "a SOCKS5 domain that is not UTF-8")?;
      return Target::from_host(name, port);
    }
  };
  Target::from_host(&ip.to_string(), port)
}

/// A reply; `bound` is the host's end of the outbound connection on success.
pub(super) fn reply(code: u8, bound: Option<SocketAddr>) -> Vec<u8> {
  let bound = bound.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
  let mut out = vec![5, code, 0];
  match bound.ip() {
    IpAddr::V4(a) => {
      out.push(1);
      out.extend_from_slice(&a.octets());
    }
    IpAddr::V6(a) => {
      out.push(4);
      out.extend_from_slice(&a.octets());
    }
  }
  out.extend_from_slice(&bound.port().to_be_bytes());
  out
}

#[cfg(test)]
mod tests {
  use tokio::io::AsyncReadExt;

  use super::*;

  async fn run(bytes: &[u8]) -> (Result<Target, Refused>, Vec<u8>, Vec<u8>) {
    let (mut a, mut b) = tokio::io::duplex(4096);
    b.write_all(bytes).await.unwrap();
    b.shutdown().await.unwrap();
    let mut intake = Intake::default();
    let r = handshake(&mut a, &mut intake).await;
    drop(a);
    let mut answered = Vec::new();
    b.read_to_end(&mut answered).await.unwrap();
    (r, answered, intake.into_rest())
  }

  #[tokio::test]
  async fn domains_and_addresses() {
    let (t, ans, rest) = run(b"\x05\x02\x02\x00\x05\x01\x00\x03\x0bOrigin.Test\x01\xbbhello").await;
    assert_eq!(t.unwrap().to_string(), "origin.test:443");
    assert_eq!(ans, [5, 0]);
    assert_eq!(rest, b"hello");
    let (t, ..) = run(b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50").await;
    assert_eq!(t.unwrap().to_string(), "127.0.0.1:80");
    let mut v6 = b"\x05\x01\x00\x05\x01\x00\x04".to_vec();
    v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
    v6.extend_from_slice(&[0, 80]);
    assert_eq!(run(&v6).await.0.unwrap().to_string(), "[::1]:80");
  }

  #[tokio::test]
  async fn what_is_refused() {
    let (r, ans, _) = run(b"\x05\x01\x02").await;
    assert_eq!(r.unwrap_err().reply, None);
    assert_eq!(ans, [5, 0xff]);
    let (r, ..) = run(b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50").await;
    assert_eq!(r.unwrap_err().reply, Some(COMMAND_NOT_SUPPORTED));
    let (r, ..) = run(b"\x05\x01\x00\x05\x01\x00\x09").await;
    assert_eq!(r.unwrap_err().reply, Some(ADDRESS_TYPE_NOT_SUPPORTED));
    let (r, ..) = run(b"\x05\x01\x00\x05\x01\x00\x03\x03a b\x00\x50").await;
    assert_eq!(r.unwrap_err().reply, Some(GENERAL_FAILURE));
    let (r, ..) = run(b"\x05\x01\x00\x05\x01").await;
    assert!(r.unwrap_err().why.contains("closed"));
  }

  #[test]
  fn replies() {
    assert_eq!(reply(2, None), [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    let v6 = reply(0, Some("[::1]:258".parse().unwrap()));
    assert_eq!((v6[3], v6.len(), &v6[20..]), (4, 22, &[1u8, 2][..]));
  }
}
