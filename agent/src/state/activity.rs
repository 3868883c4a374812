//! Activity for the idle timer: the time of the last host call that counts (everything but
//! ping and the activity query), kept in the agent and mirrored in the mtime of a root-owned
//! file. The workload cannot fake it: it cannot write that file, and a file it puts in its place
//! is not root's (the idle check must require owner 0 and one link) and is replaced on the next
//! touch. Running commands count as activity too (touched each second while any runs).

use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use trueforge_agent_proto::msg::ActivityInfo;

use crate::base::sys;

/// At most one touch of the file per this interval.
const TOUCH_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct Activity {
  last: Cell<Option<(Instant, i64)>>,
  touched: Cell<Option<Instant>>,
  wake: Notify,
}

impl Activity {
  /// A host call that counts.
  pub fn record(&self) {
    let wall = SystemTime::now()
      .duration_since(UNIX_EPOCH)
      .map(|d| d.as_millis() as i64)
      .unwrap_or(0);
    self.last.set(Some((Instant::now(), wall)));
    self.touch(false);
  }

  /// A command started: the ticker keeps the file fresh while it runs.
  pub fn command_started(&self) {
    self.wake.notify_one();
  }

  /// The layout was made: touch now, whatever the throttle says.
  pub fn enable(&self) {
    self.touch(true);
  }

  pub fn info(&self, running: u32) -> ActivityInfo {
    let last = self.last.get();
    ActivityInfo {
      last_call_unix_ms: last.map(|(_, w)| w),
      idle_ms: last.map(|(t, _)| t.elapsed().as_millis() as u64),
      running,
    }
  }

  fn touch(&self, force: bool) {
    let now = Instant::now();
    if !force && self.touched.get().is_some_and(|t| now - t < TOUCH_EVERY) {
      return;
    }
    self.touched.set(Some(now));
    // No layout yet (or a sandbox without one): nothing to record in.
    let _ = touch_file();
  }
}

/// Refreshes the activity file while commands run (`running` counts them).
pub async fn ticker(activity: &Activity, running: impl Fn() -> u32) {
  loop {
    if running() == 0 {
      activity.wake.notified().await;
    }
    tokio::time::sleep(TOUCH_EVERY).await;
    if running() > 0 {
      activity.touch(false);
    }
  }
}

const NAME: &std::ffi::CStr = c".trueforge-agent-activity";

/// The directory holding the file: the sticky `/tmp` (`msg::ACTIVITY_FILE`), where the sandbox
/// user can neither remove nor replace a file of root's; a debug build (the tests) may point it
/// elsewhere with `TRUEFORGE_AGENT_TEST_LAYOUT_ROOT`.
fn layout_root() -> &'static std::ffi::CStr {
  static ROOT: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
  ROOT.get_or_init(|| {
    let dir = std::env::var("TRUEFORGE_AGENT_TEST_LAYOUT_ROOT")
      .ok()
      .filter(|_| cfg!(debug_assertions))
      .unwrap_or_else(|| "/tmp".into());
    std::ffi::CString::new(dir).unwrap_or_else(|_| c"/tmp".into())
  })
}

/// Sets the file's mtime to now, first replacing whatever is there unless it is root's own
/// regular file with one link. Runs as root; never follows a link.
fn touch_file() -> io::Result<()> {
  let dir = sys::open(
    layout_root(),
    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
    0,
  )?;
  let d = dir.as_raw_fd();
  let existing = match sys::openat(
    d,
    NAME,
    libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
    0,
  ) {
    Ok(fd) => {
      let st = sys::fstat(fd.as_raw_fd())?;
      let ours = st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_uid == 0
        && st.st_nlink == 1
        && st.st_mode & 0o7777 == 0o644;
      if ours {
        Some(fd)
      } else {
        unsafe { libc::unlinkat(d, NAME.as_ptr(), 0) };
        None
      }
    }
    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
    Err(_) => {
      // A link, a FIFO, a directory …: not ours.
      unsafe {
        libc::unlinkat(d, NAME.as_ptr(), 0);
        libc::unlinkat(d, NAME.as_ptr(), libc::AT_REMOVEDIR);
      }
      None
    }
  };
  let fd = match existing {
    Some(fd) => fd,
    None => {
      let temp =
        std::ffi::CString::new(format!(".trueforge-agent-activity.{}", std::process::id()))
          .expect("no NUL in a number");
      unsafe { libc::unlinkat(d, temp.as_ptr(), 0) };
      let fd = sys::openat(
        d,
        &temp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o644,
      )?;
      sys::cvt(unsafe { libc::fchown(fd.as_raw_fd(), 0, 0) })?;
      sys::cvt(unsafe { libc::fchmod(fd.as_raw_fd(), 0o644) })?;
      sys::cvt(unsafe { libc::renameat(d, temp.as_ptr(), d, NAME.as_ptr()) })?;
      fd
    }
  };
  sys::cvt(unsafe { libc::futimens(fd.as_raw_fd(), std::ptr::null()) })?;
  Ok(())
}
