//! A shepherd started before its command. Forking the agent for each command copies the
//! agent's address space (a cost that grows with the agent, and is far larger under gVisor),
//! and the agent then pays copy-on-write faults on every page it touches while the shepherd
//! lives. So a thread of the agent keeps one shepherd ready: a fresh process of the agent's own
//! binary (`shepherd`, spawned as `posix_spawn` does, which copies nothing), its pipes in
//! place and its set-up done. A command takes it and sends it its plan, and the thread starts
//! the next one at once, beside the command, so that it is ready when the next command of a
//! loop comes: a spare takes about 0.5 ms to start on runc and 9 ms under gVisor's ptrace
//! platform, longer than the gap between two commands. A command that finds the next spare on
//! its way waits for it (at most about three times as long as one takes to start) rather than fork.
//! Where spares are that slow to start, one started beside a command also slows it: there, when
//! the spare was ready at once (commands come with gaps), the next starts as the command ends.
//! When none is ready or on its way (a burst, a plan too large for the pipe, a sandbox out of
//! processes), the command forks its shepherd as before: the two behave alike.
//!
//! A spare whose command ended and left no process behind (as a child subreaper it would be
//! the parent of any) is as it was before that command, so it waits for the next plan on the
//! same pipes (`recycle`): a loop of commands then neither starts a spare nor ends a shepherd
//! per command, which was most of the sandbox's CPU time for a short command (an exec of the
//! agent's binary, and an exit whose unmapping interrupts the other CPUs). Up to `POOL` wait.

use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::base::sys;
use crate::exec::contain::Containment;
use crate::exec::shepherd::{self, Plan, Spawned};

/// The argument that makes the agent's binary a spare shepherd.
pub const ARG: &str = "shepherd";

/// A plan must fit the pipe's default 64 KiB at once, with its length before it: the agent
/// never waits on a spare.
const MAX_PLAN: usize = 60 * 1024;

/// After a sandbox ran out of processes, how long no spare is kept (each holds a process).
const PRESSURE_PAUSE: Duration = Duration::from_secs(5);

/// A spare that takes longer than this to start (gVisor's ptrace platform: about 9 ms; runc:
/// 0.5 ms) is started after a command rather than beside it, when commands come with gaps.
const SLOW_SPAWN: Duration = Duration::from_millis(2);

/// A command waits for the spare on its way at most this many times as long as spares take to
/// start (smoothed): a start takes from the agent's request to the spare's exec, and varies
/// (most under gVisor, where forking the agent instead costs several times as much).
const WAIT_FACTOR: u32 = 3;

/// At most this many shepherds wait for a plan. The last one back is taken first, so a loop
/// of commands runs under one shepherd throughout, while the one started beside its first
/// command waits for a command that comes while that one is busy; neither starts or ends again.
const POOL: usize = 2;

/// How long a command waits for a spare on its way before the first one has been timed.
const FIRST_WAIT: Duration = Duration::from_millis(50);

/// The agent's spare shepherds.
pub struct Spares {
  st: Mutex<St>,
  wake: Condvar,
  /// A spare became ready (for a command waiting on one on its way).
  ready: Notify,
}

#[derive(Default)]
struct St {
  /// Spares waiting for a plan, the last recycled at the end (`POOL` at most).
  ready: Vec<Spawned>,
  wanted: bool,
  /// A spare is being started.
  making: bool,
  /// A command waits for the spare being started.
  awaited: bool,
  /// How long a spare takes to start, smoothed over the last few.
  spawn_time: Option<Duration>,
  paused_until: Option<Instant>,
  /// No thread to start them: every command forks its shepherd.
  off: bool,
}

impl St {
  fn paused(&self) -> bool {
    self.off || self.paused_until.is_some_and(|t| Instant::now() < t)
  }

  fn slow(&self) -> bool {
    self.spawn_time.is_some_and(|t| t > SLOW_SPAWN)
  }
}

/// The agent's spares (their thread starts on first use, after `contain::init`).
/// `TRUEFORGE_AGENT_NO_SPARE=1`: none, every command forks its shepherd (for its tests).
pub fn spares() -> &'static Spares {
  static SPARES: OnceLock<Arc<Spares>> = OnceLock::new();
  SPARES.get_or_init(|| {
    let s = Arc::new(Spares {
      st: Mutex::new(St::default()),
      wake: Condvar::new(),
      ready: Notify::new(),
    });
    if std::env::var_os("TRUEFORGE_AGENT_NO_SPARE").is_some_and(|v| v == "1") {
      s.st.lock().expect("spares").off = true;
      return s;
    }
    let maker = s.clone();
    // Unnamed, so it keeps the agent's command name: a spare it starts carries that name until
    // its exec, and a recovery (`recover`) knows it for the agent's own by it (its /proc link
    // is hidden then, as the agent is not dumpable) instead of killing it as a leftover.
    let started = std::thread::Builder::new()
      .stack_size(256 * 1024)
      .spawn(move || maker.make_loop());
    if started.is_err() {
      // No thread, no spares: every command forks its shepherd.
      s.st.lock().expect("spares").off = true;
    }
    s
  })
}

impl Spares {
  /// A shepherd running `plan`: the ready spare, or the one on its way. None: fork one.
  pub async fn take(&self, plan: &Plan) -> Option<Spawned> {
    let body = plan.encode();
    if body.len() > MAX_PLAN {
      return None;
    }
    let wait = {
      let mut st = self.st.lock().expect("spares");
      if st.paused() {
        return None;
      }
      if !st.ready.is_empty() || !st.making || st.awaited {
        // Where a spare is slow to start, it slows the command it starts beside: if this one
        // was ready at once (commands come with gaps), the next starts when this command ends.
        let now = st.ready.is_empty() || !st.slow();
        drop(st);
        return self.take_ready(&body, now);
      }
      // One command waits for the spare on its way; any other at the same time forks.
      st.awaited = true;
      st.spawn_time.map_or(FIRST_WAIT, |t| t * WAIT_FACTOR)
    };
    let notified = self.ready.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    // Made ready between the check above and `enable`.
    let made = !self.st.lock().expect("spares").ready.is_empty();
    if !made {
      let _ = tokio::time::timeout(wait, notified).await;
    }
    self.st.lock().expect("spares").awaited = false;
    self.take_ready(&body, true)
  }

  /// A ready spare (the last recycled), given the plan `body`, if there is one; `start_next`:
  /// the next one is started at once when no other is left ready (always when none was).
  fn take_ready(&self, body: &[u8], start_next: bool) -> Option<Spawned> {
    let sp = {
      let mut st = self.st.lock().expect("spares");
      if st.paused() {
        return None;
      }
      let sp = st.ready.pop();
      if start_next && st.ready.is_empty() {
        st.wanted = true;
        drop(st);
        self.wake.notify_one();
      }
      sp?
    };
    let mut msg = Vec::with_capacity(4 + body.len());
    msg.extend_from_slice(&(body.len() as u32).to_le_bytes());
    msg.extend_from_slice(body);
    // The pipe is empty and, at its default size, deep enough: the plan goes at once, whole.
    // A short or refused write (a shrunk pipe whose reader is stopped) ends that spare.
    let n = unsafe {
      libc::write(
        sp.control.as_raw_fd(),
        msg.as_ptr() as *const libc::c_void,
        msg.len(),
      )
    };
    if n != msg.len() as isize {
      // Dead (killed while it waited) or a partial plan: its control pipe closes with it,
      // and a spare that reads part of a plan exits without running anything.
      end(sp);
      return None;
    }
    Some(sp)
  }

  /// Starts the next spare unless one is ready or on its way (a command ended).
  pub fn want(&self) {
    let mut st = self.st.lock().expect("spares");
    if st.paused() || !st.ready.is_empty() || st.making {
      return;
    }
    st.wanted = true;
    drop(st);
    self.wake.notify_one();
  }

  /// Takes back a shepherd whose command ended and left nothing behind (it reported
  /// `RECYCLABLE` and its output pipe is drained): it waits for the next plan, as a spare does,
  /// and spares the next command a spare's start and this one's exit. Ended instead when
  /// `POOL` wait already, or spares are paused.
  pub fn recycle(&self, sp: Spawned) {
    let unused = {
      let mut st = self.st.lock().expect("spares");
      if st.paused() || st.ready.len() >= POOL {
        Some(sp)
      } else {
        st.ready.push(sp);
        None
      }
    };
    match unused {
      Some(sp) => end(sp),
      None => self.ready.notify_waiters(),
    }
  }

  /// The sandbox is out of processes: the spares waiting give their processes back, and none is
  /// kept for a while. True when one was waiting (a process was freed).
  pub fn release(&self) -> bool {
    let spares = {
      let mut st = self.st.lock().expect("spares");
      st.paused_until = Some(Instant::now() + PRESSURE_PAUSE);
      st.wanted = false;
      std::mem::take(&mut st.ready)
    };
    let freed = !spares.is_empty();
    for sp in spares {
      let pid = sp.pid as libc::pid_t;
      unsafe { libc::kill(pid, libc::SIGKILL) };
      drop(sp);
      // Reaped here, so that its pid is free when the caller tries again (the agent's
      // reaper may get to it first).
      let mut status = 0;
      unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    freed
  }

  /// The thread: starts a spare whenever one is wanted and none is ready.
  fn make_loop(&self) {
    let contained = crate::exec::contain::found();
    let comm = std::fs::read_to_string("/proc/self/comm")
      .map(|c| c.trim_end().to_string())
      .unwrap_or_default();
    // `ps` shows the spare as the agent's binary, the path it was started by.
    let argv0 = ARGV0.get().cloned().unwrap_or_else(|| comm.clone().into());
    let launch = Launch::new(&argv0, contained, &comm);
    loop {
      {
        let mut st = self.st.lock().expect("spares");
        // A take wants one only while spares are not paused; one made during a pause is
        // ended.
        while !st.wanted || !st.ready.is_empty() {
          st = self.wake.wait(st).expect("spares");
        }
        st.wanted = false;
        st.making = true;
      }
      let began = Instant::now();
      let made = make(&launch);
      let took = began.elapsed();
      let unused = {
        let mut st = self.st.lock().expect("spares");
        st.making = false;
        st.spawn_time = Some(match st.spawn_time {
          Some(t) => (t * 3 + took) / 4,
          None => took,
        });
        match made {
          // Spares cannot start here at all: every command forks its shepherd.
          Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            st.off = true;
            None
          }
          Ok(sp) if st.ready.len() < POOL && !st.paused() => {
            st.ready.push(sp);
            None
          }
          Ok(sp) => Some(sp),
          // Tried again when the next command wants one.
          Err(_) => None,
        }
      };
      if let Some(sp) = unused {
        end(sp);
      }
      // A command waiting for this one takes it, or forks if it failed.
      self.ready.notify_waiters();
    }
  }
}

/// Ends a spare that will run nothing: its control pipe closes, and it exits.
fn end(sp: Spawned) {
  drop(sp);
}

/// The agent's `argv[0]`, which spares are started under (`main` sets it).
pub static ARGV0: OnceLock<OsString> = OnceLock::new();

/// What every spare is started with: the agent's binary through /proc/self/exe (so a binary
/// replaced on disk does not matter), its arguments and an empty environment, made once.
struct Launch {
  path: CString,
  /// Owns what `argv` points at.
  _args: Vec<CString>,
  argv: Vec<*const libc::c_char>,
  envp: [*const libc::c_char; 1],
}

impl Launch {
  fn new(argv0: &OsStr, contained: Containment, comm: &str) -> Launch {
    let c = |b: &[u8]| CString::new(b.iter().copied().filter(|&x| x != 0).collect::<Vec<u8>>());
    let args: Vec<CString> = [
      argv0.as_bytes(),
      ARG.as_bytes(),
      contained.bits().to_string().as_bytes(),
      comm.as_bytes(),
    ]
    .iter()
    .map(|a| c(a).expect("no NUL left"))
    .collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    Launch {
      path: c"/proc/self/exe".to_owned(),
      _args: args,
      argv,
      envp: [std::ptr::null()],
    }
  }
}

/// The spare's process until its exec: on a stack of its own, in the agent's memory (it
/// touches only this and its stack), while the thread that started it waits.
struct Child<'a> {
  launch: &'a Launch,
  /// Its control, status, output and started pipes, for fds 0 to 3 (`shepherd::place_fds`).
  fds: [libc::c_int; 4],
  /// Set by the child as it starts: still 0 after the clone, the child did not share this
  /// memory (qemu-user makes a `CLONE_VFORK` a fork), so `err` says nothing.
  entered: libc::c_int,
  /// The errno of a failed `dup2` or exec (0: it exec'd).
  err: libc::c_int,
}

#[repr(C, align(16))]
struct ChildStack([u8; 16 * 1024]);

extern "C" fn child_entry(arg: *mut libc::c_void) -> libc::c_int {
  // SAFETY: `arg` is the `Child` on the starting thread's stack, which waits (CLONE_VFORK)
  // until this process execs or exits. Only raw system calls from here: no allocation, no lock.
  unsafe {
    let child = &mut *(arg as *mut Child);
    std::ptr::write_volatile(&mut child.entered, 1);
    // The copies are without close-on-exec; the pipes' own fds close at the exec.
    if !shepherd::place_fds(child.fds) {
      child.err = *libc::__errno_location();
      libc::_exit(127);
    }
    let l = child.launch;
    libc::execve(l.path.as_ptr(), l.argv.as_ptr(), l.envp.as_ptr());
    child.err = *libc::__errno_location();
    libc::_exit(127)
  }
}

/// Starts a spare with the pipes a forked shepherd gets at 0-3, as `posix_spawn` would
/// (`CLONE_VM | CLONE_VFORK`: nothing of the agent is copied) but without its masking and
/// resetting of signals one by one around the exec. Those keep a handler of the parent's from
/// running in the child's shared memory. The agent handles only SIGCHLD (and ignores SIGPIPE),
/// and a SIGCHLD goes to the agent's own process, never to a child that has no children.
/// Keeping every signal blocked on this thread instead would also do, but under qemu-user the
/// new process then starts with the host's signals blocked, and dies at its first fault.
fn make(launch: &Launch) -> std::io::Result<Spawned> {
  let (out_r, out_w) = sys::pipe_for_reading()?;
  let (st_r, st_w) = sys::pipe_for_reading()?;
  let (ctl_r, ctl_w) = sys::pipe()?;
  let (started_r, started_w) = shepherd::started_pipe()?;
  // A spare stopped by a root workload, behind a pipe made small (a user over its pipe
  // allowance gets one page), must not hold the agent's thread in `take`'s write.
  sys::set_nonblocking(ctl_w.as_raw_fd())?;
  let mut child = Child {
    launch,
    fds: [&ctl_r, &st_w, &out_w, &started_w].map(|f| f.as_raw_fd()),
    entered: 0,
    err: 0,
  };
  let mut stack = ChildStack([0; 16 * 1024]);
  // No working directory of its own, as a `posix_spawn` without a chdir.
  let pid = unsafe {
    let top = stack.0.as_mut_ptr().add(stack.0.len());
    libc::clone(
      child_entry,
      top as *mut libc::c_void,
      libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
      &mut child as *mut Child as *mut libc::c_void,
    )
  };
  if pid < 0 {
    return Err(std::io::Error::last_os_error());
  }
  // Read only after the child's exec or exit, which the clone waited for.
  if unsafe { std::ptr::read_volatile(&child.entered) } == 0 {
    // Whether it exec'd cannot be told (under qemu-user it cannot: the agent's binary is not
    // one the host runs), and a command would then write its plan to a spare that is gone.
    let mut status = 0;
    unsafe {
      libc::kill(pid, libc::SIGKILL);
      libc::waitpid(pid, &mut status, 0);
    }
    return Err(std::io::Error::new(
      std::io::ErrorKind::Unsupported,
      "this system does not run a CLONE_VFORK child in its parent's memory",
    ));
  }
  let err = unsafe { std::ptr::read_volatile(&child.err) };
  if err != 0 {
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
    return Err(std::io::Error::from_raw_os_error(err));
  }
  drop((ctl_r, st_w, out_w, started_w));
  // The agent's reaper waits for it, as for every shepherd.
  Ok(Spawned {
    pid: pid as u32,
    output: out_r,
    status: st_r,
    control: ctl_w,
    started: started_r,
  })
}

/// Where a spare reads its plan.
struct PlanBuf([u8; 4 + MAX_PLAN]);
static mut PLAN_BUF: PlanBuf = PlanBuf([0; 4 + MAX_PLAN]);

/// The spare's life (`trueforge-agent shepherd <flags> <name>`): set up, wait for a plan, run
/// it as a forked shepherd would. Exits without running anything when the agent goes first.
pub fn main(args: Vec<String>) -> i32 {
  let flags: u8 = args.first().and_then(|f| f.parse().ok()).unwrap_or(0);
  if let Some(name) = args
    .get(1)
    .and_then(|n| std::ffi::CString::new(n.as_str()).ok())
  {
    // The name the agent's kin go by in /proc (`recover`), not "exe".
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
  }
  let contained = Containment::from_bits(flags);
  // A spare exists only where its start ran in the agent's memory (`make` checks), so its
  // command's process runs in the spare's memory too.
  let complete = unsafe { shepherd::prepare(contained, true) };
  // fd 0 is the control pipe: a plan, then nothing until the agent closes it or, once the
  // command left nothing behind, the next plan. The agent writes each whole at once, so one
  // read most often takes all of it.
  let mut control = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
  // In the binary's zeroed data, not the heap: no mapping made for it.
  // SAFETY: a spare is single-threaded, and this is its only use of the buffer.
  let msg = unsafe { &mut *std::ptr::addr_of_mut!(PLAN_BUF.0) };
  let mut _previous: Option<Plan> = None;
  loop {
    // The agent sends a plan only to a shepherd that waits for one: nothing follows it.
    let mut got = 0;
    let len = loop {
      if got >= 4 {
        let len = u32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]) as usize;
        if len > MAX_PLAN {
          return 0;
        }
        if got >= 4 + len {
          break len;
        }
      }
      match control.read(&mut msg[got..]) {
        Ok(0) => return 0,
        Ok(n) => got += n,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
        Err(_) => return 0,
      }
    };
    match Plan::decode(&msg[4..4 + len]) {
      Some(plan) => {
        unsafe { shepherd::supervise(&plan, complete, true) };
        // Freed only once the next plan is made: freeing it now would let the allocator give
        // its pages back and map them again for the next, and an unmapping in memory that the
        // command's process also ran in interrupts the other CPUs to flush their TLBs.
        _previous = Some(plan);
      }
      None => {
        shepherd::report_spawn_failed(libc::EINVAL);
        return 0;
      }
    }
  }
}
