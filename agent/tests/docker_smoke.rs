//! The static agent inside a real container (busybox: no bash, no Python), driven through
//! `docker exec -i`. Run by scripts/ci/agent-smoke.sh, which makes the container and sets
//! `TF_SMOKE_CONTAINER`, `TRUEFORGE_AGENT_BIN` (the agent's path in the container) and
//! `TRUEFORGE_AGENT_RUNNER` (`docker exec -i -u 0 <container>`); ignored by a plain cargo test.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use trueforge_agent_proto::client::{ClientError, ExecRequest};
use trueforge_agent_proto::msg::{
  CodeModeListenSpec, DownloadSpec, ErrorKind, LayoutDir, LayoutLink, LayoutSpec, UploadSpec,
};

fn container() -> String {
  std::env::var("TF_SMOKE_CONTAINER").expect("run through scripts/ci/agent-smoke.sh")
}

fn as_user(user: &str, command: &str) -> ExecRequest {
  let mut r = req(command);
  r.user = Some(user.into());
  r
}

fn p50(mut v: Vec<Duration>) -> Duration {
  v.sort();
  v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn smoke() {
  let _ = container();
  let a = start().await;
  let c = &a.client;
  let h = c.hello().clone();
  eprintln!(
    "hello: pid {} arch {} openat2 {} subreaper {} session_guard {} fs_ids {} cap_eff {:x}",
    h.pid, h.arch, h.openat2, h.subreaper, h.session_guard, h.fs_ids, h.cap_eff
  );
  // gVisor has no subreaper: there commands are kept in their sessions instead.
  assert!(h.subreaper || h.session_guard);

  // busybox has no bash: sh runs the command.
  assert_eq!(a.run("echo ${BASH_VERSION:-none}").await.output, "none\n");
  assert_eq!(a.run_as("nobody", "id -u").await.output, "65534\n");

  // The layout, as create makes it, with the mcp-client link.
  c.layout(LayoutSpec {
    dirs: [
      "/trueforge",
      "/trueforge/uploads",
      "/trueforge/codemode",
      "/trueforge/codemode/bin",
      "/workspace/01SMOKE",
    ]
    .iter()
    .map(|p| LayoutDir {
      path: p.to_string(),
      mode: 0o755,
      user_owned: true,
    })
    .collect(),
    user: Some("nobody".into()),
    links: vec![LayoutLink {
      path: "/trueforge/codemode/bin/mcp-client".into(),
      target: std::env::var("TRUEFORGE_AGENT_BIN").unwrap(),
    }],
    activity_file: true,
  })
  .await
  .unwrap();
  let out = a
    .run("stat -c '%U %a %h' /tmp/.trueforge-agent-activity; stat -c %U /workspace/01SMOKE")
    .await;
  assert_eq!(out.output, "root 644 1\nnobody\n");

  // Files as the sandbox user.
  let up = |path: &str, user: &str| UploadSpec {
    path: path.into(),
    user: Some(user.into()),
    mode: 0o644,
    max_bytes: None,
    parents: true,
  };
  let down = |path: &str, user: &str| DownloadSpec {
    path: path.into(),
    user: Some(user.into()),
    max_bytes: 1 << 30,
  };
  c.upload_bytes(
    up("/workspace/01SMOKE/a/b.txt", "nobody"),
    Bytes::from_static(b"hi"),
  )
  .await
  .unwrap();
  assert_eq!(
    a.run("stat -c '%U %a' /workspace/01SMOKE/a /workspace/01SMOKE/a/b.txt")
      .await
      .output,
    "nobody 755\nnobody 644\n"
  );
  a.run("echo secret > /root-only; chmod 600 /root-only; ln -s /root-only /workspace/01SMOKE/planted; ln -s /etc /workspace/01SMOKE/d_etc")
    .await;
  let err = c
    .download_bytes(down("/workspace/01SMOKE/planted", "nobody"))
    .await
    .unwrap_err();
  assert!(
    matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::PermissionDenied),
    "{err:?}"
  );
  let err = c
    .upload_bytes(
      up("/workspace/01SMOKE/d_etc/evil", "nobody"),
      Bytes::from_static(b"x"),
    )
    .await
    .unwrap_err();
  assert!(
    matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::PermissionDenied),
    "{err:?}"
  );
  // /etc/hosts is bind-mounted by the engine.
  let err = c
    .upload_bytes(up("/etc/hosts", "root"), Bytes::from_static(b"x"))
    .await
    .unwrap_err();
  assert!(
    matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::Busy),
    "{err:?}"
  );
  assert!(!c
    .download_bytes(down("/etc/hosts", "nobody"))
    .await
    .unwrap()
    .is_empty());

  // Timeouts kill every escape; verified inside the container.
  let mut r =
    req("setsid sleep 71 & (sleep 72 &); env -i /bin/sleep 73 & sh -c 'sleep 74 & exit'; sleep 60");
  r.timeout = Some(Duration::from_secs(1));
  let out = c.exec(&r).await.unwrap();
  assert!(out.timed_out);
  assert_eq!(
    a.run("ps -o args | grep -c '[s]leep 7'").await.output,
    "0\n"
  );

  // Background processes do not hold the call.
  let started = Instant::now();
  assert_eq!(a.run("sleep 30 & echo bg").await.output, "bg\n");
  assert!(started.elapsed() < Duration::from_millis(1500));

  // Code Mode: the relay socket and the static mcp-client, as the sandbox user.
  let mut calls = c.code_mode_calls();
  tokio::spawn(async move {
    while let Some(mut call) = calls.recv().await {
      let _ = call.read_request().await;
      let _ = call
        .reply(Bytes::from_static(
          br#"{"ok": true, "result": {"tools": [{"name": "t", "annotations": {"readOnlyHint": true}}]}}"#,
        ))
        .await;
    }
  });
  let socket = "/trueforge/codemode/run/smoke.sock";
  c.code_mode_listen(CodeModeListenSpec {
    socket: socket.into(),
    user: Some("nobody".into()),
  })
  .await
  .unwrap();
  let mut r = as_user("nobody", "mcp-client list-tools srv");
  r.env = vec![("TFY_CM_SOCK".into(), socket.into())];
  let out = c.exec(&r).await.unwrap();
  assert_eq!(
    out.output,
    "[{\"name\": \"t\", \"annotations\": {\"readOnlyHint\": true}}]\n"
  );
  let mut times = Vec::new();
  for _ in 0..20 {
    let t = Instant::now();
    let out = c.exec(&r).await.unwrap();
    assert_eq!(out.exit_code, 0);
    times.push(t.elapsed());
  }
  let cli = p50(times);

  // Latency over the engine's exec stream, and the agent's memory.
  let mut pings = Vec::new();
  for _ in 0..200 {
    let t = Instant::now();
    c.ping().await.unwrap();
    pings.push(t.elapsed());
  }
  let mut trues = Vec::new();
  for _ in 0..100 {
    let t = Instant::now();
    c.exec(&req("true")).await.unwrap();
    trues.push(t.elapsed());
  }
  let t = Instant::now();
  let mut tasks = Vec::new();
  for _ in 0..50 {
    let c = c.clone();
    tasks.push(tokio::spawn(
      async move { c.exec(&req("true")).await.unwrap() },
    ));
  }
  for task in tasks {
    task.await.unwrap();
  }
  let fifty = t.elapsed();
  let small = Bytes::from(vec![7u8; 1024]);
  let mut ups = Vec::new();
  let mut downs = Vec::new();
  for _ in 0..100 {
    let t = Instant::now();
    c.upload_bytes(up("/workspace/01SMOKE/small", "nobody"), small.clone())
      .await
      .unwrap();
    ups.push(t.elapsed());
    let t = Instant::now();
    c.download_bytes(down("/workspace/01SMOKE/small", "nobody"))
      .await
      .unwrap();
    downs.push(t.elapsed());
  }
  let big = Bytes::from(vec![3u8; 100 << 20]);
  let t = Instant::now();
  c.upload_bytes(up("/workspace/01SMOKE/big", "nobody"), big.clone())
    .await
    .unwrap();
  let up_rate = 100.0 / t.elapsed().as_secs_f64();
  let t = Instant::now();
  let got = c
    .download_bytes(down("/workspace/01SMOKE/big", "nobody"))
    .await
    .unwrap();
  let down_rate = 100.0 / t.elapsed().as_secs_f64();
  assert_eq!(got.len(), big.len());
  a.run("rm -f /workspace/01SMOKE/big").await;
  tokio::time::sleep(Duration::from_millis(500)).await;
  let rss = a
    .run(&format!("grep VmRSS /proc/{}/status", h.pid))
    .await
    .output;
  eprintln!("FIGURES (docker exec stream, busybox, {}):", h.arch);
  eprintln!("  ping p50 {:?}", p50(pings));
  eprintln!("  exec true p50 {:?}", p50(trues));
  eprintln!("  50 concurrent true {:?}", fifty);
  eprintln!(
    "  1 KiB upload p50 {:?}, download p50 {:?}",
    p50(ups),
    p50(downs)
  );
  eprintln!("  100 MiB upload {up_rate:.0} MiB/s, download {down_rate:.0} MiB/s");
  eprintln!("  mcp-client list-tools (an exec running it) p50 {cli:?}");
  eprintln!("  agent {}", rss.trim());
}

/// The container's pids cgroup as the host sees it (cgroupfs v1 or v2 layouts).
fn pids_files() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
  let out = std::process::Command::new("docker")
    .args(["inspect", "-f", "{{.Id}}", &container()])
    .output()
    .ok()?;
  let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
  for dir in [
    format!("/sys/fs/cgroup/pids/docker/{id}"),
    format!("/sys/fs/cgroup/docker/{id}"),
    format!("/sys/fs/cgroup/system.slice/docker-{id}.scope"),
  ] {
    let d = std::path::PathBuf::from(dir);
    if d.join("pids.current").exists() {
      return Some((d.join("pids.current"), d.join("pids.max")));
    }
  }
  None
}

/// Waits until at most one pid of the container is free (a command needs two: its shepherd and
/// itself), or a few seconds where the host cannot tell.
async fn until_full() {
  let Some((current, max)) = pids_files() else {
    tokio::time::sleep(Duration::from_secs(3)).await;
    return;
  };
  let read = |p: &std::path::Path| {
    std::fs::read_to_string(p)
      .unwrap_or_default()
      .trim()
      .parse::<u64>()
      .unwrap_or(0)
  };
  for _ in 0..200 {
    if read(&current) + 1 >= read(&max) {
      return;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  panic!(
    "the bomb never filled the pids cgroup ({} of {})",
    read(&current),
    read(&max)
  );
}

/// A fork bomb that outlives its command, with the container's pids limit: the next command
/// still runs, and says the workload was killed; the container keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn fork_bomb_recovery() {
  let a = start().await;
  for user in ["nobody", "root"] {
    let out = a
      .run_as(
        user,
        "(while :; do sleep 300 & done) >/dev/null 2>&1 & echo started",
      )
      .await;
    assert_eq!(out.output, "started\n");
    until_full().await;
    let out = a.run_as(user, "echo after").await;
    assert_eq!(out.output, "after\n", "{user}");
    let note = out.recovered.unwrap_or_default();
    eprintln!("{user}: {note}");
    assert!(note.contains("out of processes"), "{user}");
    assert_eq!(
      a.run("ps -o args | grep -c '[s]leep 300'").await.output,
      "0\n"
    );
  }
  // The container's main process survived.
  let out = a.run("ps -o args | grep -c '^sleep 3600'").await;
  assert_eq!(out.output, "1\n");
}
