//! Commands through the real agent binary: exit codes from waitpid, merged output, the cap,
//! cwd, env, PATH, users, timeouts that kill every escape, background processes, concurrency.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::*;
use trueforge_agent_proto::client::ClientError;
use trueforge_agent_proto::msg::{ErrorKind, BIN_DIR};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_reports_the_agent() {
  let a = start().await;
  let h = a.client.hello();
  assert_eq!(h.agent, "trueforge-agent");
  assert_eq!(h.version, trueforge_agent_proto::VERSION);
  assert_eq!(h.uid, 0);
  assert!(a.client.ping().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_merged_output() {
  let a = start().await;
  let out = a.run("echo one; echo two >&2; echo three; exit 3").await;
  assert_eq!(out.exit_code, 3);
  assert_eq!(out.output, "one\ntwo\nthree\n");
  assert!(!out.timed_out);
  assert_eq!(a.run("kill -9 $$").await.exit_code, 137);
  assert_eq!(a.run("true").await.exit_code, 0);
  // A command that prints the old wrapper's marker text does not end the call.
  let started = Instant::now();
  let out = a
    .run("printf '\\036TFXdeadbeef00000000:x:0\\036'; sleep 0.4; exit 7")
    .await;
  assert_eq!(out.exit_code, 7);
  assert!(started.elapsed() >= Duration::from_millis(400));
  assert!(out.output.contains("TFXdeadbeef"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_over_the_cap_keeps_head_and_tail() {
  let a = start().await;
  let mut r = req("printf 'HEAD'; head -c 100000 /dev/zero | tr '\\0' x; printf 'TAIL'");
  r.max_output = 100;
  let out = a.client.exec(&r).await.unwrap();
  assert_eq!(out.omitted, 100_008 - 100);
  assert!(out.output.starts_with("HEAD"));
  assert!(out.output.ends_with("TAIL"));
  assert!(out
    .output
    .contains("\n[... 99908 bytes of output omitted ...]\n"));
  // Non-UTF-8 becomes U+FFFD.
  assert_eq!(a.run("printf 'a\\377b'").await.output, "a\u{fffd}b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_the_oom_killers_first_choice() {
  // Raised over the agent's (never lowered), for the command and what it starts, as the user
  // too: a memory bomb takes the workload, not the sandbox's init or the agent.
  let a = start().await;
  let own: i32 = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", a.pid))
    .unwrap()
    .trim()
    .parse()
    .unwrap();
  let want = (own + 500).min(1000).to_string();
  let out = a
    .run("cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'")
    .await;
  assert_eq!(out.output, format!("{want}\n{want}\n"));
  let out = a.run_as("nobody", "cat /proc/self/oom_score_adj").await;
  assert_eq!(out.output, format!("{want}\n"));
  // The shepherd itself is back at the agent's once the command has exec'd (a spare raises
  // its own ahead of the command, for the command to inherit).
  let out = a.run("sleep 0.3; cat /proc/$PPID/oom_score_adj").await;
  assert_eq!(out.output, format!("{own}\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn working_directory() {
  let a = start().await;
  let mut r = req("pwd");
  r.cwd = "/tmp".into();
  assert_eq!(a.client.exec(&r).await.unwrap().output, "/tmp\n");
  r.cwd = "/no/such/dir".into();
  let out = a.client.exec(&r).await.unwrap();
  assert_eq!(out.exit_code, 1);
  assert_eq!(
    out.output,
    "cannot change directory to /no/such/dir: no such directory\n"
  );
  // A file, and a directory the user may not enter: the real reason, not "no such directory".
  let t = TempDir::new("cwd");
  std::fs::write(t.0.join("file"), b"").unwrap();
  std::fs::create_dir(t.0.join("closed")).unwrap();
  std::fs::set_permissions(t.0.join("closed"), std::fs::Permissions::from_mode(0o700)).unwrap();
  for (cwd, user, why) in [
    ("file", None, "not a directory (it, or a parent, is a file)"),
    (
      "file/sub",
      None,
      "not a directory (it, or a parent, is a file)",
    ),
    (
      "closed",
      Some("nobody"),
      "permission denied (the user may not enter it)",
    ),
  ] {
    r.cwd = t.path(cwd);
    r.user = user.map(str::to_string);
    let out = a.client.exec(&r).await.unwrap();
    assert_eq!(out.exit_code, 1, "{cwd}");
    assert_eq!(
      out.output,
      format!("cannot change directory to {}: {why}\n", t.path(cwd))
    );
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_kills_its_supervisor_may_or_may_not_have_run() {
  // As root the command may kill its shepherd (its parent): the command ran, so the error must
  // not say it could not be started.
  let a = start().await;
  let t = TempDir::new("lost");
  let before = t.path("before");
  let err = a
    .client
    .exec(&req(&format!(
      "echo ran > {before}; kill -9 $PPID; sleep 1"
    )))
    .await
    .unwrap_err();
  match err {
    ClientError::Agent(e) => {
      assert_eq!(e.kind, ErrorKind::SupervisorLost, "{e:?}");
      assert!(
        e.message.starts_with("the command started"),
        "{}",
        e.message
      );
      assert!(
        e.message.contains("may or may not have run"),
        "{}",
        e.message
      );
    }
    other => panic!("{other:?}"),
  }
  assert_eq!(std::fs::read_to_string(&before).unwrap(), "ran\n");
  assert_eq!(a.run("echo next").await.output, "next\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_and_path() {
  let a = start_with(Options {
    env: vec![
      ("FROM_CONTAINER".into(), "c".into()),
      ("OVERRIDDEN".into(), "container".into()),
      ("TRUEFORGE_AGENT_PRIVATE".into(), "x".into()),
      ("PATH".into(), "/usr/bin:/bin".into()),
      ("HOME".into(), "/root".into()),
    ],
    ..Default::default()
  })
  .await;
  let mut r = req("env");
  r.env = vec![
    ("OVERRIDDEN".into(), "caller".into()),
    ("CALLER".into(), "it's \"$(x)\"".into()),
  ];
  let env = env_map(&a.client.exec(&r).await.unwrap().output);
  assert_eq!(env["FROM_CONTAINER"], "c");
  assert_eq!(env["OVERRIDDEN"], "caller");
  assert_eq!(env["CALLER"], "it's \"$(x)\"");
  assert!(!env.contains_key("TRUEFORGE_AGENT_PRIVATE"));
  assert_eq!(env["PATH"], format!("{BIN_DIR}:/usr/bin:/bin"));
  assert_eq!(env["HOME"], "/root");
  // The caller's PATH replaces the container's, our bin dir still first.
  r.env = vec![("PATH".into(), "/opt/x:/usr/bin:/bin".into())];
  let env = env_map(&a.client.exec(&r).await.unwrap().output);
  assert_eq!(env["PATH"], format!("{BIN_DIR}:/opt/x:/usr/bin:/bin"));
  // HOME comes from the user's passwd entry (the engine's HOME for root is not inherited).
  r.user = Some("nobody".into());
  r.env = vec![];
  let env = env_map(&a.client.exec(&r).await.unwrap().output);
  assert_eq!(env["HOME"], "/nonexistent");
  r.env = vec![("HOME".into(), "/h".into())];
  let env = env_map(&a.client.exec(&r).await.unwrap().output);
  assert_eq!(env["HOME"], "/h");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_when_there_is_one_else_sh() {
  let a = start().await;
  assert_ne!(a.run("echo ${BASH_VERSION:-none}").await.output, "none\n");
  let mut r = req("echo ${BASH_VERSION:-none}");
  r.env = vec![("PATH".into(), "/nonexistent".into())];
  assert_eq!(a.client.exec(&r).await.unwrap().output, "none\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_are_switched_with_their_groups() {
  let a = start().await;
  assert_eq!(a.run("id -u; id -g").await.output, "0\n0\n");
  let out = a.run_as("nobody", "id -u; id -g; id -G").await;
  assert_eq!(out.output, "65534\n65534\n65534\n");
  let out = a.run_as("nobody:daemon", "id -u; id -g; id -G").await;
  assert_eq!(out.output, "65534\n1\n1\n");
  let out = a.run_as("4321:4322", "id -u; id -g").await;
  assert_eq!(out.output, "4321\n4322\n");
  let mut r = req("true");
  r.user = Some("no-such-user".into());
  match a.client.exec(&r).await {
    Err(ClientError::Agent(e)) => assert_eq!(e.kind, ErrorKind::UnknownUser),
    other => panic!("{other:?}"),
  }
  // The user cannot signal or read the agent.
  let out = a
    .run_as(
      "nobody",
      &format!("kill -0 {} 2>&1; cat /proc/{}/environ 2>&1", a.pid, a.pid),
    )
    .await;
  assert!(out.output.contains("not permitted"), "{}", out.output);
  assert!(out.output.contains("Permission denied"), "{}", out.output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_as_the_sandbox_user_serves_that_user() {
  // Where the container keeps no capability (Podman with a non-root user), the host starts the
  // agent as the sandbox user: it runs commands and files as itself, and says why it cannot do
  // more.
  let a = start_with(Options {
    as_user: Some((65534, 65534)),
    ..Default::default()
  })
  .await;
  assert_eq!(a.client.hello().uid, 65534);
  assert_eq!(a.run_as("nobody", "id -u").await.output, "65534\n");
  refused_as_root(&a).await;
  // A forked shepherd's command says why it could not start through a pipe of its own, a
  // spare's in the memory it runs in until its exec: both are heard, and the next runs.
  let forked = start_with(Options {
    as_user: Some((65534, 65534)),
    env: vec![("TRUEFORGE_AGENT_NO_SPARE".into(), "1".into())],
    ..Default::default()
  })
  .await;
  refused_as_root(&forked).await;
  for _ in 0..3 {
    refused_as_root(&a).await;
    assert_eq!(a.run_as("nobody", "id -u").await.output, "65534\n");
  }
  let mut r = req(&format!("sleep {} & sleep 30", marker(14)));
  r.user = Some("nobody".into());
  r.timeout = Some(Duration::from_millis(500));
  match a.client.exec(&r).await {
    Ok(out) => assert!(out.timed_out),
    // qemu-user: no subreaper and no session guard, so the kill is not claimed as verified.
    Err(ClientError::Agent(e)) if !contained(a.client.hello()) => {
      assert_eq!(e.kind, ErrorKind::KillUnverified)
    }
    Err(e) => panic!("{e:?}"),
  }
  assert!(procs_with(&marker(14)).is_empty());
}

/// A command as root from an agent that is not root: its user switch is refused.
async fn refused_as_root(a: &Agent) {
  let mut r = req("id -u");
  r.user = Some("root".into());
  match a.client.exec(&r).await {
    Err(ClientError::Agent(e)) => {
      assert_eq!(e.kind, ErrorKind::SpawnFailed);
      assert!(e.message.contains("SETUID"), "{}", e.message);
      assert!(e.message.contains("not permitted"), "{}", e.message);
    }
    other => panic!("{other:?}"),
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_kills_every_escape_and_says_so() {
  kills_every_escape(&start().await, 1).await;
}

/// A shepherd forked for its command (none kept ready, as in a burst) kills as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_shepherd_kills_every_escape_too() {
  let a = start_with(Options {
    env: vec![("TRUEFORGE_AGENT_NO_SPARE".into(), "1".into())],
    ..Default::default()
  })
  .await;
  kills_every_escape(&a, 41).await;
}

/// Without a subreaper (as under gVisor) orphans go to init; the session guard keeps each in
/// its command's session, so the same escapes are killed and the kill is verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_subreaper_the_session_guard_keeps_every_escape() {
  let a = start_with(Options {
    env: vec![("TRUEFORGE_AGENT_NO_SUBREAPER".into(), "1".into())],
    ..Default::default()
  })
  .await;
  let h = a.client.hello();
  // qemu-user (the aarch64 binary's runner here) emulates no seccomp filter.
  let emulated = !std::env::var("TRUEFORGE_AGENT_RUNNER")
    .unwrap_or_default()
    .is_empty();
  if emulated && !h.session_guard {
    eprintln!("skipped: the emulator runs no seccomp filter, so there is no session guard: {h:?}");
    return;
  }
  assert!(!h.subreaper && h.session_guard, "{h:?}");
  // setsid succeeds for the program, which stays in the command's session.
  let out = a
    .run("a=$(cut -d' ' -f6 /proc/self/stat); b=$(setsid cut -d' ' -f6 /proc/self/stat); test \"$a\" = \"$b\" && echo same")
    .await;
  assert_eq!(out.output, "same\n");
  kills_every_escape(&a, 31).await;
}

/// A command that escapes in every way known (new sessions, double forks, `env -i`, a
/// non-dumpable process) times out: all of it is killed and the kill is verified, or where the
/// system allows neither containment (qemu-user) the answer says it is not. Markers from
/// `first` on.
async fn kills_every_escape(a: &Agent, first: u32) {
  let m: Vec<String> = (first..first + 6).map(marker).collect();
  let script = format!(
    "setsid sleep {0} & (sleep {1} &); env -i /bin/sleep {2} & sh -c 'sleep {3} & exit'; \
     python3 -c 'import ctypes,time; ctypes.CDLL(None).prctl(4,0,0,0,0); time.sleep({4})' & \
     setsid sh -c '(setsid sleep {5} &) ; sleep 1' & sleep 60",
    m[0], m[1], m[2], m[3], m[4], m[5]
  );
  let mut r = req(&script);
  r.timeout = Some(Duration::from_millis(1500));
  let started = Instant::now();
  if !contained(a.client.hello()) {
    // qemu-user: orphans go to init and may leave their session, so no kill is ever claimed
    // as verified. (gVisor has no subreaper either, but keeps them in their session.)
    match a.client.exec(&r).await {
      Err(ClientError::Agent(e)) => assert_eq!(e.kind, ErrorKind::KillUnverified),
      other => panic!("{other:?}"),
    }
    for mk in &m {
      for p in procs_with(mk) {
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
      }
    }
    return;
  }
  let out = a.client.exec(&r).await.unwrap();
  assert!(
    started.elapsed() < Duration::from_secs(6),
    "{:?}",
    started.elapsed()
  );
  assert!(out.timed_out);
  assert_eq!(out.exit_code, 124);
  assert!(out
    .output
    .ends_with("[timed out after 1.5 s: the command and every process it started were killed]"));
  for mk in &m {
    assert!(procs_with(mk).is_empty(), "{mk} survived");
  }
  // The same as the sandbox user.
  let mut r = req(&format!(
    "setsid sleep {} & (sleep {} &); sleep 60",
    marker(first + 6),
    marker(first + 7)
  ));
  r.user = Some("nobody".into());
  r.timeout = Some(Duration::from_secs(1));
  let out = a.client.exec(&r).await.unwrap();
  assert!(out.timed_out);
  assert!(procs_with(&marker(first + 6)).is_empty() && procs_with(&marker(first + 7)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_do_not_hold_the_call() {
  let a = start().await;
  let dir = TempDir::new("bg");
  let done = dir.path("done");
  let started = Instant::now();
  // The background writer fills the pipe after the call returned: it must neither block nor
  // die of SIGPIPE (the agent keeps draining the pipe).
  let out = a
    .run(&format!(
      "(sleep 0.3; head -c 3000000 /dev/zero; echo ok > {done}) & sleep {} & echo started",
      marker(9)
    ))
    .await;
  assert!(
    started.elapsed() < Duration::from_millis(1500),
    "{:?}",
    started.elapsed()
  );
  assert_eq!(out.output, "started\n");
  for _ in 0..50 {
    // The redirection makes the file before `echo` writes it.
    if std::fs::read_to_string(&done).is_ok_and(|t| !t.is_empty()) {
      break;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
  }
  assert_eq!(std::fs::read_to_string(&done).unwrap(), "ok\n");
  // Background processes survive a normal end (as in a terminal).
  assert!(!procs_with(&marker(9)).is_empty());
  for p in procs_with(&marker(9)) {
    unsafe { libc::kill(p as i32, libc::SIGKILL) };
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_commands_at_once() {
  let a = start().await;
  let started = Instant::now();
  let mut tasks = Vec::new();
  for i in 0..50 {
    let c = a.client.clone();
    tasks.push(tokio::spawn(async move {
      let out = c.exec(&req(&format!("echo {i}; sleep 0.2"))).await.unwrap();
      assert_eq!(out.output, format!("{i}\n"));
    }));
  }
  for t in tasks {
    t.await.unwrap();
  }
  assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_command_is_killed() {
  let a = start().await;
  let m = marker(10);
  let c = a.client.clone();
  let cmd = format!("setsid sleep {m} & sleep 30");
  let task = tokio::spawn(async move { c.exec(&req(&cmd)).await });
  tokio::time::sleep(Duration::from_millis(300)).await;
  assert!(!procs_with(&m).is_empty());
  task.abort();
  for _ in 0..50 {
    if procs_with(&m).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  assert!(procs_with(&m).is_empty());
  assert!(a.client.ping().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_fails_every_request_and_its_commands_die() {
  let mut a = start().await;
  let m = marker(11);
  let mut tasks = Vec::new();
  for i in 0..5 {
    let c = a.client.clone();
    let cmd = format!("sleep {m}{i}");
    tasks.push(tokio::spawn(async move { c.exec(&req(&cmd)).await }));
  }
  tokio::time::sleep(Duration::from_millis(300)).await;
  a.child.start_kill().unwrap();
  for t in tasks {
    match t.await.unwrap() {
      Err(ClientError::StreamEnded { .. }) => {}
      other => panic!("{other:?}"),
    }
  }
  assert!(matches!(
    a.client.ping().await,
    Err(ClientError::StreamEnded { .. })
  ));
  for _ in 0..50 {
    if procs_with(&m).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  assert!(procs_with(&m).is_empty(), "commands outlived their agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_stdin_ends_the_agent() {
  let mut a = start().await;
  let m = marker(12);
  let c = a.client.clone();
  let cmd = format!("sleep {m}");
  let task = tokio::spawn(async move { c.exec(&req(&cmd)).await });
  tokio::time::sleep(Duration::from_millis(300)).await;
  a.client.close();
  ends_with_its_command(&mut a, task, &m).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cancelled_while_the_agent_was_stopped_never_starts() {
  let a = start().await;
  let dir = TempDir::new("late");
  let late = dir.0.join("late.txt");
  // The child itself (the agent, or qemu running it): SIGSTOP stops it as a root workload would.
  let pid = a.child.id().unwrap() as i32;
  assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
  let c = a.client.clone();
  let cmd = format!("echo late > {}", late.display());
  let task = tokio::spawn(async move { c.exec(&req(&cmd)).await });
  tokio::time::sleep(Duration::from_millis(200)).await;
  // The host gave the call up: its cancel waits in the pipe right behind the request.
  task.abort();
  let _ = task.await;
  assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
  a.client.ping().await.unwrap();
  tokio::time::sleep(Duration::from_millis(300)).await;
  assert!(!late.exists(), "a request cancelled before it started ran");
  assert_eq!(a.run("echo served").await.output, "served\n");
}

/// A pids cgroup (v1, as on this machine; v2 where mounted so) holding only the agent.
struct PidsCgroup(std::path::PathBuf);

impl PidsCgroup {
  fn new(max: u32, pid: u32) -> Option<PidsCgroup> {
    for base in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
      // Tests run side by side in this process: each agent gets its own.
      let dir =
        std::path::Path::new(base).join(format!("tf-agent-test-{}-{pid}", std::process::id()));
      if std::fs::create_dir(&dir).is_err() {
        continue;
      }
      let ok = std::fs::write(dir.join("pids.max"), max.to_string()).is_ok()
        && std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok();
      if ok {
        return Some(PidsCgroup(dir));
      }
      let _ = std::fs::remove_dir(&dir);
    }
    None
  }
}

impl Drop for PidsCgroup {
  fn drop(&mut self) {
    for _ in 0..50 {
      if std::fs::remove_dir(&self.0).is_ok() {
        return;
      }
      std::thread::sleep(Duration::from_millis(100));
    }
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_out_of_processes_is_recovered() {
  // A full pids cgroup, as a fork bomb that outlived its command leaves a container: the agent
  // cannot fork until it kills the sandbox user's processes. A uid of its own, so that nothing
  // else on this machine is hit.
  let mut a = start().await;
  if !a.client.hello().subreaper {
    eprintln!("skipped: the agent is no subreaper here (qemu-user), so nothing reaps the bomb");
    return;
  }
  let Some(cg) = PidsCgroup::new(24, a.pid) else {
    eprintln!("skipped: no pids cgroup can be made here");
    return;
  };
  let user = "64123:64123";
  let m = marker(13);
  let out = a
    .run_as(
      user,
      &format!("(while :; do sleep {m} & done) >/dev/null 2>&1 & echo started"),
    )
    .await;
  assert_eq!(out.output, "started\n");
  // Full: every pid of the cgroup taken.
  let current = || std::fs::read_to_string(cg.0.join("pids.current")).unwrap_or_default();
  for _ in 0..100 {
    if current().trim() == "24" {
      break;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  assert_eq!(current().trim(), "24");
  // Three processes (shepherd, shell, cat): more than the two waiting shepherds give back, so
  // the command needs the recovery.
  let out = a.run_as(user, "echo after | cat").await;
  assert_eq!(out.output, "after\n");
  assert!(
    out
      .recovered
      .as_deref()
      .unwrap_or("")
      .contains("out of processes"),
    "{:?}",
    out.recovered
  );
  assert!(procs_with(&m).is_empty());
  a.client.close();
  let _ = a.child.wait().await;
  drop(cg);
}

/// An agent in a pids cgroup of `max`, or `None` (with why) where the test cannot run.
async fn crowded(max: u32) -> Option<(Agent, PidsCgroup)> {
  let a = start().await;
  if !a.client.hello().subreaper {
    eprintln!("skipped: the agent is no subreaper here (qemu-user), so nothing reaps leftovers");
    return None;
  }
  let Some(cg) = PidsCgroup::new(max, a.pid) else {
    eprintln!("skipped: no pids cgroup can be made here");
    return None;
  };
  Some((a, cg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_commands_than_processes_each_finish_or_say_why_and_none_is_killed() {
  // 30 commands that need three pids each (shepherd, shell, sleep) in a cgroup of 40: the agent
  // must not kill running commands to make room, only wait for them or say why it could not.
  let Some((a, cg)) = crowded(40).await else {
    return;
  };
  let mut tasks = Vec::new();
  for _ in 0..30 {
    let c = a.client.clone();
    let mut r = req("sleep 1; echo done");
    r.timeout = Some(Duration::from_secs(60));
    tasks.push(tokio::spawn(async move { c.exec(&r).await }));
  }
  let (mut finished, mut told) = (0, 0);
  for t in tasks {
    match t.await.unwrap() {
      Ok(out) if out.exit_code == 0 && out.output.ends_with("done\n") => finished += 1,
      // The shell's own fork failed and it said so (bash retries first).
      Ok(out) if out.exit_code != 0 && out.output.contains("fork") => told += 1,
      Err(ClientError::Agent(e)) if e.kind == ErrorKind::OutOfProcesses => {
        assert!(
          e.message.contains("commands still running"),
          "{}",
          e.message
        );
        told += 1;
      }
      other => panic!("neither finished nor said why: {other:?}"),
    }
  }
  eprintln!("{finished} finished, {told} said why they did not");
  assert!(finished > 0);
  assert_eq!(finished + told, 30);
  drop(a);
  drop(cg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_kills_what_was_left_behind_not_a_command_still_running() {
  let Some((a, cg)) = crowded(24).await else {
    return;
  };
  let user = "64124:64124";
  let m = marker(15);
  // About 2 s, and a command line of its own.
  let nap = format!("2.{:04}97", std::process::id() % 10000);
  let running = {
    let c = a.client.clone();
    let mut r = req(&format!("sleep {nap}; echo survived"));
    r.user = Some(user.into());
    tokio::spawn(async move { c.exec(&r).await })
  };
  // Its sleep runs before the sandbox fills up (else it is that command that cannot fork).
  for _ in 0..100 {
    if !procs_with(&nap).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
  }
  assert!(
    !procs_with(&nap).is_empty(),
    "the running command's sleep never started"
  );
  let out = a
    .run_as(
      user,
      &format!("(while :; do sleep {m} & done) >/dev/null 2>&1 & echo started"),
    )
    .await;
  assert_eq!(out.output, "started\n");
  let current = || std::fs::read_to_string(cg.0.join("pids.current")).unwrap_or_default();
  for _ in 0..100 {
    if current().trim() == "24" {
      break;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  assert_eq!(current().trim(), "24");
  // Three processes (shepherd, shell, cat): more than the two waiting shepherds give back, so
  // the command needs the recovery.
  let out = a.run_as(user, "echo after | cat").await;
  assert_eq!(out.output, "after\n");
  let note = out.recovered.unwrap_or_default();
  assert!(note.contains("that no running command owned"), "{note}");
  // The command that was running when the sandbox filled up was spared, and ended as it would.
  let still = running.await.unwrap().unwrap();
  assert_eq!((still.exit_code, still.output.as_str()), (0, "survived\n"));
  assert!(procs_with(&m).is_empty());
  drop(a);
  drop(cg);
}

/// An agent whose shepherds take more than one command, or `None` (saying why) where they
/// cannot: without a subreaper (qemu-user) a shepherd cannot tell that nothing is left.
async fn reusing() -> Option<Agent> {
  let a = start().await;
  if a.client.hello().subreaper {
    return Some(a);
  }
  eprintln!("skipped: the agent is no subreaper here (qemu-user), so no shepherd is reused");
  None
}

/// A shepherd whose command left nothing running takes the next command, so a loop of
/// commands starts no new shepherd; one whose command left a process behind is not reused, and
/// a later command's timeout does not reach what an earlier command left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shepherd_is_reused_only_when_its_command_left_nothing_behind() {
  let Some(a) = reusing().await else {
    return;
  };
  // A command's shell is its shepherd's child.
  let mut shepherds = std::collections::HashSet::new();
  for _ in 0..12 {
    let out = a.run("echo $PPID").await;
    assert_eq!(out.exit_code, 0);
    shepherds.insert(out.output);
  }
  // The first commands may fork theirs, or take the spare started beside them.
  assert!(shepherds.len() <= 3, "{shepherds:?}");

  let m = marker(60);
  let left = a
    .run(&format!("sleep {m} >/dev/null 2>&1 & echo $PPID"))
    .await;
  assert_eq!(left.exit_code, 0);
  // Forked before the command ended, but maybe not yet exec'd.
  for _ in 0..100 {
    if !procs_with(&m).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  assert_eq!(procs_with(&m).len(), 1);
  let mut later = Vec::new();
  for _ in 0..4 {
    later.push(a.run("echo $PPID").await.output);
  }
  assert!(!later.contains(&left.output), "{later:?} {left:?}");
  let mut r = req("sleep 30");
  r.timeout = Some(Duration::from_millis(300));
  assert!(a.client.exec(&r).await.expect("exec").timed_out);
  // Still running: it belonged to the earlier command's shepherd, which exited.
  let pids = procs_with(&m);
  assert_eq!(pids.len(), 1);
  // Its own command's output and exit code came through the reused shepherd intact.
  let out = a.run("printf 'a\\nb'; exit 3").await;
  assert_eq!((out.exit_code, out.output.as_str()), (3, "a\nb"));
  for pid in pids {
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
  }
}

/// What a command leaves on its output (a pipe its shell shares with the shepherd's) does not
/// reach the next command run by the same shepherd: non-blocking (Node.js leaves its stdout so)
/// or resized, the next finds it blocking and at its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_shepherd_gives_the_next_command_its_output_as_new() {
  let Some(a) = reusing().await else {
    return;
  };
  if a.run("command -v python3").await.exit_code != 0 {
    eprintln!("skipped: no python3 here to change a pipe's flags");
    return;
  }
  let probe = "python3 -c 'import fcntl, os; print(fcntl.fcntl(1, fcntl.F_GETFL) & os.O_NONBLOCK, fcntl.fcntl(1, 1032))'";
  let fresh = a.run(probe).await.output;
  assert!(fresh.starts_with("0 "), "{fresh}");
  let mut same = 0;
  for _ in 0..5 {
    let changed = a
      .run("python3 -c 'import fcntl, os; fcntl.fcntl(1, fcntl.F_SETFL, os.O_NONBLOCK); fcntl.fcntl(1, 1031, 4096)'; echo $PPID")
      .await;
    let next = a.run(&format!("{probe}; echo $PPID")).await.output;
    let (flags, parent) = next.split_once('\n').unwrap();
    assert_eq!(format!("{flags}\n"), fresh);
    same += (parent.trim() == changed.output.trim()) as u32;
  }
  // The check means something only where the shepherd was in fact reused.
  assert!(same > 0);
}
