//! Thin wrappers over the system calls the agent needs, and per-thread credentials.
//!
//! Credentials are per thread in the kernel, but libc's `setuid` family changes every thread of
//! the process. File work runs on worker threads that switch only their own filesystem identity
//! (`setfsuid`, `setfsgid`, `setgroups` as raw system calls; where `setfsuid` is missing, as in
//! gVisor, the thread's effective ids), so the rest of the agent stays root throughout.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The last OS error number.
pub fn errno() -> i32 {
  io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `-1` → the OS error.
pub fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
  if r == -1 {
    Err(io::Error::last_os_error())
  } else {
    Ok(r)
  }
}

fn cvt_long(r: libc::c_long) -> io::Result<libc::c_long> {
  if r == -1 {
    Err(io::Error::last_os_error())
  } else {
    Ok(r)
  }
}

/// A pipe, both ends close-on-exec: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
  let mut fds = [0; 2];
  cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
  Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pipe whose read end is non-blocking (for the runtime to poll) and whose write end is
/// not (a process writing to it waits, as on any pipe).
pub fn pipe_for_reading() -> io::Result<(OwnedFd, OwnedFd)> {
  let (r, w) = pipe()?;
  // A new pipe's read end has no other status flag to keep: one call, not a read and a write.
  cvt(unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) })?;
  Ok((r, w))
}

/// The system's page size.
pub fn page_size() -> usize {
  match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
    n if n > 0 => n as usize,
    _ => 4096,
  }
}

/// Bytes waiting in the pipe behind `fd` (either end).
pub fn unread(fd: RawFd) -> io::Result<usize> {
  let mut n: libc::c_int = 0;
  cvt(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) })?;
  Ok(n.max(0) as usize)
}

/// Bytes written to the stream socket `fd` that its peer has not read yet (at least: the
/// kernel counts what its buffers hold them in).
pub fn unsent(fd: RawFd) -> io::Result<usize> {
  let mut n: libc::c_int = 0;
  // SIOCOUTQ, which is TIOCOUTQ's number.
  cvt(unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) })?;
  Ok(n.max(0) as usize)
}

/// Makes the pipe behind `fd` hold at least `want` bytes where the kernel allows it (never
/// less than it holds already); its capacity after.
pub fn grow_pipe(fd: RawFd, want: usize) -> io::Result<usize> {
  let now = cvt(unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) })? as usize;
  if now < want {
    unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, want as libc::c_int) };
  }
  Ok(cvt(unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) })? as usize)
}

/// `splice(2)`: up to `len` bytes from `from` (at `*off` when given, which then advances) to
/// `to`, one of them a pipe, without passing through our memory.
pub fn splice(
  from: RawFd,
  off: Option<&mut i64>,
  to: RawFd,
  len: usize,
  flags: libc::c_uint,
) -> io::Result<usize> {
  let off = off.map_or(std::ptr::null_mut(), |o| o as *mut i64);
  let n = unsafe { libc::splice(from, off, to, std::ptr::null_mut(), len, flags) };
  if n < 0 {
    Err(io::Error::last_os_error())
  } else {
    Ok(n as usize)
  }
}

pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
  let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
  cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
  Ok(())
}

/// `SO_LINGER` on socket `fd`: on with a zero timeout, closing it resets the connection (RST);
/// off, closing it sends what is left and then a FIN, as usual.
pub fn set_zero_linger(fd: RawFd, on: bool) -> io::Result<()> {
  let l = libc::linger {
    l_onoff: on as libc::c_int,
    l_linger: 0,
  };
  cvt(unsafe {
    libc::setsockopt(
      fd,
      libc::SOL_SOCKET,
      libc::SO_LINGER,
      &l as *const libc::linger as *const libc::c_void,
      std::mem::size_of::<libc::linger>() as libc::socklen_t,
    )
  })?;
  Ok(())
}

/// A close-on-exec duplicate of `fd`.
pub fn dup(fd: RawFd) -> io::Result<OwnedFd> {
  let n = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) })?;
  Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

pub fn open(path: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
  let fd =
    cvt(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
  Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn openat(
  dir: RawFd,
  name: &CStr,
  flags: libc::c_int,
  mode: libc::mode_t,
) -> io::Result<OwnedFd> {
  let fd = cvt(unsafe {
    libc::openat(
      dir,
      name.as_ptr(),
      flags | libc::O_CLOEXEC,
      mode as libc::c_uint,
    )
  })?;
  Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
  let mut st: libc::stat = unsafe { std::mem::zeroed() };
  cvt(unsafe { libc::fstat(fd, &mut st) })?;
  Ok(st)
}

/// The `statfs` magic number of the file system `fd` is on.
pub fn fs_magic(fd: RawFd) -> io::Result<u64> {
  let mut st: libc::statfs = unsafe { std::mem::zeroed() };
  cvt(unsafe { libc::fstatfs(fd, &mut st) })?;
  // Signed on some targets: the magic is its low 32 bits.
  Ok(st.f_type as u64 & 0xffff_ffff)
}

pub fn fstatat(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<libc::stat> {
  let mut st: libc::stat = unsafe { std::mem::zeroed() };
  cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, flags) })?;
  Ok(st)
}

/// `renameat2(2)`'s flags (not in every libc's headers).
pub const RENAME_NOREPLACE: libc::c_uint = 1;
pub const RENAME_EXCHANGE: libc::c_uint = 2;

pub fn renameat2(
  from_dir: RawFd,
  from: &CStr,
  to_dir: RawFd,
  to: &CStr,
  flags: libc::c_uint,
) -> io::Result<()> {
  cvt_long(unsafe {
    libc::syscall(
      libc::SYS_renameat2,
      from_dir as libc::c_long,
      from.as_ptr(),
      to_dir as libc::c_long,
      to.as_ptr(),
      flags as libc::c_long,
    )
  })
  .map(|_| ())
}

/// The text of the link `name` in `dir` (`name` empty: the link `dir` itself, opened O_PATH).
pub fn readlinkat(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
  let mut buf = vec![0u8; 4096];
  let n = unsafe {
    libc::readlinkat(
      dir,
      name.as_ptr(),
      buf.as_mut_ptr() as *mut libc::c_char,
      buf.len(),
    )
  };
  if n < 0 {
    return Err(io::Error::last_os_error());
  }
  buf.truncate(n as usize);
  Ok(buf)
}

/// `openat2` with `resolve` flags, or `ENOSYS`/`EPERM` where the kernel or a seccomp profile
/// lacks it.
pub fn openat2(dir: RawFd, path: &CStr, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
  // The kernel's `struct open_how` (libc's is non-exhaustive).
  #[repr(C)]
  struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
  }
  let how = OpenHow {
    flags: (flags | libc::O_CLOEXEC) as u64,
    mode: 0,
    resolve,
  };
  let fd = cvt_long(unsafe {
    libc::syscall(
      libc::SYS_openat2,
      dir,
      path.as_ptr(),
      &how as *const OpenHow,
      std::mem::size_of::<OpenHow>(),
    )
  })?;
  Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Milliseconds since the epoch of a stat time.
pub fn mtime_ms(st: &libc::stat) -> i64 {
  st.st_mtime * 1000 + st.st_mtime_nsec / 1_000_000
}

/// The agent's own identity at start, restored after each switch.
#[derive(Debug, Clone)]
pub struct Identity {
  pub uid: u32,
  pub gid: u32,
  pub groups: Vec<u32>,
}

impl Identity {
  pub fn current() -> Identity {
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0 as libc::gid_t; n.max(0) as usize];
    let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    Identity {
      uid: unsafe { libc::geteuid() },
      gid: unsafe { libc::getegid() },
      groups,
    }
  }
}

/// Ids a request runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creds {
  pub uid: u32,
  pub gid: u32,
  pub groups: Vec<u32>,
}

fn raw_setgroups(groups: &[u32]) -> io::Result<()> {
  cvt_long(unsafe {
    libc::syscall(
      libc::SYS_setgroups,
      groups.len() as libc::c_long,
      groups.as_ptr(),
    )
  })
  .map(|_| ())
}

fn raw_setfsuid(uid: u32) -> u32 {
  unsafe { libc::syscall(libc::SYS_setfsuid, uid as libc::c_long) as u32 }
}

fn raw_setfsgid(gid: u32) -> u32 {
  unsafe { libc::syscall(libc::SYS_setfsgid, gid as libc::c_long) as u32 }
}

/// Whether this system has `setfsuid`. gVisor (release 20221219) answers it, and `setfsgid`,
/// with ENOSYS; a thread there takes the user's effective ids instead.
/// `TRUEFORGE_AGENT_NO_FS_IDS=1` takes that path anywhere (for its tests).
pub fn has_fs_ids() -> bool {
  static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
  *HAS.get_or_init(|| {
    if std::env::var_os("TRUEFORGE_AGENT_NO_FS_IDS").is_some_and(|v| v == "1") {
      return false;
    }
    // -1 changes nothing; Linux answers the current fsuid.
    let r = unsafe { libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long) };
    !(r == -1 && errno() == libc::ENOSYS)
  })
}

/// The ids this thread's file access runs with: the filesystem ids where the system has them,
/// else the effective ids (both are per thread in the kernel and in gVisor, as raw calls).
fn file_ids() -> (u32, u32) {
  if has_fs_ids() {
    return (raw_setfsuid(u32::MAX), raw_setfsgid(u32::MAX));
  }
  let (mut r, mut e, mut s) = (0u32, 0u32, 0u32);
  let (mut rg, mut eg, mut sg) = (0u32, 0u32, 0u32);
  unsafe {
    libc::syscall(libc::SYS_getresuid, &mut r, &mut e, &mut s);
    libc::syscall(libc::SYS_getresgid, &mut rg, &mut eg, &mut sg);
  }
  (e, eg)
}

/// Sets this thread's file access ids. With effective ids, the group goes first and comes back
/// last: a thread whose effective uid is not 0 has no capability left to change its group
/// (its permitted set stays, as the real and saved uids are still 0, so it can come back).
fn set_file_ids(uid: u32, gid: u32, returning: bool) {
  if has_fs_ids() {
    raw_setfsgid(gid);
    raw_setfsuid(uid);
    return;
  }
  let keep = -1 as libc::c_long;
  let set_uid = || unsafe { libc::syscall(libc::SYS_setresuid, keep, uid as libc::c_long, keep) };
  let set_gid = || unsafe { libc::syscall(libc::SYS_setresgid, keep, gid as libc::c_long, keep) };
  if returning {
    set_uid();
    set_gid();
  } else {
    set_gid();
    set_uid();
  }
}

/// Runs `f` with this thread's file access identity (fsuid and fsgid, or where the system lacks
/// them the effective ids; supplementary groups) set to `creds`, then switches back. Only this
/// thread changes. Fails with `EPERM` when the agent may not take that identity (not root, or
/// no SETUID/SETGID capability).
pub fn as_user<T>(me: &Identity, creds: &Creds, f: impl FnOnce() -> T) -> io::Result<T> {
  if creds.uid == me.uid && creds.gid == me.gid && creds.groups == me.groups {
    return Ok(f());
  }
  let mut groups_changed = false;
  let switched = (|| {
    if creds.groups != me.groups {
      raw_setgroups(&creds.groups)?;
      groups_changed = true;
    }
    set_file_ids(creds.uid, creds.gid, false);
    // setfsuid reports no error, and a refused effective gid must not pass unnoticed either:
    // read the ids back.
    if file_ids() != (creds.uid, creds.gid) {
      return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
  })();
  let out = switched.map(|_| f());
  restore(me, groups_changed);
  out
}

/// Back to the agent's own file access identity. A thread that cannot return to it must not
/// serve anything else.
fn restore(me: &Identity, groups_changed: bool) {
  set_file_ids(me.uid, me.gid, true);
  let groups_ok = !groups_changed || raw_setgroups(&me.groups).is_ok() || me.uid != 0;
  if file_ids() != (me.uid, me.gid) || !groups_ok {
    eprintln!("trueforge-agent: cannot restore its own credentials; exiting");
    std::process::abort();
  }
}

/// Reaps every exited child (the agent is a subreaper: orphans of finished commands end here);
/// how many.
pub fn reap_all() -> usize {
  let mut n = 0;
  loop {
    let mut status = 0;
    let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if r <= 0 {
      return n;
    }
    n += 1;
  }
}

/// The effective capability set, from /proc/self/status.
pub fn cap_eff() -> u64 {
  std::fs::read_to_string("/proc/self/status")
    .ok()
    .and_then(|s| {
      s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    })
    .unwrap_or(0)
}

/// Makes sure fds 0, 1 and 2 are open, so pipes made later never take those numbers.
pub fn ensure_std_fds() {
  for fd in 0..3 {
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
      let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
      if null >= 0 && null != fd {
        unsafe {
          libc::dup2(null, fd);
          libc::close(null);
        }
      }
    }
  }
}

/// Takes the host's stream off stdin and stdout onto descriptors of its own (0 and 1 become
/// /dev/null, so nothing written to stdout by mistake can corrupt it), and makes this process
/// one the workload cannot trace or read, even as the same user. Returns (input, output).
pub fn take_host_stream() -> io::Result<(OwnedFd, OwnedFd)> {
  ensure_std_fds();
  let input = dup(0)?;
  let output = dup(1)?;
  to_dev_null(0);
  to_dev_null(1);
  unsafe {
    libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    libc::umask(0o022);
  }
  Ok((input, output))
}

/// Replaces `fd` by /dev/null (stray writes to stdout must never reach the protocol stream).
pub fn to_dev_null(fd: RawFd) {
  if let Ok(null) = open(c"/dev/null", libc::O_RDWR, 0) {
    unsafe { libc::dup2(null.as_raw_fd(), fd) };
  }
}
