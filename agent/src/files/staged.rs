//! Large writes whose bytes the engine's archive endpoint delivers. The engine writes a file
//! faster than any exec stream carries one, but it writes as root, from outside the container,
//! following whatever links it meets. So it only ever writes into a directory of the agent's that
//! only root may enter (on the root file system, under a `/` that only root may write), under a
//! random name only the host learns. The agent then checks what arrived, gives it to the user and
//! moves it over the temporary file the user made in the target directory (which proved the user
//! may write there), and the user renames that into place. Whatever cannot be staged that way is
//! declined, and the host sends the bytes on the stream instead.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use trueforge_agent_proto::msg::{
  AgentError, ErrorKind, Outcome, StagedDone, StagedHead, StagedUploadSpec,
};

use crate::base::conn::{In, StreamIo};
use crate::base::sys::{self, Creds};
use crate::files::ops::{self, Staged};
use crate::state::ctx::Ctx;

/// The directory the engine writes staged files into.
pub const STAGING_DIR: &str = "/.trueforge-staging";
/// A staged file older than this was left by a host (or an agent) that never came back.
const STALE: Duration = Duration::from_secs(6 * 3600);

/// A staged write: a directory of its own in the staging directory (`<pid>.<hex>`, root's,
/// 0700, made by the agent and never listed by it) and, once the engine wrote it, the file of
/// the same name in it. Both are removed when dropped (the file unless it was placed).
///
/// Why a directory per write: gVisor (release 20221219, its default exclusive file access)
/// trusts a listing it has read of a directory on the root file system, so a name the engine
/// adds afterwards stays invisible in it (ENOENT), and the sweep lists the staging directory on
/// every write. A directory the agent made and never lists is looked up afresh.
struct Entry {
  parent: OwnedFd,
  dir: OwnedFd,
  name: CString,
  placed: bool,
}

/// The names of this agent's entries not yet placed or removed.
static IN_FLIGHT: Mutex<Vec<CString>> = Mutex::new(Vec::new());

impl Entry {
  fn new(parent: OwnedFd, dir: OwnedFd, name: CString) -> Entry {
    IN_FLIGHT.lock().expect("in flight").push(name.clone());
    Entry {
      parent,
      dir,
      name,
      placed: false,
    }
  }
}

impl Drop for Entry {
  fn drop(&mut self) {
    if !self.placed {
      unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0) };
    }
    unsafe {
      libc::unlinkat(
        self.parent.as_raw_fd(),
        self.name.as_ptr(),
        libc::AT_REMOVEDIR,
      )
    };
    IN_FLIGHT
      .lock()
      .expect("in flight")
      .retain(|n| n != &self.name);
  }
}

/// How a staged write went before the user's final rename.
enum Step {
  /// The host cancelled the stream: it wants no answer.
  Cancelled,
  Declined(String),
  /// At the name of the user's temporary file, the user's, with its mode.
  Placed {
    size: u64,
  },
  Failed(AgentError),
}

/// Serves an `upload_staged` stream: stage, wait for the host's `End`, place.
pub async fn upload(ctx: Rc<Ctx>, spec: StagedUploadSpec, mut io: StreamIo) {
  let shown = spec.path.clone();
  let (me, creds, staged) =
    match ops::prepare(&ctx, &shown, spec.user.as_deref(), spec.parents).await {
      Ok((me, creds, staged)) => (me, creds, Arc::new(staged)),
      Err(e) => return io.result(&Outcome::<StagedDone>::Err(e)),
    };
  let step = if ctx.me.uid != 0 {
    Step::Declined("the agent does not run as root".into())
  } else {
    stage_and_place(&ctx, &spec, &mut io, &staged, &creds).await
  };
  let outcome = match step {
    Step::Cancelled => None,
    Step::Declined(why) => Some(Ok(StagedDone {
      size: 0,
      declined: Some(why),
    })),
    Step::Failed(e) => Some(Err(e)),
    Step::Placed { size } => {
      let s = staged.clone();
      let renamed = ops::as_user(&ctx, me.clone(), creds.clone(), &shown, move || {
        ops::replace(s.dir.as_raw_fd(), &s.temp, &s.name, size)
      })
      .await;
      Some(renamed.map(|_| StagedDone {
        size,
        declined: None,
      }))
    }
  };
  if !matches!(&outcome, Some(Ok(StagedDone { declined: None, .. }))) {
    let s = staged.clone();
    let _ = ops::as_user(&ctx, me, creds, &shown, move || {
      unsafe { libc::unlinkat(s.dir.as_raw_fd(), s.temp.as_ptr(), 0) };
      Ok(())
    })
    .await;
  }
  if let Some(o) = outcome {
    io.result(&Outcome::from(o));
  }
}

async fn stage_and_place(
  ctx: &Ctx,
  spec: &StagedUploadSpec,
  io: &mut StreamIo,
  staged: &Arc<Staged>,
  creds: &Creds,
) -> Step {
  let s = staged.clone();
  let path = spec
    .staging
    .clone()
    .unwrap_or_else(|| STAGING_DIR.to_string());
  let p = path.clone();
  let opened = ctx
    .pool
    .run(move || open_staging(&p, s.dir.as_raw_fd()))
    .await;
  let entry = match opened {
    Ok(Ok(e)) => e,
    Ok(Err(why)) => return Step::Declined(why),
    Err(e) => return Step::Declined(format!("the staging directory: {e}")),
  };
  let name = entry.name.to_string_lossy().into_owned();
  let staging = format!("{path}/{name}");
  io.send_head(&StagedHead {
    dir: staging.clone(),
    name,
  });
  loop {
    match io.recv().await {
      None => return Step::Cancelled,
      Some(In::End) => break,
      Some(In::Data(_)) => {
        return Step::Failed(AgentError::new(
          ErrorKind::InvalidRequest,
          "a staged upload's bytes come through the engine, not the stream",
        ))
      }
      Some(In::Result(_)) => {}
    }
  }
  let (s, size, creds, mode) = (staged.clone(), spec.size, creds.clone(), spec.mode & 0o7777);
  let placed = ctx
    .pool
    .run(move || {
      let mut entry = entry;
      let placed = place(&mut entry, &s, size, &creds, mode);
      let intact = matches!(placed, Err(Unplaced::Missing)) && still_there(&staging, &entry.dir);
      (placed, intact)
    })
    .await;
  match placed {
    (Ok(()), _) => {
      PLACED.store(true, Ordering::Relaxed);
      Step::Placed { size }
    }
    (Err(Unplaced::Missing), false) => Step::Declined(
      "the staging directory was replaced while the engine wrote into it (by a root workload?); this write goes on the stream"
        .into(),
    ),
    (Err(Unplaced::Missing), true) => Step::Declined(missed()),
    (Err(Unplaced::Io(e)), _) => Step::Failed(ops::io_error(&spec.path, &e)),
    // Not what the host put (a link, a second link, another size): that attempt only.
    (Err(Unplaced::NotAsPut), _) => Step::Declined(
      "what arrived in the staging directory is not what the host put (a link, or another size); this write goes on the stream"
        .into(),
    ),
  }
}

/// Set once the engine's write of a staged file was not there, twice, while none had ever been
/// placed: a runtime with a root file system of its own (gVisor's overlay keeps the host's writes
/// out). One miss alone could be a root workload's doing (the staging directory swapped for a
/// link and back), and once a staged write was placed the runtime plainly can stage.
static UNSEEN: AtomicBool = AtomicBool::new(false);
/// Misses with the staging directory in place, and whether a staged write was ever placed.
static MISSES: AtomicU32 = AtomicU32::new(0);
static PLACED: AtomicBool = AtomicBool::new(false);
/// Misses, with none placed, that show the runtime cannot stage.
const MISSES_TO_GIVE_UP: u32 = 2;
const UNSEEN_WHY: &str =
  "what the engine writes into the root file system does not appear in the container";

/// Counts a miss with the staging directory in place; why this write goes on the stream.
fn missed() -> String {
  let misses = MISSES.fetch_add(1, Ordering::Relaxed) + 1;
  if !PLACED.load(Ordering::Relaxed) && misses >= MISSES_TO_GIVE_UP {
    UNSEEN.store(true, Ordering::Relaxed);
    return UNSEEN_WHY.into();
  }
  "what the engine reported writing is not in the staging directory; this write goes on the stream"
    .into()
}

/// Whether `path` still names the directory `dir` (and no link to it).
fn still_there(path: &str, dir: &OwnedFd) -> bool {
  let (Ok(c), Ok(opened)) = (CString::new(path), sys::fstat(dir.as_raw_fd())) else {
    return false;
  };
  sys::fstatat(libc::AT_FDCWD, &c, libc::AT_SYMLINK_NOFOLLOW).is_ok_and(|now| {
    now.st_mode & libc::S_IFMT == libc::S_IFDIR
      && (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)
  })
}

/// Why a staged file was not placed.
enum Unplaced {
  /// Not there at all.
  Missing,
  /// Not a regular file of the size the host put, with one link.
  NotAsPut,
  Io(io::Error),
}

impl From<io::Error> for Unplaced {
  fn from(e: io::Error) -> Self {
    Unplaced::Io(e)
  }
}

/// Makes (or checks) the staging directory and picks a new name in it; `Err` says why nothing
/// may be staged here. `target` is the directory the file goes to: it must be on the same file
/// system, so the staged file is moved, not copied.
fn open_staging(staging: &str, target: libc::c_int) -> io::Result<Result<Entry, String>> {
  if UNSEEN.load(Ordering::Relaxed) {
    return Ok(Err(UNSEEN_WHY.into()));
  }
  let usable = staging.starts_with('/') && !staging.split('/').any(|c| c == ".." || c == ".");
  let parent = match staging.rsplit_once('/') {
    Some((_, "")) | None => None,
    Some(("", _)) => Some("/"),
    Some((p, _)) => Some(p),
  };
  let Some(parent) = parent.filter(|_| usable) else {
    return Ok(Err(format!("{staging}: not a usable staging path")));
  };
  let Ok(parent_c) = CString::new(parent) else {
    return Ok(Err(format!("{staging}: not a usable staging path")));
  };
  let up = sys::fstatat(libc::AT_FDCWD, &parent_c, 0)?;
  if up.st_uid != 0 || up.st_mode & 0o022 != 0 {
    return Ok(Err(format!("{parent} may be written by others than root")));
  }
  let path = CString::new(staging).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
  if unsafe { libc::mkdir(path.as_ptr(), 0o700) } != 0 {
    match sys::errno() {
      libc::EEXIST => {}
      libc::EROFS => return Ok(Err("the root file system is read-only".into())),
      e => return Err(io::Error::from_raw_os_error(e)),
    }
  }
  let dir = match sys::open(
    &path,
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
    0,
  ) {
    Ok(d) => d,
    Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
      return Ok(Err(format!("{staging} is not a directory")))
    }
    Err(e) => return Err(e),
  };
  let st = sys::fstat(dir.as_raw_fd())?;
  if st.st_uid != 0 || st.st_mode & 0o077 != 0 {
    return Ok(Err(format!("{staging} may be entered by others than root")));
  }
  if sys::fstat(target)?.st_dev != st.st_dev {
    return Ok(Err(
      "the target directory is on another file system than the root".into(),
    ));
  }
  sweep(staging, &dir);
  let name = CString::new(random_name()?).expect("hex");
  sys::cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o700) })?;
  let sub = sys::openat(
    dir.as_raw_fd(),
    &name,
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
    0,
  );
  let sub = match sub {
    Ok(s) => s,
    Err(e) => {
      unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
      return Err(e);
    }
  };
  Ok(Ok(Entry::new(dir, sub, name)))
}

/// The agent's pid, then 128 random bits in hex: a name the workload cannot guess, and whose
/// agent can be told alive or gone.
fn random_name() -> io::Result<String> {
  let mut b = [0u8; 16];
  let n = unsafe { libc::syscall(libc::SYS_getrandom, b.as_mut_ptr(), b.len(), 0) };
  if n != b.len() as libc::c_long {
    return Err(io::Error::last_os_error());
  }
  let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
  Ok(format!("{}.{hex}", std::process::id()))
}

/// Removes staged writes nobody will place (their directories, and files as earlier agents
/// staged them): those of an agent that is gone (the host's stream ended with the upload in
/// flight), this agent's own that are no longer in flight (the engine made one after its upload
/// was cancelled), and any older than `STALE`.
fn sweep(path: &str, dir: &OwnedFd) {
  let Ok(entries) = std::fs::read_dir(path) else {
    return;
  };
  let now_ms = SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .unwrap_or_default()
    .as_millis() as i64;
  for e in entries.flatten() {
    let raw = e.file_name();
    let raw = std::os::unix::ffi::OsStrExt::as_bytes(raw.as_os_str()).to_vec();
    let pid = std::str::from_utf8(&raw)
      .ok()
      .and_then(|n| n.split_once('.'))
      .and_then(|(p, _)| p.parse::<libc::pid_t>().ok());
    let Ok(name) = CString::new(raw) else {
      continue;
    };
    let Ok(st) = sys::fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) else {
      continue;
    };
    let mine = pid == Some(std::process::id() as libc::pid_t);
    let gone =
      pid.is_some_and(|p| p > 0 && unsafe { libc::kill(p, 0) } != 0 && sys::errno() == libc::ESRCH);
    let abandoned = mine && !IN_FLIGHT.lock().expect("in flight").contains(&name);
    let stale = now_ms - sys::mtime_ms(&st) > STALE.as_millis() as i64;
    if !(gone || abandoned || stale) {
      continue;
    }
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
      empty(dir, &name);
      unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
    } else {
      unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) };
    }
  }
}

/// Removes what a staged write's directory holds (what the engine put there: files, no deeper
/// directories), never following a link.
fn empty(parent: &OwnedFd, name: &CString) {
  let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
  let Ok(sub) = sys::openat(parent.as_raw_fd(), name, flags, 0) else {
    return;
  };
  let Ok(listed) = std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd())) else {
    return;
  };
  for e in listed.flatten() {
    let raw = std::os::unix::ffi::OsStrExt::as_bytes(e.file_name().as_os_str()).to_vec();
    if let Ok(n) = CString::new(raw) {
      unsafe { libc::unlinkat(sub.as_raw_fd(), n.as_ptr(), 0) };
    }
  }
}

/// Checks what the engine wrote (a regular file of exactly `size` bytes, one link), gives it to
/// the user with `mode`, and moves it to the name of the user's temporary file (copied when that
/// is on another file system after all).
fn place(
  entry: &mut Entry,
  staged: &Staged,
  size: u64,
  creds: &Creds,
  mode: u32,
) -> Result<(), Unplaced> {
  let fd = sys::openat(
    entry.dir.as_raw_fd(),
    &entry.name,
    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
    0,
  )
  .map_err(|e| match e.raw_os_error() {
    Some(libc::ENOENT) => Unplaced::Missing,
    Some(libc::ELOOP | libc::ENXIO) => Unplaced::NotAsPut,
    _ => Unplaced::Io(e),
  })?;
  let st = sys::fstat(fd.as_raw_fd())?;
  if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 1 || st.st_size as u64 != size {
    return Err(Unplaced::NotAsPut);
  }
  let raw = fd.as_raw_fd();
  if st.st_uid != creds.uid || st.st_gid != creds.gid {
    sys::cvt(unsafe { libc::fchown(raw, creds.uid, creds.gid) })?;
  }
  sys::cvt(unsafe { libc::fchmod(raw, mode) })?;
  // The user's empty temporary file gives way first: a rename over it would make ext4 write
  // the staged file out before returning (see `ops::replace`). Should the user make that name
  // again meanwhile, the move is refused rather than replace what the user made.
  let (from, to) = (entry.dir.as_raw_fd(), staged.dir.as_raw_fd());
  sys::cvt(unsafe { libc::unlinkat(to, staged.temp.as_ptr(), 0) })?;
  let moved = match sys::renameat2(from, &entry.name, to, &staged.temp, sys::RENAME_NOREPLACE) {
    Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
      sys::cvt(unsafe { libc::renameat(from, entry.name.as_ptr(), to, staged.temp.as_ptr()) })
        .map(|_| ())
    }
    other => other,
  };
  match moved {
    Ok(()) => {
      entry.placed = true;
      Ok(())
    }
    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
      // A mount came between the check and now: copy (in the kernel) into a new temporary
      // file of the user's; the staged entry is removed when `entry` is dropped.
      let f = sys::openat(
        to,
        &staged.temp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
      )?;
      sys::cvt(unsafe { libc::fchown(f.as_raw_fd(), creds.uid, creds.gid) })?;
      let mut into = File::from(f);
      let copied = io::copy(&mut File::from(fd), &mut into)?;
      if copied != size {
        return Err(Unplaced::NotAsPut);
      }
      sys::cvt(unsafe { libc::fchmod(into.as_raw_fd(), mode) })?;
      Ok(())
    }
    Err(e) => Err(Unplaced::Io(e)),
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn names_are_random_hex() {
    let (a, b) = (random_name().unwrap(), random_name().unwrap());
    let (pid, hex) = a.split_once('.').unwrap();
    assert_eq!(pid, std::process::id().to_string());
    assert_eq!(hex.len(), 32);
    assert!(hex.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
  }
}
