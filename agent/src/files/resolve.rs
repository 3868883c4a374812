//! Path resolution for file work done with the sandbox user's credentials. Ordinary symbolic
//! links are followed (the user's permissions apply at every step, so a link to a file the
//! user cannot read stays unreadable); magic links (`/proc/<pid>/fd/…`, `/proc/<pid>/root`)
//! are never followed as such. `openat2` with `RESOLVE_NO_MAGICLINKS` does it where the kernel
//! and seccomp allow; elsewhere (old kernels, gVisor, old seccomp profiles) each component is
//! opened with `O_NOFOLLOW` and links are expanded from their text.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::base::sys;

/// Kernel limit on links followed in one lookup.
const MAX_LINKS: usize = 40;

static OPENAT2: AtomicBool = AtomicBool::new(false);

/// Decides once whether `openat2` works here (`TRUEFORGE_AGENT_NO_OPENAT2=1` forces the
/// fallback, for tests of it).
pub fn probe() -> bool {
  let forced_off = std::env::var_os("TRUEFORGE_AGENT_NO_OPENAT2").is_some_and(|v| v == "1");
  let works = !forced_off
    && sys::openat2(
      libc::AT_FDCWD,
      c"/",
      libc::O_PATH | libc::O_DIRECTORY,
      libc::RESOLVE_NO_MAGICLINKS,
    )
    .is_ok();
  OPENAT2.store(works, Ordering::Relaxed);
  works
}

fn cstr(b: &[u8]) -> io::Result<CString> {
  CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// What to do with symbolic links met on the way.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Links {
  /// Follow them (by their text).
  Follow,
  /// Refuse them anywhere in the path (`ELOOP`): for work done as root.
  Refuse,
}

/// Opens `path` (absolute) for reading, without blocking on a FIFO or device and without
/// taking a terminal: the caller checks the file type before reading.
pub fn open_read(path: &[u8]) -> io::Result<OwnedFd> {
  let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
  if OPENAT2.load(Ordering::Relaxed) {
    return sys::openat2(
      libc::AT_FDCWD,
      &cstr(path)?,
      flags,
      libc::RESOLVE_NO_MAGICLINKS,
    );
  }
  walk(path, Final::Open(flags), Links::Follow, None)
}

/// An `O_PATH` descriptor of `path`; a final link is followed only with `follow`.
pub fn open_path(path: &[u8], follow: bool) -> io::Result<OwnedFd> {
  let flags = libc::O_PATH | if follow { 0 } else { libc::O_NOFOLLOW };
  if OPENAT2.load(Ordering::Relaxed) {
    return sys::openat2(
      libc::AT_FDCWD,
      &cstr(path)?,
      flags,
      libc::RESOLVE_NO_MAGICLINKS,
    );
  }
  let last = if follow {
    Final::Open(libc::O_PATH)
  } else {
    Final::NoFollow
  };
  walk(path, last, Links::Follow, None)
}

/// The directory `path`, made (with `create_mode`, one component at a time) where missing.
pub fn open_dir(path: &[u8], links: Links, create_mode: Option<u32>) -> io::Result<OwnedFd> {
  if create_mode.is_none() && links == Links::Follow && OPENAT2.load(Ordering::Relaxed) {
    return sys::openat2(
      libc::AT_FDCWD,
      &cstr(path)?,
      libc::O_PATH | libc::O_DIRECTORY,
      libc::RESOLVE_NO_MAGICLINKS,
    );
  }
  walk(path, Final::Dir, links, create_mode)
}

#[derive(Clone, Copy)]
enum Final {
  /// Open the last component with these flags (following a link by its text).
  Open(libc::c_int),
  /// `O_PATH` of the last component itself, link or not.
  NoFollow,
  /// The last component must be a directory.
  Dir,
}

/// Resolves `path` from `/`, one component at a time.
fn walk(path: &[u8], last: Final, links: Links, create_mode: Option<u32>) -> io::Result<OwnedFd> {
  if !path.starts_with(b"/") {
    return Err(io::Error::from_raw_os_error(libc::EINVAL));
  }
  let root = || sys::open(c"/", libc::O_PATH | libc::O_DIRECTORY, 0);
  let mut cur = root()?;
  // Components still to walk, last first.
  let mut todo: Vec<Vec<u8>> = split_rev(path);
  let mut hops = 0;
  while let Some(comp) = todo.pop() {
    if comp == b"." {
      continue;
    }
    let name = cstr(&comp)?;
    let is_last = todo.is_empty();
    if is_last {
      if let Final::Open(flags) = last {
        match sys::openat(cur.as_raw_fd(), &name, flags | libc::O_NOFOLLOW, 0) {
          Ok(fd) if flags & libc::O_PATH == 0 => return Ok(fd),
          Ok(fd) => {
            // An O_PATH open with O_NOFOLLOW succeeds on a link: look at what it is.
            if sys::fstat(fd.as_raw_fd())?.st_mode & libc::S_IFMT != libc::S_IFLNK {
              return Ok(fd);
            }
          }
          Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
          Err(e) => return Err(e),
        }
        let target = sys::readlinkat(cur.as_raw_fd(), &name)?;
        follow(&mut cur, &mut todo, &target, &mut hops, links, root)?;
        continue;
      }
    }
    let fd = match sys::openat(cur.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
      Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create_mode.is_some() => {
        match unsafe { libc::mkdirat(cur.as_raw_fd(), name.as_ptr(), create_mode.unwrap_or(0)) } {
          0 => {}
          _ if sys::errno() == libc::EEXIST => {}
          _ => return Err(io::Error::last_os_error()),
        }
        sys::openat(cur.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0)?
      }
      other => other?,
    };
    let st = sys::fstat(fd.as_raw_fd())?;
    match st.st_mode & libc::S_IFMT {
      libc::S_IFLNK => {
        if is_last && matches!(last, Final::NoFollow) {
          return Ok(fd);
        }
        let target = sys::readlinkat(fd.as_raw_fd(), c"")?;
        follow(&mut cur, &mut todo, &target, &mut hops, links, root)?;
      }
      libc::S_IFDIR => {
        if is_last {
          return match last {
            Final::NoFollow | Final::Dir => Ok(fd),
            Final::Open(_) => unreachable!("handled above"),
          };
        }
        cur = fd;
      }
      _ if is_last && matches!(last, Final::NoFollow) => return Ok(fd),
      _ => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
    }
  }
  // The path named a directory (`/`, or it ended in a link to one).
  match last {
    Final::Open(flags) if flags & libc::O_PATH == 0 => sys::openat(cur.as_raw_fd(), c".", flags, 0),
    _ => Ok(cur),
  }
}

/// Continues the walk through a link whose text is `target`.
fn follow(
  cur: &mut OwnedFd,
  todo: &mut Vec<Vec<u8>>,
  target: &[u8],
  hops: &mut usize,
  links: Links,
  root: impl Fn() -> io::Result<OwnedFd>,
) -> io::Result<()> {
  *hops += 1;
  if links == Links::Refuse || *hops > MAX_LINKS {
    return Err(io::Error::from_raw_os_error(libc::ELOOP));
  }
  if target.starts_with(b"/") {
    *cur = root()?;
  }
  todo.extend(split_rev(target));
  Ok(())
}

/// The non-empty components of `path`, last first (so `pop` yields them in order).
fn split_rev(path: &[u8]) -> Vec<Vec<u8>> {
  path
    .split(|&b| b == b'/')
    .filter(|c| !c.is_empty())
    .rev()
    .map(|c| c.to_vec())
    .collect()
}

#[cfg(test)]
mod tests {
  use super::*;
  use std::os::unix::ffi::OsStrExt;

  fn fallback<T>(f: impl FnOnce() -> T) -> T {
    let before = OPENAT2.swap(false, Ordering::Relaxed);
    let r = f();
    OPENAT2.store(before, Ordering::Relaxed);
    r
  }

  #[test]
  fn the_walk_follows_links_by_their_text() {
    let dir = std::env::temp_dir().join(format!("tf-resolve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::write(dir.join("a/b/f"), b"hi").unwrap();
    std::os::unix::fs::symlink("a/b", dir.join("rel")).unwrap();
    std::os::unix::fs::symlink(dir.join("a"), dir.join("abs")).unwrap();
    std::os::unix::fs::symlink("../b/f", dir.join("a/b/up")).unwrap();
    std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
    let p = |s: &str| dir.join(s).as_os_str().as_bytes().to_vec();
    fallback(|| {
      for path in ["a/b/f", "rel/f", "abs/b/f", "abs/b/up", "rel/./up"] {
        let fd = open_read(&p(path)).unwrap();
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut s).unwrap();
        assert_eq!(s, "hi", "{path}");
      }
      assert_eq!(
        open_read(&p("loop")).unwrap_err().raw_os_error(),
        Some(libc::ELOOP)
      );
      assert_eq!(
        open_read(&p("a/b/f/x")).unwrap_err().raw_os_error(),
        Some(libc::ENOTDIR)
      );
      let link = open_path(&p("rel"), false).unwrap();
      assert_eq!(
        sys::fstat(link.as_raw_fd()).unwrap().st_mode & libc::S_IFMT,
        libc::S_IFLNK
      );
      assert_eq!(
        open_dir(&p("rel"), Links::Refuse, None)
          .unwrap_err()
          .raw_os_error(),
        Some(libc::ELOOP)
      );
      open_dir(&p("new/deeper"), Links::Follow, Some(0o755)).unwrap();
      assert!(dir.join("new/deeper").is_dir());
      // A magic link is followed by its text only.
      let fd = open_read(b"/proc/self/cwd/.").unwrap_or_else(|e| panic!("{e}"));
      drop(fd);
    });
    std::fs::remove_dir_all(&dir).unwrap();
    // (One test: the mode is process-wide.)
    if probe() {
      let err = open_read(b"/proc/self/fd/0").unwrap_err();
      assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
    }
  }
}
