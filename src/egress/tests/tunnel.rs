//! The three protocols, allowed and refused.

use std::net::Ipv6Addr;

use serde_json::json;
use tokio::sync::oneshot;

use super::*;

#[tokio::test]
async fn a_connect_tunnel_is_byte_exact_both_ways_with_half_close() {
  let port = reversing_origin().await;
  let r = rig(to_origin(), Limits::default());
  let (c, h, head) = r.connect(&format!("origin.test:{port}")).await;
  assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
  let sent: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 + i / 251) as u8).collect();
  let (mut rd, mut wr) = tokio::io::split(c);
  let data = sent.clone();
  let writer = tokio::spawn(async move {
    wr.write_all(&data).await.unwrap();
    // The origin answers only once it sees this EOF.
    wr.shutdown().await.unwrap();
  });
  let got = read_all(&mut rd).await;
  writer.await.unwrap();
  let mut want = sent.clone();
  want.reverse();
  assert!(
    got == want,
    "{} bytes back, {} expected",
    got.len(),
    want.len()
  );
  let Served::Allowed(carried) = h.await.unwrap() else {
    panic!("not allowed")
  };
  assert_eq!(
    (carried.bytes_out, carried.bytes_in),
    (1_000_003, 1_000_003)
  );
  assert_eq!(carried.broken, None);
  assert_eq!(carried.peer, format!("127.0.0.1:{port}").parse().unwrap());
  let s = r.egress.stats();
  assert_eq!((s.allowed, s.refused, s.failed, s.open), (1, 0, 0, 0));
  assert_eq!((s.bytes_out, s.bytes_in), (1_000_003, 1_000_003));
}

#[tokio::test]
async fn bytes_sent_with_the_connect_head_go_first() {
  let port = echo_origin().await;
  let r = rig(to_origin(), Limits::default());
  let (mut c, h) = r.start();
  let req = format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\nearly");
  c.write_all(req.as_bytes()).await.unwrap();
  assert!(read_head(&mut c).await.starts_with("HTTP/1.1 200"));
  c.write_all(b" late").await.unwrap();
  c.shutdown().await.unwrap();
  assert_eq!(read_all(&mut c).await, b"early late");
  assert!(matches!(h.await.unwrap(), Served::Allowed(_)));
}

#[tokio::test]
async fn a_plain_http_request_reaches_the_origin_in_origin_form() {
  let (tx, rx) = oneshot::channel();
  let tx = Arc::new(Mutex::new(Some(tx)));
  let port = origin(move |mut s| {
    let tx = tx.clone();
    async move {
      let head = read_head(&mut s).await;
      let mut body = [0u8; 4];
      s.read_exact(&mut body).await.unwrap();
      tx.lock()
        .unwrap()
        .take()
        .unwrap()
        .send((head, body))
        .unwrap();
      let reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
      s.write_all(reply.as_bytes()).await.unwrap();
    }
  })
  .await;
  let r = rig(to_origin(), Limits::default());
  let (mut c, h) = r.start();
  let req = format!(
    "POST http://origin.test:{port}/up?x=1 HTTP/1.1\r\nHost: origin.test:{port}\r\n\
     Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic dTpw\r\nUser-Agent: t/1\r\n\
     Content-Length: 4\r\n\r\nbody"
  );
  c.write_all(req.as_bytes()).await.unwrap();
  let (head, body) = rx.await.unwrap();
  assert_eq!(
    head,
    format!(
      "POST /up?x=1 HTTP/1.1\r\nHost: origin.test:{port}\r\nUser-Agent: t/1\r\n\
       Content-Length: 4\r\nConnection: close\r\n\r\n"
    )
  );
  assert_eq!(&body, b"body");
  c.shutdown().await.unwrap();
  let reply = String::from_utf8(read_all(&mut c).await).unwrap();
  assert!(reply.starts_with("HTTP/1.1 200 OK\r\n") && reply.ends_with("\r\n\r\nok"));
  assert!(matches!(h.await.unwrap(), Served::Allowed(_)));
}

#[tokio::test]
async fn an_http_refusal_names_the_host_and_the_rule() {
  let r = rig(
    json!({"allow": ["pkgs.example", "*.pkgs.example"], "deny": ["evil.pkgs.example"]}),
    Limits::default(),
  );
  let (mut c, h) = r.start();
  c.write_all(b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n")
    .await
    .unwrap();
  let body = "egress to evil.example:443 refused by the sandbox's egress policy: no allow rule \
              matches (allowed: pkgs.example, *.pkgs.example)\n";
  assert_eq!(
    String::from_utf8(read_all(&mut c).await).unwrap(),
    format!(
      "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
       Connection: close\r\n\r\n{body}",
      body.len()
    )
  );
  assert!(matches!(h.await.unwrap(), Served::Refused(_)));
  let (mut c, _) = r.start();
  c.write_all(b"GET http://evil.pkgs.example/x HTTP/1.1\r\n\r\n")
    .await
    .unwrap();
  let reply = String::from_utf8(read_all(&mut c).await).unwrap();
  assert!(reply.ends_with(
    "egress to evil.pkgs.example:80 refused by the sandbox's egress policy: denied by rule \
     'evil.pkgs.example'\n"
  ));
  let log = r.refusals.lock().unwrap();
  assert_eq!(log.len(), 2);
  assert_eq!((log[0].host.as_str(), log[0].port), ("evil.example", 443));
  assert_eq!(r.egress.stats().refused, 2);
}

#[tokio::test]
async fn the_default_policy_keeps_loopback_and_metadata_out() {
  let r = rig_with(Policy::default_open_web(), Limits::default());
  let port = echo_origin().await;
  let (_, _, head) = r.connect(&format!("localhost:{port}")).await;
  assert!(head.starts_with("HTTP/1.1 403"), "{head}");
  let line = r.refusals.lock().unwrap()[0].reason.clone();
  assert!(
    line.starts_with("localhost resolves only to") && line.contains("a loopback address"),
    "{line}"
  );
  assert!(line.ends_with("; allow it explicitly with an IP rule if you mean it"));
  for target in [
    format!("127.0.0.1:{port}"),
    "169.254.169.254:80".to_string(),
  ] {
    let (_, h, head) = r.connect(&target).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{target}: {head}");
    let Served::Refused(refusal) = h.await.unwrap() else {
      panic!()
    };
    assert!(refusal
      .reason
      .starts_with("an IP address passes only by an IP or CIDR allow rule"));
  }
  // A name the operator maps to loopback is named explicitly.
  let r = rig(
    json!({"allow": ["*"], "hosts": {"origin.test": "127.0.0.1"}}),
    Limits::default(),
  );
  let (_, _, head) = r.connect(&format!("origin.test:{port}")).await;
  assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test]
async fn a_name_connects_to_the_addresses_that_pass() {
  let port = echo_origin().await;
  let r = rig(
    json!({"allow": ["localhost", "127.0.0.1"]}),
    Limits::default(),
  );
  let (mut c, h, head) = r.connect(&format!("localhost:{port}")).await;
  assert!(head.starts_with("HTTP/1.1 200"), "{head}");
  c.write_all(b"x").await.unwrap();
  c.shutdown().await.unwrap();
  assert_eq!(read_all(&mut c).await, b"x");
  let Served::Allowed(carried) = h.await.unwrap() else {
    panic!()
  };
  assert_eq!(carried.peer.ip().to_string(), "127.0.0.1");
  // The bare IP rule names the address; a wide one does not.
  let r = rig(
    json!({"allow": ["localhost", "0.0.0.0/0"]}),
    Limits::default(),
  );
  let (_, _, head) = r.connect(&format!("localhost:{port}")).await;
  assert!(head.starts_with("HTTP/1.1 403"), "{head}");
}

async fn socks_connect(
  r: &Rig,
  atyp_addr: &[u8],
  port: u16,
) -> (DuplexStream, JoinHandle<Served>, Vec<u8>) {
  let (mut c, h) = r.start();
  c.write_all(&[5, 1, 0]).await.unwrap();
  let mut greet = [0u8; 2];
  c.read_exact(&mut greet).await.unwrap();
  assert_eq!(greet, [5, 0]);
  let mut req = vec![5, 1, 0];
  req.extend_from_slice(atyp_addr);
  req.extend_from_slice(&port.to_be_bytes());
  c.write_all(&req).await.unwrap();
  let mut head = [0u8; 4];
  c.read_exact(&mut head).await.unwrap();
  let rest = if head[3] == 4 { 18 } else { 6 };
  let mut tail = vec![0u8; rest];
  c.read_exact(&mut tail).await.unwrap();
  (c, h, [&head[..], &tail].concat())
}

fn domain(n: &str) -> Vec<u8> {
  [&[3, n.len() as u8][..], n.as_bytes()].concat()
}

async fn round_trip(c: &mut DuplexStream) {
  c.write_all(b"ping").await.unwrap();
  c.shutdown().await.unwrap();
  assert_eq!(read_all(c).await, b"ping");
}

#[tokio::test]
async fn socks5_by_domain_and_ipv4() {
  let port = echo_origin().await;
  let r = rig(
    json!({"allow": ["origin.test", "127.0.0.1"], "hosts": {"origin.test": "127.0.0.1"}}),
    Limits::default(),
  );
  let (mut c, h, reply) = socks_connect(&r, &domain("origin.test"), port).await;
  assert_eq!(&reply[..4], &[5, 0, 0, 1]);
  assert_eq!(
    &reply[4..8],
    &[127, 0, 0, 1],
    "the host's end of the connection"
  );
  round_trip(&mut c).await;
  assert!(matches!(h.await.unwrap(), Served::Allowed(_)));
  let (mut c, _, reply) = socks_connect(&r, &[1, 127, 0, 0, 1], port).await;
  assert_eq!(reply[1], 0);
  round_trip(&mut c).await;
  let (_, h, reply) = socks_connect(&r, &domain("evil.test"), port).await;
  assert_eq!(
    reply,
    [5, 2, 0, 1, 0, 0, 0, 0, 0, 0],
    "connection not allowed by ruleset"
  );
  assert!(matches!(h.await.unwrap(), Served::Refused(_)));
  let (_, _, reply) = socks_connect(&r, &[1, 127, 0, 0, 2], port).await;
  assert_eq!(reply[1], 2);
  let (_, h, reply) = socks_connect(&r, &[1, 127, 0, 0, 1], closed_port().await).await;
  assert_eq!(reply[1], 5, "connection refused");
  assert!(matches!(h.await.unwrap(), Served::Failed(m) if m.contains("refused the connection")));
  let s = r.egress.stats();
  assert_eq!((s.allowed, s.refused, s.failed), (2, 2, 1));
}

#[tokio::test]
async fn socks5_by_ipv6_where_the_host_has_it() {
  let Ok(l) = TcpListener::bind("[::1]:0").await else {
    eprintln!("no ::1 here; skipped");
    return;
  };
  let port = l.local_addr().unwrap().port();
  tokio::spawn(async move {
    while let Ok((s, _)) = l.accept().await {
      tokio::spawn(async move {
        let (mut r, mut w) = s.into_split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
      });
    }
  });
  let r = rig(json!({"allow": ["[::1]"]}), Limits::default());
  let mut v6 = vec![4];
  v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
  let (mut c, _, reply) = socks_connect(&r, &v6, port).await;
  assert_eq!(&reply[..4], &[5, 0, 0, 4]);
  round_trip(&mut c).await;
  let r = rig_with(Policy::default_open_web(), Limits::default());
  let (_, _, reply) = socks_connect(&r, &v6, port).await;
  assert_eq!(reply[1], 2);
}

#[tokio::test]
async fn what_the_proxy_does_not_speak() {
  let r = rig(to_origin(), Limits::default());
  let (mut c, h) = r.start();
  c.write_all(&[4, 1, 0, 80, 127, 0, 0, 1, 0]).await.unwrap();
  assert_eq!(read_all(&mut c).await, [0, 0x5b, 0, 0, 0, 0, 0, 0]);
  assert!(matches!(h.await.unwrap(), Served::Failed(m) if m.contains("SOCKS4")));
  let (mut c, _) = r.start();
  c.write_all(b"GET /index.html HTTP/1.1\r\nHost: origin.test\r\n\r\n")
    .await
    .unwrap();
  let reply = String::from_utf8(read_all(&mut c).await).unwrap();
  assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");
  assert!(reply.contains("this is the sandbox's egress proxy"));
  let (mut c, _) = r.start();
  let big = format!(
    "GET http://origin.test/ HTTP/1.1\r\nX: {}\r\n",
    "a".repeat(70_000)
  );
  let _ = c.write_all(big.as_bytes()).await;
  let reply = String::from_utf8(read_all(&mut c).await).unwrap();
  assert!(reply.starts_with("HTTP/1.1 431 "), "{reply}");
  let (mut c, _) = r.start();
  c.write_all(&[5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80])
    .await
    .unwrap();
  assert_eq!(read_all(&mut c).await, [5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0]);
  assert_eq!(r.egress.stats().failed, 4);
}

#[tokio::test]
async fn a_refused_connect_is_a_502() {
  let r = rig(to_origin(), Limits::default());
  let port = closed_port().await;
  let (_, h, head) = r.connect(&format!("origin.test:{port}")).await;
  assert!(head.starts_with("HTTP/1.1 502 Bad Gateway"), "{head}");
  let Served::Failed(m) = h.await.unwrap() else {
    panic!()
  };
  assert_eq!(
    m,
    format!("origin.test:{port} (127.0.0.1) refused the connection")
  );
}
