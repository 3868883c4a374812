//! The egress port: real loopback connections on this machine carried through the agent to an
//! `EgressConn` on the host side, and back.

mod common;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use trueforge_agent_proto::client::{AgentClient, ClientError, EgressConn};
use trueforge_agent_proto::msg::{EgressListenSpec, ErrorKind};

const MIB: usize = 1 << 20;

/// The window these tests listen with: far under the protocol's 2 MiB, so an agent that sent
/// past it would be cut off by the client's check.
const WINDOW: u32 = 64 * 1024;

async fn within<T>(f: impl Future<Output = T>) -> T {
  tokio::time::timeout(Duration::from_secs(60), f)
    .await
    .expect("the test finishes in time")
}

/// A port nothing listens on now.
fn free_port() -> u16 {
  let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
  l.local_addr().unwrap().port()
}

fn spec(port: u16, window: u32, max_connections: u32) -> EgressListenSpec {
  EgressListenSpec {
    port,
    window,
    max_connections,
  }
}

async fn listening(client: &AgentClient, max_connections: u32) -> u16 {
  let port = free_port();
  client
    .egress_listen(spec(port, WINDOW, max_connections))
    .await
    .expect("egress_listen");
  port
}

/// Hands the test each connection as it arrives.
fn conns(client: &AgentClient) -> mpsc::UnboundedReceiver<EgressConn> {
  let (tx, rx) = mpsc::unbounded_channel();
  client.on_egress(Arc::new(move |c| {
    let _ = tx.send(c);
  }));
  rx
}

async fn connect(port: u16) -> TcpStream {
  TcpStream::connect(("127.0.0.1", port)).await.unwrap()
}

/// Byte `i` of a stream: differs from its neighbours and repeats only every 2^32 bytes, so a
/// lost, repeated or reordered chunk shows.
fn byte_at(i: usize) -> u8 {
  ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8
}

fn pattern(from: usize, len: usize) -> Vec<u8> {
  (from..from + len).map(byte_at).collect()
}

/// Writes `total` pattern bytes, counting them in `sent` as they go.
async fn write_pattern<W: AsyncWriteExt + Unpin>(w: &mut W, total: usize, sent: &AtomicUsize) {
  let mut at = 0;
  while at < total {
    let n = (total - at).min(64 * 1024);
    w.write_all(&pattern(at, n)).await.unwrap();
    at += n;
    sent.store(at, Ordering::SeqCst);
  }
}

/// Reads to the end, checking every byte against the pattern; `pause` between reads.
async fn read_pattern<R: AsyncReadExt + Unpin>(r: &mut R, chunk: usize, pause: Duration) -> usize {
  let mut buf = vec![0u8; chunk];
  let mut at = 0;
  loop {
    let n = r.read(&mut buf).await.unwrap();
    if n == 0 {
      return at;
    }
    assert!(
      buf[..n] == pattern(at, n)[..],
      "bytes {at}..{} differ from what was sent",
      at + n
    );
    at += n;
    if !pause.is_zero() {
      tokio::time::sleep(pause).await;
    }
  }
}

/// How a socket the agent reset ends: the bytes that arrived before it, and the error. A
/// reset drops what the client had not yet taken, but what it had may still come first.
async fn read_error(s: &mut TcpStream) -> (usize, io::ErrorKind) {
  let mut buf = [0u8; 4096];
  let mut before = 0;
  loop {
    match s.read(&mut buf).await {
      Ok(0) => panic!("the socket ended cleanly after {before} bytes; a reset was expected"),
      Ok(n) => before += n,
      Err(e) => return (before, e.kind()),
    }
  }
}

const RESET: (usize, io::ErrorKind) = (0, io::ErrorKind::ConnectionReset);

/// A connection the agent resets as soon as it takes it: the reset may already be there when
/// the connect completes.
async fn reset_on_arrival(port: u16) {
  match TcpStream::connect(("127.0.0.1", port)).await {
    Ok(mut s) => assert_eq!(read_error(&mut s).await, RESET),
    Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
  }
}

/// A TCP echo server on this machine.
async fn echo_server() -> SocketAddr {
  let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
  let addr = l.local_addr().unwrap();
  tokio::spawn(async move {
    while let Ok((mut s, _)) = l.accept().await {
      tokio::spawn(async move {
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
      });
    }
  });
  addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_with_copy_bidirectional_carries_both_ways() {
  let a = start().await;
  let target = echo_server().await;
  let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
  let s = seen.clone();
  a.client.on_egress(Arc::new(move |mut conn: EgressConn| {
    s.lock().unwrap().push((conn.port, conn.peer.clone()));
    tokio::spawn(async move {
      let mut up = TcpStream::connect(target).await.unwrap();
      match tokio::io::copy_bidirectional(&mut conn, &mut up).await {
        Ok(_) => conn.finish(),
        Err(e) => conn.fail(&e.to_string()),
      }
    });
  }));
  let port = listening(&a.client, 16).await;
  within(async {
    let mut c = connect(port).await;
    let (mut r, mut w) = c.split();
    let sent = AtomicUsize::new(0);
    let ((), got) = tokio::join!(
      async {
        write_pattern(&mut w, 8 * MIB, &sent).await;
        w.shutdown().await.unwrap();
      },
      read_pattern(&mut r, 64 * 1024, Duration::ZERO),
    );
    // The echo server's end came back as the end of the stream, not a reset.
    assert_eq!(got, 8 * MIB);
    let me = c.local_addr().unwrap().to_string();
    assert_eq!(seen.lock().unwrap()[0], (port, me));
    // The agent also listens on ::1 where this machine has it.
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
      let mut c6 = TcpStream::connect(("::1", port)).await.unwrap();
      c6.write_all(b"over ipv6").await.unwrap();
      c6.shutdown().await.unwrap();
      let mut back = Vec::new();
      c6.read_to_end(&mut back).await.unwrap();
      assert_eq!(back, b"over ipv6");
      assert!(seen.lock().unwrap()[1].1.starts_with("[::1]:"));
    }
  })
  .await;
  assert!(!a.client.is_closed());
}

/// Connections share the agent's one stream: many at once, each with its own window, all
/// arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_at_once_each_arrive_whole() {
  let a = start().await;
  let target = echo_server().await;
  a.client.on_egress(Arc::new(move |mut conn: EgressConn| {
    tokio::spawn(async move {
      let mut up = TcpStream::connect(target).await.unwrap();
      match tokio::io::copy_bidirectional(&mut conn, &mut up).await {
        Ok(_) => conn.finish(),
        Err(e) => conn.fail(&e.to_string()),
      }
    });
  }));
  let port = listening(&a.client, 64).await;
  within(async {
    let clients = (0..48).map(|_| async move {
      let mut c = connect(port).await;
      let (mut r, mut w) = c.split();
      let sent = AtomicUsize::new(0);
      let ((), got) = tokio::join!(
        async {
          write_pattern(&mut w, 512 * 1024, &sent).await;
          w.shutdown().await.unwrap();
        },
        read_pattern(&mut r, 16 * 1024, Duration::ZERO),
      );
      assert_eq!(got, 512 * 1024);
    });
    run_all(clients).await;
  })
  .await;
  assert_eq!(a.client.ping().await.unwrap().egress_turned_away, 0);
}

/// Runs every future to its end, concurrently.
async fn run_all<F: Future<Output = ()> + Send + 'static>(fs: impl Iterator<Item = F>) {
  let tasks: Vec<_> = fs.map(tokio::spawn).collect();
  for t in tasks {
    t.await.unwrap();
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_side_can_end_its_data_and_still_receive() {
  let a = start().await;
  let mut rx = conns(&a.client);
  let port = listening(&a.client, 16).await;
  within(async {
    // The client ends first, then still receives.
    let mut c = connect(port).await;
    let mut conn = rx.recv().await.unwrap();
    c.write_all(b"request").await.unwrap();
    c.shutdown().await.unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"request");
    conn.write_all(b"answer after your end").await.unwrap();
    conn.shutdown().await.unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"answer after your end");
    conn.finish();

    // The host ends first: the client sees its end of file and can still send.
    let mut c = connect(port).await;
    let mut conn = rx.recv().await.unwrap();
    conn.write_all(b"greeting").await.unwrap();
    conn.shutdown().await.unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"greeting");
    c.write_all(b"sent after your end").await.unwrap();
    c.shutdown().await.unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"sent after your end");
    conn.finish();
    // Finished cleanly: the socket closes without a reset.
    assert_eq!(c.read(&mut [0u8; 8]).await.unwrap(), 0);
  })
  .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_floods_an_unread_connection_is_held_at_the_window() {
  let a = start().await;
  let mut rx = conns(&a.client);
  let port = listening(&a.client, 16).await;
  within(async {
    let c = connect(port).await;
    let mut conn = rx.recv().await.unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn({
      let sent = sent.clone();
      async move {
        let mut c = c;
        write_pattern(&mut c, 20 * MIB, &sent).await;
        c.shutdown().await.unwrap();
        c
      }
    });
    // Nobody reads: the client is stopped once the socket buffers are full, and the agent sent
    // no more than the window (the client's check would have ended the connection).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = sent.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = sent.load(Ordering::SeqCst);
    assert_eq!(
      before, after,
      "the client kept sending to a connection nobody reads"
    );
    assert!(after < 20 * MIB);
    assert!(!a.client.is_closed(), "the agent sent past the window");
    // Reading resumes it: every byte arrives, in order.
    assert_eq!(
      read_pattern(&mut conn, 32 * 1024, Duration::ZERO).await,
      20 * MIB
    );
    let mut c = writer.await.unwrap();
    conn.shutdown().await.unwrap();
    conn.finish();
    assert_eq!(c.read(&mut [0u8; 8]).await.unwrap(), 0);
  })
  .await;
  assert!(!a.client.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_reaches_a_slow_reader_whole_and_in_order() {
  let a = start().await;
  let mut rx = conns(&a.client);
  let port = listening(&a.client, 16).await;
  within(async {
    let mut c = connect(port).await;
    let mut conn = rx.recv().await.unwrap();
    let host = tokio::spawn(async move {
      write_pattern(&mut conn, 20 * MIB, &AtomicUsize::new(0)).await;
      conn.shutdown().await.unwrap();
      conn
    });
    let got = read_pattern(&mut c, 16 * 1024, Duration::from_micros(500)).await;
    assert_eq!(got, 20 * MIB);
    host.await.unwrap().finish();
  })
  .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_reset_without_a_stream() {
  let a = start().await;
  let mut rx = conns(&a.client);
  let port = listening(&a.client, 2).await;
  within(async {
    let mut c1 = connect(port).await;
    let first = rx.recv().await.unwrap();
    let _c2 = connect(port).await;
    let _second = rx.recv().await.unwrap();
    reset_on_arrival(port).await;
    assert!(
      tokio::time::timeout(Duration::from_millis(300), rx.recv())
        .await
        .is_err(),
      "a stream was opened for a connection over the limit"
    );
    assert_eq!(a.client.ping().await.unwrap().egress_turned_away, 1);
    // Once one ends, there is room again.
    first.finish();
    assert_eq!(c1.read(&mut [0u8; 8]).await.unwrap(), 0);
    let _c4 = connect(port).await;
    let fourth = rx.recv().await.unwrap();
    assert_eq!(fourth.port, port);
  })
  .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_dropped_connection_resets_the_client() {
  let a = start().await;
  let port = listening(&a.client, 16).await;
  within(async {
    // No handler yet: refused.
    reset_on_arrival(port).await;
    let mut rx = conns(&a.client);
    let mut c = connect(port).await;
    let mut conn = rx.recv().await.unwrap();
    c.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
      .await
      .unwrap();
    conn.read_exact(&mut [0u8; 8]).await.unwrap();
    // An answer begun, then failed: whatever part of it arrived, the client sees a failure.
    conn.write_all(b"HTTP/1.1 200").await.unwrap();
    conn.fail("denied by policy");
    let (_, e) = read_error(&mut c).await;
    assert_eq!(e, io::ErrorKind::ConnectionReset);
    let mut c = connect(port).await;
    drop(rx.recv().await.unwrap());
    assert_eq!(read_error(&mut c).await, RESET);
  })
  .await;
  assert!(!a.client.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_reaches_the_host_as_a_reset() {
  let a = start().await;
  let mut rx = conns(&a.client);
  let port = listening(&a.client, 16).await;
  within(async {
    let c = connect(port).await;
    let mut conn = rx.recv().await.unwrap();
    c.set_zero_linger().unwrap();
    drop(c);
    let mut buf = [0u8; 64];
    let e = conn.read(&mut buf).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    // Writes fail too, rather than wait for credit that never comes.
    let e = conn.write_all(&[0u8; 1 << 16]).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
  })
  .await;
  assert!(!a.client.is_closed());
}

/// The agent's stdin closing (the host's end), or the agent being killed, resets every
/// connection: none may look complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_is_reset_when_the_agent_goes() {
  for kill in [false, true] {
    let mut a = start().await;
    let mut rx = conns(&a.client);
    let port = listening(&a.client, 16).await;
    within(async {
      let mut clients = Vec::new();
      let mut held = Vec::new();
      for _ in 0..3 {
        clients.push(connect(port).await);
        held.push(rx.recv().await.unwrap());
      }
      // Half of an answer on the way.
      held[0].write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
      let mut line = [0u8; 17];
      clients[0].read_exact(&mut line).await.unwrap();
      if kill {
        a.child.start_kill().unwrap();
      } else {
        a.client.close();
      }
      for c in &mut clients {
        assert_eq!(read_error(c).await, RESET);
      }
      a.child.wait().await.unwrap();
      let refused = TcpStream::connect(("127.0.0.1", port)).await.unwrap_err();
      assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    })
    .await;
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listening_again_keeps_or_replaces_the_port() {
  let a = start().await;
  let target = echo_server().await;
  a.client.on_egress(Arc::new(move |mut conn: EgressConn| {
    tokio::spawn(async move {
      let mut up = TcpStream::connect(target).await.unwrap();
      let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
      conn.finish();
    });
  }));
  let echo = |port: u16| async move {
    let mut c = connect(port).await;
    c.write_all(b"ping").await.unwrap();
    c.shutdown().await.unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"ping");
  };
  within(async {
    let port = listening(&a.client, 16).await;
    a.client
      .egress_listen(spec(port, WINDOW, 16))
      .await
      .expect("the same spec again is fine");
    echo(port).await;
    a.client
      .egress_listen(spec(port, WINDOW / 2, 8))
      .await
      .expect("new limits on the same port");
    echo(port).await;
    let other = free_port();
    a.client
      .egress_listen(spec(other, WINDOW, 16))
      .await
      .expect("another port");
    echo(other).await;
    let refused = TcpStream::connect(("127.0.0.1", port)).await.unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    a.client.egress_close().await.unwrap();
    let refused = TcpStream::connect(("127.0.0.1", other)).await.unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
  })
  .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_is_address_in_use_and_bad_specs_are_refused() {
  let a = start().await;
  let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
  let port = taken.local_addr().unwrap().port();
  match a.client.egress_listen(spec(port, WINDOW, 16)).await {
    Err(ClientError::Agent(e)) => {
      assert_eq!(e.kind, ErrorKind::AddressInUse);
      assert!(e
        .message
        .contains(&format!("already listens on port {port}")));
    }
    other => panic!("{other:?}"),
  }
  for bad in [
    spec(0, WINDOW, 1),
    spec(port, 0, 1),
    spec(port, 4 << 20, 1),
    spec(port, WINDOW, 0),
  ] {
    match a.client.egress_listen(bad).await {
      Err(ClientError::Agent(e)) => assert_eq!(e.kind, ErrorKind::InvalidRequest),
      other => panic!("{other:?}"),
    }
  }
  assert!(!a.client.is_closed());
}
