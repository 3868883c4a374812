//! The Code Mode relay in the agent, and the static `mcp-client` against the Python CLI it
//! replaces (`codemode/mcp_client.py`): both run against the same relay and host, and must
//! print the same bytes and exit with the same codes.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use trueforge_agent_proto::client::AgentClient;
use trueforge_agent_proto::msg::CodeModeListenSpec;

/// Serves Code Mode calls with a small fake MCP host: `list_tools` lists fixed tools;
/// `call_tool` answers by tool name (`echo` returns the raw request it got).
fn serve_fake_host(client: &AgentClient) {
  let mut calls = client.code_mode_calls();
  tokio::spawn(async move {
    while let Some(mut call) = calls.recv().await {
      let Ok(request) = call.read_request().await else {
        continue;
      };
      assert_eq!(call.size, Some(request.len() as u64));
      let req: serde_json::Value = serde_json::from_slice(&request).unwrap_or_default();
      let reply = fake_reply(&req, &request);
      if req["tool"] == "fail_in_transit" {
        call.fail("the MCP gateway is unreachable");
        continue;
      }
      tokio::spawn(async move {
        let _ = call.reply(Bytes::from(reply)).await;
      });
    }
  });
}

fn fake_reply(req: &serde_json::Value, raw: &[u8]) -> String {
  if req["op"] == "list_tools" {
    return r#"{"ok": true, "result": {"tools": [
      {"name": "read", "annotations": {"readOnlyHint": true}},
      {"name": "rm", "annotations": {"destructiveHint": true}},
      {"name": "write", "annotations": {"readOnlyHint": false}},
      {"name": "plain"}, {"name": "err"}, {"name": "text"}, {"name": "numbers"},
      {"name": "echo"}, {"name": "caller_error"}, {"name": "fail_in_transit"}, {"name": "empty"}
    ]}}"#
      .to_string();
  }
  let tool = req["tool"].as_str().unwrap_or("");
  let result = match tool {
    "read" => r#"{"content": [{"type": "text", "text": "{\"b\": 1, \"a\": [1.5, \"\u00e9\"]}"}]}"#.to_string(),
    "plain" | "rm" | "write" => r#"{"structuredContent": {"z": null, "a": true}, "content": []}"#.to_string(),
    "err" => r#"{"isError": true, "content": [{"type": "text", "text": "boom"}, {"type": "image"}, {"type": "text", "text": "again"}]}"#.to_string(),
    "text" => r#"{"content": [{"type": "text", "text": "not json"}]}"#.to_string(),
    "numbers" => r#"{"structuredContent": {"f": 1e16, "g": 0.1, "h": 1E-7, "i": 12345678901234567890, "s": "\u00e9\ud83d\ude00\u0001\t", "k": -0, "n": [1.0, 2.50]}}"#.to_string(),
    "echo" => serde_json::json!({"structuredContent": String::from_utf8_lossy(raw)}).to_string(),
    "empty" => r#"{"content": []}"#.to_string(),
    "caller_error" => return r#"{"ok": false, "error": {"why": "bad 'args'"}, "source": "caller"}"#.to_string(),
    _ => return r#"{"ok": false, "error": "no such tool"}"#.to_string(),
  };
  format!(r#"{{"ok": true, "result": {result}}}"#)
}

async fn listening(a: &Agent, t: &TempDir, user: Option<&str>) -> String {
  let socket = t.path("run/relay.sock");
  a.client
    .code_mode_listen(CodeModeListenSpec {
      socket: socket.clone(),
      user: user.map(str::to_string),
    })
    .await
    .unwrap();
  socket
}

fn exchange(socket: &str, request: &[u8]) -> Vec<u8> {
  let mut s = UnixStream::connect(socket).unwrap();
  s.write_all(request).unwrap();
  s.shutdown(std::net::Shutdown::Write).unwrap();
  let mut out = Vec::new();
  s.read_to_end(&mut out).unwrap();
  out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_is_owner_only_and_carries_requests() {
  let a = start().await;
  let t = TempDir::new("cm");
  std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o777)).unwrap();
  serve_fake_host(&a.client);
  let socket = listening(&a, &t, Some("nobody")).await;
  let dir = std::fs::metadata(t.path("run")).unwrap();
  assert_eq!((dir.uid(), dir.mode() & 0o7777), (65534, 0o700));
  let sock = std::fs::symlink_metadata(&socket).unwrap();
  assert_eq!((sock.uid(), sock.mode() & 0o7777), (65534, 0o600));
  let s = socket.clone();
  let reply = tokio::task::spawn_blocking(move || {
    exchange(
      &s,
      br#"{"op": "call_tool", "server": "s", "tool": "plain", "arguments": {}}"#,
    )
  })
  .await
  .unwrap();
  assert_eq!(
    String::from_utf8(reply).unwrap(),
    r#"{"ok": true, "result": {"structuredContent": {"z": null, "a": true}, "content": []}}"#
  );
  // Many clients at once (more than the agent carries at a time).
  let mut tasks = Vec::new();
  for _ in 0..40 {
    let s = socket.clone();
    tasks.push(tokio::task::spawn_blocking(move || {
      exchange(&s, br#"{"op": "list_tools", "server": "s"}"#)
    }));
  }
  for t in tasks {
    assert!(t.await.unwrap().starts_with(br#"{"ok": true"#));
  }
  // A failure in transit reaches the client as a transport error.
  let s = socket.clone();
  let reply = tokio::task::spawn_blocking(move || {
    exchange(&s, br#"{"op": "call_tool", "tool": "fail_in_transit"}"#)
  })
  .await
  .unwrap();
  assert_eq!(
    String::from_utf8(reply).unwrap(),
    r#"{"ok": false, "error": "the MCP gateway is unreachable", "source": "transport"}"#
  );
  // Over the 64 MiB limit: the relay's own answer, as relay.py words it.
  let s = socket.clone();
  let reply = tokio::task::spawn_blocking(move || exchange(&s, &vec![b' '; (64 << 20) + 1]))
    .await
    .unwrap();
  assert_eq!(
    String::from_utf8(reply).unwrap(),
    r#"{"ok": false, "error": "Code Mode request of 67108865 bytes exceeds the limit of 67108864 bytes", "source": "caller"}"#
  );
  a.client.code_mode_close(&socket).await.unwrap();
  assert!(std::fs::symlink_metadata(&socket).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_host_handler_fail_as_transport_errors() {
  let a = start().await;
  let t = TempDir::new("cm2");
  let socket = listening(&a, &t, None).await;
  let reply = tokio::task::spawn_blocking(move || exchange(&socket, b"{}"))
    .await
    .unwrap();
  assert_eq!(
    String::from_utf8(reply).unwrap(),
    r#"{"ok": false, "error": "Code Mode is not served by this host", "source": "transport"}"#
  );
}

struct Run {
  code: i32,
  stdout: String,
  stderr: String,
}

async fn run_cli(program: &[String], args: &[&str], env: &[(&str, &str)]) -> Run {
  let mut cmd = tokio::process::Command::new(&program[0]);
  cmd.args(&program[1..]).args(args).env_clear();
  cmd.env("PATH", "/usr/bin:/bin");
  for (k, v) in env {
    cmd.env(k, v);
  }
  let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
    .await
    .unwrap()
    .unwrap();
  Run {
    code: out.status.code().unwrap_or(-1),
    stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
  }
}

fn b64(s: &str) -> String {
  const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  let b = s.as_bytes();
  let mut out = String::new();
  for c in b.chunks(3) {
    let n =
      (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
    for i in 0..4 {
      if i <= c.len() {
        out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
      } else {
        out.push('=');
      }
    }
  }
  out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_static_cli_prints_what_the_python_cli_prints() {
  if std::process::Command::new("python3")
    .arg("-V")
    .output()
    .is_err()
  {
    eprintln!("skipped: no python3 to compare with");
    return;
  }
  let a = start().await;
  let t = TempDir::new("cli");
  serve_fake_host(&a.client);
  let socket = listening(&a, &t, None).await;
  // The agent binary under the name mcp-client, as the sandbox's bin dir links it.
  let link = t.path("mcp-client");
  std::os::unix::fs::symlink(agent_bin(), &link).unwrap();
  let ours = match std::env::var("TRUEFORGE_AGENT_RUNNER") {
    Ok(runner) if !runner.is_empty() => vec![runner, link],
    _ => vec![link],
  };
  let python = vec![
    "python3".to_string(),
    format!("{}/../codemode/mcp_client.py", env!("CARGO_MANIFEST_DIR")),
  ];
  let servers = b64(r#"{"srv": {"allowed_tools": []}, "narrow": {"allowed_tools": ["read"]}}"#);
  let base: Vec<(&str, &str)> = vec![
    ("TFY_CM_SOCK", &socket),
    ("TFY_MCP_SERVERS", &servers),
    ("TFY_TRACEPARENT", "00-abc-def-01"),
  ];
  let with = |extra: &[(&'static str, &'static str)]| {
    let mut e = base.clone();
    for (k, v) in extra {
      e.retain(|(ek, _)| ek != k);
      e.push((k, v));
    }
    e
  };
  type Env<'a> = Vec<(&'a str, &'a str)>;
  let cases: Vec<(Vec<&str>, Env)> = vec![
    (vec!["call-tool", "srv", "read", r#"{"x": 1}"#], with(&[])),
    (vec!["call-tool", "srv", "read"], with(&[])),
    (vec!["call-tool", "srv", "rm", "{}"], with(&[])),
    (vec!["call-tool", "srv", "write", "{}"], with(&[])),
    (
      vec!["call-tool", "srv", "write", "{}"],
      with(&[("TFY_ENABLE_AGENT_APPROVALS", " False ")]),
    ),
    (vec!["call-tool", "srv", "missing", "{}"], with(&[])),
    (vec!["call-tool", "other", "read", "{}"], with(&[])),
    (vec!["call-tool", "narrow", "plain", "{}"], with(&[])),
    (vec!["call-tool", "narrow", "read", "{}"], with(&[])),
    (vec!["call-tool", "srv", "plain", "{}"], with(&[])),
    (vec!["call-tool", "srv", "err", "{}"], with(&[])),
    (vec!["call-tool", "srv", "text", "{}"], with(&[])),
    (vec!["call-tool", "srv", "empty", "{}"], with(&[])),
    (vec!["call-tool", "srv", "numbers", "{}"], with(&[])),
    (
      vec![
        "call-tool",
        "srv",
        "echo",
        r#"{"é": [1, 2.5, "x\ny"], "n": null}"#,
      ],
      with(&[]),
    ),
    (
      vec!["call-tool", "srv", "echo", "{}"],
      with(&[("TFY_TRACESTATE", "k=v")]),
    ),
    (vec!["call-tool", "srv", "caller_error", "{}"], with(&[])),
    (vec!["call-tool", "srv", "fail_in_transit", "{}"], with(&[])),
    (vec!["list-tools", "srv"], with(&[])),
    (vec!["list-tools", "nowhere"], with(&[])),
    (
      vec!["call-tool", "srv", "read", "{}"],
      with(&[("TFY_CM_SOCK", "")]),
    ),
    (
      vec!["call-tool", "srv", "read", "{}"],
      with(&[("TFY_CM_SOCK", "/nonexistent/relay.sock")]),
    ),
    (
      vec!["call-tool", "srv", "read", "{}"],
      with(&[("TFY_MCP_SERVERS", "e30")]),
    ),
    (
      vec!["call-tool", "srv", "read", "{}"],
      with(&[("TFY_MCP_SERVERS", "bm90IGpzb24=")]),
    ),
    (
      vec!["call-tool", "srv", "read", "{}"],
      with(&[("TFY_MCP_SERVERS", "WzFd")]),
    ),
    (vec![], with(&[])),
    (vec!["call-tool", "srv"], with(&[])),
    (vec!["call-tool", "srv", "t", "[1]"], with(&[])),
    (vec!["call-tool", "srv", "t", "{bad"], with(&[])),
    (vec!["call-tool", "srv", "t", "{}", "extra"], with(&[])),
    (vec!["list-tools", "srv", "--verbose"], with(&[])),
    (vec!["launch", "srv"], with(&[])),
    (vec!["-h"], with(&[])),
    (vec!["call-tool", "-h"], with(&[])),
    (vec!["list-tools", "--help"], with(&[])),
  ];
  let mut mismatches = Vec::new();
  for (args, env) in &cases {
    let theirs = run_cli(&python, args, env).await;
    let mine = run_cli(&ours, args, env).await;
    if (mine.code, &mine.stdout, &mine.stderr) != (theirs.code, &theirs.stdout, &theirs.stderr) {
      mismatches.push(format!(
        "{args:?}\n  python: {} {:?} {:?}\n  static: {} {:?} {:?}",
        theirs.code, theirs.stdout, theirs.stderr, mine.code, mine.stdout, mine.stderr
      ));
    }
  }
  assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
