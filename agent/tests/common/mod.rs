//! Starting the real agent binary as a child and driving it through `AgentClient` over its
//! pipes. `TRUEFORGE_AGENT_BIN` picks another binary (the static builds) and
//! `TRUEFORGE_AGENT_RUNNER` a command to run it with, split at spaces (`qemu-aarch64` for the
//! arm64 one, `docker exec -i -u 0 <container>` for the smoke test).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use trueforge_agent_proto::client::{AgentClient, ClientOptions, ExecOutput, ExecRequest};

pub struct Agent {
  pub client: AgentClient,
  pub child: tokio::process::Child,
  pub pid: u32,
  /// Linked (`Options::link`): the exec's stdin and stdout, which then carry no frames, and
  /// the directory of the socket.
  pub lifeline: Option<Lifeline>,
}

pub struct Lifeline {
  pub stdin: tokio::process::ChildStdin,
  pub stdout: tokio::process::ChildStdout,
  pub dir: TempDir,
}

pub fn agent_bin() -> String {
  std::env::var("TRUEFORGE_AGENT_BIN")
    .unwrap_or_else(|_| env!("CARGO_BIN_EXE_trueforge-agent").to_string())
}

pub fn command(bin: &str) -> tokio::process::Command {
  let runner = std::env::var("TRUEFORGE_AGENT_RUNNER").unwrap_or_default();
  let mut words = runner.split_whitespace();
  match words.next() {
    Some(first) => {
      let mut c = tokio::process::Command::new(first);
      c.args(words).arg(bin);
      c
    }
    None => tokio::process::Command::new(bin),
  }
}

#[derive(Default)]
pub struct Options {
  pub env: Vec<(String, String)>,
  /// Start the agent as this uid and gid instead of root.
  pub as_user: Option<(u32, u32)>,
  /// Serve over a Unix socket the test listens on (`--link`), not stdin and stdout.
  pub link: bool,
}

pub async fn start() -> Agent {
  start_with(Options::default()).await
}

pub async fn start_with(opts: Options) -> Agent {
  let mut cmd = command(&agent_bin());
  cmd
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
  for (k, v) in &opts.env {
    cmd.env(k, v);
  }
  if let Some((uid, gid)) = opts.as_user {
    cmd.uid(uid).gid(gid);
  }
  let listening = opts.link.then(|| {
    let dir = TempDir::new("link");
    if let Some((uid, gid)) = opts.as_user {
      std::os::unix::fs::chown(&dir.0, Some(uid), Some(gid)).unwrap();
    }
    let path = dir.path("agent.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    cmd.arg("--link").arg(&path);
    (dir, listener)
  });
  let mut child = cmd.spawn().expect("start the agent");
  let stdout = child.stdout.take().unwrap();
  let stdin = child.stdin.take().unwrap();
  let Some((dir, listener)) = listening else {
    let client = AgentClient::connect(stdout, stdin, ClientOptions::default())
      .await
      .expect("agent hello");
    let pid = client.hello().pid;
    return Agent {
      client,
      child,
      pid,
      lifeline: None,
    };
  };
  let (socket, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
    .await
    .expect("the agent connects")
    .unwrap();
  let (read, write) = socket.into_split();
  let client = AgentClient::connect(read, write, ClientOptions::default())
    .await
    .expect("agent hello");
  let pid = client.hello().pid;
  Agent {
    client,
    child,
    pid,
    lifeline: Some(Lifeline { stdin, stdout, dir }),
  }
}

/// Whether every process a command starts stays within its timeout's reach: through a
/// subreaper, or where there is none (gVisor) the session guard.
pub fn contained(h: &trueforge_agent_proto::msg::Hello) -> bool {
  h.subreaper || h.session_guard
}

pub fn req(command: &str) -> ExecRequest {
  ExecRequest {
    command: command.to_string(),
    cwd: "/".to_string(),
    env: vec![],
    user: None,
    timeout: Some(Duration::from_secs(30)),
    max_output: 1 << 20,
  }
}

impl Agent {
  pub async fn run(&self, command: &str) -> ExecOutput {
    self.client.exec(&req(command)).await.expect("exec")
  }

  pub async fn run_as(&self, user: &str, command: &str) -> ExecOutput {
    let mut r = req(command);
    r.user = Some(user.to_string());
    self.client.exec(&r).await.expect("exec")
  }
}

/// The agent exits cleanly, the command in flight (`task`, running `sleep <marker>`) fails as
/// the stream ended, and the command's processes are gone.
pub async fn ends_with_its_command(
  a: &mut Agent,
  task: tokio::task::JoinHandle<Result<ExecOutput, trueforge_agent_proto::client::ClientError>>,
  marker: &str,
) {
  let status = tokio::time::timeout(Duration::from_secs(5), a.child.wait())
    .await
    .unwrap()
    .unwrap();
  assert!(status.success());
  assert!(matches!(
    task.await.unwrap(),
    Err(trueforge_agent_proto::client::ClientError::StreamEnded { .. })
  ));
  for _ in 0..50 {
    if procs_with(marker).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  assert!(procs_with(marker).is_empty());
}

/// Pids whose command line contains `needle` (our own process excluded).
pub fn procs_with(needle: &str) -> Vec<u32> {
  let me = std::process::id();
  let mut out = Vec::new();
  for e in std::fs::read_dir("/proc").unwrap().flatten() {
    let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
      continue;
    };
    if pid == me {
      continue;
    }
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
      continue;
    };
    let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
    // Zombies have an empty command line and are dead already.
    if cmd.contains(needle) {
      out.push(pid);
    }
  }
  out
}

/// A unique sleep length, to find a test's processes in /proc.
pub fn marker(n: u32) -> String {
  format!("{}.{:04}{}", 40 + n, std::process::id() % 10000, n)
}

/// A temporary directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
  pub fn new(name: &str) -> TempDir {
    // The clock alone can give two tests running at once the same name (and one of them then
    // finds the other's files): a counter keeps them apart.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let p = std::env::temp_dir().join(format!(
      "tf-agent-{name}-{}-{}-{}",
      std::process::id(),
      SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
      std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
    ));
    std::fs::create_dir(&p).unwrap();
    TempDir(p)
  }

  pub fn path(&self, rel: &str) -> String {
    self.0.join(rel).to_string_lossy().into_owned()
  }
}

impl Drop for TempDir {
  fn drop(&mut self) {
    let _ = std::fs::remove_dir_all(&self.0);
  }
}

pub fn env_map(text: &str) -> BTreeMap<String, String> {
  text
    .lines()
    .filter_map(|l| l.split_once('='))
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
