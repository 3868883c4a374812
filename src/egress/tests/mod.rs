//! `Egress::serve` end to end: clients on in-memory streams, origins on loopback, names mapped
//! to loopback by `hosts` entries or `/etc/hosts` (no name is resolved over a network).

mod bounds;
mod clients;
mod perf;
mod tunnel;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::*;

/// What the in-memory client side holds in flight.
const DUPLEX: usize = 64 * 1024;

struct Rig {
  egress: Arc<Egress>,
  refusals: Arc<Mutex<Vec<Refusal>>>,
}

fn rig(policy: Value, limits: Limits) -> Rig {
  let policy = Policy::from_json(&policy).unwrap();
  rig_with(policy, limits)
}

fn rig_with(policy: Policy, limits: Limits) -> Rig {
  let refusals = Arc::new(Mutex::new(Vec::new()));
  let log = refusals.clone();
  let egress = Egress::new(
    Arc::new(policy),
    limits,
    Arc::new(move |r: &Refusal| log.lock().unwrap().push(r.clone())),
  );
  Rig {
    egress: Arc::new(egress),
    refusals,
  }
}

/// A policy reaching `origin.test` (→ 127.0.0.1) on any port.
fn to_origin() -> Value {
  serde_json::json!({"allow": ["origin.test"], "hosts": {"origin.test": "127.0.0.1"}})
}

impl Rig {
  /// A client connection being served.
  fn start(&self) -> (DuplexStream, JoinHandle<Served>) {
    let (client, ours) = tokio::io::duplex(DUPLEX);
    let e = self.egress.clone();
    (client, tokio::spawn(async move { e.serve(ours).await }))
  }

  /// A tunnel to `target` through CONNECT, with the proxy's reply head.
  async fn connect(&self, target: &str) -> (DuplexStream, JoinHandle<Served>, String) {
    let (mut c, h) = self.start();
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut c).await;
    (c, h, head)
  }
}

/// Reads up to the end of a response head, byte by byte so nothing past it is taken.
async fn read_head<R: AsyncReadExt + Unpin>(r: &mut R) -> String {
  let mut head = Vec::new();
  while !head.ends_with(b"\r\n\r\n") {
    let mut b = [0u8];
    if r.read(&mut b).await.unwrap() == 0 {
      break;
    }
    head.push(b[0]);
  }
  String::from_utf8(head).unwrap()
}

async fn read_all<R: AsyncReadExt + Unpin>(r: &mut R) -> Vec<u8> {
  let mut v = Vec::new();
  r.read_to_end(&mut v).await.unwrap();
  v
}

/// An origin on loopback that runs `each` on every connection it accepts.
async fn origin<F, Fut>(each: F) -> u16
where
  F: Fn(TcpStream) -> Fut + Send + 'static,
  Fut: std::future::Future<Output = ()> + Send + 'static,
{
  let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
  let port = l.local_addr().unwrap().port();
  tokio::spawn(async move {
    while let Ok((s, _)) = l.accept().await {
      tokio::spawn(each(s));
    }
  });
  port
}

/// Reads everything, then sends it back reversed and closes: a reply only after the client's
/// EOF arrived, which tests half-close.
async fn reversing_origin() -> u16 {
  origin(|mut s| async move {
    let mut got = read_all(&mut s).await;
    got.reverse();
    let _ = s.write_all(&got).await;
  })
  .await
}

/// Echoes as bytes come; closes at the client's EOF.
async fn echo_origin() -> u16 {
  origin(|s| async move {
    let (mut r, mut w) = s.into_split();
    let _ = tokio::io::copy(&mut r, &mut w).await;
  })
  .await
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
  let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
  l.local_addr().unwrap().port()
}

fn sec(ms: u64) -> Duration {
  Duration::from_millis(ms)
}
