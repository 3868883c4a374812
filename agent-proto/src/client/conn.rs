//! The handle on one connection: `AgentClient::connect` starts it after the handshake, and
//! every request goes out through `open` (a stream of its own) or `call` (one answer).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use super::demux::read_loop;
use super::error::{outcome, ClientError};
use super::handshake::{handshake, ClientOptions};
use super::outbox::Ended;
use super::shared::Shared;
use super::stream::{Carrier, Inbound, Origin, Stream};
use crate::frame::{Frame, Kind, AGENT_STREAM, MAX_PAYLOAD};
use crate::msg::{ActivityInfo, Hello, PingInfo, Request};

/// A connection to one agent. Clones share it; dropping the last one closes the agent's
/// stdin, and the agent exits (killing any command still running).
#[derive(Clone)]
pub struct AgentClient {
  pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
  pub shared: Arc<Shared>,
  hello: Hello,
  next_id: AtomicU32,
}

impl Drop for Inner {
  fn drop(&mut self) {
    // Closes the agent's stdin once what is queued is written.
    self.shared.out.close();
  }
}

impl AgentClient {
  /// Waits for the agent's hello on `reader`, checks its version, and starts the reader and
  /// writer tasks (on the current tokio runtime). On error the halves are dropped, which
  /// closes the agent's stdin.
  pub async fn connect<R, W>(
    mut reader: R,
    writer: W,
    opts: ClientOptions,
  ) -> Result<AgentClient, ClientError>
  where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
  {
    let (hello, buf) = handshake(&mut reader, &opts).await?;
    let shared = Arc::new(Shared::new(writer));
    tokio::spawn(flush_loop(shared.clone()));
    tokio::spawn(read_loop(reader, buf, shared.clone()));
    Ok(AgentClient {
      inner: Arc::new(Inner {
        shared,
        hello,
        next_id: AtomicU32::new(1),
      }),
    })
  }

  /// What the agent said when it started.
  pub fn hello(&self) -> &Hello {
    &self.inner.hello
  }

  /// Whether the stream has ended (every request now fails).
  pub fn is_closed(&self) -> bool {
    *self.inner.shared.ended.borrow()
  }

  /// How long since the agent last sent anything.
  pub fn silent_for(&self) -> Duration {
    let sh = &self.inner.shared;
    let heard = Duration::from_micros(sh.heard.load(Ordering::Relaxed));
    sh.born.elapsed().saturating_sub(heard)
  }

  /// Waits until the stream ends; the error says why.
  pub async fn closed(&self) -> ClientError {
    let mut rx = self.inner.shared.ended.subscribe();
    let _ = rx.wait_for(|e| *e).await;
    self.inner.shared.ended_error()
  }

  /// Closes the agent's stdin: it exits, killing commands still running. Requests in flight
  /// fail with `StreamEnded`, and each is cancelled first: an agent that was only stopped
  /// (SIGSTOP) reads everything sent before the end when it continues, and then starts none of
  /// them late.
  pub fn close(&self) {
    let shared = &self.inner.shared;
    let open: Vec<u32> = {
      let st = shared.state.lock().expect("state");
      st.streams
        .keys()
        .copied()
        .filter(|id| id & AGENT_STREAM == 0)
        .collect()
    };
    for id in open {
      shared.send(&Frame::empty(Kind::Cancel, id));
    }
    shared.end("the host closed the connection".into());
  }

  /// Opens a stream for `req`.
  pub(super) fn open(&self, req: &Request) -> Result<Stream, ClientError> {
    let body = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
    if body.len() > MAX_PAYLOAD {
      return Err(ClientError::RequestTooLarge {
        bytes: body.len(),
        max: MAX_PAYLOAD,
      });
    }
    let id = loop {
      let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed) & !AGENT_STREAM;
      if id != 0 {
        break id;
      }
    };
    let shared = &self.inner.shared;
    let stream = {
      let mut st = shared.state.lock().expect("state");
      if st.ended.is_some() {
        drop(st);
        return Err(shared.ended_error());
      }
      let (slot, stream) = Stream::new(shared.clone(), id, Origin::Host);
      st.streams.insert(id, slot);
      stream
    };
    shared.send(&Frame::new(Kind::Open, id, body));
    Ok(stream)
  }

  /// Sends `req` and waits for its `Result`, skipping anything else.
  pub(super) async fn call<T: serde::de::DeserializeOwned>(
    &self,
    req: &Request,
  ) -> Result<T, ClientError> {
    let mut s = self.open(req)?;
    loop {
      if let Inbound::Result(body) = s.next().await? {
        return outcome(&body);
      }
    }
  }

  /// A round trip that does nothing (not counted as activity).
  pub async fn ping(&self) -> Result<PingInfo, ClientError> {
    self.call(&Request::Ping).await
  }

  /// When the host last called (anything but ping and activity) and how many commands run.
  pub async fn activity(&self) -> Result<ActivityInfo, ClientError> {
    self.call(&Request::Activity).await
  }
}

/// Writes what senders could not write themselves, until the stream closes or fails.
async fn flush_loop(shared: Arc<Shared>) {
  let reason = match shared.out.flusher().await {
    Ended::Closed => "the host closed the connection".to_string(),
    Ended::Failed(e) => format!("writing to the agent failed: {e}"),
  };
  shared.end(reason);
}
