//! `EgressConn` against a scripted agent on an in-memory pipe.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::super::tests::{pair, Fake};
use super::*;
use crate::client::{AgentClient, ClientError};
use crate::frame::{Frame, Kind, AGENT_STREAM, WINDOW};
use crate::msg::{AgentRequest, EgressListenSpec};

/// The window the host asks for: far under `WINDOW`.
const W: u32 = 64 * 1024;

/// A client that has egress listening (window `W`), and the connections it is handed.
async fn listening(max: u32) -> (AgentClient, Fake, mpsc::UnboundedReceiver<EgressConn>) {
  let (c, mut fake) = pair().await;
  let (tx, rx) = mpsc::unbounded_channel();
  c.on_egress(Arc::new(move |conn| {
    let _ = tx.send(conn);
  }));
  let listen = tokio::spawn({
    let c = c.clone();
    async move {
      c.egress_listen(EgressListenSpec {
        port: 3128,
        window: W,
        max_connections: max,
      })
      .await
    }
  });
  let open = fake.recv().await.unwrap();
  assert_eq!(open.kind, Kind::Open);
  fake.result(open.id, ()).await;
  listen.await.unwrap().unwrap();
  (c, fake, rx)
}

/// The agent opens connection `n`; its stream id.
async fn connect(fake: &mut Fake, n: u32) -> u32 {
  let id = AGENT_STREAM | n;
  let open = AgentRequest::EgressConnect {
    port: 3128,
    peer: "127.0.0.1:40000".into(),
  };
  fake.send(Frame::json(Kind::Open, id, &open)).await;
  id
}

/// The next frame, which must be the answer to stream `id`: `Ok` or the error's message.
async fn answer(fake: &mut Fake, id: u32) -> Result<(), String> {
  let f = fake.recv_skip_credit().await.unwrap();
  assert_eq!((f.kind, f.id), (Kind::Result, id));
  match serde_json::from_slice::<Outcome<()>>(&f.payload).unwrap() {
    Outcome::Ok(()) => Ok(()),
    Outcome::Err(e) => Err(e.message),
  }
}

#[tokio::test]
async fn reads_grant_credit_back_within_the_smaller_window() {
  let (_c, mut fake, mut rx) = listening(4).await;
  let id = connect(&mut fake, 1).await;
  let mut conn = rx.recv().await.unwrap();
  assert_eq!((conn.port, conn.peer.as_str()), (3128, "127.0.0.1:40000"));
  // A whole window, then another once it is granted back: a batch of `CREDIT_BATCH` would
  // never come back within a window this small.
  for round in 0..2u8 {
    for _ in 0..4 {
      fake
        .send(Frame::new(Kind::Data, id, vec![round; W as usize / 4]))
        .await;
    }
    let mut got = vec![0u8; W as usize];
    conn.read_exact(&mut got).await.unwrap();
    assert!(got.iter().all(|&b| b == round));
    let mut granted = 0;
    while granted < W {
      let f = fake.recv().await.unwrap();
      assert_eq!((f.kind, f.id), (Kind::Credit, id));
      granted += f.credit_amount().unwrap();
    }
    assert_eq!(granted, W);
  }
  fake.send(Frame::empty(Kind::End, id)).await;
  assert_eq!(conn.read(&mut [0u8; 8]).await.unwrap(), 0);
  assert_eq!(conn.read(&mut [0u8; 8]).await.unwrap(), 0);
  conn.finish();
  assert_eq!(answer(&mut fake, id).await, Ok(()));
}

#[tokio::test]
async fn data_past_the_egress_window_is_a_violation() {
  let (c, mut fake, _rx) = listening(4).await;
  let id = connect(&mut fake, 1).await;
  fake
    .send(Frame::new(Kind::Data, id, vec![0u8; W as usize]))
    .await;
  fake.send(Frame::new(Kind::Data, id, vec![0u8; 1])).await;
  match c.closed().await {
    ClientError::StreamEnded { reason } => assert!(reason.contains("more data than its credit")),
    other => panic!("{other:?}"),
  }
}

#[tokio::test]
async fn writes_wait_for_the_agents_credit() {
  let (_c, mut fake, mut rx) = listening(4).await;
  let id = connect(&mut fake, 1).await;
  let mut conn = rx.recv().await.unwrap();
  let total = WINDOW as usize + 100;
  let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
  let writer = tokio::spawn({
    let data = data.clone();
    async move {
      conn.write_all(&data).await.unwrap();
      conn.shutdown().await.unwrap();
      conn
    }
  });
  let mut got = Vec::new();
  while got.len() < WINDOW as usize {
    let f = fake.recv().await.unwrap();
    assert_eq!((f.kind, f.id), (Kind::Data, id));
    got.extend_from_slice(&f.payload);
  }
  assert_eq!(got.len(), WINDOW as usize);
  tokio::time::sleep(Duration::from_millis(100)).await;
  assert!(!writer.is_finished(), "wrote past the agent's credit");
  fake.send(Frame::credit(id, 100)).await;
  let f = fake.recv().await.unwrap();
  assert_eq!((f.kind, f.payload.len()), (Kind::Data, 100));
  got.extend_from_slice(&f.payload);
  assert_eq!(got, data);
  let conn = writer.await.unwrap();
  let f = fake.recv().await.unwrap();
  assert_eq!((f.kind, f.id), (Kind::End, id));
  conn.finish();
  assert_eq!(answer(&mut fake, id).await, Ok(()));
}

#[tokio::test]
async fn connections_are_refused_without_a_handler_or_over_the_limit() {
  let (c, mut fake) = pair().await;
  let id = connect(&mut fake, 1).await;
  assert_eq!(
    answer(&mut fake, id).await,
    Err("egress is not served by this host".into())
  );
  drop(c);
  let (_c, mut fake, mut rx) = listening(1).await;
  let first = connect(&mut fake, 1).await;
  let mut conn = rx.recv().await.unwrap();
  let second = connect(&mut fake, 2).await;
  assert_eq!(
    answer(&mut fake, second).await,
    Err("too many egress connections at once".into())
  );
  // The agent gives the first up (its client reset it): there is room again, and the
  // connection reads as reset.
  fake.send(Frame::empty(Kind::Cancel, first)).await;
  let e = conn.read(&mut [0u8; 8]).await.unwrap_err();
  assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
  let e = conn.write(b"x").await.unwrap_err();
  assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
  drop(conn);
  connect(&mut fake, 3).await;
  assert_eq!(rx.recv().await.unwrap().port, 3128);
}

#[tokio::test]
async fn a_failed_or_dropped_connection_answers_with_an_error() {
  let (_c, mut fake, mut rx) = listening(4).await;
  let id = connect(&mut fake, 1).await;
  rx.recv().await.unwrap().fail("denied by policy");
  assert_eq!(answer(&mut fake, id).await, Err("denied by policy".into()));
  let id = connect(&mut fake, 2).await;
  drop(rx.recv().await.unwrap());
  assert_eq!(
    answer(&mut fake, id).await,
    Err("the host dropped the egress connection".into())
  );
}

/// The provider moves connections into tasks on a multi-threaded runtime.
#[test]
fn an_egress_connection_is_send() {
  fn send<T: Send + Unpin + AsyncRead + AsyncWrite>() {}
  send::<EgressConn>();
}
