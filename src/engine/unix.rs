//! A connection to the engine's Unix socket that the runtime watches for reading only. A Unix
//! socket signals room to write each time the peer reads what was sent, so a socket watched for
//! writing too wakes a runtime thread after every request the engine reads (a command sent to
//! the agent, an engine call): for nothing, while the writes find room at once. Here a write is
//! tried first; only one that finds no room watches a second descriptor of the socket for
//! writing, until a write is taken at once again.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use hyper_util::client::legacy::connect::{Connected, Connection};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// A peer gone yields EPIPE, not SIGPIPE (on macOS the socket says so itself: `connect`).
#[cfg(target_os = "linux")]
const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
#[cfg(not(target_os = "linux"))]
const SEND_FLAGS: libc::c_int = libc::MSG_DONTWAIT;

/// One connection to the engine's socket.
pub struct UnixConn {
  fd: AsyncFd<OwnedFd>,
  /// A second descriptor of the socket, watched for writing while a write waits for room.
  room: Option<AsyncFd<OwnedFd>>,
}

impl UnixConn {
  pub async fn connect(path: &Path) -> io::Result<UnixConn> {
    let stream = tokio::net::UnixStream::connect(path).await?;
    // Taken off the runtime's watch (for both directions), still non-blocking.
    let fd = OwnedFd::from(stream.into_std()?);
    #[cfg(target_os = "macos")]
    no_sigpipe(&fd)?;
    Ok(UnixConn {
      fd: register(fd, Interest::READABLE)?,
      room: None,
    })
  }

  fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a msghdr naming the caller's buffers, which outlive the call.
    let n = unsafe {
      let mut msg: libc::msghdr = std::mem::zeroed();
      msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
      msg.msg_iovlen = bufs.len() as _;
      libc::sendmsg(self.fd.as_raw_fd(), &msg, SEND_FLAGS)
    };
    if n < 0 {
      Err(io::Error::last_os_error())
    } else {
      Ok(n as usize)
    }
  }

  fn poll_send(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
    match self.send(bufs) {
      Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
      other => {
        // Room at once: writes need no watch now.
        self.room = None;
        return Poll::Ready(other);
      }
    }
    if self.room.is_none() {
      let second = self.fd.get_ref().try_clone()?;
      self.room = Some(register(second, Interest::WRITABLE)?);
    }
    loop {
      let room = self.room.as_ref().expect("watched");
      let mut guard = ready!(room.poll_write_ready(cx))?;
      match guard.try_io(|_| self.send(bufs)) {
        Ok(r) => return Poll::Ready(r),
        Err(_would_block) => continue,
      }
    }
  }
}

fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
  // SAFETY: the registration owns the descriptor, so it stays open and the same while
  // registered.
  unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

#[cfg(target_os = "macos")]
fn no_sigpipe(fd: &OwnedFd) -> io::Result<()> {
  let on: libc::c_int = 1;
  // SAFETY: an int option on a socket this connection owns.
  let r = unsafe {
    libc::setsockopt(
      fd.as_raw_fd(),
      libc::SOL_SOCKET,
      libc::SO_NOSIGPIPE,
      (&on as *const libc::c_int).cast(),
      std::mem::size_of::<libc::c_int>() as libc::socklen_t,
    )
  };
  if r < 0 {
    Err(io::Error::last_os_error())
  } else {
    Ok(())
  }
}

impl AsyncRead for UnixConn {
  fn poll_read(
    self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
  ) -> Poll<io::Result<()>> {
    loop {
      let mut guard = ready!(self.fd.poll_read_ready(cx))?;
      // SAFETY: recv writes at most `unfilled.len()` bytes into it; only those are marked.
      let unfilled = unsafe { buf.unfilled_mut() };
      let n = unsafe {
        libc::recv(
          guard.get_inner().as_raw_fd(),
          unfilled.as_mut_ptr().cast(),
          unfilled.len(),
          0,
        )
      };
      if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
          guard.clear_ready();
          continue;
        }
        return Poll::Ready(Err(e));
      }
      let n = n as usize;
      // A short read took all there was: the next read waits for the poller rather than
      // asking the socket again (as the runtime's own sockets do).
      if n > 0 && n < unfilled.len() {
        guard.clear_ready();
      }
      unsafe { buf.assume_init(n) };
      buf.advance(n);
      return Poll::Ready(Ok(()));
    }
  }
}

impl AsyncWrite for UnixConn {
  fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    self.get_mut().poll_send(cx, &[IoSlice::new(buf)])
  }

  fn poll_write_vectored(
    self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
  ) -> Poll<io::Result<usize>> {
    self.get_mut().poll_send(cx, bufs)
  }

  fn is_write_vectored(&self) -> bool {
    true
  }

  fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
    Poll::Ready(Ok(()))
  }

  fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
    // SAFETY: a socket this connection owns.
    let r = unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) };
    Poll::Ready(if r < 0 {
      Err(io::Error::last_os_error())
    } else {
      Ok(())
    })
  }
}

impl Connection for UnixConn {
  fn connected(&self) -> Connected {
    Connected::new()
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use tokio::io::{AsyncReadExt, AsyncWriteExt};

  /// Writes far past the socket's buffer while the peer reads slowly: every byte arrives, in
  /// order, through the watched second descriptor.
  #[tokio::test]
  async fn a_write_that_waits_for_room_completes() {
    let dir = std::env::temp_dir().join(format!("tf-unixconn-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let listener = tokio::net::UnixListener::bind(&dir).unwrap();
    let total = 8 * 1024 * 1024;
    let reader = tokio::spawn(async move {
      let (mut s, _) = listener.accept().await.unwrap();
      let mut got = Vec::new();
      let mut chunk = vec![0u8; 7000];
      loop {
        let n = s.read(&mut chunk).await.unwrap();
        if n == 0 {
          break;
        }
        got.extend_from_slice(&chunk[..n]);
        if got.len() % 5 == 0 {
          tokio::task::yield_now().await;
        }
      }
      got
    });
    let mut conn = UnixConn::connect(&dir).await.unwrap();
    let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    conn.write_all(&data).await.unwrap();
    conn.shutdown().await.unwrap();
    let got = reader.await.unwrap();
    let _ = std::fs::remove_file(&dir);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the bytes arrived changed or out of order");
  }

  /// A reply is read after its request, and the end of the peer's stream reads as 0 bytes.
  #[tokio::test]
  async fn reads_the_reply_and_the_end() {
    let dir = std::env::temp_dir().join(format!("tf-unixconn-r-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let listener = tokio::net::UnixListener::bind(&dir).unwrap();
    let server = tokio::spawn(async move {
      let (mut s, _) = listener.accept().await.unwrap();
      let mut req = [0u8; 4];
      s.read_exact(&mut req).await.unwrap();
      s.write_all(b"pong").await.unwrap();
      req
    });
    let mut conn = UnixConn::connect(&dir).await.unwrap();
    conn.write_all(b"ping").await.unwrap();
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply).await.unwrap();
    let _ = std::fs::remove_file(&dir);
    assert_eq!(&server.await.unwrap(), b"ping");
    assert_eq!(reply, b"pong");
  }
}
