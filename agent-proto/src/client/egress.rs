//! A connection from the sandbox to its egress proxy, as the host sees it: a byte stream
//! (`AsyncRead + AsyncWrite`) carried by one agent-opened stream. The host speaks the proxy
//! protocol on it; the agent only moves the bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, TryAcquireError};

use super::stream::{Inbound, Stream};
use crate::frame::MAX_DATA;
use crate::msg::{AgentError, ErrorKind, Outcome};

/// Takes each egress connection as it arrives, on the reader task: it must not block (hand the
/// connection to a task, or drop it to refuse it).
pub type EgressHandler = Arc<dyn Fn(EgressConn) + Send + Sync>;

type CreditWait = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// One TCP connection a sandbox process made to the egress port. Reads give the client's bytes
/// (`Ok(0)` once it shut its write side), granting the agent credit as they are taken; writes
/// go to the client under the agent's credit (`Pending` until there is some); `poll_shutdown`
/// shuts the client's read side. End it with `finish` (closed gracefully) or `fail` (reset);
/// dropping it fails it.
pub struct EgressConn {
  /// The listening port the client connected to.
  pub port: u16,
  /// The client's address in the sandbox (`127.0.0.1:54321`).
  pub peer: String,
  stream: Stream,
  /// Received but not yet read.
  pending: Bytes,
  /// The client's end of data has been read: every later read gives 0 bytes.
  eof: bool,
  /// Our end of data was sent.
  shut: bool,
  /// Woken when the agent grants credit, while a write has none.
  credit_wait: Option<CreditWait>,
}

impl EgressConn {
  pub(super) fn new(port: u16, peer: String, stream: Stream) -> EgressConn {
    EgressConn {
      port,
      peer,
      stream,
      pending: Bytes::new(),
      eof: false,
      shut: false,
      credit_wait: None,
    }
  }

  /// Ends the connection cleanly: the agent closes the client's socket once everything written
  /// has reached it (call it after `shutdown`, or after the client's end of data).
  pub fn finish(mut self) {
    if !self.stream.is_finished() {
      self.stream.finish_with(&Outcome::Ok(()));
    }
  }

  /// Ends the connection as a failure: the agent resets the client's socket at once (the client
  /// sees `ECONNRESET`), dropping anything not yet delivered. `message` is for the agent's
  /// side only; the client gets no text.
  pub fn fail(mut self, message: &str) {
    if !self.stream.is_finished() {
      self
        .stream
        .finish_with(&Outcome::<()>::Err(AgentError::new(ErrorKind::Io, message)));
    }
  }

  /// Why the stream is gone, as the I/O error a proxy passes on.
  fn gone(&self) -> io::Error {
    if self.stream.carrier().is_ended() {
      io::Error::new(
        io::ErrorKind::ConnectionAborted,
        self.stream.carrier().ended_error().to_string(),
      )
    } else {
      io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the egress connection failed in the sandbox (its client reset it)",
      )
    }
  }

  /// Polls the wait for credit, if there is one: `Ready(Ok)` once some may be available, an
  /// error once the stream is over.
  fn poll_credit(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    let Some(wait) = self.credit_wait.as_mut() else {
      return Poll::Ready(Ok(()));
    };
    let r = std::task::ready!(wait.as_mut().poll(cx));
    self.credit_wait = None;
    match r {
      // Only the wake-up was wanted: the permit goes back, and the write takes what it needs.
      Ok(permit) => drop(permit),
      Err(_) => return Poll::Ready(Err(self.gone())),
    }
    Poll::Ready(Ok(()))
  }
}

impl AsyncRead for EgressConn {
  fn poll_read(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
  ) -> Poll<io::Result<()>> {
    let this = &mut *self;
    if buf.remaining() == 0 {
      return Poll::Ready(Ok(()));
    }
    loop {
      if !this.pending.is_empty() {
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        this.stream.consumed(n);
        return Poll::Ready(Ok(()));
      }
      if this.eof {
        return Poll::Ready(Ok(()));
      }
      match std::task::ready!(this.stream.poll_next(cx)) {
        Some(Inbound::Data(b)) => this.pending = b,
        Some(Inbound::End) => this.eof = true,
        Some(Inbound::Head(_)) => {}
        // The agent never answers its own stream; either way it is over.
        Some(Inbound::Result(_)) | None => return Poll::Ready(Err(this.gone())),
      }
    }
  }
}

impl AsyncWrite for EgressConn {
  fn poll_write(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &[u8],
  ) -> Poll<io::Result<usize>> {
    let this = &mut *self;
    if buf.is_empty() {
      return Poll::Ready(Ok(0));
    }
    if this.shut {
      return Poll::Ready(Err(io::Error::new(
        io::ErrorKind::BrokenPipe,
        "a write after the egress connection was shut down",
      )));
    }
    loop {
      // A waiter may hold some of what the agent just granted: it goes back first, so the write
      // takes the whole grant at once.
      std::task::ready!(this.poll_credit(cx))?;
      let credit = this.stream.credit();
      let n = buf.len().min(MAX_DATA).min(credit.available_permits());
      if n > 0 {
        match credit.try_acquire_many(n as u32) {
          Ok(p) => p.forget(),
          Err(TryAcquireError::Closed) => return Poll::Ready(Err(this.gone())),
          Err(TryAcquireError::NoPermits) => continue,
        }
        this.stream.send_data_copy(&buf[..n]);
        return Poll::Ready(Ok(n));
      }
      if credit.is_closed() {
        return Poll::Ready(Err(this.gone()));
      }
      this.credit_wait = Some(Box::pin(credit.clone().acquire_owned()));
    }
  }

  fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
    // Frames leave as they are sent (or wait in the client's outbox, in order).
    Poll::Ready(Ok(()))
  }

  fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
    if !std::mem::replace(&mut self.shut, true) {
      self.stream.send_end();
    }
    Poll::Ready(Ok(()))
  }
}

#[cfg(test)]
mod tests;
