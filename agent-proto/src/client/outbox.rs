//! The host's outgoing byte stream. A sender writes its frame itself, from its own thread, when
//! nothing is queued before it and the stream takes it at once; what is left waits in a queue a
//! flusher task writes out. A small message (a command, a Code Mode reply from the JavaScript
//! thread) then leaves without a task switch: on a virtual machine, waking another thread costs
//! more than the write.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// A write of queued frames gathers small ones up to this many bytes.
const GATHER: usize = 256 * 1024;

/// The parts of one message up to this many bytes in all are joined before they are written:
/// one write, so the engine and the agent on the other side wake once for it, not per part.
const JOIN: usize = 64 * 1024;

type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// The outgoing stream, shared by every sender and the flusher.
pub struct Outbox {
  st: Mutex<State>,
  wake: Notify,
}

struct State {
  /// `None` once closed.
  writer: Option<Writer>,
  queue: VecDeque<Bytes>,
  /// Written but maybe not flushed (a TLS layer may hold bytes until flushed).
  unflushed: bool,
  closing: bool,
  failed: Option<String>,
  /// The flusher waits for the stream to take more: a sender must not poll the stream then
  /// (its own poll would replace the flusher's waker), so it queues.
  flusher_waits: bool,
}

/// How the flusher ended.
pub enum Ended {
  Closed,
  Failed(String),
}

impl Outbox {
  pub fn new<W: AsyncWrite + Send + 'static>(writer: W) -> Outbox {
    Outbox {
      st: Mutex::new(State {
        writer: Some(Box::pin(writer)),
        queue: VecDeque::new(),
        unflushed: false,
        closing: false,
        failed: None,
        flusher_waits: false,
      }),
      wake: Notify::new(),
    }
  }

  /// Sends `parts`, in order and with no other sender's bytes between them: written here and
  /// now when nothing waits before them and the stream has room, else queued for the flusher.
  /// Dropped once the stream is closing or failed.
  pub fn send<const N: usize>(&self, parts: [Bytes; N]) {
    let total: usize = parts.iter().map(Bytes::len).sum();
    if total == 0 {
      return;
    }
    let joined = (N > 1 && total <= JOIN).then(|| {
      let mut b = BytesMut::with_capacity(total);
      parts.iter().for_each(|p| b.extend_from_slice(p));
      b.freeze()
    });
    // Joined, the parts themselves are not sent.
    let rest = if joined.is_some() { 0 } else { N };
    let mut parts = joined
      .into_iter()
      .chain(parts.into_iter().take(rest))
      .filter(|b| !b.is_empty());
    let mut st = self.st.lock().expect("outbox");
    if st.closing || st.failed.is_some() || st.writer.is_none() {
      return;
    }
    if st.queue.is_empty() && !st.flusher_waits {
      // No waker of ours: a `Pending` leaves the rest to the flusher, which polls with its own.
      let mut cx = Context::from_waker(Waker::noop());
      for mut b in parts.by_ref() {
        match st.write_some(&mut cx, &mut b) {
          Poll::Ready(Ok(())) => {}
          Poll::Ready(Err(e)) => {
            st.failed = Some(e.to_string());
            drop(st);
            self.wake.notify_one();
            return;
          }
          Poll::Pending => {
            st.queue.push_back(b);
            break;
          }
        }
      }
      if st.queue.is_empty() && st.flush(&mut cx).is_ready() {
        return;
      }
    }
    st.queue.extend(parts);
    drop(st);
    self.wake.notify_one();
  }

  /// No more frames: the flusher writes what is queued, then shuts the stream down.
  pub fn close(&self) {
    self.st.lock().expect("outbox").closing = true;
    self.wake.notify_one();
  }

  /// Writes queued frames until the stream is closed or a write fails.
  pub async fn flusher(&self) -> Ended {
    loop {
      let woken = self.wake.notified();
      let drained = poll_fn(|cx| {
        let mut st = self.st.lock().expect("outbox");
        let r = st.drain(cx);
        st.flusher_waits = r.is_pending();
        r
      });
      match drained.await {
        Ok(true) => return Ended::Closed,
        Ok(false) => {}
        Err(e) => return Ended::Failed(e),
      }
      woken.await;
    }
  }
}

impl State {
  /// Writes from the front of `b` until it is all written or the stream would block.
  fn write_some(&mut self, cx: &mut Context<'_>, b: &mut Bytes) -> Poll<io::Result<()>> {
    let Some(w) = self.writer.as_mut() else {
      return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
    };
    while !b.is_empty() {
      match w.as_mut().poll_write(cx, b) {
        Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
        Poll::Ready(Ok(n)) => {
          let _ = b.split_to(n);
          self.unflushed = true;
        }
        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
        Poll::Pending => return Poll::Pending,
      }
    }
    Poll::Ready(Ok(()))
  }

  fn flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    if !self.unflushed {
      return Poll::Ready(Ok(()));
    }
    let Some(w) = self.writer.as_mut() else {
      return Poll::Ready(Ok(()));
    };
    let r = w.as_mut().poll_flush(cx);
    if matches!(r, Poll::Ready(Ok(()))) {
      self.unflushed = false;
    }
    r
  }

  /// The flusher's turn: everything queued, then a flush, then (closing) the shutdown.
  /// `Ok(true)` once closed; `Pending` until the stream takes more.
  fn drain(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, String>> {
    if let Some(e) = &self.failed {
      self.writer = None;
      return Poll::Ready(Err(e.clone()));
    }
    while let Some(mut front) = self.gather() {
      let r = self.write_some(cx, &mut front);
      if !front.is_empty() {
        self.queue.push_front(front);
      }
      match r {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(e))),
        Poll::Pending => return Poll::Pending,
      }
    }
    match self.flush(cx) {
      Poll::Ready(Ok(())) => {}
      Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(e))),
      Poll::Pending => return Poll::Pending,
    }
    if !self.closing {
      return Poll::Ready(Ok(false));
    }
    if let Some(w) = self.writer.as_mut() {
      if w.as_mut().poll_shutdown(cx).is_pending() {
        return Poll::Pending;
      }
    }
    self.writer = None;
    Poll::Ready(Ok(true))
  }

  /// The next bytes to write: the front frame, with the small ones behind it joined on.
  fn gather(&mut self) -> Option<Bytes> {
    let first = self.queue.pop_front()?;
    if first.len() >= GATHER || self.queue.front().is_none_or(|b| b.len() >= GATHER) {
      return Some(first);
    }
    let mut joined = BytesMut::with_capacity(GATHER);
    joined.extend_from_slice(&first);
    while let Some(next) = self.queue.front() {
      if joined.len() + next.len() > GATHER {
        break;
      }
      joined.extend_from_slice(next);
      self.queue.pop_front();
    }
    Some(joined.freeze())
  }

  fn fail(&mut self, e: io::Error) -> String {
    let msg = e.to_string();
    self.failed = Some(msg.clone());
    self.writer = None;
    msg
  }
}

#[cfg(test)]
mod tests {
  use std::sync::Arc;

  use tokio::io::AsyncReadExt;

  use super::*;

  /// Records of `len` bytes, each `[sender, seq_hi, seq_lo, …]`, so a reader can check order.
  fn record(sender: u8, seq: u16, len: usize) -> Bytes {
    let mut v = vec![sender; len.max(3)];
    v[1..3].copy_from_slice(&seq.to_be_bytes());
    Bytes::from(v)
  }

  #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
  async fn senders_on_any_thread_keep_their_order_through_a_narrow_stream() {
    // A 97-byte pipe: nearly every write blocks part way, so direct writes, queueing and the
    // flusher all take turns.
    let (w, mut r) = tokio::io::duplex(97);
    let out = Arc::new(Outbox::new(w));
    let flusher = tokio::spawn({
      let out = out.clone();
      async move { matches!(out.flusher().await, Ended::Closed) }
    });
    const N: u16 = 400;
    let sizes = |seq: u16| 3 + (seq as usize * 37) % 300;
    // Two plain threads (as the JavaScript thread sends) and a task.
    let threads: Vec<_> = (1..=2u8)
      .map(|sender| {
        let out = out.clone();
        std::thread::spawn(move || {
          for seq in 0..N {
            let r = record(sender, seq, sizes(seq));
            if sender == 1 {
              out.send([r]);
            } else {
              // In three parts, which must arrive together all the same.
              out.send([r.slice(..1), r.slice(1..3), r.slice(3..)]);
            }
          }
        })
      })
      .collect();
    let task = tokio::spawn({
      let out = out.clone();
      async move {
        for seq in 0..N {
          // Two parts that must stay together (as a frame's header and payload).
          let r = record(3, seq, sizes(seq));
          out.send([r.slice(..3), r.slice(3..)]);
          tokio::task::yield_now().await;
        }
      }
    });
    let total: usize = (0..N).map(sizes).sum::<usize>() * 3;
    let reader = tokio::spawn(async move {
      let mut got = Vec::new();
      while got.len() < total {
        let mut buf = [0u8; 4096];
        let n = r.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended early");
        got.extend_from_slice(&buf[..n]);
      }
      got
    });
    for t in threads {
      t.join().unwrap();
    }
    task.await.unwrap();
    let got = tokio::time::timeout(std::time::Duration::from_secs(20), reader)
      .await
      .expect("every byte arrives")
      .unwrap();
    // Records of one sender never interleave with another's (each is written whole before
    // the next one starts), and arrive in order.
    let mut next = [0u16; 4];
    let mut at = 0;
    while at < got.len() {
      let sender = got[at];
      let seq = u16::from_be_bytes([got[at + 1], got[at + 2]]);
      assert_eq!(seq, next[sender as usize], "sender {sender} out of order");
      let len = sizes(seq);
      assert!(got[at + 3..at + len].iter().all(|&b| b == sender));
      next[sender as usize] += 1;
      at += len;
    }
    assert_eq!(next[1..], [N, N, N]);
    out.close();
    assert!(flusher.await.unwrap(), "the flusher ends cleanly at close");
  }

  /// A stream that takes everything and keeps the size of each write.
  struct Writes(Arc<Mutex<Vec<usize>>>);

  impl AsyncWrite for Writes {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
      self.0.lock().unwrap().push(b.len());
      Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
      Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
      Poll::Ready(Ok(()))
    }
  }

  #[test]
  fn a_small_message_leaves_in_one_write_a_large_one_as_its_parts() {
    let writes = Arc::new(Mutex::new(Vec::new()));
    let out = Outbox::new(Writes(writes.clone()));
    let head = Bytes::from_static(&[7; 9]);
    out.send([head.clone(), Bytes::from(vec![1u8; 77])]);
    out.send([head.clone(), Bytes::new(), Bytes::from(vec![2u8; JOIN - 9])]);
    out.send([head, Bytes::from(vec![3u8; JOIN])]);
    assert_eq!(*writes.lock().unwrap(), [86, JOIN, 9, JOIN]);
  }

  #[tokio::test]
  async fn a_failed_write_ends_the_flusher_with_the_error() {
    let (w, r) = tokio::io::duplex(16);
    drop(r);
    let out = Outbox::new(w);
    out.send([Bytes::from_static(b"hello")]);
    match tokio::time::timeout(std::time::Duration::from_secs(5), out.flusher()).await {
      Ok(Ended::Failed(e)) => assert!(!e.is_empty()),
      Ok(Ended::Closed) => panic!("a write to a closed pipe must fail"),
      Err(_) => panic!("the flusher must notice the failure"),
    }
    // Later sends are dropped, not queued forever.
    out.send([Bytes::from_static(b"more")]);
    assert!(out.st.lock().unwrap().queue.is_empty());
  }
}
