//! One command's supervisor. The agent forks a "shepherd" per command: it stays root, becomes
//! a child subreaper, and starts the command's shell (`spawn_command`), which drops to the
//! sandbox user and execs.
//! Every process the command starts that loses its parent is reparented to the shepherd, so the
//! command's processes are exactly the shepherd's subtree in /proc, whatever they do (`setsid`,
//! double forks, `env -i`, non-dumpable). The shepherd reports how the command ended on a status
//! pipe; on a timeout, or when its control pipe closes (the request was cancelled or the agent
//! died), it kills the subtree round after round until /proc shows none of it left, and reports
//! whether that was verified.
//!
//! The shepherd is forked from a process that has other threads, so until it exits it only
//! makes system calls and touches memory prepared before the fork (no allocation, no locks).
//!
//! The shepherd's descriptors: 0 the control pipe, 1 the status pipe, 2 the command's output,
//! 3 the started pipe (`STARTED_FD`).

use std::cell::UnsafeCell;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::base::sys;

/// Status report kinds (first u32 of the 16-byte report).
pub const EXITED: u32 = 1;
pub const TIMED_OUT: u32 = 2;
pub const CANCELLED: u32 = 3;
pub const SPAWN_FAILED: u32 = 4;

/// The shepherd's end of the started pipe. The command's process writes a byte there just before
/// it execs its shell, so before any of the command's own code runs: a shepherd that dies after
/// it leaves a command that may have run. The agent reads it only when a shepherd ended without
/// a report (and empties it when it takes a shepherd back), so the byte wakes nobody: a report
/// on the status pipe would wake the agent in the middle of every command's start.
pub const STARTED_FD: libc::c_int = 3;

/// Where a spawn failed (`SPAWN_FAILED`'s first value).
pub const STAGE_FORK: i32 = 1;
pub const STAGE_GROUPS: i32 = 2;
pub const STAGE_GID: i32 = 3;
pub const STAGE_UID: i32 = 4;
pub const STAGE_EXEC: i32 = 5;
pub const STAGE_GUARD: i32 = 6;

/// How long a kill may take before it is reported unverified.
const KILL_BUDGET_NS: i64 = 5_000_000_000;

/// A report from the shepherd: `kind`, then three values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
  pub kind: u32,
  pub a: i32,
  pub b: i32,
  pub c: i32,
}

impl Report {
  pub fn parse(b: &[u8; 16]) -> Report {
    let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
    Report {
      kind: u32::from_le_bytes(word(0)),
      a: i32::from_le_bytes(word(4)),
      b: i32::from_le_bytes(word(8)),
      c: i32::from_le_bytes(word(12)),
    }
  }
}

/// Everything the shepherd and the command need, prepared before the fork.
pub struct Plan {
  /// Candidate shells in order, each with the index of its argv (0: bash, 1: sh).
  shells: Vec<(CString, usize)>,
  _argv_strings: Vec<CString>,
  argv: [[*const libc::c_char; 4]; 2],
  _env_strings: Vec<CString>,
  envp: Vec<*const libc::c_char>,
  cwd: CString,
  /// `cannot change directory to <cwd>: `, the reason then follows (see `cwd_reason`).
  cwd_message: Vec<u8>,
  /// uid, gid, supplementary groups; `None`: keep the agent's.
  ids: Option<(u32, u32, Vec<libc::gid_t>)>,
  timeout_ns: Option<i64>,
  /// The command's `oom_score_adj`, as written to /proc (empty: leave it).
  oom_score: Vec<u8>,
  /// How the command's processes are kept findable (`contain`).
  contained: crate::exec::contain::Containment,
}

impl Plan {
  /// The command's timeout from now on (what is left of it after a wait for processes).
  pub fn set_timeout_ms(&mut self, ms: u64) {
    if self.timeout_ns.is_some() {
      self.timeout_ns = Some(ms as i64 * 1_000_000);
    }
  }

  /// `env` holds the command's `NAME=value` entries; `path` its final `PATH` (searched for
  /// bash, then sh).
  pub fn new(
    command: &str,
    cwd: &str,
    env: Vec<Vec<u8>>,
    path: &[u8],
    ids: Option<(u32, u32, Vec<u32>)>,
    timeout_ms: u64,
  ) -> Result<Plan, String> {
    let c =
      |s: &str, what: &str| CString::new(s).map_err(|_| format!("{what} contains a NUL byte"));
    let mut env_strings = Vec::with_capacity(env.len());
    for entry in env {
      env_strings
        .push(CString::new(entry).map_err(|_| "an environment variable contains a NUL byte")?);
    }
    let mut shells = Vec::new();
    for (name, which) in [("bash", 0), ("sh", 1)] {
      for dir in path.split(|&b| b == b':') {
        // An empty PATH entry is the working directory, as execvp has it.
        let mut full = dir.to_vec();
        while full.len() > 1 && full.ends_with(b"/") {
          full.pop();
        }
        if !full.is_empty() && full != b"/" {
          full.push(b'/');
        }
        full.extend_from_slice(name.as_bytes());
        if let Ok(s) = CString::new(full) {
          shells.push((s, which));
        }
      }
    }
    shells.push((c("/bin/sh", "")?, 1));
    Ok(Plan::assemble(Parts {
      command: c(command, "the command")?,
      cwd: c(cwd, "the working directory")?,
      env: env_strings,
      shells,
      ids,
      timeout_ns: (timeout_ms > 0).then(|| timeout_ms as i64 * 1_000_000),
      oom_score: command_oom_score().to_vec(),
      contained: crate::exec::contain::found(),
    }))
  }

  /// The plan from its parts: the argument and environment vectors point into them.
  fn assemble(p: Parts) -> Plan {
    let fixed = |s: &CStr| s.to_owned();
    let argv_strings = vec![fixed(c"bash"), fixed(c"sh"), fixed(c"-c"), p.command];
    let argv = [
      [
        argv_strings[0].as_ptr(),
        argv_strings[2].as_ptr(),
        argv_strings[3].as_ptr(),
        std::ptr::null(),
      ],
      [
        argv_strings[1].as_ptr(),
        argv_strings[2].as_ptr(),
        argv_strings[3].as_ptr(),
        std::ptr::null(),
      ],
    ];
    let mut envp: Vec<*const libc::c_char> = p.env.iter().map(|s| s.as_ptr()).collect();
    envp.push(std::ptr::null());
    let mut cwd_message = b"cannot change directory to ".to_vec();
    cwd_message.extend_from_slice(p.cwd.as_bytes());
    cwd_message.extend_from_slice(b": ");
    Plan {
      shells: p.shells,
      _argv_strings: argv_strings,
      argv,
      _env_strings: p.env,
      envp,
      cwd: p.cwd,
      cwd_message,
      ids: p.ids,
      timeout_ns: p.timeout_ns,
      oom_score: p.oom_score,
      contained: p.contained,
    }
  }

  /// The plan as bytes, for a shepherd started before it (`spare`): `decode` reads them back.
  pub fn encode(&self) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let bytes = |out: &mut Vec<u8>, b: &[u8]| {
      out.extend_from_slice(&(b.len() as u32).to_le_bytes());
      out.extend_from_slice(b);
    };
    out.extend_from_slice(&self.timeout_ns.unwrap_or(-1).to_le_bytes());
    out.push(self.contained.bits());
    match &self.ids {
      Some((uid, gid, groups)) => {
        out.push(1);
        out.extend_from_slice(&uid.to_le_bytes());
        out.extend_from_slice(&gid.to_le_bytes());
        out.extend_from_slice(&(groups.len() as u32).to_le_bytes());
        groups
          .iter()
          .for_each(|g| out.extend_from_slice(&g.to_le_bytes()));
      }
      None => out.push(0),
    }
    bytes(&mut out, &self.oom_score);
    bytes(&mut out, self.cwd.as_bytes());
    bytes(&mut out, self._argv_strings[3].as_bytes());
    out.extend_from_slice(&(self._env_strings.len() as u32).to_le_bytes());
    self
      ._env_strings
      .iter()
      .for_each(|e| bytes(&mut out, e.as_bytes()));
    out.extend_from_slice(&(self.shells.len() as u32).to_le_bytes());
    for (path, which) in &self.shells {
      out.push(*which as u8);
      bytes(&mut out, path.as_bytes());
    }
    out
  }

  /// The plan `encode` wrote (`None`: not one).
  pub fn decode(b: &[u8]) -> Option<Plan> {
    let mut r = Reader(b);
    let timeout = i64::from_le_bytes(r.take(8)?.try_into().ok()?);
    let flags = r.u8()?;
    let ids = match r.u8()? {
      0 => None,
      1 => {
        let (uid, gid, n) = (r.u32()?, r.u32()?, r.u32()? as usize);
        let mut groups = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
          groups.push(r.u32()?);
        }
        Some((uid, gid, groups))
      }
      _ => return None,
    };
    let oom_score = r.bytes()?.to_vec();
    let cwd = r.cstring()?;
    let command = r.cstring()?;
    let mut env = Vec::new();
    for _ in 0..r.u32()? {
      env.push(r.cstring()?);
    }
    let mut shells = Vec::new();
    for _ in 0..r.u32()? {
      let which = r.u8()? as usize;
      if which > 1 {
        return None;
      }
      shells.push((r.cstring()?, which));
    }
    if !r.0.is_empty() {
      return None;
    }
    Some(Plan::assemble(Parts {
      command,
      cwd,
      env,
      shells,
      ids,
      timeout_ns: (timeout >= 0).then_some(timeout),
      oom_score,
      contained: crate::exec::contain::Containment::from_bits(flags),
    }))
  }
}

/// What a plan is made of (the rest is derived).
struct Parts {
  command: CString,
  cwd: CString,
  env: Vec<CString>,
  shells: Vec<(CString, usize)>,
  ids: Option<(u32, u32, Vec<libc::gid_t>)>,
  timeout_ns: Option<i64>,
  oom_score: Vec<u8>,
  contained: crate::exec::contain::Containment,
}

/// Reads an encoded plan front to back.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
  fn take(&mut self, n: usize) -> Option<&'a [u8]> {
    if self.0.len() < n {
      return None;
    }
    let (head, rest) = self.0.split_at(n);
    self.0 = rest;
    Some(head)
  }
  fn u8(&mut self) -> Option<u8> {
    Some(self.take(1)?[0])
  }
  fn u32(&mut self) -> Option<u32> {
    Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
  }
  fn bytes(&mut self) -> Option<&'a [u8]> {
    let n = self.u32()? as usize;
    self.take(n)
  }
  fn cstring(&mut self) -> Option<CString> {
    CString::new(self.bytes()?).ok()
  }
}

/// A started shepherd: the command's merged output, the status pipe, the control pipe
/// (dropping it kills the command), and the started pipe's read end (`STARTED_FD`).
pub struct Spawned {
  /// The shepherd's pid.
  pub pid: u32,
  pub output: OwnedFd,
  pub status: OwnedFd,
  pub control: OwnedFd,
  pub started: OwnedFd,
}

/// Whether the command's process got as far as its exec, from the started pipe's read end
/// (`Spawned::started`), which this empties: a shepherd's command writes one byte at most, and
/// the pipe is emptied before the shepherd takes another, so one non-blocking read takes all.
pub fn took_started(started: &OwnedFd) -> bool {
  let mut b = [0u8; 8];
  unsafe { libc::read(started.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) > 0 }
}

/// The started pipe: both ends non-blocking, so that a command's process never waits on it.
pub fn started_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
  let (r, w) = sys::pipe()?;
  sys::set_nonblocking(r.as_raw_fd())?;
  sys::set_nonblocking(w.as_raw_fd())?;
  Ok((r, w))
}

/// Forks a shepherd for `plan`. `EAGAIN` means the sandbox is out of processes.
pub fn spawn(plan: &Plan) -> io::Result<Spawned> {
  let (out_r, out_w) = sys::pipe_for_reading()?;
  let (st_r, st_w) = sys::pipe_for_reading()?;
  let (ctl_r, ctl_w) = sys::pipe()?;
  let (started_r, started_w) = started_pipe()?;
  let fds = [&ctl_r, &st_w, &out_w, &started_w].map(|f| f.as_raw_fd());
  let pid = unsafe { libc::fork() };
  if pid < 0 {
    return Err(io::Error::last_os_error());
  }
  if pid == 0 {
    unsafe { shepherd(plan, fds) }
  }
  drop((out_w, st_w, ctl_r, started_w));
  Ok(Spawned {
    pid: pid as u32,
    output: out_r,
    status: st_r,
    control: ctl_w,
    started: started_r,
  })
}

/// A spare's answer to a plan it could not read (the agent and it disagree: never expected).
pub fn report_spawn_failed(errno: i32) {
  report(SPAWN_FAILED, STAGE_FORK, errno, 0);
}

/// One 16-byte report on the status pipe (atomic: under PIPE_BUF).
fn report(kind: u32, a: i32, b: i32, c: i32) {
  let mut buf = [0u8; 16];
  buf[0..4].copy_from_slice(&kind.to_le_bytes());
  buf[4..8].copy_from_slice(&a.to_le_bytes());
  buf[8..12].copy_from_slice(&b.to_le_bytes());
  buf[12..16].copy_from_slice(&c.to_le_bytes());
  unsafe { libc::write(1, buf.as_ptr() as *const libc::c_void, 16) };
}

fn errno() -> i32 {
  unsafe { *libc::__errno_location() }
}

fn now_ns() -> i64 {
  let mut ts = libc::timespec {
    tv_sec: 0,
    tv_nsec: 0,
  };
  unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
  ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn sleep_ns(ns: i64) {
  let ts = libc::timespec {
    tv_sec: ns / 1_000_000_000,
    tv_nsec: ns % 1_000_000_000,
  };
  unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

extern "C" fn on_sigchld(_: libc::c_int) {}

/// Closes every descriptor from `first` up (the agent's stream, other commands' pipes …).
/// gVisor (release 20221219) has no `close_range`: there the open ones are read from
/// /proc/self/fd, as closing each possible number one call at a time costs seconds under its
/// ptrace platform.
unsafe fn close_from(first: libc::c_int) {
  if libc::syscall(
    libc::SYS_close_range,
    first as libc::c_uint,
    libc::c_uint::MAX,
    0,
  ) == 0
  {
    return;
  }
  if close_listed(first) {
    return;
  }
  let mut fd = first;
  while fd < 65536 {
    libc::close(fd);
    fd += 1;
  }
}

/// Closes the descriptors from `first` up that /proc/self/fd lists, pass after pass until one
/// finds none (a listing need not survive the closes made while it is read). False when /proc
/// cannot be read.
unsafe fn close_listed(first: libc::c_int) -> bool {
  loop {
    let dir = libc::open(
      c"/proc/self/fd".as_ptr(),
      libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if dir < 0 {
      return false;
    }
    let mut closed = 0;
    let mut dents = [0u8; 4096];
    loop {
      let got = libc::syscall(libc::SYS_getdents64, dir, dents.as_mut_ptr(), dents.len());
      if got <= 0 {
        break;
      }
      let mut off = 0usize;
      while off + 19 < got as usize {
        let reclen = u16::from_ne_bytes([dents[off + 16], dents[off + 17]]) as usize;
        if reclen == 0 {
          break;
        }
        let name = &dents[off + 19..off + reclen];
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        if let Some(fd) = parse_u32(&name[..len]) {
          let fd = fd as libc::c_int;
          if fd >= first && fd != dir {
            libc::close(fd);
            closed += 1;
          }
        }
        off += reclen;
      }
    }
    libc::close(dir);
    if closed == 0 {
      return true;
    }
  }
}

/// The shepherd's whole life (never returns). `fds`: its control, status, output and started
/// pipes, for 0-3.
unsafe fn shepherd(plan: &Plan, fds: [libc::c_int; 4]) -> ! {
  place_fds(fds);
  let complete = prepare(plan.contained, false);
  supervise(plan, complete, false);
  libc::_exit(0)
}

/// Puts the shepherd's pipes at 0-3 (0: control, EOF = kill; 1: status reports; 2: the
/// command's output; 3: the started pipe), in that order: every source is above 2 (the agent
/// keeps 0-2 open), so none is clobbered before it is copied. Async-signal-safe.
pub unsafe fn place_fds(fds: [libc::c_int; 4]) -> bool {
  for (to, &from) in fds.iter().enumerate() {
    let to = to as libc::c_int;
    // dup2 onto itself would keep close-on-exec; a spare's exec must keep this one.
    let placed = if from == to {
      libc::fcntl(to, libc::F_SETFD, 0) == 0
    } else {
      libc::dup2(from, to) == to
    };
    if !placed {
      return false;
    }
  }
  true
}

/// What a shepherd does before it knows its command, its pipes at 0-3 already: returns whether
/// a kill can be verified complete. `shares_memory`: a process it clones with `CLONE_VM` runs in
/// its memory until the exec (a spare's own start proved it), so the command's process can say
/// there why it could not exec, with no pipe made per command.
pub unsafe fn prepare(contained: crate::exec::contain::Containment, shares_memory: bool) -> bool {
  close_from(STARTED_FD + 1);
  // The command's copy closes at its exec.
  libc::fcntl(STARTED_FD, libc::F_SETFD, libc::FD_CLOEXEC);
  // Without it (gVisor, qemu-user) orphans go to init: a kill is then verified only where the
  // command's processes are kept in its session (`contain`).
  let reaper = contained.subreaper && libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
  libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);

  // SIGCHLD stays blocked except inside ppoll, so a child's exit always interrupts the wait.
  let mut chld: libc::sigset_t = std::mem::zeroed();
  libc::sigemptyset(&mut chld);
  libc::sigaddset(&mut chld, libc::SIGCHLD);
  libc::sigprocmask(libc::SIG_BLOCK, &chld, std::ptr::null_mut());
  let mut sa: libc::sigaction = std::mem::zeroed();
  sa.sa_sigaction = on_sigchld as *const () as usize;
  libc::sigemptyset(&mut sa.sa_mask);
  libc::sigaction(libc::SIGCHLD, &sa, std::ptr::null_mut());
  libc::signal(libc::SIGPIPE, libc::SIG_IGN);
  let early = &mut *EARLY.0.get();
  early.devnull = open_cloexec(c"/dev/null", libc::O_RDWR);
  early.reaper = reaper;
  early.shares_memory = shares_memory;
  if reaper {
    early.pipe_size = libc::fcntl(2, libc::F_GETPIPE_SZ);
  }
  raise_for_oom(early);
  reaper || contained.session_guard
}

/// What `prepare` opens and sets ahead of the command, so that the steps between a command's
/// request and its exec are fewer (each costs tens of microseconds under gVisor's ptrace
/// platform). Written by the shepherd before the command's process exists; that process reads
/// it in the same memory until its exec.
struct Early {
  /// /dev/null, for the command's stdin (-1: the command opens it itself).
  devnull: libc::c_int,
  /// The shepherd's own `oom_score_adj`, held open while it is raised for the command to
  /// inherit (-1: the command raises its own).
  oom_fd: libc::c_int,
  /// The value to lower it back to once the command has exec'd.
  own: [u8; 12],
  own_len: usize,
  /// The raised value, written again before a recycled shepherd's next command.
  raised: [u8; 12],
  raised_len: usize,
  /// A child subreaper: every process its command leaves behind is its child.
  reaper: bool,
  /// The output pipe's capacity as made, put back for a recycled shepherd's next command.
  pipe_size: libc::c_int,
  /// The command's process runs in the shepherd's memory until its exec (`prepare`).
  shares_memory: bool,
}

struct EarlyCell(UnsafeCell<Early>);
// Only the single-threaded shepherd and, until its exec, its command's process touch it.
unsafe impl Sync for EarlyCell {}

static EARLY: EarlyCell = EarlyCell(UnsafeCell::new(Early {
  devnull: -1,
  oom_fd: -1,
  own: [0; 12],
  own_len: 0,
  raised: [0; 12],
  raised_len: 0,
  reaper: false,
  pipe_size: 0,
  shares_memory: false,
}));

/// `open` with `O_CLOEXEC` as one system call (musl's wrapper adds an `F_SETFD`).
unsafe fn open_cloexec(path: &CStr, flags: libc::c_int) -> libc::c_int {
  libc::syscall(
    libc::SYS_openat,
    libc::AT_FDCWD,
    path.as_ptr(),
    flags | libc::O_CLOEXEC,
  ) as libc::c_int
}

/// Raises the shepherd's own `oom_score_adj` as `prefer_for_oom` would the command's, so that
/// the command inherits it; `set_score` puts it back. Only where putting it back is
/// allowed: without `CAP_SYS_RESOURCE` a process may lower its score only to the floor a
/// privileged writer set, so that is tried first. Otherwise nothing changes, and the command
/// raises its own.
unsafe fn raise_for_oom(early: &mut Early) {
  let fd = open_cloexec(c"/proc/self/oom_score_adj", libc::O_RDWR);
  if fd < 0 {
    return;
  }
  let mut own = [0u8; 12];
  let n = libc::pread(fd, own.as_mut_ptr() as *mut libc::c_void, own.len(), 0);
  let own_len = if n > 0 { n as usize } else { 0 };
  let mut raised = [0u8; 12];
  let raised_len = std::str::from_utf8(&own[..own_len])
    .ok()
    .and_then(raised_score)
    .map(|v| format_i32(v, &mut raised))
    .unwrap_or(0);
  let set = |b: &[u8]| libc::pwrite(fd, b.as_ptr() as *const libc::c_void, b.len(), 0) > 0;
  if raised_len == 0 || !set(&raised[..raised_len]) {
    libc::close(fd);
    return;
  }
  if !(set(&own[..own_len]) && set(&raised[..raised_len])) {
    set(&own[..own_len]);
    libc::close(fd);
    return;
  }
  early.oom_fd = fd;
  early.own = own;
  early.own_len = own_len;
  early.raised = raised;
  early.raised_len = raised_len;
}

/// Sets the shepherd's `oom_score_adj`, where `raise_for_oom` kept it open (only where the
/// shepherd may put it back): raised for its next command to inherit, or back to its own once
/// the command has exec'd.
unsafe fn set_score(raised: bool) {
  let early = &*EARLY.0.get();
  if early.oom_fd < 0 {
    return;
  }
  let (value, len) = if raised {
    (&early.raised, early.raised_len)
  } else {
    (&early.own, early.own_len)
  };
  libc::pwrite(early.oom_fd, value.as_ptr() as *const libc::c_void, len, 0);
}

/// `v` in decimal into `out`, without allocating; returns its length.
fn format_i32(v: i32, out: &mut [u8; 12]) -> usize {
  let mut digits = [0u8; 11];
  let mut n = v.unsigned_abs();
  let mut i = digits.len();
  loop {
    i -= 1;
    digits[i] = b'0' + (n % 10) as u8;
    n /= 10;
    if n == 0 {
      break;
    }
  }
  let mut len = 0;
  if v < 0 {
    out[0] = b'-';
    len = 1;
  }
  for &d in &digits[i..] {
    out[len] = d;
    len += 1;
  }
  len
}

/// Set in an `EXITED` report's third value: the shepherd left nothing behind and waits on its
/// control pipe for another plan (`supervise` with `recycle`), or for the pipe to close.
pub const RECYCLABLE: i32 = 1;

/// Starts the command and sees it to its end; `prepare` ran. Returns only with `recycle`, after
/// reporting `RECYCLABLE`: the command ended and left no process behind (as a subreaper the
/// shepherd would be the parent of any), so the shepherd is as it was before the command and
/// can take another. Otherwise it exits.
pub unsafe fn supervise(plan: &Plan, complete: bool, recycle: bool) {
  let mut waitmask: libc::sigset_t = std::mem::zeroed();
  libc::sigemptyset(&mut waitmask);

  let started = now_ns();
  let child = match start_command(plan) {
    (child, None) => {
      set_score(false);
      child
    }
    (child, Some((stage, code))) => {
      if child > 0 {
        let mut status = 0;
        libc::waitpid(child, &mut status, 0);
      }
      report(SPAWN_FAILED, stage, code, 0);
      libc::_exit(0);
    }
  };

  let deadline = plan.timeout_ns.map(|t| started + t);
  loop {
    loop {
      let mut status = 0;
      let r = libc::waitpid(-1, &mut status, libc::WNOHANG);
      if r <= 0 {
        break;
      }
      if r == child {
        // The command itself ended; what it left running is reparented to the agent.
        let code = if libc::WIFEXITED(status) {
          libc::WEXITSTATUS(status)
        } else if libc::WIFSIGNALED(status) {
          128 + libc::WTERMSIG(status)
        } else {
          -1
        };
        if recycle && (*EARLY.0.get()).reaper && no_children() {
          report(EXITED, code, 0, RECYCLABLE);
          set_score(true);
          reset_output();
          return;
        }
        report(EXITED, code, 0, 0);
        libc::_exit(0);
      }
    }
    let mut ts = libc::timespec {
      tv_sec: 0,
      tv_nsec: 0,
    };
    let tsp = match deadline {
      Some(d) => {
        let left = d - now_ns();
        if left <= 0 {
          let (verified, left) = kill_subtree(child as u32);
          report(TIMED_OUT, (verified && complete) as i32, left, 0);
          libc::_exit(0);
        }
        ts.tv_sec = left / 1_000_000_000;
        ts.tv_nsec = left % 1_000_000_000;
        &ts as *const libc::timespec
      }
      None => std::ptr::null(),
    };
    let mut pfd = libc::pollfd {
      fd: 0,
      events: libc::POLLIN,
      revents: 0,
    };
    let r = libc::ppoll(&mut pfd, 1, tsp, &waitmask);
    if r > 0 && pfd.revents != 0 {
      let mut b = [0u8; 16];
      let n = libc::read(0, b.as_mut_ptr() as *mut libc::c_void, b.len());
      if n <= 0 {
        let (verified, left) = kill_subtree(child as u32);
        report(CANCELLED, (verified && complete) as i32, left, 0);
        libc::_exit(0);
      }
    }
  }
}

/// The output pipe (fd 2) as the next command must find it. Its commands shared its open file
/// description: one may have left it non-blocking (Node.js leaves its stdout so), which would
/// fail the next command's writes to a full pipe, or resized it.
unsafe fn reset_output() {
  libc::fcntl(2, libc::F_SETFL, 0);
  let early = &*EARLY.0.get();
  if early.pipe_size > 0 && libc::fcntl(2, libc::F_GETPIPE_SZ) != early.pipe_size {
    libc::fcntl(2, libc::F_SETPIPE_SZ, early.pipe_size);
  }
}

/// Whether the shepherd has no child left, alive or not (those that ended are reaped here).
unsafe fn no_children() -> bool {
  loop {
    let mut status = 0;
    match libc::waitpid(-1, &mut status, libc::WNOHANG) {
      0 => return false,
      r if r > 0 => continue,
      _ => return errno() == libc::ECHILD,
    }
  }
}

/// The command's stack until its exec. The shepherd makes one command, so one stack will do.
#[repr(C, align(16))]
struct CommandStack([u8; 128 * 1024]);
static mut COMMAND_STACK: CommandStack = CommandStack([0; 128 * 1024]);

/// Where the command's process says why it could not exec: the pipe `errfd` (closed by the
/// exec), or, where it runs in the shepherd's memory until then, `failed` itself.
struct CommandStart<'a> {
  plan: &'a Plan,
  errfd: libc::c_int,
  /// (stage, errno), written by the command's process before it exits without an exec.
  failed: Option<(i32, i32)>,
}

extern "C" fn command_entry(arg: *mut libc::c_void) -> libc::c_int {
  // SAFETY: `arg` is the `CommandStart` on the shepherd's stack, which waits (CLONE_VFORK)
  // until this process has exec'd or exited.
  unsafe { command(arg as *mut CommandStart) }
}

/// Starts the command's process and waits until it has exec'd its shell or failed to: its pid
/// (or -1), and why it failed, if it did.
unsafe fn start_command(plan: &Plan) -> (libc::pid_t, Option<(i32, i32)>) {
  let mut errp = [-1 as libc::c_int; 2];
  if !(*EARLY.0.get()).shares_memory && libc::pipe2(errp.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
    return (-1, Some((STAGE_FORK, errno())));
  }
  let mut start = CommandStart {
    plan,
    errfd: errp[1],
    failed: None,
  };
  let child = spawn_command(&mut start);
  if child < 0 {
    let e = errno();
    for fd in errp.into_iter().filter(|&fd| fd >= 0) {
      libc::close(fd);
    }
    return (-1, Some((STAGE_FORK, e)));
  }
  if errp[0] < 0 {
    // Written, if at all, before the command's process exited, which the clone waited for.
    return (child, std::ptr::read_volatile(&start.failed));
  }
  libc::close(errp[1]);
  // The command writes (stage, errno) here if it could not exec; an exec closes the pipe.
  let mut err = [0u8; 8];
  let mut got = 0usize;
  while got < 8 {
    let n = libc::read(
      errp[0],
      err.as_mut_ptr().add(got) as *mut libc::c_void,
      8 - got,
    );
    if n > 0 {
      got += n as usize;
    } else if n == 0 || errno() != libc::EINTR {
      break;
    }
  }
  libc::close(errp[0]);
  let word = |i: usize| i32::from_le_bytes([err[i], err[i + 1], err[i + 2], err[i + 3]]);
  (child, (got == 8).then(|| (word(0), word(4))))
}

/// Starts the command's process as posix_spawn does (`CLONE_VM | CLONE_VFORK`): it runs in the
/// shepherd's memory, on a stack of its own, until its exec, and the shepherd waits until then.
/// A fork would copy the shepherd's address space (the agent's, as forked) only for the exec to
/// drop it, a copy that costs more the larger the agent, and far more under gVisor.
/// Until then `command` writes only its own stack, `start.failed` and the thread's errno, which
/// the shepherd sets again before it reads it.
unsafe fn spawn_command(start: &mut CommandStart) -> libc::pid_t {
  let stack = std::ptr::addr_of_mut!(COMMAND_STACK) as *mut u8;
  let top = stack.add(std::mem::size_of::<CommandStack>());
  libc::clone(
    command_entry,
    top as *mut libc::c_void,
    libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
    start as *mut CommandStart as *mut libc::c_void,
  )
}

/// The command's process (never returns): drop to the user, enter the directory, exec a shell.
unsafe fn command(start: *mut CommandStart) -> ! {
  let plan = (*start).plan;
  let errfd = (*start).errfd;
  let fail = |stage: i32, code: i32| -> ! {
    if errfd >= 0 {
      let mut b = [0u8; 8];
      b[0..4].copy_from_slice(&stage.to_le_bytes());
      b[4..8].copy_from_slice(&code.to_le_bytes());
      libc::write(errfd, b.as_ptr() as *const libc::c_void, 8);
    } else {
      std::ptr::write_volatile(&mut (*start).failed, Some((stage, code)));
    }
    libc::_exit(127);
  };
  let early = &*EARLY.0.get();
  let mut none: libc::sigset_t = std::mem::zeroed();
  libc::sigemptyset(&mut none);
  libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
  // Ignored signals stay ignored across exec: the command gets the defaults.
  libc::signal(libc::SIGPIPE, libc::SIG_DFL);
  libc::signal(libc::SIGCHLD, libc::SIG_DFL);
  libc::setsid();
  // From here on nothing this process starts can leave the session just made; a guard that
  // cannot be installed fails the command rather than run it beyond the timeout's reach.
  if plan.contained.session_guard && !crate::exec::contain::guard_session() {
    fail(STAGE_GUARD, errno());
  }
  if early.devnull >= 0 {
    // The copy at 0 is not close-on-exec; the shepherd's own is.
    libc::dup2(early.devnull, 0);
  } else {
    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    if null >= 0 {
      libc::dup2(null, 0);
      if null > 2 {
        libc::close(null);
      }
    } else {
      libc::close(0);
    }
  }
  // stdout and stderr share one pipe, so the output keeps its true order.
  libc::dup2(2, 1);
  // Before the user switch: this process is not dumpable, so its /proc files stay root's.
  // Inherited already when the shepherd raised its own.
  if early.oom_fd < 0 {
    prefer_for_oom(&plan.oom_score);
  }
  if let Some((uid, gid, groups)) = &plan.ids {
    // Raw system calls: this process has one thread, and libc's wrappers may expect others.
    if libc::syscall(
      libc::SYS_setgroups,
      groups.len() as libc::c_long,
      groups.as_ptr(),
    ) != 0
    {
      fail(STAGE_GROUPS, errno());
    }
    let g = *gid as libc::c_long;
    if libc::syscall(libc::SYS_setresgid, g, g, g) != 0 {
      fail(STAGE_GID, errno());
    }
    let u = *uid as libc::c_long;
    if libc::syscall(libc::SYS_setresuid, u, u, u) != 0 {
      fail(STAGE_UID, errno());
    }
  }
  if libc::chdir(plan.cwd.as_ptr()) != 0 {
    let reason = cwd_reason(errno());
    for part in [&plan.cwd_message[..], reason.as_bytes(), b"\n"] {
      libc::write(1, part.as_ptr() as *const libc::c_void, part.len());
    }
    libc::_exit(1);
  }
  libc::write(STARTED_FD, b"s".as_ptr() as *const libc::c_void, 1);
  let mut last = libc::ENOENT;
  let mut denied = false;
  for (path, which) in &plan.shells {
    libc::execve(
      path.as_ptr(),
      plan.argv[*which].as_ptr(),
      plan.envp.as_ptr(),
    );
    last = errno();
    denied |= last == libc::EACCES;
  }
  fail(STAGE_EXEC, if denied { libc::EACCES } else { last });
}

/// Why the working directory could not be entered, for the command's output.
fn cwd_reason(errno: i32) -> &'static str {
  match errno {
    libc::ENOENT => "no such directory",
    libc::ENOTDIR => "not a directory (it, or a parent, is a file)",
    libc::EACCES | libc::EPERM => "permission denied (the user may not enter it)",
    libc::ELOOP => "too many levels of symbolic links",
    libc::ENAMETOOLONG => "a name in the path is too long",
    _ => "the system refused it",
  }
}

/// How much a command's `oom_score_adj` is raised over the agent's.
const OOM_PREFER: i32 = 500;

/// The `oom_score_adj` commands get: the agent's own (read once) raised by `OOM_PREFER`.
fn command_oom_score() -> &'static [u8] {
  static SCORE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
  SCORE.get_or_init(|| {
    std::fs::read_to_string("/proc/self/oom_score_adj")
      .ok()
      .and_then(|own| raised(&own))
      .unwrap_or_default()
      .into_bytes()
  })
}

/// `own` (as /proc shows it) raised by `OOM_PREFER`, at most 1000.
fn raised(own: &str) -> Option<String> {
  raised_score(own).map(|v| v.to_string())
}

/// `raised`, as a number (no allocation: the shepherd's `raise_for_oom` uses it too).
fn raised_score(own: &str) -> Option<i32> {
  let own: i32 = own.trim().parse().ok()?;
  Some((own + OOM_PREFER).min(1000))
}

/// Makes the command (and what it starts) the OOM killer's first choice in the container, ahead
/// of the container's init and the agent: a memory bomb then takes the workload, and the kernel's
/// next pick, when it kills again while its first victim is still exiting, is the workload too,
/// not the init (which would stop the sandbox). Raising is allowed without privilege; a failure
/// leaves the value as it was.
unsafe fn prefer_for_oom(score: &[u8]) {
  if score.is_empty() {
    return;
  }
  let fd = libc::open(
    c"/proc/self/oom_score_adj".as_ptr(),
    libc::O_WRONLY | libc::O_CLOEXEC,
  );
  if fd >= 0 {
    libc::write(fd, score.as_ptr() as *const libc::c_void, score.len());
    libc::close(fd);
  }
}

// ---- Killing the subtree (runs in the shepherd: fixed buffers, no allocation) ----

const MAX_PROCS: usize = 65536;
/// Linux's PID_MAX_LIMIT.
const MAX_PID: usize = 1 << 22;

/// (pid, ppid, session, state) of one process.
type ProcEntry = (u32, u32, u32, u8);

struct ScanBuf {
  procs: [ProcEntry; MAX_PROCS],
  marks: [u64; MAX_PID / 64],
}

struct ScanCell(UnsafeCell<ScanBuf>);
// Only the single-threaded shepherd ever touches it (its own copy after the fork).
unsafe impl Sync for ScanCell {}

static SCAN: ScanCell = ScanCell(UnsafeCell::new(ScanBuf {
  procs: [(0, 0, 0, 0); MAX_PROCS],
  marks: [0; MAX_PID / 64],
}));

/// Kills the shepherd's whole subtree (and anything still in the command's session, `sid`)
/// until /proc shows none of it alive. Returns (none left, processes still alive when it gave
/// up).
unsafe fn kill_subtree(sid: u32) -> (bool, i32) {
  let me = libc::getpid() as u32;
  let start = now_ns();
  let mut round = 0;
  loop {
    reap();
    let alive = kill_round(me, sid);
    if alive == 0 {
      reap();
      return (true, 0);
    }
    if now_ns() - start > KILL_BUDGET_NS {
      return (false, alive as i32);
    }
    // Killed processes take a moment to die and be reparented; their children are next.
    sleep_ns((200_000i64 << round.min(6)).min(20_000_000));
    round += 1;
  }
}

unsafe fn reap() {
  loop {
    let mut status = 0;
    if libc::waitpid(-1, &mut status, libc::WNOHANG) <= 0 {
      break;
    }
  }
}

/// One pass: reads every process's parent from /proc, marks the subtree under `me` (and the
/// command's session `sid`, which catches orphans even where `me` is no subreaper), and
/// SIGKILLs each live member. Returns how many were alive.
unsafe fn kill_round(me: u32, sid: u32) -> usize {
  let buf = &mut *SCAN.0.get();
  let n = scan_proc(&mut buf.procs);
  let procs = &buf.procs[..n];
  let mark = |marks: &mut [u64], pid: u32| marks[pid as usize / 64] |= 1 << (pid % 64);
  let marked = |marks: &[u64], pid: u32| marks[pid as usize / 64] & (1 << (pid % 64)) != 0;
  mark(&mut buf.marks, me);
  for &(pid, _, session, _) in procs {
    if session == sid {
      mark(&mut buf.marks, pid);
    }
  }
  loop {
    let mut changed = false;
    for &(pid, ppid, _, _) in procs {
      if !marked(&buf.marks, pid) && marked(&buf.marks, ppid) {
        mark(&mut buf.marks, pid);
        changed = true;
      }
    }
    if !changed {
      break;
    }
  }
  let mut alive = 0;
  for &(pid, _, _, state) in procs {
    if pid != me && marked(&buf.marks, pid) && state != b'Z' && state != b'X' {
      libc::kill(pid as libc::pid_t, libc::SIGKILL);
      alive += 1;
    }
  }
  for &(pid, _, _, _) in procs {
    buf.marks[pid as usize / 64] = 0;
  }
  buf.marks[me as usize / 64] = 0;
  alive
}

/// Fills `out` with every process in /proc; returns how many.
unsafe fn scan_proc(out: &mut [ProcEntry]) -> usize {
  let dir = libc::open(
    c"/proc".as_ptr(),
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
  );
  if dir < 0 {
    return 0;
  }
  let mut n = 0;
  let mut dents = [0u8; 8192];
  loop {
    let got = libc::syscall(libc::SYS_getdents64, dir, dents.as_mut_ptr(), dents.len());
    if got <= 0 {
      break;
    }
    let mut off = 0usize;
    while off + 19 < got as usize {
      let reclen = u16::from_ne_bytes([dents[off + 16], dents[off + 17]]) as usize;
      if reclen == 0 {
        break;
      }
      let name = &dents[off + 19..off + reclen];
      let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
      if let Some(pid) = parse_u32(&name[..len]) {
        if n < out.len() {
          if let Some((ppid, sid, state)) = read_stat(&name[..len]) {
            if pid < MAX_PID as u32 && ppid < MAX_PID as u32 {
              out[n] = (pid, ppid, sid, state);
              n += 1;
            }
          }
        }
      }
      off += reclen;
    }
  }
  libc::close(dir);
  n
}

fn parse_u32(s: &[u8]) -> Option<u32> {
  if s.is_empty() || s.len() > 9 {
    return None;
  }
  let mut v = 0u32;
  for &b in s {
    if !b.is_ascii_digit() {
      return None;
    }
    v = v * 10 + (b - b'0') as u32;
  }
  Some(v)
}

/// (ppid, session, state) from /proc/<pid>/stat: "pid (comm) S ppid pgrp session …", where
/// comm may hold anything, so the fields are read after the last ')'.
unsafe fn read_stat(pid: &[u8]) -> Option<(u32, u32, u8)> {
  let mut path = [0u8; 32];
  let prefix = b"/proc/";
  let suffix = b"/stat\0";
  if prefix.len() + pid.len() + suffix.len() > path.len() {
    return None;
  }
  path[..prefix.len()].copy_from_slice(prefix);
  path[prefix.len()..prefix.len() + pid.len()].copy_from_slice(pid);
  path[prefix.len() + pid.len()..prefix.len() + pid.len() + suffix.len()].copy_from_slice(suffix);
  let fd = libc::open(
    CStr::from_bytes_until_nul(&path).ok()?.as_ptr(),
    libc::O_RDONLY | libc::O_CLOEXEC,
  );
  if fd < 0 {
    return None;
  }
  let mut buf = [0u8; 512];
  let n = libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len());
  libc::close(fd);
  if n <= 0 {
    return None;
  }
  let text = &buf[..n as usize];
  let close = text.iter().rposition(|&b| b == b')')?;
  let rest = text.get(close + 2..)?;
  let state = *rest.first()?;
  let mut fields = rest.get(2..)?.split(|&b| b == b' ');
  let ppid = parse_u32(fields.next()?)?;
  let _pgrp = fields.next()?;
  let sid = parse_u32(fields.next()?)?;
  Some((ppid, sid, state))
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn working_directory_failures_say_why() {
    assert_eq!(cwd_reason(libc::ENOENT), "no such directory");
    assert!(cwd_reason(libc::ENOTDIR).starts_with("not a directory"));
    assert!(cwd_reason(libc::EACCES).starts_with("permission denied"));
    assert_eq!(cwd_reason(libc::EIO), "the system refused it");
  }

  #[test]
  fn scores_are_written_in_decimal() {
    for v in [0, 7, 500, 1000, -5, -1000, i32::MIN, i32::MAX] {
      let mut out = [0u8; 12];
      let n = format_i32(v, &mut out);
      assert_eq!(std::str::from_utf8(&out[..n]).unwrap(), v.to_string());
    }
  }

  #[test]
  fn oom_scores_are_raised_and_capped() {
    assert_eq!(raised("0\n").as_deref(), Some("500"));
    assert_eq!(raised("-999\n").as_deref(), Some("-499"));
    assert_eq!(raised("700").as_deref(), Some("1000"));
    assert_eq!(raised(""), None);
  }

  #[test]
  fn reports_round_trip() {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&TIMED_OUT.to_le_bytes());
    b[4..8].copy_from_slice(&1i32.to_le_bytes());
    b[8..12].copy_from_slice(&(-3i32).to_le_bytes());
    assert_eq!(
      Report::parse(&b),
      Report {
        kind: TIMED_OUT,
        a: 1,
        b: -3,
        c: 0
      }
    );
  }

  #[test]
  fn stat_lines_with_odd_names_parse() {
    let me = std::process::id().to_string();
    let (ppid, sid, state) = unsafe { read_stat(me.as_bytes()) }.unwrap();
    assert_eq!(ppid, std::os::unix::process::parent_id());
    assert_eq!(sid, unsafe { libc::getsid(0) } as u32);
    assert!(state.is_ascii_uppercase());
    assert_eq!(parse_u32(b"123"), Some(123));
    assert_eq!(parse_u32(b"self"), None);
  }

  #[test]
  fn plans_travel_to_a_spare_whole() {
    let env = vec![b"A=1".to_vec(), b"PATH=/x:/y".to_vec()];
    let p = Plan::new(
      "echo hi",
      "/w",
      env,
      b"/x:/y",
      Some((5, 6, vec![7, 8])),
      1500,
    )
    .unwrap();
    let back = Plan::decode(&p.encode()).unwrap();
    assert_eq!(back.encode(), p.encode());
    assert_eq!(back.shells, p.shells);
    assert_eq!(back._argv_strings, p._argv_strings);
    assert_eq!(back._env_strings, p._env_strings);
    assert_eq!(
      (back.cwd.clone(), back.cwd_message.clone()),
      (p.cwd.clone(), p.cwd_message.clone())
    );
    assert_eq!(back.ids, Some((5, 6, vec![7, 8])));
    assert_eq!(back.timeout_ns, Some(1_500_000_000));
    assert_eq!(back.oom_score, p.oom_score);
    assert_eq!(back.contained, p.contained);
    for bits in 0..4 {
      assert_eq!(
        crate::exec::contain::Containment::from_bits(bits).bits(),
        bits
      );
    }
    // The pointer vectors point into the decoded plan's own strings.
    assert_eq!(unsafe { CStr::from_ptr(back.argv[1][2]) }, c"echo hi");
    assert_eq!(unsafe { CStr::from_ptr(back.envp[1]) }, c"PATH=/x:/y");
    assert!(back.envp[2].is_null());
    let none = Plan::new("true", "/", vec![], b"", None, 0).unwrap();
    let back = Plan::decode(&none.encode()).unwrap();
    assert_eq!((back.ids, back.timeout_ns), (None, None));
    // Cut short, or with bytes over: not a plan.
    let bytes = p.encode();
    assert!(Plan::decode(&bytes[..bytes.len() - 1]).is_none());
    assert!(Plan::decode(&[bytes.clone(), vec![0]].concat()).is_none());
    assert!(Plan::decode(&[]).is_none());
  }

  #[test]
  fn plans_search_path_for_bash_then_sh() {
    let p = Plan::new("true", "/", vec![], b"/a:/b/", None, 0).unwrap();
    let names: Vec<_> = p
      .shells
      .iter()
      .map(|(s, w)| (s.to_str().unwrap().to_string(), *w))
      .collect();
    assert_eq!(
      names,
      vec![
        ("/a/bash".to_string(), 0),
        ("/b/bash".to_string(), 0),
        ("/a/sh".to_string(), 1),
        ("/b/sh".to_string(), 1),
        ("/bin/sh".to_string(), 1),
      ]
    );
    assert!(Plan::new("a\0b", "/", vec![], b"", None, 0).is_err());
    assert!(Plan::new("x", "/", vec![b"A=\0".to_vec()], b"", None, 0).is_err());
  }
}
