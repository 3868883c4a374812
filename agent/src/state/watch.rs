//! Whether a file was written while a download read it. Timestamps cannot tell: a write sets
//! the file's times before it copies its bytes, so a read that begins while a write is under way
//! sees the same times before and after, and a mix of the two versions in between. inotify's
//! `IN_MODIFY` is queued once a write has copied its bytes, so a watch placed before the first
//! read and drained after the last byte is out sees every write that overlapped the read.
//!
//! One inotify instance serves the whole agent (root's instances are few, and shared with every
//! other container on the host: `fs.inotify.max_user_instances`), made at the first download.
//! Two downloads of one file share its watch, counted. A queue overflow counts as a change for
//! every download in flight. Writes through a shared mapping (`mmap`) raise no event.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// After inotify could not be had (the per-user instance limit, say), how long until it is
/// tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// The agent's one inotify instance and the watches in use.
#[derive(Default)]
pub struct Watcher {
  state: RefCell<State>,
}

#[derive(Default)]
struct State {
  /// Never watch (`TRUEFORGE_AGENT_NO_INOTIFY=1`, so tests cover the path taken without it).
  off: bool,
  fd: Option<OwnedFd>,
  failed_at: Option<Instant>,
  watches: HashMap<i32, Watch>,
  /// Queue overflows seen: events were lost, so every watched file may have changed.
  overflows: u64,
}

struct Watch {
  /// Downloads using this watch.
  refs: u32,
  /// Writes seen (`IN_MODIFY`, or the watch gone under it).
  writes: u64,
}

/// One download's watch on its file; removed (when no other download uses it) when dropped.
pub struct Watching<'a> {
  watcher: &'a Watcher,
  wd: i32,
  writes: u64,
  overflows: u64,
}

impl Watcher {
  /// A watcher; `enabled: false` watches nothing.
  pub fn new(enabled: bool) -> Watcher {
    let w = Watcher::default();
    w.state.borrow_mut().off = !enabled;
    w
  }

  /// Watches the open file `fd` for writes. `None` where inotify is not to be had; the caller
  /// must then find changes another way.
  pub fn watch(&self, fd: RawFd) -> Option<Watching<'_>> {
    let mut s = self.state.borrow_mut();
    let inotify = s.instance()?;
    // Through /proc the watch lands on the very inode that was opened, not on whatever the
    // path names by now.
    let path = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number");
    let wd = unsafe { libc::inotify_add_watch(inotify, path.as_ptr(), libc::IN_MODIFY) };
    if wd < 0 {
      return None;
    }
    // Events already queued for a watch this inode shares belong to other downloads.
    s.drain();
    let w = s.watches.entry(wd).or_insert(Watch { refs: 0, writes: 0 });
    w.refs += 1;
    let writes = w.writes;
    Some(Watching {
      watcher: self,
      wd,
      writes,
      overflows: s.overflows,
    })
  }
}

impl Watching<'_> {
  /// Whether the file was written since the watch was placed (or events were lost).
  pub fn written(&self) -> bool {
    let mut s = self.watcher.state.borrow_mut();
    s.drain();
    let writes = s.watches.get(&self.wd).map_or(u64::MAX, |w| w.writes);
    writes != self.writes || s.overflows != self.overflows
  }
}

impl Drop for Watching<'_> {
  fn drop(&mut self) {
    let mut s = self.watcher.state.borrow_mut();
    let Some(w) = s.watches.get_mut(&self.wd) else {
      return;
    };
    w.refs -= 1;
    if w.refs == 0 {
      s.watches.remove(&self.wd);
      if let Some(fd) = &s.fd {
        unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), self.wd) };
      }
    }
  }
}

impl State {
  /// The inotify descriptor, made on first use.
  fn instance(&mut self) -> Option<RawFd> {
    if let Some(fd) = &self.fd {
      return Some(fd.as_raw_fd());
    }
    if self.off || self.failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER) {
      return None;
    }
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
      self.failed_at = Some(Instant::now());
      return None;
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    self.fd = Some(fd);
    Some(raw)
  }

  /// Reads every queued event into the counts.
  fn drain(&mut self) {
    let Some(fd) = self.fd.as_ref().map(|f| f.as_raw_fd()) else {
      return;
    };
    // Aligned for the kernel's `struct inotify_event`.
    let mut buf = [0u64; 512];
    loop {
      let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, 8 * buf.len()) };
      if n <= 0 {
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
          continue;
        }
        return;
      }
      let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, n as usize) };
      for (wd, mask) in events(bytes) {
        self.note(wd, mask);
      }
    }
  }

  fn note(&mut self, wd: i32, mask: u32) {
    if mask & libc::IN_Q_OVERFLOW != 0 {
      self.overflows += 1;
    } else if let Some(w) = self.watches.get_mut(&wd) {
      // IN_IGNORED: the kernel dropped the watch (its file system went away); nothing more
      // would be seen, so it counts as a change.
      if mask & (libc::IN_MODIFY | libc::IN_IGNORED) != 0 {
        w.writes += 1;
      }
    }
  }
}

/// (watch, mask) of each `struct inotify_event` in `buf`: wd, mask, cookie, len, then `len`
/// bytes of name.
fn events(buf: &[u8]) -> impl Iterator<Item = (i32, u32)> + '_ {
  let mut off = 0;
  std::iter::from_fn(move || {
    let head = buf.get(off..off + 16)?;
    let word = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
    let wd = i32::from_ne_bytes(word(0));
    let mask = u32::from_ne_bytes(word(4));
    let len = u32::from_ne_bytes(word(12)) as usize;
    off += 16 + len;
    Some((wd, mask))
  })
}

#[cfg(test)]
mod tests {
  use super::*;
  use std::io::Write;

  fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tf-watch-{}-{name}", std::process::id()))
  }

  #[test]
  fn a_write_after_the_watch_is_seen_by_every_download_sharing_it() {
    let path = temp("shared");
    std::fs::write(&path, b"one").unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let w = Watcher::default();
    let a = w.watch(file.as_raw_fd()).expect("inotify");
    let b = w.watch(file.as_raw_fd()).expect("inotify");
    assert!(!a.written() && !b.written());
    std::fs::OpenOptions::new()
      .write(true)
      .open(&path)
      .unwrap()
      .write_all(b"two")
      .unwrap();
    assert!(a.written() && b.written());
    drop(a);
    // The other download's watch is still in place: its later writes are seen too.
    let c = w.watch(file.as_raw_fd()).expect("inotify");
    assert!(!c.written());
    std::fs::write(&path, b"three").unwrap();
    assert!(c.written());
    drop((b, c));
    assert!(w.state.borrow().watches.is_empty());
    std::fs::remove_file(&path).unwrap();
  }

  #[test]
  fn reads_renames_and_a_new_file_at_the_path_are_no_change() {
    let path = temp("renamed");
    std::fs::write(&path, b"old").unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let w = Watcher::default();
    let a = w.watch(file.as_raw_fd()).expect("inotify");
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    // Replaced by rename, as uploads do: the opened file keeps its bytes.
    let next = temp("renamed.next");
    std::fs::write(&next, b"new").unwrap();
    std::fs::rename(&next, &path).unwrap();
    assert!(!a.written());
    drop(a);
    std::fs::remove_file(&path).unwrap();
  }

  #[test]
  fn events_parse_with_and_without_names() {
    let mut buf = Vec::new();
    for (wd, mask, name) in [
      (3i32, libc::IN_MODIFY, &b""[..]),
      (-1, libc::IN_Q_OVERFLOW, b"x\0\0\0"),
    ] {
      buf.extend_from_slice(&wd.to_ne_bytes());
      buf.extend_from_slice(&mask.to_ne_bytes());
      buf.extend_from_slice(&0u32.to_ne_bytes());
      buf.extend_from_slice(&(name.len() as u32).to_ne_bytes());
      buf.extend_from_slice(name);
    }
    let got: Vec<_> = events(&buf).collect();
    assert_eq!(got, vec![(3, libc::IN_MODIFY), (-1, libc::IN_Q_OVERFLOW)]);
    let mut s = State::default();
    s.watches.insert(3, Watch { refs: 1, writes: 0 });
    for (wd, mask) in got {
      s.note(wd, mask);
    }
    assert_eq!((s.watches[&3].writes, s.overflows), (1, 1));
  }
}
