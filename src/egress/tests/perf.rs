//! What a connection's set-up costs: parse, decide and connect to a loopback origin, against a
//! plain connect to the same origin. `cargo test --lib egress::tests::perf -- --nocapture`
//! prints the figures.

use tokio::time::Instant;

use super::*;

fn median(mut v: Vec<Duration>) -> Duration {
  v.sort();
  v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_up_adds_well_under_a_millisecond() {
  let port = origin(|s| async move { drop(s) }).await;
  let r = rig(to_origin(), Limits::default());
  let target = format!("origin.test:{port}");
  let (mut direct, mut proxied) = (Vec::new(), Vec::new());
  for i in 0..400 {
    let t0 = Instant::now();
    let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let plain = t0.elapsed();
    drop(s);
    let t0 = Instant::now();
    let (mut c, _h) = r.start();
    let req = format!("CONNECT {target} HTTP/1.1\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 39];
    c.read_exact(&mut head).await.unwrap();
    let via = t0.elapsed();
    assert_eq!(&head[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
    // The first runs warm up the allocator and the runtime.
    if i >= 50 {
      direct.push(plain);
      proxied.push(via);
    }
  }
  let (d, p) = (median(direct), median(proxied));
  eprintln!(
    "set-up p50: direct connect {d:?}, through the proxy {p:?}, added {:?}",
    p.saturating_sub(d)
  );
  // Loose, for a loaded machine and a debug build; the printed figure is the one to read.
  assert!(p < sec(5), "{p:?}");
}

/// A connection's state is the future (and, apart from it, a head of at most 64 KiB while the
/// handshake lasts, then the two buffers): nothing in it grows with what the peers do.
#[test]
fn a_connection_is_a_small_future() {
  let r = rig(to_origin(), Limits::default());
  let (_, ours) = tokio::io::duplex(16);
  let f = r.egress.serve(ours);
  let size = std::mem::size_of_val(&f);
  eprintln!("serve future: {size} bytes");
  assert!(size < 4096, "{size}");
}
