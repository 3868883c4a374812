//! How a command's processes are kept findable, so that a timeout can kill all of them.
//!
//! Where the agent and each command's shepherd can be child subreapers (Linux), every orphan of
//! a command is reparented into its shepherd's subtree. gVisor (release 20221219) answers
//! `PR_SET_CHILD_SUBREAPER` with EINVAL: orphans go to PID 1 there, and one that called
//! `setsid` would leave the command's session too, so nothing would tie it to its command. There
//! the session is made the boundary instead: each command's process, once it has made its own
//! session, installs a seccomp filter under which `setsid` returns 0 without effect. The filter
//! is inherited by everything the command starts and cannot be removed, so every process it
//! starts stays in its session, where the shepherd's kill finds it (`shepherd::kill_round`).
//! `setsid` is the only way out of a session. What a process sees: `setsid()` succeeds, but it
//! stays in the command's session (commands run without a terminal, so none changes hands).
//!
//! Installing a filter needs `no_new_privs`; the provider sets it on every sandbox by default
//! (`noNewPrivileges`), and where it is off, commands get it with the filter (setuid programs
//! then do not gain privileges). Which of the two holds is probed once at the start and said
//! in the hello (`subreaper`, `session_guard`); with neither (qemu-user emulates neither), a
//! timeout's kill is never reported verified.

use std::sync::OnceLock;

/// What this system allows, found once at the agent's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Containment {
  /// The agent and shepherds are child subreapers.
  pub subreaper: bool,
  /// No subreaper, but commands are kept in their sessions.
  pub session_guard: bool,
}

impl Containment {
  /// As one byte, for a spare shepherd's arguments and a plan sent to it (`from_bits` reads it).
  pub fn bits(self) -> u8 {
    self.subreaper as u8 | (self.session_guard as u8) << 1
  }

  pub fn from_bits(bits: u8) -> Containment {
    Containment {
      subreaper: bits & 1 != 0,
      session_guard: bits & 2 != 0,
    }
  }
}

static FOUND: OnceLock<Containment> = OnceLock::new();

/// Makes the agent a child subreaper where it can, else probes the session guard. Call once,
/// before any thread is started. `TRUEFORGE_AGENT_NO_SUBREAPER=1` acts as if the system had no
/// subreaper (for tests of the guard).
pub fn init() -> Containment {
  *FOUND.get_or_init(|| {
    let allowed = std::env::var_os("TRUEFORGE_AGENT_NO_SUBREAPER").is_none_or(|v| v != "1");
    let subreaper =
      allowed && unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == 0;
    Containment {
      subreaper,
      session_guard: !subreaper && probe_guard(),
    }
  })
}

/// What `init` found (nothing contained before it ran).
pub fn found() -> Containment {
  FOUND.get().copied().unwrap_or(Containment {
    subreaper: false,
    session_guard: false,
  })
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
/// x86_64's x32 system calls carry this bit; aarch64 has none (the same check again there).
#[cfg(target_arch = "x86_64")]
const X32_SETSID: u32 = 0x4000_0000 | libc::SYS_setsid as u32;
#[cfg(target_arch = "aarch64")]
const X32_SETSID: u32 = libc::SYS_setsid as u32;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const RET_ALLOW: u32 = 0x7fff_0000;
/// SECCOMP_RET_ERRNO with errno 0: the call returns 0 and is not made.
const RET_NOTHING: u32 = 0x0005_0000;

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
  libc::sock_filter { code, jt, jf, k }
}

/// `seccomp_data`: the call's number at offset 0, the architecture at 4. A call of another
/// architecture is let through (this agent's commands are of its own).
static FILTER: [libc::sock_filter; 7] = [
  insn(BPF_LD_W_ABS, 0, 0, 4),
  insn(BPF_JEQ_K, 0, 3, AUDIT_ARCH),
  insn(BPF_LD_W_ABS, 0, 0, 0),
  insn(BPF_JEQ_K, 2, 0, libc::SYS_setsid as u32),
  insn(BPF_JEQ_K, 1, 0, X32_SETSID),
  insn(BPF_RET_K, 0, 0, RET_ALLOW),
  insn(BPF_RET_K, 0, 0, RET_NOTHING),
];

/// Keeps this process and everything it starts in its session from now on. Async-signal-safe
/// (runs in a forked child of a threaded process): two system calls on static data.
///
/// # Safety
/// Only in a single-threaded process (the filter binds the calling thread and its children).
pub unsafe fn guard_session() -> bool {
  let prog = libc::sock_fprog {
    len: FILTER.len() as u16,
    filter: FILTER.as_ptr() as *mut libc::sock_filter,
  };
  libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    && libc::prctl(
      libc::PR_SET_SECCOMP,
      libc::SECCOMP_MODE_FILTER,
      &prog as *const libc::sock_fprog,
    ) == 0
}

/// Whether the guard holds here: a child installs it, calls `setsid`, and must get 0 and stay
/// in its parent's session.
fn probe_guard() -> bool {
  let session = unsafe { libc::getsid(0) };
  let pid = unsafe { libc::fork() };
  if pid < 0 {
    return false;
  }
  if pid == 0 {
    unsafe {
      let held =
        guard_session() && libc::syscall(libc::SYS_setsid) == 0 && libc::getsid(0) == session;
      libc::_exit(if held { 0 } else { 1 });
    }
  }
  let mut status = 0;
  loop {
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r == pid {
      return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    }
    if r < 0 && crate::base::sys::errno() != libc::EINTR {
      return false;
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn the_guard_keeps_a_process_in_its_session() {
    // Linux has both; the probe runs in a child, so this test process is not filtered.
    assert!(probe_guard());
  }
}
