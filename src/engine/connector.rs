//! Every engine connection (unix, tcp, TLS, SSH) goes through `Metered`, which caps what one
//! reply may bring into memory. bollard reads a JSON reply whole, and its transport must hand it
//! hyper's own body type, so the cap cannot wrap the body: it sits on the connection instead.
//! Each request written resets the count and picks the cap from its method and path; the status
//! line read says whether the reply is an error (capped lower); a read past the cap fails with
//! `ReplyTooLarge`, which `Engine::map_error` turns into `EngineReplyTooLarge`. Streamed replies
//! (archives, logs, attached streams, pull and build progress) are not capped by count: the code
//! reading them bounds what it keeps.

use std::future::Future;
use std::io::IoSlice;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bollard::errors::Error as BollardError;
use bollard::{BollardRequest, ClientVersion, Docker};
use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;

use crate::engine::unix::UnixConn;

/// The most a JSON reply (inspect, list, version, info …) may bring, headers included.
pub const REPLY_CAP: u64 = 8 * 1024 * 1024;
/// The most an error reply may bring, whatever the request.
pub const ERROR_CAP: u64 = 1024 * 1024;
/// The longest request line kept to pick a cap; a longer one gets the JSON cap.
const LINE_MAX: usize = 8 * 1024;

/// A reply went past its cap: the engine is not behaving as one (or holds more than we read).
#[derive(Debug)]
pub struct ReplyTooLarge {
  pub limit: u64,
  /// The request's method and path, for the message.
  pub request: String,
}

impl std::fmt::Display for ReplyTooLarge {
  fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    write!(
      f,
      "the reply to {} went past {} bytes",
      self.request, self.limit
    )
  }
}

impl std::error::Error for ReplyTooLarge {}

/// The `ReplyTooLarge` somewhere in `e`'s chain (io errors carry it as their inner error).
pub fn reply_too_large<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ReplyTooLarge> {
  let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
  while let Some(err) = cur {
    if let Some(r) = err.downcast_ref::<ReplyTooLarge>() {
      return Some(r);
    }
    if let Some(r) = err
      .downcast_ref::<std::io::Error>()
      .and_then(|io| io.get_ref())
      .and_then(|inner| inner.downcast_ref::<ReplyTooLarge>())
    {
      return Some(r);
    }
    cur = err.source();
  }
  None
}

/// How a request's reply is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
  /// Read whole into memory: capped.
  Whole,
  /// Streamed to code that bounds what it keeps.
  Streamed,
  /// Streamed, and the connection becomes a raw stream once the engine agrees (exec, attach).
  Hijacked,
}

/// The kind of reply a request gets, from its method and path (`/v1.41/…` or bare).
fn kind_of(method: &str, path: &str) -> Kind {
  let path = path.split('?').next().unwrap_or("");
  let mut parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
  let versioned = |p: &str| {
    p.strip_prefix('v')
      .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
  };
  if parts.first().is_some_and(|p| versioned(p)) {
    parts.remove(0);
  }
  let last = parts.last().copied().unwrap_or("");
  match (
    method,
    parts.first().copied().unwrap_or(""),
    parts.len(),
    last,
  ) {
    ("POST", "exec", 3, "start") | ("POST", "containers", 3, "attach") => Kind::Hijacked,
    // A wait is a long poll, but its reply is one small JSON object: it stays capped.
    ("GET", "containers", 3, "archive" | "logs" | "export" | "stats")
    | ("POST", "images", 2, "create" | "load")
    | ("POST", "images", _, "push")
    | ("GET", "images", _, "get")
    | ("POST", "build", 1, _)
    | ("GET", "events", 1, _) => Kind::Streamed,
    _ => Kind::Whole,
  }
}

/// Where the connection is in its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
  /// A request is being written (its line may still be coming).
  Request,
  /// Its reply is being read.
  Reply,
}

/// The count and cap of one connection's current reply.
#[derive(Debug)]
struct Meter {
  phase: Phase,
  /// The request line so far, until its end is seen.
  line: Vec<u8>,
  line_done: bool,
  kind: Kind,
  request: String,
  /// The status line so far, until its code is known.
  status: Vec<u8>,
  status_code: Option<u16>,
  count: u64,
  /// A raw stream from now on (an exec or attach the engine agreed to): nothing is counted.
  raw: bool,
}

impl Default for Meter {
  fn default() -> Self {
    Self {
      phase: Phase::Reply,
      line: Vec::new(),
      line_done: true,
      // Until a request says otherwise, a reply is capped.
      kind: Kind::Whole,
      request: "a request".into(),
      status: Vec::new(),
      status_code: None,
      count: 0,
      raw: false,
    }
  }
}

impl Meter {
  fn wrote(&mut self, bytes: &[u8]) {
    if self.raw || bytes.is_empty() {
      return;
    }
    if self.phase == Phase::Reply {
      // HTTP/1.1 without pipelining: a write after a reply was read starts the next request.
      *self = Self {
        phase: Phase::Request,
        line_done: false,
        ..Self::default()
      };
    }
    if self.line_done {
      return;
    }
    let end = bytes.iter().position(|b| *b == b'\n');
    let take = end.map_or(bytes.len(), |i| i + 1);
    let room = LINE_MAX.saturating_sub(self.line.len());
    self.line.extend_from_slice(&bytes[..take.min(room)]);
    if end.is_some() || self.line.len() >= LINE_MAX {
      self.line_done = true;
      let line = String::from_utf8_lossy(&self.line).into_owned();
      let mut words = line.split_whitespace();
      let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
      self.kind = kind_of(method, path);
      self.request = format!("{method} {}", path.split('?').next().unwrap_or(""));
      self.line = Vec::new();
    }
  }

  fn cap(&self) -> Option<u64> {
    match (self.status_code, self.kind) {
      (Some(s), _) if s >= 400 => Some(ERROR_CAP),
      (_, Kind::Whole) => Some(REPLY_CAP),
      _ => None,
    }
  }

  fn read(&mut self, bytes: &[u8]) -> std::io::Result<()> {
    if self.raw || bytes.is_empty() {
      return Ok(());
    }
    self.phase = Phase::Reply;
    if self.status_code.is_none() {
      // "HTTP/1.1 200": the code is the 3 digits after the first space.
      let want = 16usize.saturating_sub(self.status.len()).min(bytes.len());
      self.status.extend_from_slice(&bytes[..want]);
      let text = String::from_utf8_lossy(&self.status);
      if let Some(code) = text
        .split(' ')
        .nth(1)
        .filter(|c| c.len() == 3)
        .and_then(|c| c.parse::<u16>().ok())
      {
        self.status_code = Some(code);
        if self.kind == Kind::Hijacked && code < 400 {
          self.raw = true;
          return Ok(());
        }
      }
    }
    self.count += bytes.len() as u64;
    match self.cap() {
      Some(limit) if self.count > limit => Err(std::io::Error::other(ReplyTooLarge {
        limit,
        request: self.request.clone(),
      })),
      _ => Ok(()),
    }
  }
}

/// A connection whose replies are counted against their caps.
pub struct Metered<T> {
  inner: T,
  meter: Meter,
}

impl<T> Metered<T> {
  pub fn new(inner: T) -> Self {
    Self {
      inner,
      meter: Meter::default(),
    }
  }
}

impl<T: Read + Unpin> Read for Metered<T> {
  fn poll_read(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    mut buf: ReadBufCursor<'_>,
  ) -> Poll<std::io::Result<()>> {
    let this = &mut *self;
    // SAFETY: bytes are only read into the cursor's unfilled part, and only those the inner
    // stream filled are advanced over, as hyper's own adapters do.
    let n = unsafe {
      let mut sub = ReadBuf::uninit(buf.as_mut());
      ready!(Pin::new(&mut this.inner).poll_read(cx, sub.unfilled()))?;
      let filled = sub.filled();
      this.meter.read(filled)?;
      filled.len()
    };
    unsafe { buf.advance(n) };
    Poll::Ready(Ok(()))
  }
}

impl<T: Write + Unpin> Write for Metered<T> {
  fn poll_write(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &[u8],
  ) -> Poll<std::io::Result<usize>> {
    let this = &mut *self;
    let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
    this.meter.wrote(&buf[..n]);
    Poll::Ready(Ok(n))
  }

  fn poll_write_vectored(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
  ) -> Poll<std::io::Result<usize>> {
    let this = &mut *self;
    let mut n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
    let written = n;
    for b in bufs {
      if n == 0 {
        break;
      }
      let k = n.min(b.len());
      this.meter.wrote(&b[..k]);
      n -= k;
    }
    Poll::Ready(Ok(written))
  }

  fn is_write_vectored(&self) -> bool {
    self.inner.is_write_vectored()
  }

  fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Pin::new(&mut self.inner).poll_flush(cx)
  }

  fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Pin::new(&mut self.inner).poll_shutdown(cx)
  }
}

impl<T: Connection> Connection for Metered<T> {
  fn connected(&self) -> Connected {
    self.inner.connected()
  }
}

/// A connector whose connections are `Metered`.
#[derive(Clone)]
pub struct MeteredConnector<C>(pub C);

type Connecting<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<C> tower_service::Service<Uri> for MeteredConnector<C>
where
  C: tower_service::Service<Uri> + Send,
  C::Response: Send + 'static,
  C::Error: Into<BoxError>,
  C::Future: Send + 'static,
{
  type Response = Metered<C::Response>;
  type Error = BoxError;
  type Future = Connecting<Self::Response>;

  fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
    self.0.poll_ready(cx).map_err(Into::into)
  }

  fn call(&mut self, uri: Uri) -> Self::Future {
    let connecting = self.0.call(uri);
    Box::pin(async move { Ok(Metered::new(connecting.await.map_err(Into::into)?)) })
  }
}

/// Connects to the engine's unix socket (the URI's host is ignored).
#[derive(Clone)]
pub struct UnixConnector(pub Arc<PathBuf>);

impl tower_service::Service<Uri> for UnixConnector {
  type Response = TokioIo<UnixConn>;
  type Error = std::io::Error;
  type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

  fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Poll::Ready(Ok(()))
  }

  fn call(&mut self, _: Uri) -> Self::Future {
    let path = self.0.clone();
    Box::pin(async move { Ok(TokioIo::new(UnixConn::connect(path.as_path()).await?)) })
  }
}

/// A pooled HTTP client over `connector`, each connection metered; `pooled: false` opens a
/// connection per request (as bollard's own unix and plain-tcp clients do).
pub fn http_client<C, B>(connector: C, pooled: bool) -> Arc<Client<MeteredConnector<C>, B>>
where
  C: tower_service::Service<Uri> + Clone + Send + Sync + 'static,
  C::Response: Read + Write + Connection + Unpin + Send + 'static,
  C::Error: Into<BoxError>,
  C::Future: Send + 'static,
  B: hyper::body::Body + Send + 'static + Unpin,
  B::Data: Send,
  B::Error: Into<BoxError>,
{
  let mut builder = Client::builder(hyper_util::rt::TokioExecutor::new());
  if pooled {
    builder.pool_idle_timeout(std::time::Duration::from_secs(30));
  } else {
    builder.pool_max_idle_per_host(0);
  }
  Arc::new(builder.build(MeteredConnector(connector)))
}

/// A bollard client whose requests go through `connector`, each connection metered. `addr` is
/// the URL bollard builds request URIs from.
pub fn docker<C>(
  connector: C,
  addr: &str,
  pooled: bool,
  timeout: u64,
  version: &ClientVersion,
) -> Result<Docker, BollardError>
where
  C: tower_service::Service<Uri> + Clone + Send + Sync + 'static,
  C::Response: Read + Write + Connection + Unpin + Send + 'static,
  C::Error: Into<BoxError>,
  C::Future: Send + 'static,
{
  let client = http_client(connector, pooled);
  Docker::connect_with_custom_transport(
    move |req: BollardRequest| {
      let client = client.clone();
      async move { client.request(req).await.map_err(BollardError::from) }
    },
    Some(addr),
    timeout,
    version,
  )
}

#[cfg(test)]
mod tests {
  use super::*;

  fn exchange(m: &mut Meter, request: &str, reply: &[&[u8]]) -> std::io::Result<()> {
    m.wrote(request.as_bytes());
    for r in reply {
      m.read(r)?;
    }
    Ok(())
  }

  #[test]
  fn kinds_come_from_method_and_path() {
    assert_eq!(kind_of("GET", "/v1.41/containers/abc/json"), Kind::Whole);
    assert_eq!(kind_of("GET", "/v1.41/containers/json?all=1"), Kind::Whole);
    assert_eq!(
      kind_of("GET", "/containers/abc/archive?path=%2Fa"),
      Kind::Streamed
    );
    assert_eq!(
      kind_of("HEAD", "/v1.41/containers/abc/archive"),
      Kind::Whole
    );
    assert_eq!(kind_of("PUT", "/v1.41/containers/abc/archive"), Kind::Whole);
    assert_eq!(kind_of("POST", "/v1.41/exec/e1/start"), Kind::Hijacked);
    assert_eq!(kind_of("POST", "/v1.41/exec/e1/json"), Kind::Whole);
    assert_eq!(
      kind_of("POST", "/v1.41/containers/c/attach?stream=1"),
      Kind::Hijacked
    );
    assert_eq!(
      kind_of("POST", "/v1.41/images/create?fromImage=x"),
      Kind::Streamed
    );
    assert_eq!(
      kind_of("GET", "/v1.41/images/reg:5000/a/b/json"),
      Kind::Whole
    );
    assert_eq!(kind_of("POST", "/v1.41/build?t=x"), Kind::Streamed);
    assert_eq!(kind_of("POST", "/v1.41/containers/c/wait"), Kind::Whole);
    assert_eq!(kind_of("GET", "/version"), Kind::Whole);
    assert_eq!(
      kind_of("GET", "/containers/abc/logs?follow=1"),
      Kind::Streamed
    );
    assert_eq!(kind_of("POST", "/exec/e1/start"), Kind::Hijacked);
    assert_eq!(
      kind_of("GET", "/v/containers/abc/logs"),
      Kind::Whole,
      "not a version"
    );
    assert_eq!(kind_of("", ""), Kind::Whole);
  }

  #[test]
  fn a_whole_reply_is_cut_at_its_cap_and_the_next_request_starts_afresh() {
    let mut m = Meter::default();
    let chunk = vec![b'x'; 1 << 20];
    let mut reply: Vec<&[u8]> = vec![b"HTTP/1.1 200 OK\r\n\r\n"];
    reply.extend(std::iter::repeat_n(&chunk[..], 8));
    let e = exchange(
      &mut m,
      "GET /v1.41/containers/c/json HTTP/1.1\r\nHost: x\r\n\r\n",
      &reply,
    )
    .unwrap_err();
    let too = reply_too_large(&e).expect("ReplyTooLarge");
    assert_eq!(too.limit, REPLY_CAP);
    assert_eq!(too.request, "GET /v1.41/containers/c/json");
    exchange(
      &mut m,
      "GET /v1.41/version HTTP/1.1\r\n\r\n",
      &[b"HTTP/1.1 200 OK\r\n\r\n{}"],
    )
    .expect("a new count");
  }

  #[test]
  fn streamed_replies_are_not_counted_but_their_errors_are() {
    let mut m = Meter::default();
    let big = vec![0u8; 4 << 20];
    let head: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";
    exchange(
      &mut m,
      "GET /v1.41/containers/c/archive?path=/a HTTP/1.1\r\n\r\n",
      &[head, &big, &big, &big],
    )
    .expect("an archive is streamed");
    let e = exchange(
      &mut m,
      "GET /v1.41/containers/c/logs HTTP/1.1\r\n\r\n",
      &[b"HTTP/1.1 500 Oops\r\n\r\n", &big],
    );
    assert_eq!(reply_too_large(&e.unwrap_err()).unwrap().limit, ERROR_CAP);
  }

  #[test]
  fn a_hijacked_stream_is_raw_once_agreed() {
    let mut m = Meter::default();
    let big = vec![3u8; 16 << 20];
    exchange(
      &mut m,
      "POST /v1.41/exec/e/start HTTP/1.1\r\n\r\n",
      &[b"HTTP/1.1 101 UPGRADED\r\n\r\n", &big],
    )
    .expect("raw");
    // Writes on the raw stream (stdin) are not requests.
    exchange(
      &mut m,
      "GET /v1.41/containers/c/json HTTP/1.1\r\n\r\n",
      &[&big],
    )
    .expect("still raw");
  }

  #[test]
  fn a_request_line_split_across_writes_still_picks_its_cap() {
    let mut m = Meter::default();
    m.wrote(b"GET /v1.41/containers/c/arc");
    m.wrote(b"hive?path=/x HTTP/1.1\r\nHost: x\r\n\r\n");
    m.read(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
    m.read(&vec![0u8; 16 << 20]).expect("streamed");
    // The status line split across reads too.
    m.wrote(b"GET /v1.41/info HTTP/1.1\r\n\r\n");
    m.read(b"HTTP/1.1 4").unwrap();
    m.read(b"04 Not Found\r\n\r\n").unwrap();
    assert!(m.read(&vec![0u8; 2 << 20]).is_err(), "error cap");
  }
}
