//! The sandbox's egress port: a loopback TCP listener whose connections are carried to the host
//! byte for byte, each on a stream of our own. The host speaks the proxy protocols and decides
//! what may leave; the agent interprets nothing.
//!
//! Every accepted socket has a zero linger until it ends cleanly, so that every other way it
//! can close (the host fails it or goes away, the agent exits or is killed) resets it: a client
//! must never take a connection cut short for a complete answer.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use trueforge_agent_proto::frame::{MAX_DATA, WINDOW};
use trueforge_agent_proto::msg::{AgentError, AgentRequest, EgressListenSpec, ErrorKind, Outcome};

use crate::base::conn::{In, Sender, StreamIo};
use crate::base::sys;
use crate::state::ctx::Ctx;
use crate::state::held::Listening;

/// Connections the kernel queues before we accept them.
const BACKLOG: u32 = 1024;

/// Room a client's bytes are read into (each read is also capped by the stream's credit).
const READ_CHUNK: usize = 64 * 1024;

fn invalid(message: String) -> Outcome<()> {
  Outcome::Err(AgentError::new(ErrorKind::InvalidRequest, message))
}

/// Listens on `spec.port`; again on the same port, new connections get the new window and
/// limit; on another port, that one replaces it (the old port closes once the new one is bound;
/// connections in flight go on either way).
pub fn listen(ctx: &Rc<Ctx>, spec: EgressListenSpec) -> Outcome<()> {
  if spec.port == 0 {
    return invalid(
      "egress port 0: clients cannot be pointed at it; give the port the proxy variables name"
        .into(),
    );
  }
  if spec.window == 0 || spec.window > WINDOW {
    return invalid(format!(
      "an egress window of {} bytes: it must be between 1 and {WINDOW}",
      spec.window
    ));
  }
  if spec.max_connections == 0 {
    return invalid("max_connections of 0: at least 1 (to allow no egress, do not listen)".into());
  }
  if let Some(l) = ctx
    .egress
    .listening
    .borrow_mut()
    .as_mut()
    .filter(|l| l.spec.port == spec.port)
  {
    l.spec = spec;
    return Outcome::Ok(());
  }
  let port = spec.port;
  let v4 = match bind(Ipv4Addr::LOCALHOST.into(), port) {
    Ok(l) => l,
    Err(e) => return Outcome::Err(bind_error(port, e)),
  };
  // Best effort: a sandbox may have no IPv6 loopback, and the proxy variables name 127.0.0.1.
  let v6 = bind(Ipv6Addr::LOCALHOST.into(), port).ok();
  let listeners = std::iter::once(v4)
    .chain(v6)
    .map(|l| {
      let l = Rc::new(l);
      let task = tokio::task::spawn_local(accept(ctx.clone(), l.clone(), port));
      (l, task)
    })
    .collect();
  let old = ctx
    .egress
    .listening
    .replace(Some(Listening { spec, listeners }));
  drop(old);
  Outcome::Ok(())
}

/// Stops listening; connections in flight go on.
pub fn close(ctx: &Ctx) -> Outcome<()> {
  drop(ctx.egress.listening.take());
  Outcome::Ok(())
}

fn bind(ip: IpAddr, port: u16) -> io::Result<TcpListener> {
  let s = if ip.is_ipv4() {
    TcpSocket::new_v4()?
  } else {
    TcpSocket::new_v6()?
  };
  s.set_reuseaddr(true)?;
  s.bind(SocketAddr::new(ip, port))?;
  s.listen(BACKLOG)
}

fn bind_error(port: u16, e: io::Error) -> AgentError {
  if e.raw_os_error() == Some(libc::EADDRINUSE) {
    AgentError::new(
      ErrorKind::AddressInUse,
      format!(
        "cannot listen for egress on 127.0.0.1:{port}: something in the sandbox already \
         listens on port {port}; stop it, or give egress another port"
      ),
    )
  } else {
    AgentError::new(
      ErrorKind::Io,
      format!("cannot listen for egress on 127.0.0.1:{port}: {e}"),
    )
  }
}

async fn accept(ctx: Rc<Ctx>, listener: Rc<TcpListener>, port: u16) {
  loop {
    match listener.accept().await {
      Ok((sock, peer)) => admit(&ctx, sock, peer, port),
      // Shut down by `Listening::drop`.
      Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
      // The client gave up before we took it.
      Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
      // Out of descriptors or memory: the connection stays queued; retrying at once would spin.
      Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
    }
  }
}

/// Opens a stream for a new connection, or resets it when `max_connections` are in flight.
fn admit(ctx: &Rc<Ctx>, sock: TcpStream, peer: SocketAddr, port: u16) {
  let _ = sys::set_zero_linger(sock.as_raw_fd(), true);
  let eg = &ctx.egress;
  let limits = eg
    .listening
    .borrow()
    .as_ref()
    .map(|l| (l.spec.window, l.spec.max_connections));
  let Some((window, max)) = limits else {
    return;
  };
  if eg.in_flight.get() >= max {
    eg.turned_away.set(eg.turned_away.get() + 1);
    return;
  }
  // Proxied protocols take turns (a TLS handshake): Nagle would hold each small write back.
  let _ = sock.set_nodelay(true);
  eg.in_flight.set(eg.in_flight.get() + 1);
  let open = AgentRequest::EgressConnect {
    port,
    peer: peer.to_string(),
  };
  let io = ctx.conn.open_agent_stream_with(&open, window);
  tokio::task::spawn_local(carry(InFlight(ctx.clone()), sock, io));
}

/// One connection counted in flight; uncounted when dropped.
struct InFlight(Rc<Ctx>);

impl Drop for InFlight {
  fn drop(&mut self) {
    let n = &self.0.egress.in_flight;
    n.set(n.get().saturating_sub(1));
  }
}

/// How a connection ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
  /// The host finished it: close after what was written.
  Clean,
  /// The host failed it or is gone: reset.
  Reset,
  /// The socket failed: the host is told with `Cancel`.
  Failed,
}

/// Carries one connection both ways until it ends.
async fn carry(_counted: InFlight, sock: TcpStream, mut io: StreamIo) {
  let end = {
    let tx = io.sender();
    let mut up = pin!(upstream(&sock, &tx));
    let mut down = pin!(downstream(&sock, &mut io));
    let mut up_done = false;
    loop {
      tokio::select! {
        r = &mut up, if !up_done => match r {
          Ok(()) => up_done = true,
          Err(_) => break End::Failed,
        },
        end = &mut down => break end,
      }
    }
  };
  match end {
    End::Clean => {
      let _ = sys::set_zero_linger(sock.as_raw_fd(), false);
    }
    End::Reset => {}
    End::Failed if !io.cancelled() => io.cancel(),
    End::Failed => {}
  }
}

/// The client's bytes to the host, under the stream's credit; `End` at the client's end of
/// data. Returns then, or once the stream is over.
async fn upstream(sock: &TcpStream, tx: &Sender) -> io::Result<()> {
  let mut buf = BytesMut::new();
  loop {
    let credit = tx.credit().await;
    if credit == 0 {
      return Ok(());
    }
    sock.readable().await?;
    if buf.capacity() < READ_CHUNK / 4 {
      buf.reserve(READ_CHUNK);
    }
    let want = (credit as usize).min(MAX_DATA);
    match sock.try_read_buf(&mut (&mut buf).limit(want)) {
      Ok(0) => {
        tx.send_end();
        return Ok(());
      }
      Ok(_) => tx.send_now(buf.split().freeze()),
      Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
      Err(e) => return Err(e),
    }
  }
}

/// The host's side to the client: its data, its `End` (the socket's write side is shut), and
/// its `Result`, which ends the connection.
async fn downstream(sock: &TcpStream, io: &mut StreamIo) -> End {
  // Once the stream is over: everything the host sent, taken at once to see how it ended.
  let mut rest: Option<VecDeque<In>> = None;
  loop {
    let next = match rest.as_mut() {
      Some(q) => q.pop_front(),
      None => io.recv().await,
    };
    match next {
      Some(In::Data(b)) => {
        if let Err(end) = write_all(sock, &b, io, &mut rest).await {
          return end;
        }
        // Credit goes back only as the client takes the bytes: a client that stops reading
        // stops the host, and nothing piles up here.
        io.consumed(b.len());
      }
      Some(In::End) => {
        unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_WR) };
      }
      Some(In::Result(r)) => return if ok(&r) { End::Clean } else { End::Reset },
      None => return End::Reset,
    }
  }
}

/// Writes `b` to the client. Meanwhile the stream may end: a host that failed the connection or
/// is gone must not wait on a client that does not read, so it is reset at once; one that
/// finished it cleanly has its data delivered first.
async fn write_all(
  sock: &TcpStream,
  b: &[u8],
  io: &mut StreamIo,
  rest: &mut Option<VecDeque<In>>,
) -> Result<(), End> {
  let mut at = 0;
  while at < b.len() {
    tokio::select! {
      biased;
      _ = io.until_cancelled(), if rest.is_none() => {
        let mut q = VecDeque::new();
        while let Some(m) = io.try_recv() {
          q.push_back(m);
        }
        if !matches!(q.back(), Some(In::Result(r)) if ok(r)) {
          return Err(End::Reset);
        }
        *rest = Some(q);
      }
      r = sock.writable() => {
        r.map_err(|_| End::Failed)?;
        match sock.try_write(&b[at..]) {
          Ok(n) => at += n,
          Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
          Err(_) => return Err(End::Failed),
        }
      }
    }
  }
  Ok(())
}

/// Whether a `Result` the host sent is `{"ok": null}`.
fn ok(result: &[u8]) -> bool {
  matches!(
    serde_json::from_slice::<Outcome<()>>(result),
    Ok(Outcome::Ok(()))
  )
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn only_an_ok_result_closes_cleanly() {
    assert!(ok(br#"{"ok":null}"#));
    assert!(!ok(
      br#"{"err":{"kind":"io","message":"denied by policy"}}"#
    ));
    assert!(!ok(b"not json"));
  }

  #[test]
  fn a_taken_port_says_so() {
    let e = bind_error(3128, io::Error::from_raw_os_error(libc::EADDRINUSE));
    assert_eq!(e.kind, ErrorKind::AddressInUse);
    assert!(e.message.contains("already listens on port 3128"));
    let e = bind_error(3128, io::Error::from_raw_os_error(libc::EACCES));
    assert_eq!(e.kind, ErrorKind::Io);
  }
}
