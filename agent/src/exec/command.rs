//! Commands: the environment and user they run with, their shepherd (see `shepherd`), their
//! output streamed under the host's credit, and the recovery of a sandbox out of processes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use trueforge_agent_proto::frame::MAX_DATA;
use trueforge_agent_proto::msg::{
  AgentError, ErrorKind, ExecDone, ExecSpec, Outcome, BIN_DIR, DEFAULT_PATH, TIMEOUT_EXIT_CODE,
};

use crate::base::conn::StreamIo;
use crate::base::sys;
use crate::base::users::User;
use crate::exec::shepherd::{self, Plan, Report};
use crate::exec::{recover, spare};
use crate::state::ctx::Ctx;
use crate::state::procs::Recovery;

/// The longest a command waits for processes that running commands hold (and never past its
/// own timeout, which the wait counts against).
const PIDS_WAIT: Duration = Duration::from_secs(30);
/// The longest pause between tries while waiting for processes (a reaped child wakes one
/// waiter at once).
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Runs one command to its end and answers its stream (nothing when the host cancelled it).
pub async fn run(ctx: Rc<Ctx>, spec: ExecSpec, mut io: StreamIo) {
  // Cancelled before it started: read together with its request by an agent that was stopped
  // while the host gave the call up. The caller was told it may not have run; it does not.
  if io.cancelled() {
    return;
  }
  ctx.running.set(ctx.running.get() + 1);
  ctx.activity.command_started();
  let mut after = Aftermath::default();
  let outcome = run_inner(&ctx, spec, &io, &mut after).await;
  ctx.running.set(ctx.running.get() - 1);
  if let Some(o) = outcome {
    io.result(&o);
  }
  if after.due() {
    // Queued behind the writer, which the answer just woke: the answer leaves first.
    tokio::task::spawn_local(async move { after.settle() });
  }
}

/// What a command's answer need not wait for: closing its pipes (a deregistration and a
/// close each, tens of microseconds apiece under gVisor).
#[derive(Default)]
struct Aftermath {
  pipes: Vec<pipe::Receiver>,
  control: Option<OwnedFd>,
}

impl Aftermath {
  fn due(&self) -> bool {
    self.control.is_some() || !self.pipes.is_empty()
  }

  fn settle(self) {
    drop(self.pipes);
    drop(self.control);
  }
}

/// Starts the command, waiting while the sandbox is out of processes: what no running command
/// owns is killed (see `recover`); what running commands own is waited for, within the
/// command's own timeout and `PIDS_WAIT`.
async fn run_inner(
  ctx: &Ctx,
  spec: ExecSpec,
  io: &StreamIo,
  after: &mut Aftermath,
) -> Option<Outcome<ExecDone>> {
  let user = match ctx.users.resolve(spec.user.as_deref()) {
    Ok(u) => u,
    Err(e) => return Some(Outcome::Err(AgentError::new(ErrorKind::UnknownUser, e))),
  };
  let mut plan = match plan(ctx, &spec, &user) {
    Ok(p) => p,
    Err(e) => return Some(Outcome::Err(AgentError::new(ErrorKind::InvalidRequest, e))),
  };
  let timeout = (spec.timeout_ms > 0).then(|| Duration::from_millis(spec.timeout_ms));
  let budget = timeout.map_or(PIDS_WAIT, |t| t.min(PIDS_WAIT));
  let began = Instant::now();
  let mut recovered = None;
  let mut pause = Duration::from_millis(5);
  loop {
    if let Some(t) = timeout {
      plan.set_timeout_ms(t.saturating_sub(began.elapsed()).as_millis().max(1) as u64);
    }
    match start(ctx, &plan, io, after).await {
      Start::Reported(r) => return Some(finish(r, &user, recovered)),
      Start::Done(o) => return o,
      Start::OutOfProcesses => {}
    }
    // A spare shepherd waiting holds a process: it goes first.
    if spare::spares().release() {
      continue;
    }
    let r = recover::recover(&ctx.procs, &user).await;
    if r.killed > 0 {
      recovered = Some(recover::note(&user, r.killed));
    }
    let waited = began.elapsed();
    if waited >= budget || r.killed + r.owned == 0 {
      return Some(Outcome::Err(out_of_processes(&user, r, waited)));
    }
    if r.killed > 0 {
      continue;
    }
    // A reaped child (a command that ended) wakes one waiter at once.
    ctx.procs.until_reaped(pause.min(budget - waited)).await;
    pause = (pause * 2).min(MAX_PAUSE);
    sys::reap_all();
  }
}

/// How one start went.
enum Start {
  Reported(Report),
  /// Answered (or cancelled: `None`) without a report to read.
  Done(Option<Outcome<ExecDone>>),
  /// A fork failed with `EAGAIN`: the pids cgroup is full.
  OutOfProcesses,
}

/// Starts a shepherd (a spare one, else forked) and drives the command, its shepherd counted
/// as a running command's while it runs (a recovery spares its processes).
async fn start(ctx: &Ctx, plan: &Plan, io: &StreamIo, after: &mut Aftermath) -> Start {
  let spawned = match spare::spares().take(plan).await {
    Some(sp) => Ok(sp),
    None => shepherd::spawn(plan),
  };
  let sp = match spawned {
    Ok(sp) => sp,
    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Start::OutOfProcesses,
    Err(e) => {
      return Start::Done(Some(Outcome::Err(AgentError::new(
        ErrorKind::SpawnFailed,
        format!("cannot start the command: {e}"),
      ))))
    }
  };
  let pid = sp.pid;
  ctx.procs.running(pid);
  let driven = drive(sp, io, after).await;
  // Before the answer: in a loop of commands the next comes moments after it, and should find
  // the spare started (asked for later, it forked a fifth of a loop's commands under gVisor).
  spare::spares().want();
  ctx.procs.ended(pid);
  match driven {
    Driven::Cancelled => Start::Done(None),
    Driven::Lost { started } => Start::Done(Some(Outcome::Err(lost(started)))),
    Driven::Reported(r) if r.kind == shepherd::SPAWN_FAILED && r.b == libc::EAGAIN => {
      // Tried again, maybe many times while processes are short: each try's pipes go now.
      after.pipes.clear();
      Start::OutOfProcesses
    }
    Driven::Reported(r) => Start::Reported(r),
  }
}

/// Why a command could not start for lack of processes.
fn out_of_processes(user: &User, r: Recovery, waited: Duration) -> AgentError {
  let msg = if r.owned > 0 {
    format!(
      "the sandbox is out of processes: {} of them belong to commands still running, and not enough ended in the {:.1} s this command waited (the agent kills only processes that no running command owns); run fewer commands at once, wait for them, or raise resources.pidsLimit",
      r.owned,
      waited.as_secs_f64()
    )
  } else {
    format!(
      "the sandbox is out of processes, and none the agent may kill for it is left (what holds them belongs to the container's init, its main process, the agent or another user than {}); restart the sandbox or raise resources.pidsLimit",
      user.describe()
    )
  };
  AgentError::new(ErrorKind::OutOfProcesses, msg)
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
  // The shell is searched for in the caller's PATH: BIN_DIR holds only the agent's own tools,
  // and trying it first would cost two failed execs per command.
  Plan::new(
    &spec.command,
    &spec.cwd,
    entries,
    &given_path,
    ids,
    spec.timeout_ms,
  )
}

enum Driven {
  Reported(Report),
  /// The shepherd ended without a report; `started`: after it said the command started.
  Lost {
    started: bool,
  },
  Cancelled,
}

/// The error for a shepherd that ended without saying how the command ended (something killed
/// it: the command itself can, when it runs as root).
fn lost(started: bool) -> AgentError {
  let msg = if started {
    "the command started, then its supervisor died before it could report how the command ended (was it killed, perhaps by the command itself?); the command may or may not have run to its end: check its effects before running it again"
  } else {
    "the command's supervisor died before it could confirm that the command started (was it killed?); the command may or may not have run: check its effects before running it again"
  };
  AgentError::new(ErrorKind::SupervisorLost, msg)
}

/// Streams the command's output until the shepherd reports, then what the command wrote before
/// it ended. Output written later by processes it left behind is read and dropped, so they
/// never block on a full pipe or die of SIGPIPE.
async fn drive(sp: shepherd::Spawned, io: &StreamIo, after: &mut Aftermath) -> Driven {
  let shepherd::Spawned {
    pid,
    output,
    status,
    control,
    started,
  } = sp;
  let (Ok(output), Ok(mut status)) = (receiver(output), receiver(status)) else {
    return Driven::Lost { started: false };
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
  let rest = if open {
    read_rest(&output, io).await
  } else {
    Rest::Ended
  };
  open = rest != Rest::Ended;
  let drained = rest == Rest::Drained;
  let recyclable = |r: &Report| r.kind == shepherd::EXITED && r.c == shepherd::RECYCLABLE;
  if let Some(r) = reported.filter(|r| drained && recyclable(r)) {
    // The shepherd waits for another plan on the same pipes (none of which another process
    // holds: the command left none behind).
    if let (Ok(output), Ok(status)) = (output.into_nonblocking_fd(), status.into_nonblocking_fd()) {
      // Emptied for its next command's byte.
      shepherd::took_started(&started);
      spare::spares().recycle(shepherd::Spawned {
        pid,
        output,
        status,
        control,
        started,
      });
    }
    return Driven::Reported(r);
  }
  if open {
    tokio::task::spawn_local(discard(output));
  } else {
    after.pipes.push(output);
  }
  after.pipes.push(status);
  after.control = Some(control);
  match reported {
    Some(r) => Driven::Reported(r),
    None if io.cancelled() => Driven::Cancelled,
    None => Driven::Lost {
      started: shepherd::took_started(&started),
    },
  }
}

/// How reading what a command left in its pipe ended.
#[derive(PartialEq, Eq)]
enum Rest {
  /// Read to its end for now: nothing of this command is left in it.
  Drained,
  /// The pipe's end: no process holds it any more.
  Ended,
  /// Stopped with bytes maybe left: the call was cancelled, or the host gave no credit.
  Stopped,
}

/// Reads what the command wrote before it ended, within the host's credit. Most commands left
/// little or nothing there: that is read onto the stack, with no buffer allocated for it
/// (mapped and unmapped by the allocator) and no question how much the pipe holds.
async fn read_rest(output: &pipe::Receiver, io: &StreamIo) -> Rest {
  let mut small = [0u8; SMALL_READ];
  let mut large = false;
  loop {
    let avail = tokio::select! {
      biased;
      _ = io.until_cancelled() => return Rest::Stopped,
      n = io.credit() => n,
    };
    if avail == 0 {
      return Rest::Stopped;
    }
    let read = if large {
      let mut buf = BytesMut::with_capacity(chunk_room(output, avail));
      read_now(output, &mut buf).inspect(|&n| {
        if n > 0 {
          io.send_now(buf.freeze())
        }
      })
    } else {
      let want = SMALL_READ.min(avail as usize);
      read_into(output, &mut small[..want]).inspect(|&n| {
        large = n == want;
        if n > 0 {
          io.send_now(Bytes::copy_from_slice(&small[..n]))
        }
      })
    };
    match read {
      Ok(0) => return Rest::Ended,
      Ok(_) => {}
      Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Rest::Drained,
      Err(_) => return Rest::Ended,
    }
  }
}

/// The first reads of what a command left in its pipe go onto the stack, this much at a time.
const SMALL_READ: usize = 4096;

/// `read_now` into a slice.
fn read_into(output: &pipe::Receiver, buf: &mut [u8]) -> std::io::Result<usize> {
  // SAFETY: `buf` is writable for its length.
  unsafe { read_raw(output, buf.as_mut_ptr(), buf.len()) }
}

/// Reads what the pipe holds now, asking the system itself: the runtime's readiness for the pipe
/// may not have caught up with data written just before the command ended (under gVisor it
/// often had not, and whole outputs were lost), and `try_read_buf` trusts it.
fn read_now(output: &pipe::Receiver, buf: &mut BytesMut) -> std::io::Result<usize> {
  let spare = buf.spare_capacity_mut();
  // SAFETY: the spare capacity is writable for its length, and `read` initializes what it
  // reports.
  let n = unsafe { read_raw(output, spare.as_mut_ptr() as *mut u8, spare.len())? };
  unsafe { buf.set_len(buf.len() + n) };
  Ok(n)
}

/// One `read` of the pipe into `len` bytes at `to`.
unsafe fn read_raw(output: &pipe::Receiver, to: *mut u8, len: usize) -> std::io::Result<usize> {
  let n = libc::read(output.as_raw_fd(), to as *mut libc::c_void, len);
  if n < 0 {
    return Err(std::io::Error::last_os_error());
  }
  Ok(n as usize)
}

/// Room for the next read: what the pipe holds (at least a small block, which also sees its end),
/// within the host's credit and a frame. A buffer of the frame's size every time would be mapped
/// and unmapped by the allocator per read, and per command, with a flush of every thread's TLB.
fn chunk_room(output: &pipe::Receiver, credit: u64) -> usize {
  const SMALL: usize = 4096;
  let held = sys::unread(output.as_raw_fd()).unwrap_or(MAX_DATA);
  held.clamp(SMALL, MAX_DATA).min(credit as usize)
}

/// A shepherd's pipe, made non-blocking where it was made (`sys::pipe_for_reading`).
fn receiver(fd: OwnedFd) -> std::io::Result<pipe::Receiver> {
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
    let mut buf = BytesMut::with_capacity(chunk_room(output, avail));
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
    shepherd::TIMED_OUT if r.b == 0 => Outcome::Err(AgentError::new(
      ErrorKind::KillUnverified,
      "the command timed out and every process of it that could be found was killed, but this system lets a process leave the command's reach (no child subreaper and no session guard, as under qemu-user), so processes it started may still run",
    )),
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
        shepherd::STAGE_GUARD => format!("cannot keep the command's processes within reach of its timeout (seccomp filter refused: {err}); it was not run"),
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
