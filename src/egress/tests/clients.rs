//! Real clients through the proxy, set up as a sandbox's commands are (`HTTP_PROXY`,
//! `ALL_PROXY=socks5h://`), each skipped where it is not installed. The proxy listens on a
//! loopback port here, standing in for the agent's 127.0.0.1:3128; `origin.test` is mapped to
//! loopback by the policy, so the clients never resolve it.

use tokio::process::Command;
use tokio::time::timeout;

use super::*;

/// An HTTP/1.1 origin answering every request with `hello` and closing.
async fn hello_origin() -> u16 {
  origin(|mut s| async move {
    read_head(&mut s).await;
    let reply = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    let _ = s.write_all(reply.as_bytes()).await;
  })
  .await
}

/// The proxy on a loopback port.
async fn listening(r: &Rig) -> u16 {
  let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
  let port = l.local_addr().unwrap().port();
  let e = r.egress.clone();
  tokio::spawn(async move {
    while let Ok((s, _)) = l.accept().await {
      let e = e.clone();
      tokio::spawn(async move { e.serve(s).await });
    }
  });
  port
}

/// Runs a client with the sandbox's proxy settings; `None` where it is not installed.
async fn run(proxy: u16, argv: &[&str]) -> Option<(bool, String)> {
  let http = format!("http://127.0.0.1:{proxy}");
  let socks = format!("socks5h://127.0.0.1:{proxy}");
  let mut cmd = Command::new(argv[0]);
  cmd.args(&argv[1..]);
  for (k, v) in [
    ("HTTP_PROXY", &http),
    ("HTTPS_PROXY", &http),
    ("ALL_PROXY", &socks),
  ] {
    cmd.env(k, v).env(k.to_ascii_lowercase(), v);
  }
  cmd.env_remove("NO_PROXY").env_remove("no_proxy");
  let out = timeout(sec(20_000), cmd.output()).await.ok()?.ok()?;
  let text =
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
  Some((out.status.success(), text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_wget_and_python_work_unchanged() {
  let o = hello_origin().await;
  let r = rig(to_origin(), Limits::default());
  let p = listening(&r).await;
  let url = format!("http://origin.test:{o}/simple/x/");
  let py_urllib =
    format!("import urllib.request;print(urllib.request.urlopen('{url}').read().decode())");
  let py_requests = format!("import requests;print(requests.get('{url}').text)");
  let socks = format!("socks5h://127.0.0.1:{p}");
  let clients: [(&str, Vec<&str>); 6] = [
    ("curl, absolute-form", vec!["curl", "-sS", &url]),
    ("curl, CONNECT", vec!["curl", "-sS", "-p", &url]),
    (
      "curl, socks5h",
      vec!["curl", "-sS", "--proxy", &socks, &url],
    ),
    ("wget", vec!["wget", "-q", "-O", "-", &url]),
    ("python urllib", vec!["python3", "-c", &py_urllib]),
    ("python requests", vec!["python3", "-c", &py_requests]),
  ];
  let mut ran = 0;
  for (what, argv) in clients {
    let Some((ok, text)) = run(p, &argv).await else {
      eprintln!("{what}: not installed, skipped");
      continue;
    };
    if text.contains("No module named") {
      eprintln!("{what}: not installed, skipped");
      continue;
    }
    assert!(ok && text.trim() == "hello", "{what}: {text}");
    ran += 1;
  }
  eprintln!("{ran} clients ran");
  // A refusal reads as such in curl.
  if let Some((ok, text)) = run(p, &["curl", "-sS", "http://evil.test/"]).await {
    assert!(
      !ok || text.contains("refused by the sandbox's egress policy"),
      "{text}"
    );
    assert!(text.contains("egress to evil.test:80 refused"), "{text}");
  }
}
