//! The client against a scripted agent on an in-memory pipe.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{duplex, split, AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

use super::*;
use crate::frame::{self, Frame, Kind, AGENT_STREAM, MAX_DATA, MAX_PAYLOAD, WINDOW};
use crate::msg::{
  AgentError, AgentRequest, DownloadHead, DownloadSpec, ErrorKind, ExecDone, ExecSpec, FileKind,
  Hello, Outcome, PingInfo, Request, UploadDone, UploadSpec,
};

pub(super) struct Fake {
  rd: ReadHalf<DuplexStream>,
  wr: WriteHalf<DuplexStream>,
  buf: BytesMut,
}

impl Fake {
  pub(super) async fn send(&mut self, f: Frame) {
    self.wr.write_all(&f.to_bytes()).await.unwrap();
  }

  pub(super) async fn recv(&mut self) -> Option<Frame> {
    loop {
      if let Some(f) = frame::decode(&mut self.buf).unwrap() {
        return Some(f);
      }
      if self.rd.read_buf(&mut self.buf).await.unwrap() == 0 {
        return None;
      }
    }
  }

  /// The next frame that is not a credit grant.
  pub(super) async fn recv_skip_credit(&mut self) -> Option<Frame> {
    loop {
      let f = self.recv().await?;
      if f.kind != Kind::Credit {
        return Some(f);
      }
    }
  }

  pub(super) async fn result<T: serde::Serialize>(&mut self, id: u32, v: T) {
    self
      .send(Frame::json(Kind::Result, id, &Outcome::Ok(v)))
      .await;
  }
}

fn hello(version: &str) -> Frame {
  Frame::json(
    Kind::Hello,
    0,
    &Hello {
      agent: "trueforge-agent".into(),
      version: version.into(),
      protocol: crate::PROTOCOL,
      pid: 7,
      uid: 0,
      arch: "x86_64".into(),
      cap_eff: 0,
      openat2: true,
      subreaper: true,
      session_guard: false,
      fs_ids: true,
    },
  )
}

pub(super) async fn pair() -> (AgentClient, Fake) {
  let (host, agent) = duplex(16 << 20);
  let (hr, hw) = split(host);
  let (ar, aw) = split(agent);
  let mut fake = Fake {
    rd: ar,
    wr: aw,
    buf: BytesMut::new(),
  };
  fake.send(hello(crate::VERSION)).await;
  let c = AgentClient::connect(hr, hw, ClientOptions::default())
    .await
    .unwrap();
  (c, fake)
}

fn exec_req(max_output: usize) -> ExecRequest {
  ExecRequest {
    command: "true".into(),
    cwd: "/".into(),
    env: vec![],
    user: None,
    timeout: Some(Duration::from_millis(1500)),
    max_output,
  }
}

#[tokio::test]
async fn text_instead_of_a_hello_is_a_handshake_error_that_shows_it() {
  let (host, mut agent) = duplex(1024);
  let (hr, hw) = split(host);
  agent
    .write_all(b"OCI runtime exec failed: exec: \"/trueforge/agent\": no such file\n")
    .await
    .unwrap();
  drop(agent);
  let err = AgentClient::connect(hr, hw, ClientOptions::default())
    .await
    .err()
    .unwrap();
  match err {
    ClientError::Handshake(m) => assert!(m.contains("no such file"), "{m}"),
    other => panic!("{other:?}"),
  }
}

#[tokio::test]
async fn another_version_is_refused() {
  let (host, agent) = duplex(1024);
  let (hr, hw) = split(host);
  let (_ar, mut aw) = split(agent);
  aw.write_all(&hello("0.0.1").to_bytes()).await.unwrap();
  let err = AgentClient::connect(hr, hw, ClientOptions::default())
    .await
    .err()
    .unwrap();
  assert!(matches!(err, ClientError::VersionMismatch { ref agent, .. } if agent == "0.0.1"));
}

#[tokio::test]
async fn every_request_in_flight_fails_when_the_stream_ends() {
  let (c, mut fake) = pair().await;
  let mut tasks = Vec::new();
  for _ in 0..5 {
    let c = c.clone();
    tasks.push(tokio::spawn(async move { c.exec(&exec_req(100)).await }));
  }
  for _ in 0..5 {
    assert_eq!(fake.recv().await.unwrap().kind, Kind::Open);
  }
  drop(fake);
  for t in tasks {
    let err = t.await.unwrap().unwrap_err();
    assert!(matches!(err, ClientError::StreamEnded { .. }), "{err:?}");
  }
  assert!(c.is_closed());
  assert!(matches!(
    c.ping().await,
    Err(ClientError::StreamEnded { .. })
  ));
}

#[tokio::test]
async fn exec_output_is_capped_and_a_timeout_says_so() {
  let (c, mut fake) = pair().await;
  let task = tokio::spawn({
    let c = c.clone();
    async move { c.exec(&exec_req(10)).await }
  });
  let open = fake.recv().await.unwrap();
  let req: Request = serde_json::from_slice(&open.payload).unwrap();
  assert!(matches!(
    req,
    Request::Exec(ExecSpec {
      timeout_ms: 1500,
      ..
    })
  ));
  for chunk in [&b"01234"[..], b"56789", b"abcdef"] {
    fake.send(Frame::new(Kind::Data, open.id, chunk)).await;
  }
  fake
    .result(
      open.id,
      ExecDone {
        exit_code: -1,
        timed_out: true,
        recovered: None,
      },
    )
    .await;
  let out = task.await.unwrap().unwrap();
  assert_eq!(out.exit_code, 124);
  assert!(out.timed_out);
  assert_eq!(out.omitted, 6);
  assert_eq!(
    out.output,
    "01234\n[... 6 bytes of output omitted ...]\nbcdef\n[timed out after 1.5 s: the command and every process it started were killed]"
  );
}

#[tokio::test]
async fn an_agent_that_ignores_credit_is_cut_off() {
  let (c, mut fake) = pair().await;
  let task = tokio::spawn({
    let c = c.clone();
    async move { c.exec(&exec_req(10)).await }
  });
  // The client grants credit as it consumes, so flood faster than the grants can follow: no
  // grant is read here, and 2 windows are sent in one go.
  let open = fake.recv().await.unwrap();
  let mut burst = BytesMut::new();
  for _ in 0..(2 * WINDOW as usize / MAX_DATA + 1) {
    Frame::new(Kind::Data, open.id, vec![0u8; MAX_DATA]).encode(&mut burst);
  }
  fake.wr.write_all(&burst).await.unwrap();
  let err = task.await.unwrap().unwrap_err();
  match err {
    ClientError::StreamEnded { reason } => assert!(reason.contains("credit"), "{reason}"),
    other => panic!("{other:?}"),
  }
}

#[tokio::test]
async fn a_download_nobody_reads_does_not_stall_other_requests() {
  let (c, mut fake) = pair().await;
  let download = tokio::spawn({
    let c = c.clone();
    async move {
      let d = c
        .download(DownloadSpec {
          path: "/big".into(),
          user: None,
          max_bytes: 1 << 30,
        })
        .await
        .unwrap();
      // Holds the download without reading it.
      tokio::time::sleep(Duration::from_secs(3600)).await;
      drop(d);
    }
  });
  let open = fake.recv().await.unwrap();
  fake
    .send(Frame::json(
      Kind::Head,
      open.id,
      &DownloadHead {
        size: 1 << 30,
        mode: 0o644,
        mtime_ms: 0,
      },
    ))
    .await;
  for _ in 0..WINDOW as usize / MAX_DATA {
    fake
      .send(Frame::new(Kind::Data, open.id, vec![1u8; MAX_DATA]))
      .await;
  }
  let ping = tokio::spawn({
    let c = c.clone();
    async move { c.ping().await }
  });
  let p = fake.recv_skip_credit().await.unwrap();
  assert_eq!(p.kind, Kind::Open);
  let info = PingInfo {
    uptime_ms: 1,
    egress_turned_away: 0,
  };
  fake.result(p.id, info).await;
  assert_eq!(ping.await.unwrap().unwrap().uptime_ms, 1);
  download.abort();
  // Dropping the download cancels it.
  let f = fake.recv_skip_credit().await.unwrap();
  assert_eq!((f.kind, f.id), (Kind::Cancel, open.id));
}

#[tokio::test]
async fn uploads_wait_for_credit() {
  let (c, mut fake) = pair().await;
  let total = WINDOW as usize + 3 * MAX_DATA + 5;
  let upload = tokio::spawn({
    let c = c.clone();
    async move {
      c.upload(
        UploadSpec {
          path: "/f".into(),
          user: None,
          mode: 0o644,
          max_bytes: None,
          parents: true,
        },
        &vec![9u8; total][..],
      )
      .await
    }
  });
  let open = fake.recv().await.unwrap();
  let mut got = 0;
  while got < WINDOW as usize {
    let f = fake.recv().await.unwrap();
    assert_eq!(f.kind, Kind::Data);
    got += f.payload.len();
  }
  assert_eq!(got, WINDOW as usize);
  // Nothing more until the agent grants room.
  assert!(
    tokio::time::timeout(Duration::from_millis(100), fake.recv())
      .await
      .is_err()
  );
  fake.send(Frame::credit(open.id, WINDOW)).await;
  loop {
    let f = fake.recv().await.unwrap();
    if f.kind == Kind::End {
      break;
    }
    got += f.payload.len();
  }
  assert_eq!(got, total);
  fake
    .result(open.id, UploadDone { size: total as u64 })
    .await;
  assert_eq!(upload.await.unwrap().unwrap().size, total as u64);
}

#[tokio::test]
async fn an_upload_refused_early_stops_sending_and_reports_the_error() {
  let (c, mut fake) = pair().await;
  let upload = tokio::spawn({
    let c = c.clone();
    async move {
      c.upload_bytes(
        UploadSpec {
          path: "/etc/x".into(),
          user: Some("nobody".into()),
          mode: 0o644,
          max_bytes: None,
          parents: true,
        },
        Bytes::from(vec![0u8; 4 * WINDOW as usize]),
      )
      .await
    }
  });
  let open = fake.recv().await.unwrap();
  fake
    .send(Frame::json(
      Kind::Result,
      open.id,
      &Outcome::<()>::Err(AgentError::new(ErrorKind::PermissionDenied, "denied")),
    ))
    .await;
  let err = upload.await.unwrap().unwrap_err();
  assert!(matches!(
    err,
    ClientError::Agent(AgentError {
      kind: ErrorKind::PermissionDenied,
      ..
    })
  ));
}

#[tokio::test]
async fn typed_errors_keep_their_details() {
  let (c, mut fake) = pair().await;
  let task = tokio::spawn({
    let c = c.clone();
    async move {
      c.download_bytes(DownloadSpec {
        path: "/p".into(),
        user: None,
        max_bytes: 10,
      })
      .await
    }
  });
  let open = fake.recv().await.unwrap();
  let mut e = AgentError::new(ErrorKind::NotRegularFile, "/p is a named pipe");
  e.file_kind = Some(FileKind::Fifo);
  fake
    .send(Frame::json(
      Kind::Result,
      open.id,
      &Outcome::<()>::Err(e.clone()),
    ))
    .await;
  assert_eq!(task.await.unwrap().unwrap_err(), ClientError::Agent(e));
}

#[tokio::test]
async fn code_mode_calls_are_routed_and_answered() {
  let (c, mut fake) = pair().await;
  let id = AGENT_STREAM | 1;
  let open = |id| {
    Frame::json(
      Kind::Open,
      id,
      &AgentRequest::CodeModeCall {
        socket: "/s.sock".into(),
        size: Some(19),
      },
    )
  };
  // Nobody serves Code Mode yet: refused at once.
  fake.send(open(id)).await;
  let f = fake.recv().await.unwrap();
  assert_eq!((f.kind, f.id), (Kind::Result, id));
  let mut calls = c.code_mode_calls();
  let id = AGENT_STREAM | 2;
  fake.send(open(id)).await;
  fake
    .send(Frame::new(Kind::Data, id, &b"{\"op\":"[..]))
    .await;
  fake
    .send(Frame::new(Kind::Data, id, &b"\"list_tools\"}"[..]))
    .await;
  fake.send(Frame::empty(Kind::End, id)).await;
  let mut call = calls.recv().await.unwrap();
  assert_eq!((call.socket.as_str(), call.size), ("/s.sock", Some(19)));
  assert_eq!(
    &call.read_request().await.unwrap()[..],
    b"{\"op\":\"list_tools\"}"
  );
  // Over one window: the reply waits for credit, and is not sent in one go.
  let reply = Bytes::from(vec![b'x'; WINDOW as usize + 44 * 1024]);
  assert!(!call.reply_now(&reply));
  let answer = tokio::spawn(call.reply(reply.clone()));
  let mut got = Vec::new();
  loop {
    let f = fake.recv().await.unwrap();
    match f.kind {
      Kind::Data => {
        got.extend_from_slice(&f.payload);
        if got.len() == WINDOW as usize {
          fake.send(Frame::credit(id, WINDOW)).await;
        }
      }
      Kind::Result => break,
      other => panic!("{other:?}"),
    }
  }
  assert_eq!(got, reply);
  answer.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_small_code_mode_reply_goes_at_once_with_its_answer() {
  let (c, mut fake) = pair().await;
  let mut calls = c.code_mode_calls();
  let id = AGENT_STREAM | 1;
  let req = AgentRequest::CodeModeCall {
    socket: "/s.sock".into(),
    size: Some(2),
  };
  fake.send(Frame::json(Kind::Open, id, &req)).await;
  fake.send(Frame::new(Kind::Data, id, &b"{}"[..])).await;
  fake.send(Frame::empty(Kind::End, id)).await;
  let mut call = calls.recv().await.unwrap();
  assert_eq!(&call.read_request().await.unwrap()[..], b"{}");
  assert!(call.reply_now(&Bytes::from_static(b"{\"ok\":true}")));
  let data = fake.recv_skip_credit().await.unwrap();
  assert_eq!((data.kind, data.id), (Kind::Data, id));
  assert_eq!(&data.payload[..], b"{\"ok\":true}");
  let done = fake.recv_skip_credit().await.unwrap();
  assert_eq!((done.kind, done.id), (Kind::Result, id));
  let o: Outcome<()> = serde_json::from_slice(&done.payload).unwrap();
  assert!(matches!(o, Outcome::Ok(())));
}

#[tokio::test]
async fn a_dropped_exec_is_cancelled() {
  let (c, mut fake) = pair().await;
  let task = tokio::spawn({
    let c = c.clone();
    async move { c.exec(&exec_req(10)).await }
  });
  let open = fake.recv().await.unwrap();
  task.abort();
  let f = fake.recv().await.unwrap();
  assert_eq!((f.kind, f.id), (Kind::Cancel, open.id));
}

#[tokio::test]
async fn closing_cancels_each_request_in_flight_before_the_end() {
  let (c, mut fake) = pair().await;
  let task = tokio::spawn({
    let c = c.clone();
    async move { c.exec(&exec_req(10)).await }
  });
  let open = fake.recv().await.unwrap();
  c.close();
  // A stopped agent reads these only when it continues: the cancel must precede the end.
  let f = fake.recv().await.unwrap();
  assert_eq!((f.kind, f.id), (Kind::Cancel, open.id));
  assert!(fake.recv().await.is_none());
  assert!(matches!(
    task.await.unwrap(),
    Err(ClientError::StreamEnded { .. })
  ));
}

#[tokio::test]
async fn dropping_the_client_closes_the_agents_stdin() {
  let (c, mut fake) = pair().await;
  drop(c);
  assert!(fake.recv().await.is_none());
}

#[tokio::test]
async fn a_request_over_the_frame_cap_is_refused_here() {
  let (c, _fake) = pair().await;
  let mut req = exec_req(10);
  req.command = "x".repeat(MAX_PAYLOAD + 1);
  assert!(matches!(
    c.exec(&req).await,
    Err(ClientError::RequestTooLarge { .. })
  ));
}

/// The addon calls these from napi's multi-threaded runtime: every future must be `Send`.
#[tokio::test]
async fn futures_are_send() {
  fn send<T: Send>(_: T) {}
  let (c, _fake) = pair().await;
  send(c.ping());
  send(c.exec(&exec_req(10)));
  send(c.exec_with(&exec_req(10), |_| {}));
  send(c.upload(
    UploadSpec {
      path: "/f".into(),
      user: None,
      mode: 0o644,
      max_bytes: None,
      parents: true,
    },
    &b"x"[..],
  ));
  send(c.download(DownloadSpec {
    path: "/f".into(),
    user: None,
    max_bytes: 1,
  }));
  send(c.closed());
  send(c.code_mode_calls());
}

#[tokio::test]
async fn a_small_code_mode_call_is_handed_over_whole_and_a_large_one_at_once() {
  let (c, mut fake) = pair().await;
  let mut calls = c.code_mode_calls();
  let open = |id, size| {
    Frame::json(
      Kind::Open,
      id,
      &AgentRequest::CodeModeCall {
        socket: "/s.sock".into(),
        size: Some(size),
      },
    )
  };
  // Small: nothing is handed over until its end has arrived, and then all of it is there.
  let small = AGENT_STREAM | 1;
  fake.send(open(small, 4)).await;
  fake.send(Frame::new(Kind::Data, small, &b"{\"a"[..])).await;
  tokio::time::sleep(std::time::Duration::from_millis(50)).await;
  assert!(calls.try_recv().is_err(), "handed over before its end");
  fake.send(Frame::new(Kind::Data, small, &b"}"[..])).await;
  fake.send(Frame::empty(Kind::End, small)).await;
  let mut call = calls.recv().await.unwrap();
  assert_eq!(&call.take_request().unwrap().unwrap()[..], b"{\"a}");
  assert!(call.take_request().is_none(), "taken once");
  call.fail("done");
  // Large: handed over at its open, before any byte (room is made first); read under credit.
  let large = AGENT_STREAM | 2;
  let size = 100 * 1024;
  fake.send(open(large, size as u64)).await;
  let mut call = calls.recv().await.unwrap();
  assert!(call.take_request().is_none());
  let body = vec![b'x'; size];
  let read = tokio::spawn(async move { call.read_request().await.map(|b| b.len()) });
  fake.send(Frame::new(Kind::Data, large, body.clone())).await;
  fake.send(Frame::empty(Kind::End, large)).await;
  assert_eq!(read.await.unwrap().unwrap(), size);
  // A small call the agent gives up before its end is dropped quietly.
  let gone = AGENT_STREAM | 3;
  fake.send(open(gone, 10)).await;
  fake.send(Frame::empty(Kind::Cancel, gone)).await;
  tokio::time::sleep(std::time::Duration::from_millis(50)).await;
  assert!(calls.try_recv().is_err());
  assert!(!c.is_closed());
}
