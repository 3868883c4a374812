//! Carrying bytes both ways once a connection is open: one fixed buffer per direction (what a
//! peer does never grows it), half-close (one side's EOF shuts the other side's write), counts
//! as the bytes move, and an idle timeout over both directions.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// When either direction last moved a byte.
struct Clock {
  base: Instant,
  last_ns: AtomicU64,
}

impl Clock {
  fn new() -> Clock {
    Clock {
      base: Instant::now(),
      last_ns: AtomicU64::new(0),
    }
  }

  fn touch(&self) {
    let ns = self.base.elapsed().as_nanos() as u64;
    self.last_ns.store(ns, Ordering::Relaxed);
  }

  fn last(&self) -> Instant {
    self.base + Duration::from_nanos(self.last_ns.load(Ordering::Relaxed))
  }

  /// Returns once nothing has moved for `idle`.
  async fn idle(&self, idle: Duration) {
    loop {
      let due = self.last() + idle;
      if Instant::now() >= due {
        return;
      }
      tokio::time::sleep_until(due).await;
    }
  }
}

/// A stream that counts what is read from it (here and into a sandbox-wide total) and marks
/// every byte moved on the clock.
struct Metered<'a, T> {
  io: &'a mut T,
  read: u64,
  total: &'a AtomicU64,
  clock: &'a Clock,
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<'_, T> {
  fn poll_read(
    self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
  ) -> Poll<io::Result<()>> {
    let me = self.get_mut();
    let before = buf.filled().len();
    ready!(Pin::new(&mut *me.io).poll_read(cx, buf))?;
    let n = (buf.filled().len() - before) as u64;
    if n > 0 {
      me.read += n;
      me.total.fetch_add(n, Ordering::Relaxed);
      me.clock.touch();
    }
    Poll::Ready(Ok(()))
  }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<'_, T> {
  fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    let me = self.get_mut();
    let n = ready!(Pin::new(&mut *me.io).poll_write(cx, buf))?;
    if n > 0 {
      me.clock.touch();
    }
    Poll::Ready(Ok(n))
  }

  fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    Pin::new(&mut *self.get_mut().io).poll_flush(cx)
  }

  fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    Pin::new(&mut *self.get_mut().io).poll_shutdown(cx)
  }
}

/// The sandbox-wide byte counters a relay adds to.
pub(super) struct Totals<'a> {
  pub out: &'a AtomicU64,
  pub inn: &'a AtomicU64,
}

/// What one relay carried, and why it ended if not by both sides finishing.
#[derive(Debug)]
pub(super) struct Relayed {
  pub out: u64,
  pub inn: u64,
  pub broken: Option<String>,
}

/// Carries `client` (the sandbox) to `origin` and back until both have finished, an error,
/// or `idle` with no byte either way. Dropping it drops nothing but borrows: the caller's
/// streams close when the caller drops them.
pub(super) async fn relay<A, B>(
  client: &mut A,
  origin: &mut B,
  buffer: usize,
  idle: Duration,
  totals: Totals<'_>,
) -> Relayed
where
  A: AsyncRead + AsyncWrite + Unpin,
  B: AsyncRead + AsyncWrite + Unpin,
{
  let clock = Clock::new();
  clock.touch();
  let mut a = Metered {
    io: client,
    read: 0,
    total: totals.out,
    clock: &clock,
  };
  let mut b = Metered {
    io: origin,
    read: 0,
    total: totals.inn,
    clock: &clock,
  };
  let broken = {
    let copy = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, buffer, buffer);
    tokio::select! {
      r = copy => r.err().map(|e| e.to_string()),
      _ = clock.idle(idle) => Some(format!("no byte either way for {} s", idle.as_secs_f64())),
    }
  };
  Relayed {
    out: a.read,
    inn: b.read,
    broken,
  }
}
