//! Commands: the environment and user they run with, their shepherd (see `shepherd`), their
//! output streamed under the host's credit, and the recovery of a sandbox out of processes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use trueforge_agent_proto::frame::MAX_DATA;
use trueforge_agent_proto::msg::{
  AgentError, ErrorKind, ExecDone, ExecSpec, Outcome, BIN_DIR, DEFAULT_PATH, TIMEOUT_EXIT_CODE,
};

use crate::conn::StreamIo;
use crate::ctx::Ctx;
use crate::shepherd::{self, Plan, Report};
use crate::users::User;
use crate::{recover, sys};

/// How many times a spawn that failed for lack of processes is retried after a recovery.
const SPAWN_ATTEMPTS: usize = 4;

/// Runs one command to its end and answers its stream (nothing when the host cancelled it).
pub async fn run(ctx: Rc<Ctx>, spec: ExecSpec, mut io: StreamIo) {
  // Cancelled before it started: read together with its request by an agent that was stopped
  // while the host gave the call up. The caller was told it may not have run; it does not.
  if io.cancelled() {
    return;
  }
  ctx.running.set(ctx.running.get() + 1);
  ctx.activity.command_started();
  let outcome = run_inner(&ctx, spec, &io).await;
  ctx.running.set(ctx.running.get() - 1);
  if let Some(o) = outcome {
    io.result(&o);
  }
}

async fn run_inner(ctx: &Ctx, spec: ExecSpec, io: &StreamIo) -> Option<Outcome<ExecDone>> {
  let user = match ctx.users.resolve(spec.user.as_deref()) {
    Ok(u) => u,
    Err(e) => return Some(Outcome::Err(AgentError::new(ErrorKind::UnknownUser, e))),
  };
  let plan = match plan(ctx, &spec, &user) {
    Ok(p) => p,
    Err(e) => return Some(Outcome::Err(AgentError::new(ErrorKind::InvalidRequest, e))),
  };
  let mut recovered = None;
  for attempt in 0..SPAWN_ATTEMPTS {
    let out_of_processes = match shepherd::spawn(&plan) {
      Ok(sp) => match drive(sp, io).await {
        Driven::Cancelled => return None,
        Driven::Lost => {
          return Some(Outcome::Err(AgentError::new(
            ErrorKind::Io,
            "the command's supervisor died before it reported how the command ended",
          )))
        }
        Driven::Reported(r) if r.kind == shepherd::SPAWN_FAILED && r.b == libc::EAGAIN => true,
        Driven::Reported(r) => return Some(finish(r, &user, recovered)),
      },
      Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => true,
      Err(e) => {
        return Some(Outcome::Err(AgentError::new(
          ErrorKind::SpawnFailed,
          format!("cannot start the command: {e}"),
        )))
      }
    };
    if out_of_processes && attempt + 1 < SPAWN_ATTEMPTS {
      recovered = Some(recover::kill_workload(&user, attempt).await);
    }
  }
  Some(Outcome::Err(AgentError::new(
    ErrorKind::OutOfProcesses,
    format!(
      "the sandbox is out of processes even after the agent killed every process of {}; restart the sandbox",
      user.describe()
    ),
  )))
}

/// The command's environment and shepherd plan.
fn plan(ctx: &Ctx, spec: &ExecSpec, user: &User) -> Result<Plan, String> {
  for (k, v) in &spec.env {
    if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
      return Err(format!("environment variable {k:?} is not valid"));
    }
  }
  if !spec.cwd.starts_with('/') {
    return Err(format!(
      "the working directory {:?} is not absolute",
      spec.cwd
    ));
  }
  // The container's environment, then the caller's (later wins, in place).
  let mut env: Vec<(Vec<u8>, Vec<u8>)> = ctx.base_env.clone();
  for (k, v) in &spec.env {
    let (k, v) = (k.as_bytes().to_vec(), v.as_bytes().to_vec());
    match env.iter_mut().find(|(ek, _)| *ek == k) {
      Some(e) => e.1 = v,
      None => env.push((k, v)),
    }
  }
  let given_path = env
    .iter()
    .find(|(k, _)| k == b"PATH")
    .map(|(_, v)| v.clone())
    .filter(|v| !v.is_empty())
    .unwrap_or_else(|| DEFAULT_PATH.as_bytes().to_vec());
  let mut path = BIN_DIR.as_bytes().to_vec();
  path.push(b':');
  path.extend_from_slice(&given_path);
  match env.iter_mut().find(|(k, _)| k == b"PATH") {
    Some(e) => e.1 = path.clone(),
    None => env.push((b"PATH".to_vec(), path.clone())),
  }
  if !env.iter().any(|(k, _)| k == b"HOME") {
    env.push((b"HOME".to_vec(), user.home.as_bytes().to_vec()));
  }
  let entries = env
    .into_iter()
    .map(|(mut k, v)| {
      k.push(b'=');
      k.extend_from_slice(&v);
      k
    })
    .collect();
  let me = &ctx.me;
  let c = ctx.creds_of(user);
  let ids = (c.uid != me.uid || c.gid != me.gid || c.groups != me.groups)
    .then_some((c.uid, c.gid, c.groups));
  Plan::new(
    &spec.command,
    &spec.cwd,
    entries,
    &path,
    ids,
    spec.timeout_ms,
  )
}

enum Driven {
  Reported(Report),
  /// The shepherd ended without a report.
  Lost,
  Cancelled,
}

/// Streams the command's output until the shepherd reports, then what the command wrote before
/// it ended. Output written later by processes it left behind is read and dropped, so they
/// never block on a full pipe or die of SIGPIPE.
async fn drive(sp: shepherd::Spawned, io: &StreamIo) -> Driven {
  let shepherd::Spawned {
    output,
    status,
    control,
  } = sp;
  let (Ok(output), Ok(mut status)) = (receiver(output), receiver(status)) else {
    return Driven::Lost;
  };
  let mut report = [0u8; 16];
  let mut got = 0;
  let mut open = true;
  let reported = loop {
    tokio::select! {
      biased;
      _ = io.until_cancelled() => {
        // Closing the control pipe makes the shepherd kill the command's processes.
        drop(control);
        tokio::task::spawn_local(discard(output));
        return Driven::Cancelled;
      }
      r = status.read(&mut report[got..]) => match r {
        Ok(0) | Err(_) => break None,
        Ok(n) => {
          got += n;
          if got == report.len() {
            break Some(Report::parse(&report));
          }
        }
      },
      r = read_some(&output, io), if open => match r {
        Some(chunk) => io.send_now(chunk.freeze()),
        None => open = false,
      },
    }
  };
  // Everything the command wrote before it ended is in the pipe now.
  while open {
    let avail = tokio::select! {
      biased;
      _ = io.until_cancelled() => break,
      n = io.credit() => n,
    };
    if avail == 0 {
      break;
    }
    let mut buf = BytesMut::with_capacity((avail as usize).min(MAX_DATA));
    match output.try_read_buf(&mut buf) {
      Ok(0) => open = false,
      Ok(_) => io.send_now(buf.freeze()),
      Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
      Err(_) => open = false,
    }
  }
  if open {
    tokio::task::spawn_local(discard(output));
  }
  drop(control);
  match reported {
    Some(r) => Driven::Reported(r),
    None if io.cancelled() => Driven::Cancelled,
    None => Driven::Lost,
  }
}

fn receiver(fd: OwnedFd) -> std::io::Result<pipe::Receiver> {
  sys::set_nonblocking(fd.as_raw_fd())?;
  pipe::Receiver::from_owned_fd_unchecked(fd)
}

/// Reads what the pipe has once the host has room for it; `None` at end of file.
async fn read_some(output: &pipe::Receiver, io: &StreamIo) -> Option<BytesMut> {
  loop {
    let avail = io.credit().await;
    if avail == 0 {
      // Cancelled: the select's cancel branch takes over.
      std::future::pending::<()>().await;
    }
    if output.readable().await.is_err() {
      return None;
    }
    let mut buf = BytesMut::with_capacity((avail as usize).min(MAX_DATA));
    match output.try_read_buf(&mut buf) {
      Ok(0) => return None,
      Ok(_) => return Some(buf),
      Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
      Err(_) => return None,
    }
  }
}

/// Reads a pipe to its end and drops what comes.
async fn discard(output: pipe::Receiver) {
  let mut output = output;
  let mut buf = [0u8; 4096];
  while let Ok(n) = output.read(&mut buf).await {
    if n == 0 {
      break;
    }
  }
}

/// The answer for a shepherd's report.
fn finish(r: Report, user: &User, recovered: Option<String>) -> Outcome<ExecDone> {
  match r.kind {
    shepherd::EXITED => Outcome::Ok(ExecDone {
      exit_code: r.a,
      timed_out: false,
      recovered,
    }),
    shepherd::TIMED_OUT if r.a == 1 => Outcome::Ok(ExecDone {
      exit_code: TIMEOUT_EXIT_CODE,
      timed_out: true,
      recovered,
    }),
    shepherd::TIMED_OUT => Outcome::Err(AgentError::new(
      ErrorKind::KillUnverified,
      format!(
        "the command timed out and {} of its processes were still alive after 5 s of killing them",
        r.b
      ),
    )),
    shepherd::SPAWN_FAILED => {
      let err = std::io::Error::from_raw_os_error(r.b);
      let msg = match r.a {
        shepherd::STAGE_GROUPS | shepherd::STAGE_GID | shepherd::STAGE_UID => format!(
          "cannot run the command as {}: {err} (the container must keep the SETUID and SETGID capabilities for the agent)",
          user.describe()
        ),
        shepherd::STAGE_EXEC => format!("no shell to run the command (bash or sh on PATH, or /bin/sh): {err}"),
        _ => format!("cannot start the command: {err}"),
      };
      Outcome::Err(AgentError::new(ErrorKind::SpawnFailed, msg))
    }
    _ => Outcome::Err(AgentError::new(
      ErrorKind::Io,
      "the command's supervisor sent an unknown report",
    )),
  }
}
