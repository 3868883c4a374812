//! Figures for the agent over plain pipes (the floor under any engine stream):
//! `cargo test --release -p trueforge-agent --test bench -- --ignored --nocapture`.
//! With `TRUEFORGE_AGENT_RUNNER=docker exec -i -u 0 <container>` they are taken through the
//! engine's exec stream instead (scripts/ci/agent-smoke.sh prints those too).

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use trueforge_agent_proto::msg::{DownloadSpec, UploadSpec};

fn p50(mut v: Vec<Duration>) -> Duration {
  v.sort();
  v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn figures() {
  let a = start().await;
  let c = &a.client;
  let t = TempDir::new("bench");
  let path = |n: &str| t.path(n);
  let up = |p: String| UploadSpec {
    path: p,
    user: None,
    mode: 0o644,
    max_bytes: None,
    parents: true,
  };
  let down = |p: String| DownloadSpec {
    path: p,
    user: None,
    max_bytes: 1 << 30,
  };
  for _ in 0..50 {
    c.ping().await.unwrap();
  }
  // 1 GiB of output into a 10 MiB cap, first (before big transfers warm the allocator): the
  // host's memory grows by about the cap.
  let own_rss = || {
    std::fs::read_to_string("/proc/self/status")
      .unwrap_or_default()
      .lines()
      .find_map(|l| l.strip_prefix("VmRSS:"))
      .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
      .unwrap_or(0)
  };
  let before = own_rss();
  let mut r = req("head -c 1073741824 /dev/zero");
  r.max_output = 10 << 20;
  let s = Instant::now();
  let out = c.exec(&r).await.unwrap();
  let gib = s.elapsed();
  assert_eq!(out.omitted, (1 << 30) - (10 << 20));
  let growth = own_rss().saturating_sub(before);
  drop(out);
  let mut pings = Vec::new();
  for _ in 0..2000 {
    let s = Instant::now();
    c.ping().await.unwrap();
    pings.push(s.elapsed());
  }
  let mut trues = Vec::new();
  for _ in 0..300 {
    let s = Instant::now();
    let out = c.exec(&req("true")).await.unwrap();
    assert_eq!(out.exit_code, 0);
    trues.push(s.elapsed());
  }
  let mut walls = Vec::new();
  for _ in 0..5 {
    let s = Instant::now();
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
    walls.push(s.elapsed());
  }
  let small = Bytes::from(vec![7u8; 1024]);
  let (mut ups, mut downs) = (Vec::new(), Vec::new());
  for _ in 0..300 {
    let s = Instant::now();
    c.upload_bytes(up(path("small")), small.clone())
      .await
      .unwrap();
    ups.push(s.elapsed());
    let s = Instant::now();
    c.download_bytes(down(path("small"))).await.unwrap();
    downs.push(s.elapsed());
  }
  let big = Bytes::from(vec![3u8; 100 << 20]);
  let mut up_rates = Vec::new();
  let mut down_rates = Vec::new();
  for _ in 0..3 {
    let s = Instant::now();
    c.upload_bytes(up(path("big")), big.clone()).await.unwrap();
    up_rates.push(100.0 / s.elapsed().as_secs_f64());
    let s = Instant::now();
    let mut d = c.download(down(path("big"))).await.unwrap();
    let mut n = 0;
    while let Some(chunk) = d.chunk().await.unwrap() {
      n += chunk.len();
    }
    assert_eq!(n, big.len());
    down_rates.push(100.0 / s.elapsed().as_secs_f64());
  }
  let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
  tokio::time::sleep(Duration::from_millis(300)).await;
  let rss = std::fs::read_to_string(format!("/proc/{}/status", a.pid))
    .unwrap_or_default()
    .lines()
    .find(|l| l.starts_with("VmRSS"))
    .unwrap_or("")
    .to_string();
  eprintln!(
    "FIGURES over {}:",
    if std::env::var_os("TRUEFORGE_AGENT_RUNNER").is_some() {
      "the runner's stream"
    } else {
      "pipes"
    }
  );
  eprintln!("  ping p50 {:?}", p50(pings));
  eprintln!("  exec true p50 {:?}", p50(trues));
  eprintln!("  50 concurrent true, wall p50 {:?}", p50(walls));
  eprintln!(
    "  1 KiB upload p50 {:?}, download p50 {:?}",
    p50(ups),
    p50(downs)
  );
  eprintln!(
    "  100 MiB upload {:.0} MiB/s, download {:.0} MiB/s (best of 3)",
    best(&up_rates),
    best(&down_rates)
  );
  eprintln!(
    "  1 GiB of output in {gib:?}; host RSS grew {} MiB (cap 10 MiB)",
    growth / 1024
  );
  eprintln!("  agent after the run: {}", rss.trim());
}
