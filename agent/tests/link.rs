//! The agent linked to a Unix socket of the host's (`--link`): every frame travels there, the
//! exec's own stdin only says when the host has gone, and a socket that cannot be reached
//! leaves the agent on stdin and stdout.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::AsyncReadExt;
use trueforge_agent_proto::client::AgentClient;

fn linked() -> Options {
  Options {
    link: true,
    ..Default::default()
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_agent_serves_on_the_socket_alone() {
  let mut a = start_with(linked()).await;
  let out = a.run("echo one; echo two >&2; exit 3").await;
  assert_eq!((out.exit_code, out.output.as_str()), (3, "one\ntwo\n"));
  let many = a.run("seq 1 200000").await;
  assert_eq!(many.exit_code, 0);
  assert!(
    many.output.ends_with("199999\n200000\n"),
    "{}",
    many.output.len()
  );
  a.client.close();
  let status = tokio::time::timeout(Duration::from_secs(5), a.child.wait())
    .await
    .unwrap()
    .unwrap();
  assert!(status.success());
  // Nothing came on the exec's stdout: it is a lifeline only.
  let mut rest = Vec::new();
  let mut life = a.lifeline.take().unwrap();
  life.stdout.read_to_end(&mut rest).await.unwrap();
  assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_stdin_ends_a_linked_agent_and_its_commands() {
  let mut a = start_with(linked()).await;
  let m = marker(31);
  let c = a.client.clone();
  let cmd = format!("sleep {m}");
  let task = tokio::spawn(async move { c.exec(&req(&cmd)).await });
  for _ in 0..100 {
    if !procs_with(&m).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
  }
  assert!(!procs_with(&m).is_empty());
  // The host's end of the exec closes; the socket is still open.
  drop(a.lifeline.take().unwrap().stdin);
  ends_with_its_command(&mut a, task, &m).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_cannot_be_reached_leaves_the_agent_on_stdio() {
  let dir = TempDir::new("nolink");
  let mut child = command(&agent_bin())
    .arg("--link")
    .arg(dir.path("absent.sock"))
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
  let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
  let mut stderr = child.stderr.take().unwrap();
  let client = AgentClient::connect(stdout, stdin, Default::default())
    .await
    .expect("a hello on stdout");
  let out = client.exec(&req("echo here")).await.unwrap();
  assert_eq!((out.exit_code, out.output.as_str()), (0, "here\n"));
  client.close();
  drop(client);
  let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
    .await
    .unwrap()
    .unwrap();
  assert!(status.success());
  let mut said = String::new();
  stderr.read_to_string(&mut said).await.unwrap();
  assert!(said.contains("absent.sock cannot be reached"), "{said}");
  assert!(said.contains("serving on stdin and stdout"), "{said}");
}
