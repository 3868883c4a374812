//! The Code Mode relay, inside the agent: an owner-only Unix socket for the sandbox user that
//! speaks what `codemode/relay.py` speaks to clients (one request per connection: the client
//! writes JSON and shuts its write side; it reads the reply until EOF; an oversized request gets
//! a `{"ok": false, …, "source": "caller"}` reply), with each request carried to the host as a
//! stream of our own and the host's reply carried back.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use trueforge_agent_proto::codemode::{MAX_MESSAGE_BYTES, MAX_REPLY_BYTES};
use trueforge_agent_proto::msg::{
  AgentError, AgentRequest, CodeModeListenSpec, ErrorKind, Outcome,
};

use crate::base::conn::In;
use crate::base::sys;
use crate::codemode::pyjson::{self, Value};
use crate::files::resolve::{self, Links};
use crate::state::ctx::Ctx;
use crate::state::held::{remove_socket, Relay};

fn bad(kind: ErrorKind, msg: String) -> Outcome<()> {
  Outcome::Err(AgentError::new(kind, msg))
}

/// Opens (or reopens) the relay socket `spec.socket`.
pub async fn listen(ctx: Rc<Ctx>, spec: CodeModeListenSpec) -> Outcome<()> {
  let path = spec.socket.clone();
  if !path.starts_with('/') || path.contains('\0') || path.len() >= 108 || path.ends_with('/') {
    return bad(
      ErrorKind::InvalidPath,
      format!("{path}: not a usable socket path (absolute, under 108 bytes)"),
    );
  }
  let user = match ctx.users.resolve(spec.user.as_deref()) {
    Ok(u) => u,
    Err(e) => return bad(ErrorKind::UnknownUser, e),
  };
  let old = ctx.relays.open.borrow_mut().remove(&path);
  if let Some(old) = old {
    old.task.abort();
  }
  let creds = user.creds();
  let (me, c, p) = (ctx.me.clone(), creds.clone(), path.clone());
  let made = ctx
    .pool
    .run(move || sys::as_user(&me, &c, || bind(&p)))
    .await;
  let listener = match made {
    Ok(Ok(l)) => l,
    Ok(Err(e)) | Err(e) => {
      return bad(
        ErrorKind::Io,
        format!("cannot open the Code Mode socket {path}: {e}"),
      )
    }
  };
  let listener = match listener
    .set_nonblocking(true)
    .and_then(|_| UnixListener::from_std(listener))
  {
    Ok(l) => l,
    Err(e) => return bad(ErrorKind::Io, format!("{path}: {e}")),
  };
  let task = tokio::task::spawn_local(accept(ctx.clone(), path.clone(), listener));
  ctx
    .relays
    .open
    .borrow_mut()
    .insert(path, Relay { task, creds });
  Outcome::Ok(())
}

/// Closes a relay and removes its socket.
pub fn close(ctx: &Ctx, socket: &str) -> Outcome<()> {
  let relay = ctx.relays.open.borrow_mut().remove(socket);
  if let Some(r) = relay {
    r.task.abort();
    remove_socket(&ctx.me, socket, &r.creds);
  }
  Outcome::Ok(())
}

/// Makes the socket's directory (0700) and the socket (0600), as the user. Runs on a pool
/// thread with the user's credentials, so everything made is the user's.
pub(crate) fn bind(path: &str) -> io::Result<std::os::unix::net::UnixListener> {
  let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
  let dir = if dir.is_empty() { "/" } else { dir };
  let (parent, leaf) = dir.rsplit_once('/').unwrap_or(("", dir));
  if !leaf.is_empty() {
    let parent = if parent.is_empty() { "/" } else { parent };
    let pfd = resolve::open_dir(parent.as_bytes(), Links::Follow, Some(0o755))?;
    let leaf_c = CString::new(leaf).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    if unsafe { libc::mkdirat(pfd.as_raw_fd(), leaf_c.as_ptr(), 0o700) } != 0
      && sys::errno() != libc::EEXIST
    {
      return Err(io::Error::last_os_error());
    }
    let d = sys::openat(
      pfd.as_raw_fd(),
      &leaf_c,
      libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
      0,
    )?;
    // Owner only, as the Python relay made it (a directory that is not the user's keeps its mode).
    unsafe { libc::fchmod(d.as_raw_fd(), 0o700) };
  }
  let p = CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
  unsafe { libc::unlink(p.as_ptr()) };
  let listener = std::os::unix::net::UnixListener::bind(path)?;
  // Connecting needs write permission: until this chmod the umask leaves it without any for
  // others anyway.
  sys::cvt(unsafe { libc::chmod(p.as_ptr(), 0o600) })?;
  Ok(listener)
}

async fn accept(ctx: Rc<Ctx>, socket: String, listener: UnixListener) {
  loop {
    match listener.accept().await {
      Ok((conn, _)) => {
        tokio::task::spawn_local(serve(ctx.clone(), socket.clone(), conn));
      }
      Err(e)
        if e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE) =>
      {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
      }
      Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
    }
  }
}

/// The JSON an error reply carries, as the Python relay writes it.
fn error_reply(message: &str, source: &str) -> Vec<u8> {
  pyjson::dumps(&Value::Dict(vec![
    ("ok".into(), Value::Bool(false)),
    ("error".into(), Value::Str(message.into())),
    ("source".into(), Value::Str(source.into())),
  ]))
  .into_bytes()
}

/// Reads a client's request to its end of file: `None` when the connection failed, `Err` with
/// the reply for one over the limit (counted to the end, not kept).
pub(crate) async fn read_request(conn: &mut UnixStream) -> Option<Result<BytesMut, Vec<u8>>> {
  // Read straight into the body, which starts small and doubles: a request is usually a few
  // hundred bytes, and a large scratch buffer per call costs a mapping and its page faults.
  let mut body = BytesMut::with_capacity(4096);
  let mut size = 0usize;
  loop {
    if body.capacity() - body.len() < 1024 {
      body.reserve(body.len().max(4096));
    }
    match read_some(conn, &mut body).await {
      Ok(0) => break,
      Ok(n) => {
        size += n;
        if size > MAX_MESSAGE_BYTES {
          body.clear();
        }
      }
      Err(_) => return None,
    }
  }
  if size > MAX_MESSAGE_BYTES {
    return Some(Err(error_reply(
      &format!("Code Mode request of {size} bytes exceeds the limit of {MAX_MESSAGE_BYTES} bytes"),
      "caller",
    )));
  }
  Some(Ok(body))
}

/// One read from a client, as `read_buf` but without tokio's shortcut of waiting for the next
/// event after a short read: gVisor reports a client's `shutdown(SHUT_WR)` that lands with its
/// last bytes as readable only (no hang-up), so after that short read no event would come and
/// the request would never end. Reading again until the socket says "would block" sees the end.
async fn read_some(conn: &UnixStream, body: &mut BytesMut) -> io::Result<usize> {
  loop {
    match conn.try_read_buf(body) {
      Err(e) if e.kind() == io::ErrorKind::WouldBlock => conn.readable().await?,
      r => return r,
    }
  }
}

/// One client connection: its request to the host, the host's reply back.
async fn serve(ctx: Rc<Ctx>, socket: String, mut conn: UnixStream) {
  let body = match read_request(&mut conn).await {
    None => return,
    Some(Ok(b)) => b,
    Some(Err(reply)) => {
      let _ = conn.write_all(&reply).await;
      let _ = conn.shutdown().await;
      return;
    }
  };
  let Ok(_slot) = ctx.relays.calls.acquire().await else {
    return;
  };
  // The size goes first: the host makes room for the request before it reads a byte.
  let size = Some(body.len() as u64);
  let mut io = ctx
    .conn
    .open_agent_stream(&AgentRequest::CodeModeCall { socket, size });
  if io.send_data(body.freeze()).await {
    io.send_end();
  }
  let mut reply = BytesMut::new();
  let answer: Option<Bytes> = loop {
    match io.recv().await {
      Some(In::Data(b)) => {
        if reply.len() + b.len() > MAX_REPLY_BYTES {
          io.cancel();
          break Some(error_reply("the Code Mode reply is over the limit", "transport").into());
        }
        reply.extend_from_slice(&b);
        io.consumed(b.len());
      }
      Some(In::Result(r)) => {
        break match serde_json::from_slice::<Outcome<()>>(&r) {
          Ok(Outcome::Ok(())) => Some(reply.split().freeze()),
          Ok(Outcome::Err(e)) => Some(error_reply(&e.message, "transport").into()),
          Err(_) => Some(error_reply("an unreadable answer from the host", "transport").into()),
        };
      }
      Some(In::End) => {}
      // The host connection is gone: the client sees the connection closed without a reply.
      None => break None,
    }
  };
  if let Some(a) = answer {
    let _ = conn.write_all(&a).await;
  }
  let _ = conn.shutdown().await;
}
