//! The handshake: the agent's hello, read before anything else, and the check of its version.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::error::ClientError;
use crate::frame::{self, Kind};
use crate::msg::Hello;

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
  /// The version the agent must report (else `VersionMismatch`). Default `crate::VERSION`;
  /// `None` accepts any.
  pub expected_version: Option<String>,
  /// How long to wait for the agent's hello. Default 10 s.
  pub hello_timeout: Duration,
}

impl Default for ClientOptions {
  fn default() -> Self {
    Self {
      expected_version: Some(crate::VERSION.to_string()),
      hello_timeout: Duration::from_secs(10),
    }
  }
}

/// Waits for the agent's hello on `reader` and checks its version; the bytes read after the
/// hello stay in the returned buffer, for the reader task.
pub(super) async fn handshake<R: AsyncRead + Unpin>(
  reader: &mut R,
  opts: &ClientOptions,
) -> Result<(Hello, BytesMut), ClientError> {
  let mut buf = BytesMut::with_capacity(64 * 1024);
  let hello = tokio::time::timeout(opts.hello_timeout, read_hello(reader, &mut buf))
    .await
    .map_err(|_| {
      ClientError::Handshake(format!(
        "no hello within {} ms{}",
        opts.hello_timeout.as_millis(),
        preview(&buf)
      ))
    })??;
  if let Some(expected) = &opts.expected_version {
    if &hello.version != expected || hello.protocol != crate::PROTOCOL {
      return Err(ClientError::VersionMismatch {
        agent: hello.version,
        protocol: hello.protocol,
        expected: expected.clone(),
      });
    }
  }
  Ok((hello, buf))
}

/// Reads frames until the hello. Anything else first means this is not (a working) agent.
async fn read_hello<R: AsyncRead + Unpin>(
  reader: &mut R,
  buf: &mut BytesMut,
) -> Result<Hello, ClientError> {
  loop {
    match frame::decode(buf) {
      Ok(Some(f)) if f.kind == Kind::Hello => {
        return serde_json::from_slice(&f.payload)
          .map_err(|e| ClientError::Handshake(format!("an unreadable hello: {e}")));
      }
      Ok(Some(f)) => {
        return Err(ClientError::Handshake(format!(
          "a {:?} frame came before the hello",
          f.kind
        )))
      }
      Ok(None) => {}
      Err(e) => {
        return Err(ClientError::Handshake(format!(
          "the output is not the agent protocol ({e}){}",
          preview(buf)
        )))
      }
    }
    buf.reserve(4096);
    let n = reader
      .read_buf(buf)
      .await
      .map_err(|e| ClientError::Handshake(format!("reading its output failed: {e}")))?;
    if n == 0 {
      return Err(ClientError::Handshake(format!(
        "its output ended before the hello{}",
        preview(buf)
      )));
    }
  }
}

/// What the stream held, for a message (a shell's "not found" …).
fn preview(buf: &[u8]) -> String {
  if buf.is_empty() {
    return String::new();
  }
  let text = String::from_utf8_lossy(&buf[..buf.len().min(300)]);
  format!(": {:?}", text.trim())
}
