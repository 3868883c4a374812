//! A Code Mode call as the host receives it: one request from a client in the sandbox, read and
//! answered on the agent-opened stream that carries it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::error::ClientError;
use super::stream::{Inbound, Stream};
use crate::codemode::{MAX_MESSAGE_BYTES, MAX_REPLY_BYTES};
use crate::msg::{AgentError, ErrorKind, Outcome};

/// One Code Mode request from a client in the sandbox, delivered before its bytes are read:
/// `size` says how many there are, so the host can make room for them first (until
/// `read_request`, the agent waits under flow control and the host holds at most one credit
/// window of them). Answer it with `reply` (the bytes the client receives) or `fail`; dropping
/// it fails it.
pub struct CodeModeCall {
  /// The relay socket the client used (the one given to `code_mode_listen`).
  pub socket: String,
  /// The request's length as the agent announced it (an older agent does not say).
  pub size: Option<u64>,
  stream: Stream,
  /// All of the request had arrived when the call was handed over (`take_request`).
  pub(super) complete: bool,
}

impl CodeModeCall {
  /// A call whose request is still to arrive.
  pub(super) fn new(socket: String, size: Option<u64>, stream: Stream) -> CodeModeCall {
    CodeModeCall {
      socket,
      size,
      stream,
      complete: false,
    }
  }

  /// The client's request bytes (JSON, at most 64 MiB, exactly `size` when it was given), read
  /// under credit. Call it once.
  pub async fn read_request(&mut self) -> Result<Bytes, ClientError> {
    let mut body = self.body_buffer();
    loop {
      let item = self.stream.next().await?;
      if self.absorb(item, &mut body)? {
        break;
      }
    }
    self.check_size(body)
  }

  /// The whole request without waiting, when all of it had arrived before the call was handed
  /// over (a small one: its bytes come with the call); `None` otherwise, and then
  /// `read_request` reads it.
  pub fn take_request(&mut self) -> Option<Result<Bytes, ClientError>> {
    if !std::mem::take(&mut self.complete) {
      return None;
    }
    let mut body = self.body_buffer();
    loop {
      let Some(item) = self.stream.try_next() else {
        // Its end was routed before the call was handed over: this cannot be.
        return Some(Err(
          self.stream.violation("a Code Mode request is incomplete"),
        ));
      };
      match self.absorb(item, &mut body) {
        Ok(true) => return Some(self.check_size(body)),
        Ok(false) => {}
        Err(e) => return Some(Err(e)),
      }
    }
  }

  fn limit(&self) -> u64 {
    let most = MAX_REPLY_BYTES as u64;
    self.size.unwrap_or(most).min(most)
  }

  fn body_buffer(&self) -> BytesMut {
    BytesMut::with_capacity(self.size.unwrap_or(0).min(self.limit()) as usize)
  }

  /// Takes one inbound item into `body`; `true` at the request's end.
  fn absorb(&mut self, item: Inbound, body: &mut BytesMut) -> Result<bool, ClientError> {
    match item {
      Inbound::Data(b) => {
        if (body.len() + b.len()) as u64 > self.limit() {
          return Err(
            self
              .stream
              .violation("a Code Mode request is longer than announced"),
          );
        }
        self.stream.consumed(b.len());
        body.extend_from_slice(&b);
        Ok(false)
      }
      Inbound::End => Ok(true),
      Inbound::Head(_) => Ok(false),
      Inbound::Result(_) => Err(ClientError::StreamEnded {
        reason: "the agent gave up the Code Mode call".into(),
      }),
    }
  }

  fn check_size(&mut self, body: BytesMut) -> Result<Bytes, ClientError> {
    if self.size.is_some_and(|n| n != body.len() as u64) {
      return Err(
        self
          .stream
          .violation("a Code Mode request is shorter than announced"),
      );
    }
    Ok(body.freeze())
  }

  /// Sends a small `reply` at once, without waiting, when the agent's credit allows: `true`,
  /// and the call is answered. `false`: nothing was sent; answer it with `reply`.
  pub fn reply_now(&mut self, reply: &Bytes) -> bool {
    self.stream.try_finish_with_data(reply, &Outcome::Ok(()))
  }

  /// Sends `reply` to the client, streamed under the agent's credit.
  pub async fn reply(mut self, reply: Bytes) -> Result<(), ClientError> {
    if reply.len() > MAX_REPLY_BYTES {
      let msg = format!(
        "Code Mode reply of {} bytes exceeds the limit of {} bytes",
        reply.len(),
        MAX_MESSAGE_BYTES
      );
      self.stream.finish_with(&Outcome::<()>::Err(AgentError::new(
        ErrorKind::TooLarge,
        msg,
      )));
      return Ok(());
    }
    if !self.stream.send_data(reply).await? {
      return Err(ClientError::StreamEnded {
        reason: "the agent gave up the Code Mode call".into(),
      });
    }
    self.stream.finish_with(&Outcome::Ok(()));
    Ok(())
  }

  /// Fails the call: the client receives a Code Mode transport error with `message`.
  pub fn fail(mut self, message: &str) {
    self
      .stream
      .finish_with(&Outcome::<()>::Err(AgentError::new(ErrorKind::Io, message)));
  }
}

/// Takes each Code Mode call as it arrives, on the reader task: it must not block (hand the call
/// to a task, or drop it to fail it).
pub type CallHandler = Arc<dyn Fn(CodeModeCall) + Send + Sync>;
