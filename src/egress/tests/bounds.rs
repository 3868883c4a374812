//! The bounds: connect deadline, connection limit, idle timeout, slow readers, cancellation.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::TcpSocket;
use tokio::time::{sleep, timeout, Instant};

use super::*;

fn limits(f: impl FnOnce(&mut Limits)) -> Limits {
  let mut l = Limits::default();
  f(&mut l);
  l
}

/// A loopback listener that never accepts, its queue filled, so a new connect hangs.
async fn full_listener() -> (u16, Vec<TcpStream>, TcpListener) {
  let sock = TcpSocket::new_v4().unwrap();
  sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
  let l = sock.listen(1).unwrap();
  let addr = l.local_addr().unwrap();
  let mut held = Vec::new();
  loop {
    match timeout(sec(200), TcpStream::connect(addr)).await {
      Ok(Ok(s)) => held.push(s),
      Err(_) => break,
      Ok(Err(e)) => panic!("{e}"),
    }
    assert!(held.len() < 64, "the listener's queue never filled");
  }
  (addr.port(), held, l)
}

#[tokio::test]
async fn a_connect_past_its_deadline_is_a_504_and_socks_ttl_expired() {
  let (port, _held, _l) = full_listener().await;
  let r = rig(to_origin(), limits(|l| l.connect_timeout = sec(300)));
  let t0 = Instant::now();
  let (_, h, head) = r.connect(&format!("origin.test:{port}")).await;
  let took = t0.elapsed();
  assert!(head.starts_with("HTTP/1.1 504 Gateway Timeout"), "{head}");
  assert!(took >= sec(290) && took < sec(2000), "{took:?}");
  let Served::Failed(m) = h.await.unwrap() else {
    panic!()
  };
  assert!(m.contains("within the connect timeout (300 ms)"), "{m}");
  let (mut c, _) = r.start();
  c.write_all(&[5, 1, 0, 5, 1, 0, 3, 11]).await.unwrap();
  c.write_all(b"origin.test").await.unwrap();
  c.write_all(&port.to_be_bytes()).await.unwrap();
  assert_eq!(&read_all(&mut c).await[..4], &[5, 0, 5, 6], "TTL expired");
}

#[tokio::test]
async fn the_connection_past_the_limit_is_refused_while_the_others_stay_open() {
  let port = echo_origin().await;
  let r = rig(to_origin(), limits(|l| l.buffer_bytes = 4096));
  let target = format!("origin.test:{port}");
  let mut open = Vec::new();
  for _ in 0..256 {
    let (c, h, head) = r.connect(&target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    open.push((c, h));
  }
  assert_eq!(r.egress.stats().open, 256);
  let (mut c, h, head) = r.connect(&target).await;
  assert!(
    head.starts_with("HTTP/1.1 503 Service Unavailable"),
    "{head}"
  );
  let body = String::from_utf8(read_all(&mut c).await).unwrap();
  assert_eq!(
    body,
    format!(
      "egress to origin.test:{port} refused: the sandbox already has 256 egress connections \
       open, its limit\n"
    )
  );
  assert!(matches!(h.await.unwrap(), Served::Refused(r) if r.over_limit));
  let (mut c, _) = r.start();
  c.write_all(&[5, 1, 0, 5, 1, 0, 3, 11]).await.unwrap();
  c.write_all(b"origin.test").await.unwrap();
  c.write_all(&port.to_be_bytes()).await.unwrap();
  assert_eq!(&read_all(&mut c).await[..4], &[5, 0, 5, 1]);
  // Every open one still works; closing one makes room.
  for (c, _) in open.iter_mut().take(3) {
    c.write_all(b"hi").await.unwrap();
    let mut b = [0u8; 2];
    c.read_exact(&mut b).await.unwrap();
  }
  let (mut c, h) = open.pop().unwrap();
  c.shutdown().await.unwrap();
  read_all(&mut c).await;
  assert!(matches!(h.await.unwrap(), Served::Allowed(_)));
  assert_eq!(r.egress.stats().open, 255);
  let (_, _, head) = r.connect(&target).await;
  assert!(head.starts_with("HTTP/1.1 200"), "{head}");
  let s = r.egress.stats();
  assert_eq!((s.allowed, s.refused, s.open), (257, 2, 256));
  assert_eq!(r.refusals.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn an_idle_tunnel_is_closed_after_the_idle_timeout_and_activity_defers_it() {
  let port = echo_origin().await;
  let r = rig(to_origin(), limits(|l| l.idle_timeout = sec(400)));
  let (mut c, h, _) = r.connect(&format!("origin.test:{port}")).await;
  let t0 = Instant::now();
  for _ in 0..3 {
    sleep(sec(250)).await;
    c.write_all(b"k").await.unwrap();
    let mut b = [0u8];
    c.read_exact(&mut b).await.unwrap();
  }
  let last = Instant::now();
  assert!(read_all(&mut c).await.is_empty());
  let quiet = last.elapsed();
  assert!(t0.elapsed() > sec(1000));
  assert!(quiet >= sec(390) && quiet < sec(1500), "{quiet:?}");
  let Served::Allowed(carried) = h.await.unwrap() else {
    panic!()
  };
  assert_eq!(
    carried.broken.as_deref(),
    Some("no byte either way for 0.4 s")
  );
  assert_eq!(r.egress.stats().open, 0);
}

/// An origin that sends `total` bytes as fast as it may, counting what it got out.
async fn firehose(total: u64, sent: Arc<AtomicU64>) -> u16 {
  origin(move |mut s| {
    let sent = sent.clone();
    async move {
      let chunk = vec![7u8; 64 * 1024];
      while sent.load(Ordering::Relaxed) < total {
        if s.write_all(&chunk).await.is_err() {
          return;
        }
        sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
      }
    }
  })
  .await
}

#[tokio::test]
async fn a_client_that_reads_nothing_holds_the_proxy_to_its_buffer() {
  const FIFTY_MIB: u64 = 50 << 20;
  let sent = Arc::new(AtomicU64::new(0));
  let port = firehose(FIFTY_MIB, sent.clone()).await;
  let r = rig(to_origin(), Limits::default());
  let (_c, h, _) = r.connect(&format!("origin.test:{port}")).await;
  sleep(sec(300)).await;
  let first = r.egress.stats().bytes_in;
  sleep(sec(500)).await;
  let later = r.egress.stats().bytes_in;
  // Pulled from the origin: at most what the client's stream holds and the proxy's buffer.
  let bound = (DUPLEX + Limits::default().buffer_bytes) as u64;
  assert!(
    later <= bound,
    "{later} bytes pulled from the origin, bound {bound}"
  );
  assert_eq!(first, later, "the proxy kept reading");
  assert!(
    sent.load(Ordering::Relaxed) < FIFTY_MIB,
    "the origin was not held back"
  );
  // Another sandbox is not slowed.
  let echo = echo_origin().await;
  let other = rig(to_origin(), Limits::default());
  let t0 = Instant::now();
  let (mut c2, _, _) = other.connect(&format!("origin.test:{echo}")).await;
  c2.write_all(b"ping").await.unwrap();
  c2.shutdown().await.unwrap();
  assert_eq!(read_all(&mut c2).await, b"ping");
  assert!(t0.elapsed() < sec(500), "{:?}", t0.elapsed());
  h.abort();
}

#[tokio::test]
async fn an_origin_that_reads_nothing_holds_the_client_back() {
  let port = origin(|s| async move {
    sleep(sec(5000)).await;
    drop(s);
  })
  .await;
  let r = rig(to_origin(), Limits::default());
  let (c, h, _) = r.connect(&format!("origin.test:{port}")).await;
  let written = Arc::new(AtomicU64::new(0));
  let w = written.clone();
  let writer = tokio::spawn(async move {
    let mut c = c;
    let chunk = vec![1u8; 64 * 1024];
    while c.write_all(&chunk).await.is_ok() {
      w.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
  });
  sleep(sec(500)).await;
  let (first, wrote) = (r.egress.stats().bytes_out, written.load(Ordering::Relaxed));
  sleep(sec(500)).await;
  // What the proxy took sits in the kernel's socket buffers (a few MiB on loopback) and in
  // its one buffer; it takes no more, and the client's writes wait.
  assert_eq!(first, r.egress.stats().bytes_out, "the proxy kept reading");
  assert_eq!(
    wrote,
    written.load(Ordering::Relaxed),
    "the client kept writing"
  );
  assert!(first < 64 << 20, "{first}");
  writer.abort();
  h.abort();
}

#[tokio::test]
async fn dropping_serve_closes_both_sides() {
  let (tx, rx) = tokio::sync::oneshot::channel();
  let tx = Arc::new(Mutex::new(Some(tx)));
  let port = origin(move |mut s| {
    let tx = tx.clone();
    async move {
      let mut v = Vec::new();
      let r = s.read_to_end(&mut v).await;
      let _ = tx.lock().unwrap().take().unwrap().send(r.is_ok());
    }
  })
  .await;
  let r = rig(to_origin(), Limits::default());
  let (mut c, h, _) = r.connect(&format!("origin.test:{port}")).await;
  assert_eq!(r.egress.stats().open, 1);
  h.abort();
  let _ = h.await;
  assert!(
    timeout(sec(2000), rx).await.is_ok(),
    "the origin saw its end"
  );
  assert!(read_all(&mut c).await.is_empty(), "the client saw its end");
  assert_eq!(r.egress.stats().open, 0);
}
