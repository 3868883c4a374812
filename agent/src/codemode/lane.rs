//! `trueforge-agent codemode-lane <socket> [user]`: one Code Mode socket on a stream of its own.
//! The host starts it (as root) on an exec of its own and reads that stream on its JavaScript
//! thread, so a call reaches the dispatcher with no thread of the host in between. It speaks
//! what `codemode/relay.py` speaks: to clients, one request per connection (read to EOF, the
//! reply written, the connection shut); to the host, frames of a 9-byte header (kind u8, id u32,
//! length u32, big endian) and a payload: READY (`{"pid": …}`) and REQUEST out, REPLY in. The
//! socket is bound as the user, as the agent's own relay binds it; the process is not dumpable,
//! so the workload cannot trace it. It removes its socket and exits when its stdin closes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use trueforge_agent_proto::codemode::{
  encode as frame, Head, HEADER_LEN, KIND_READY, KIND_REPLY, KIND_REQUEST, MAX_REPLY_BYTES,
};
use trueforge_agent_proto::msg::MAX_CODE_MODE_CALLS;

use crate::base::sys::{self, Identity};
use crate::base::users::Users;
use crate::codemode::relay;

/// Replies awaited, by the id their request went out with.
type Waiting = Rc<RefCell<HashMap<u32, oneshot::Sender<Bytes>>>>;

/// Runs the lane; returns the exit code.
pub fn main(args: Vec<String>) -> i32 {
  let Some(socket) = args.first().cloned() else {
    eprintln!("trueforge-agent codemode-lane: usage: codemode-lane <socket> [user]");
    return 2;
  };
  match start(&socket, args.get(1).map(String::as_str)) {
    Ok(code) => code,
    Err(e) => {
      eprintln!("trueforge-agent codemode-lane: {e}");
      2
    }
  }
}

fn start(socket: &str, user: Option<&str>) -> io::Result<i32> {
  let (input, output) = sys::take_host_stream()?;
  if !socket.starts_with('/') || socket.len() >= 108 || socket.ends_with('/') {
    return Err(io::Error::other(format!(
      "{socket}: not a usable socket path (absolute, under 108 bytes)"
    )));
  }
  let me = Identity::current();
  let user = Users::default().resolve(user).map_err(io::Error::other)?;
  let mut creds = user.creds();
  // Without CAP_SETGID (capability 6) the groups cannot change: acting as its own ids, the
  // lane keeps the groups it has.
  if sys::cap_eff() & (1 << 6) == 0 && creds.uid == me.uid && creds.gid == me.gid {
    creds.groups = me.groups.clone();
  }
  let listener = sys::as_user(&me, &creds, || relay::bind(socket))?
    .map_err(|e| io::Error::other(format!("cannot open the Code Mode socket {socket}: {e}")))?;
  let bound = identity(socket);
  listener.set_nonblocking(true)?;
  let rt = tokio::runtime::Builder::new_current_thread()
    .enable_io()
    .build()?;
  let local = tokio::task::LocalSet::new();
  local.block_on(&rt, serve(input, output, listener));
  // The stream closed: the socket goes with it, unless it is not ours any more (the host gave up
  // on this lane and another server bound the same path).
  if let Ok(p) = CString::new(socket) {
    let _ = sys::as_user(&me, &creds, || {
      if bound.is_some() && identity(socket) == bound {
        unsafe { libc::unlink(p.as_ptr()) };
      }
    });
  }
  Ok(0)
}

/// The device and inode at `path` (not following a link), when there is something there.
fn identity(path: &str) -> Option<(u64, u64)> {
  use std::os::unix::fs::MetadataExt;
  std::fs::symlink_metadata(path)
    .ok()
    .map(|m| (m.dev(), m.ino()))
}

async fn serve(input: OwnedFd, output: OwnedFd, listener: std::os::unix::net::UnixListener) {
  let ready = (|| {
    sys::set_nonblocking(input.as_raw_fd())?;
    sys::set_nonblocking(output.as_raw_fd())?;
    let input = pipe::Receiver::from_owned_fd_unchecked(input)?;
    let output = pipe::Sender::from_owned_fd_unchecked(output)?;
    let listener = UnixListener::from_std(listener)?;
    io::Result::Ok((input, output, listener))
  })();
  let Ok((input, output, listener)) = ready else {
    return;
  };
  let (out, rx) = mpsc::unbounded_channel::<Bytes>();
  tokio::task::spawn_local(write_loop(output, rx));
  let pid = std::process::id();
  let _ = out.send(frame(
    KIND_READY,
    0,
    format!("{{\"pid\": {pid}}}").as_bytes(),
  ));
  let waiting = Waiting::default();
  let calls = Rc::new(Semaphore::new(MAX_CODE_MODE_CALLS));
  let accepting = tokio::task::spawn_local(accept(listener, out, waiting.clone(), calls));
  read_loop(input, waiting).await;
  accepting.abort();
}

/// Writes frames to the host in the order they were sent.
async fn write_loop(mut output: pipe::Sender, mut rx: mpsc::UnboundedReceiver<Bytes>) {
  while let Some(b) = rx.recv().await {
    if output.write_all(&b).await.is_err() {
      // The host is gone: nothing more can be carried.
      std::process::exit(0);
    }
  }
}

/// Hands each REPLY to the connection awaiting it, until stdin closes or carries nonsense.
async fn read_loop(mut input: pipe::Receiver, waiting: Waiting) {
  let mut buf = BytesMut::with_capacity(64 * 1024);
  loop {
    while let Some(Head { kind, id, len }) = Head::parse(&buf) {
      if len > MAX_REPLY_BYTES {
        return;
      }
      if buf.len() < HEADER_LEN + len {
        buf.reserve(HEADER_LEN + len - buf.len());
        break;
      }
      buf.advance(HEADER_LEN);
      let payload = buf.split_to(len).freeze();
      if kind == KIND_REPLY {
        if let Some(tx) = waiting.borrow_mut().remove(&id) {
          let _ = tx.send(payload);
        }
      }
    }
    if buf.capacity() - buf.len() < 4096 {
      buf.reserve(64 * 1024);
    }
    match input.read_buf(&mut buf).await {
      Ok(0) | Err(_) => return,
      Ok(_) => {}
    }
  }
}

async fn accept(
  listener: UnixListener,
  out: mpsc::UnboundedSender<Bytes>,
  waiting: Waiting,
  calls: Rc<Semaphore>,
) {
  let mut next: u32 = 0;
  loop {
    match listener.accept().await {
      Ok((conn, _)) => {
        next = next.wrapping_add(1);
        tokio::task::spawn_local(call(
          conn,
          next,
          out.clone(),
          waiting.clone(),
          calls.clone(),
        ));
      }
      Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) => {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
      }
      Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
    }
  }
}

/// One client connection: its request out as a REQUEST frame, the REPLY back.
async fn call(
  mut conn: UnixStream,
  id: u32,
  out: mpsc::UnboundedSender<Bytes>,
  waiting: Waiting,
  calls: Rc<Semaphore>,
) {
  let Some(body) = relay::read_request(&mut conn).await else {
    return;
  };
  let body = match body {
    Ok(b) => b,
    Err(reply) => {
      let _ = conn.write_all(&reply).await;
      let _ = conn.shutdown().await;
      return;
    }
  };
  let Ok(_slot) = calls.acquire().await else {
    return;
  };
  let (tx, rx) = oneshot::channel();
  waiting.borrow_mut().insert(id, tx);
  if out.send(frame(KIND_REQUEST, id, &body)).is_err() {
    return;
  }
  drop(body);
  // No reply (the stream closed): the client sees its connection closed without one.
  if let Ok(reply) = rx.await {
    let _ = conn.write_all(&reply).await;
  }
  let _ = conn.shutdown().await;
}
