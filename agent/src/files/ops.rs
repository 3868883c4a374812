//! Uploads, downloads, stat and the layout, done inside the container with the sandbox user's
//! credentials (on pool threads that switch only their own file-system identity). Reads never
//! block on a FIFO or device (opened non-blocking, refused unless regular); writes go to a
//! temporary file in the target directory that is renamed into place.

use std::collections::hash_map::RandomState;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use trueforge_agent_proto::frame::MAX_DATA;
use trueforge_agent_proto::msg::{
  AgentError, DownloadDone, DownloadHead, DownloadSpec, ErrorKind, FileKind, LayoutSpec, Outcome,
  StatInfo, StatSpec, UploadDone, UploadSpec,
};

use crate::base::conn::{In, Pipe, StreamIo};
use crate::base::sys::{self, Creds, Identity};
use crate::files::resolve::{self, Links};
use crate::state::ctx::Ctx;

/// Longest path accepted (PATH_MAX less the terminating NUL).
const MAX_PATH: usize = 4095;
/// Bytes read from a file per pool job.
const READ_CHUNK: usize = 256 * 1024;
/// A download's read buffer, taken this much at a time.
const READ_BLOCK: usize = 4 << 20;
/// Files at least this large are put in place without a rename over the old one (see `replace`).
const SWAP_MIN: u64 = 1 << 20;
/// Upload bytes gathered into one pool job.
const WRITE_BATCH: usize = 1 << 20;

/// Checks a path from the host: absolute, no NUL, no `..`.
fn check_path(path: &str) -> Result<Vec<u8>, AgentError> {
  let bad = |why: &str| AgentError::new(ErrorKind::InvalidPath, format!("{path}: {why}"));
  if !path.starts_with('/') {
    return Err(bad("not an absolute path"));
  }
  if path.contains('\0') {
    return Err(bad("contains a NUL byte"));
  }
  if path.len() > MAX_PATH {
    return Err(bad("longer than the system allows"));
  }
  if path.split('/').any(|c| c == "..") {
    return Err(bad("contains '..'"));
  }
  Ok(path.as_bytes().to_vec())
}

/// The kind of a file from its mode.
pub fn kind_of(mode: libc::mode_t) -> FileKind {
  match mode & libc::S_IFMT {
    libc::S_IFREG => FileKind::File,
    libc::S_IFDIR => FileKind::Directory,
    libc::S_IFLNK => FileKind::Symlink,
    libc::S_IFCHR => FileKind::CharDevice,
    libc::S_IFBLK => FileKind::BlockDevice,
    libc::S_IFIFO => FileKind::Fifo,
    libc::S_IFSOCK => FileKind::Socket,
    _ => FileKind::Unknown,
  }
}

/// A typed error for an OS error met while working on `path`.
pub(crate) fn io_error(path: &str, e: &io::Error) -> AgentError {
  // Opening a Unix socket (or a device with no driver) fails with ENXIO: it is no regular file.
  if e.raw_os_error() == Some(libc::ENXIO) {
    return not_regular(path, FileKind::Socket);
  }
  let (kind, why) = match e.raw_os_error().unwrap_or(0) {
    libc::ENOENT => (ErrorKind::NotFound, "no such file or directory"),
    libc::EISDIR => (ErrorKind::IsDirectory, "is a directory"),
    libc::ENOTDIR => (
      ErrorKind::NotADirectory,
      "a parent of this path is a file, not a directory",
    ),
    libc::EACCES | libc::EPERM => (ErrorKind::PermissionDenied, "permission denied"),
    libc::EROFS => (
      ErrorKind::ReadOnly,
      "the path is on a read-only file system",
    ),
    libc::EBUSY => (
      ErrorKind::Busy,
      "the path is a mount point or busy (the engine bind-mounts some files, such as /etc/hosts)",
    ),
    libc::ELOOP => (
      ErrorKind::InvalidPath,
      "too many levels of symbolic links, or a link the agent does not follow (/proc/…/fd)",
    ),
    libc::ENAMETOOLONG => (ErrorKind::InvalidPath, "a name in the path is too long"),
    libc::ENOSPC | libc::EDQUOT | libc::EFBIG => (ErrorKind::NoSpace, "no space left"),
    libc::EXDEV => (ErrorKind::Busy, "the path is on another file system"),
    _ => return AgentError::new(ErrorKind::Io, format!("{path}: {e}")),
  };
  AgentError::new(kind, format!("{path}: {why}"))
}

fn not_regular(path: &str, kind: FileKind) -> AgentError {
  let mut e = AgentError::new(
    ErrorKind::NotRegularFile,
    format!("{path} is a {}, not a regular file", kind.describe()),
  );
  e.file_kind = Some(kind);
  e
}

fn too_large(path: &str, size: u64, max: u64) -> AgentError {
  let mut e = AgentError::new(
    ErrorKind::TooLarge,
    format!("{path} is {size} bytes, over the limit of {max}"),
  );
  e.size = Some(size);
  e.max = Some(max);
  e
}

pub(crate) fn changed(path: &str) -> AgentError {
  AgentError::new(
    ErrorKind::Changed,
    format!("{path} changed while it was being read; try again"),
  )
}

/// The user a request acts as, with the agent's own identity to return to.
fn who(ctx: &Ctx, spec: Option<&str>) -> Result<(Identity, Creds), AgentError> {
  let user = ctx
    .users
    .resolve(spec)
    .map_err(|e| AgentError::new(ErrorKind::UnknownUser, e))?;
  Ok((ctx.me.clone(), ctx.creds_of(&user)))
}

/// Runs `f` on a pool thread as `creds`. A failed switch is a permission error.
pub(crate) async fn as_user<T: Send + 'static>(
  ctx: &Ctx,
  me: Identity,
  creds: Creds,
  path: &str,
  f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<T, AgentError> {
  let r = ctx.pool.run(move || sys::as_user(&me, &creds, f)).await;
  match r {
    Ok(Ok(v)) => Ok(v),
    Ok(Err(e)) => Err(io_error(path, &e)),
    Err(e) => Err(AgentError::new(
      ErrorKind::PermissionDenied,
      format!("{path}: the agent cannot act as the sandbox user ({e}); the container must keep the SETUID and SETGID capabilities"),
    )),
  }
}

/// Streams a file to the host: its size first, then its bytes under the host's credit.
pub async fn download(ctx: Rc<Ctx>, spec: DownloadSpec, mut io: StreamIo) {
  if let Some(outcome) = download_inner(&ctx, &spec, &io).await {
    io.result(&outcome);
  }
}

async fn download_inner(
  ctx: &Ctx,
  spec: &DownloadSpec,
  io: &StreamIo,
) -> Option<Outcome<DownloadDone>> {
  let shown = spec.path.as_str();
  let (file, st) = match open_download(ctx, spec).await {
    Ok(v) => v,
    Err(e) => return Some(Outcome::Err(e)),
  };
  let size = st.st_size as u64;
  if size > spec.max_bytes {
    return Some(Outcome::Err(too_large(shown, size, spec.max_bytes)));
  }
  // Placed before the first byte is read (see `watch`). Without it, what was sent is hashed
  // and compared with the file read again.
  let watching = ctx.watcher.watch(file.as_raw_fd());
  let keys = watching.is_none().then(RandomState::new);
  io.send_head(&DownloadHead {
    size,
    mode: st.st_mode & 0o7777,
    mtime_ms: sys::mtime_ms(&st),
  });
  let file = Arc::new(file);
  let spliced = match keys {
    Some(_) => Sent::NoSplice,
    None => send_spliced(ctx, io, &file, size).await,
  };
  let (sent, digest) = match spliced {
    Sent::NoSplice => send_copied(ctx, io, &file, size, keys.clone()).await,
    other => (other, None),
  };
  let sent = match sent {
    Sent::All(n) => n,
    Sent::Cancelled | Sent::NoSplice => return None,
    Sent::Failed(e) => return Some(Outcome::Err(io_error(shown, &e))),
    Sent::Grew => return Some(Outcome::Err(changed(shown))),
  };
  let mut whole = sent == size && settled(ctx, &file, &st).await;
  whole &= match (&watching, keys, digest) {
    (Some(w), _, _) => !w.written(),
    (None, Some(keys), Some(d)) => read_digest(ctx, &file, size, keys).await == Some(d),
    _ => false,
  };
  if !whole {
    return Some(Outcome::Err(changed(shown)));
  }
  Some(Outcome::Ok(DownloadDone { size: sent }))
}

/// Opens a download's file as its user: a regular file, or a typed error.
async fn open_download(ctx: &Ctx, spec: &DownloadSpec) -> Result<(File, libc::stat), AgentError> {
  let shown = spec.path.as_str();
  let path = check_path(shown)?;
  let (me, creds) = who(ctx, spec.user.as_deref())?;
  let (file, st, kernel) = as_user(ctx, me, creds, shown, move || {
    let fd = resolve::open_read(&path)?;
    let mut st = sys::fstat(fd.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT == libc::S_IFREG {
      // A write already under way (its times set before `st`) is waited out, as `settled`
      // does at the end: any write the download then overlaps begins after `st`, and shows
      // in its change time even when its inotify event comes after the last byte is out.
      unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_DATA) };
      st = sys::fstat(fd.as_raw_fd())?;
    }
    // gVisor's procfs answers statfs with ENOSYS: a file system that cannot say what it is
    // is taken for the kernel's.
    let kernel = match sys::fs_magic(fd.as_raw_fd()) {
      Ok(magic) => kernel_fs(magic),
      Err(e) => e.raw_os_error() == Some(libc::ENOSYS),
    };
    Ok((File::from(fd), st, kernel))
  })
  .await?;
  match kind_of(st.st_mode) {
    // /proc, /sys and their kin show their files as regular, empty or of a made-up size, and
    // many refuse to be read: what a link there leads to is no file to download.
    FileKind::File if kernel => Err(not_regular(shown, FileKind::KernelFile)),
    FileKind::File => Ok((file, st)),
    FileKind::Directory => Err(AgentError::new(
      ErrorKind::IsDirectory,
      format!("{shown} is a directory"),
    )),
    other => Err(not_regular(shown, other)),
  }
}

/// File systems of the kernel's own (by `statfs` magic): proc, sysfs, debugfs, tracefs,
/// securityfs, cgroup, cgroup2, bpf, configfs, pstore, efivarfs, selinuxfs, smackfs,
/// binfmt_misc, fusectl, nsfs.
fn kernel_fs(magic: u64) -> bool {
  const KERNEL: [u64; 16] = [
    0x9fa0,
    0x6265_6572,
    0x6462_6720,
    0x7472_6163,
    0x7363_6673,
    0x0027_e0eb,
    0x6367_7270,
    0xcafe_4a11,
    0x6265_6570,
    0x6165_676c,
    0xde5e_81e4,
    0xf97c_ff8c,
    0x4341_5d53,
    0x4249_4e4d,
    0x6573_5543,
    0x6e73_6673,
  ];
  KERNEL.contains(&magic)
}

/// Whether the file is as it was when opened (`st`), once any write under way has ended. A
/// write sets the file's times before it copies its bytes: asking for the start of its data
/// takes the inode's lock on the common file systems (ext4, tmpfs, overlayfs over them), so it
/// waits out a write still copying, whose event `watch` then sees. A write begun after `st`
/// shows in the change time (file systems with fine-grained times give a new one to a change
/// made after the time was read).
async fn settled(ctx: &Ctx, file: &Arc<File>, st: &libc::stat) -> bool {
  let f = file.clone();
  let after = ctx
    .pool
    .run(move || {
      unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
      sys::fstat(f.as_raw_fd())
    })
    .await;
  after.is_ok_and(|a| same_version(st, &a))
}

/// Size, inode, and modification and change times alike.
fn same_version(a: &libc::stat, b: &libc::stat) -> bool {
  (a.st_dev, a.st_ino, a.st_size) == (b.st_dev, b.st_ino, b.st_size)
    && (a.st_mtime, a.st_mtime_nsec) == (b.st_mtime, b.st_mtime_nsec)
    && (a.st_ctime, a.st_ctime_nsec) == (b.st_ctime, b.st_ctime_nsec)
}

/// The file's first `size` bytes hashed with `keys`, read again; `None` if it is shorter or
/// cannot be read. In pool jobs of `READ_BLOCK` bytes, so a large file holds no thread long.
async fn read_digest(ctx: &Ctx, file: &Arc<File>, size: u64, keys: RandomState) -> Option<u64> {
  let mut hasher = Some(keys.build_hasher());
  let mut offset = 0u64;
  while offset < size {
    let (f, mut h) = (file.clone(), hasher.take()?);
    let want = (size - offset).min(READ_BLOCK as u64) as usize;
    let (h, n) = ctx
      .pool
      .run(move || {
        let mut buf = vec![0u8; want.min(READ_CHUNK)];
        let mut got = 0;
        while got < want {
          let take = (want - got).min(buf.len());
          match f.read_at(&mut buf[..take], offset + got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
              h.write(&buf[..n]);
              got += n;
            }
          }
        }
        (h, got)
      })
      .await;
    if n == 0 {
      return None;
    }
    offset += n as u64;
    hasher = Some(h);
  }
  hasher.map(|h| h.finish())
}

/// How a download's bytes went.
enum Sent {
  All(u64),
  Cancelled,
  Failed(io::Error),
  /// More bytes than the size announced: the file grew while it was read.
  Grew,
  /// The file system takes no splice; nothing was sent.
  NoSplice,
}

/// Pipes a download alternates between: one is filled while the other drains.
const PIPES: usize = 2;
/// The least a download's pipe must hold for splicing to pay.
const MIN_PIPE: usize = 64 * 1024;
/// Files from this size on are spliced: below it a copy costs little, and needs no wait for
/// the pipe to drain before the file is checked again.
const SPLICE_FROM: u64 = 512 << 10;

/// Sends the file without copying it through our memory: a pool thread moves its pages into a
/// pipe of ours (a read from disk may wait there, never on the protocol thread), and the writer
/// moves them from that pipe to stdout. The file is read at explicit offsets, so a file system
/// without splice leaves it as it was for `send_copied`.
async fn send_spliced(ctx: &Ctx, io: &StreamIo, file: &Arc<File>, size: u64) -> Sent {
  if !ctx.splice || size < SPLICE_FROM {
    return Sent::NoSplice;
  }
  let mut pipes = Vec::with_capacity(PIPES);
  for _ in 0..PIPES {
    let Ok((read, write)) = sys::pipe() else {
      return Sent::NoSplice;
    };
    // A user over its pipe allowance gets one-page pipes: copying is faster then.
    let capacity = sys::grow_pipe(write.as_raw_fd(), READ_CHUNK).unwrap_or(0);
    if capacity < MIN_PIPE + sys::page_size() {
      return Sent::NoSplice;
    }
    pipes.push(Arc::new(Pipe {
      read,
      write,
      capacity,
    }));
  }
  let page = sys::page_size();
  let mut in_flight = std::collections::VecDeque::new();
  let (mut offset, mut sent, mut turn) = (0i64, 0u64, 0usize);
  let outcome = loop {
    // The pipe this turn fills is free once the frame sent from it two turns ago is out.
    if in_flight.len() == PIPES {
      let done: tokio::sync::oneshot::Receiver<bool> = in_flight.pop_front().expect("in flight");
      if !done.await.unwrap_or(false) {
        break Sent::Cancelled; // stdout is gone: the agent is exiting
      }
    }
    let avail = io.credit().await;
    if avail == 0 {
      break Sent::Cancelled;
    }
    let pipe = pipes[turn % PIPES].clone();
    turn += 1;
    // A pipe holds pages, not bytes: a read that starts inside a page needs one page more.
    let want = (avail as usize).min(READ_CHUNK).min(pipe.capacity - page);
    let (f, p) = (file.clone(), pipe.clone());
    let filled = ctx.pool.run(move || fill(&f, offset, &p, want)).await;
    let n = match filled {
      Ok(n) => n,
      Err(e) if sent == 0 && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
        return Sent::NoSplice;
      }
      Err(e) => break Sent::Failed(e),
    };
    if n == 0 {
      break Sent::All(sent);
    }
    offset += n as i64;
    sent += n as u64;
    if sent > size {
      break Sent::Grew;
    }
    in_flight.push_back(io.send_spliced(pipe, n));
    if sent == size {
      break Sent::All(sent);
    }
  };
  // Whatever was handed to the writer goes out before the answer. Until the engine's end of
  // stdout has read it, what sits in the pipes is the file's pages, not copies: a write to the
  // file would still show in them. So the file is checked again (for a change while it was
  // read) only once they are read.
  for done in in_flight {
    let _ = done.await;
  }
  if matches!(outcome, Sent::All(_)) {
    io.drained().await;
  }
  outcome
}

/// Moves up to `want` bytes of `file` from `offset` into the empty `pipe`; fewer at the end of
/// the file, or when the pipe has no slot left. Never waits on the pipe: a download's pipe
/// stuck full would hold this pool thread for good.
fn fill(file: &File, offset: i64, pipe: &Pipe, want: usize) -> io::Result<usize> {
  let (from, to) = (file.as_raw_fd(), pipe.write.as_raw_fd());
  let mut off = offset;
  let mut got = 0;
  let nonblock = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
  while got < want {
    match sys::splice(from, Some(&mut off), to, want - got, nonblock) {
      Ok(0) => break,
      Ok(n) => got += n,
      Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
      Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => break,
      // Nothing moved into the empty pipe: older kernels say so when the file's pages are not
      // cached yet. A waiting splice into a pipe with room waits for the disk only (it moves
      // what fits and returns).
      Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
        match sys::splice(from, Some(&mut off), to, want, libc::SPLICE_F_MOVE)? {
          0 => break,
          n => got += n,
        }
      }
      Err(e) => return Err(e),
    }
  }
  Ok(got)
}

/// Sends the file through a buffer of ours (a file system that takes no splice, small files,
/// and downloads with no watch). With `keys`, also the hash of what was sent.
async fn send_copied(
  ctx: &Ctx,
  io: &StreamIo,
  file: &Arc<File>,
  size: u64,
  keys: Option<RandomState>,
) -> (Sent, Option<u64>) {
  let mut sent = 0u64;
  let mut hasher = keys.map(|k| k.build_hasher());
  // Read into one block, reused once the pieces sent from it are written (a fresh buffer per
  // read costs a mapping and its page faults each time).
  let mut block = BytesMut::new();
  loop {
    // Growth shows in the size checked after (no read to the end of the file needed).
    if sent == size {
      return (Sent::All(sent), hasher.map(|h| h.finish()));
    }
    let avail = io.credit().await;
    if avail == 0 {
      return (Sent::Cancelled, None);
    }
    let want = (avail as usize).min(READ_CHUNK);
    let (f, mut b, mut h) = (file.clone(), std::mem::take(&mut block), hasher.take());
    let read = ctx
      .pool
      .run(move || {
        if b.capacity() < want {
          b.reserve(READ_BLOCK);
        }
        b.resize(want, 0);
        // At explicit offsets: the file's position is left alone.
        let n = f.read_at(&mut b, sent)?;
        b.truncate(n);
        if let Some(h) = h.as_mut() {
          h.write(&b);
        }
        let chunk = b.split().freeze();
        Ok::<_, io::Error>((chunk, b, h))
      })
      .await;
    let mut chunk = match read {
      Ok((c, b, h)) => {
        (block, hasher) = (b, h);
        c
      }
      Err(e) => return (Sent::Failed(e), None),
    };
    if chunk.is_empty() {
      return (Sent::All(sent), hasher.map(|h| h.finish()));
    }
    sent += chunk.len() as u64;
    if sent > size {
      return (Sent::Grew, None);
    }
    while !chunk.is_empty() {
      let n = chunk.len().min(MAX_DATA);
      io.send_now(chunk.split_to(n));
    }
  }
}

/// Names temporary upload files; unique with the pid and a counter (and O_EXCL).
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A temporary file being written in the target's directory.
pub(crate) struct Staged {
  pub dir: OwnedFd,
  pub temp: CString,
  pub name: CString,
  pub file: Arc<File>,
}

/// Writes a file from the host's data: a temporary file in the target directory, renamed into
/// place once complete, removed on any failure.
pub async fn upload(ctx: Rc<Ctx>, spec: UploadSpec, mut io: StreamIo) {
  let shown = spec.path.clone();
  let (me, creds, staged) = match prepare(&ctx, &shown, spec.user.as_deref(), spec.parents).await {
    Ok(v) => v,
    Err(e) => return io.result(&Outcome::<UploadDone>::Err(e)),
  };
  let written = receive(&ctx, &spec, &mut io, &staged).await;
  let outcome = match written {
    None => None,
    Some(Err(e)) => Some(Err(e)),
    Some(Ok(size)) => {
      let mode = spec.mode & 0o7777;
      let (file, dir, temp, name) = (
        staged.file.clone(),
        staged.dir.as_raw_fd(),
        staged.temp.clone(),
        staged.name.clone(),
      );
      let placed = as_user(&ctx, me.clone(), creds.clone(), &shown, move || {
        // The mode is set explicitly: the umask must not narrow what the caller asked for.
        sys::cvt(unsafe { libc::fchmod(file.as_raw_fd(), mode) })?;
        replace(dir, &temp, &name, size)
      })
      .await;
      Some(placed.map(|_| UploadDone { size }))
    }
  };
  if !matches!(outcome, Some(Ok(_))) {
    let (dir, temp) = (staged.dir, staged.temp);
    let _ = as_user(&ctx, me, creds, &shown, move || {
      unsafe { libc::unlinkat(dir.as_raw_fd(), temp.as_ptr(), 0) };
      Ok(())
    })
    .await;
  }
  if let Some(o) = outcome {
    io.result(&Outcome::from(o));
  }
}

/// Checks an upload's path, resolves its user and, as that user, opens the target directory
/// (making missing parents when asked) and creates the temporary file there.
pub(crate) async fn prepare(
  ctx: &Ctx,
  shown: &str,
  user: Option<&str>,
  parents: bool,
) -> Result<(Identity, Creds, Staged), AgentError> {
  let path = check_path(shown)?;
  let (me, creds) = who(ctx, user)?;
  let (parent, name) = split_parent(&path)
    .ok_or_else(|| AgentError::new(ErrorKind::IsDirectory, format!("{shown} is a directory")))?;
  let staged = as_user(ctx, me.clone(), creds.clone(), shown, move || {
    stage(&parent, &name, parents)
  })
  .await?;
  Ok((me, creds, staged))
}

/// Renames `temp` to `name` in `dir`, atomically replacing what is there. Never by a plain
/// rename over an existing file: ext4 then starts writing the new file's whole dirty contents out
/// before it returns (its `auto_da_alloc` guard for programs that skip fsync), about 90 ms for
/// 100 MiB here. A new name is taken with `RENAME_NOREPLACE`; an existing file is swapped with
/// `RENAME_EXCHANGE` and then unlinked. A directory at `name` is swapped back and refused, as a
/// plain rename would refuse it. File systems without these flags get a plain rename, and so do
/// files under `SWAP_MIN` (what little ext4 writes out for them costs less than the swap would
/// where the old file is in an image layer: overlayfs copies it up before swapping).
pub(crate) fn replace(dir: libc::c_int, temp: &CStr, name: &CStr, size: u64) -> io::Result<()> {
  let plain = || sys::cvt(unsafe { libc::renameat(dir, temp.as_ptr(), dir, name.as_ptr()) });
  if size < SWAP_MIN {
    return plain().map(|_| ());
  }
  let unsupported = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS));
  for _ in 0..8 {
    match sys::renameat2(dir, temp, dir, name, sys::RENAME_NOREPLACE) {
      Ok(()) => return Ok(()),
      Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
      Err(e) if unsupported(&e) => return plain().map(|_| ()),
      Err(e) => return Err(e),
    }
    match sys::renameat2(dir, temp, dir, name, sys::RENAME_EXCHANGE) {
      Ok(()) => {
        let old = sys::fstatat(dir, temp, libc::AT_SYMLINK_NOFOLLOW)?;
        if old.st_mode & libc::S_IFMT == libc::S_IFDIR {
          sys::renameat2(dir, temp, dir, name, sys::RENAME_EXCHANGE)?;
          return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        sys::cvt(unsafe { libc::unlinkat(dir, temp.as_ptr(), 0) })?;
        return Ok(());
      }
      // Gone between the two calls: take the name again.
      Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
      Err(e) if unsupported(&e) => return plain().map(|_| ()),
      Err(e) => return Err(e),
    }
  }
  plain().map(|_| ())
}

/// `/a/b/c` → (`/a/b`, `c`); `None` for a path naming a directory (`/`, `…/`, `…/.`).
fn split_parent(path: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
  if path.ends_with(b"/") || path.ends_with(b"/.") {
    return None;
  }
  let cut = path.iter().rposition(|&b| b == b'/')?;
  let name = &path[cut + 1..];
  if name.is_empty() || name == b"." {
    return None;
  }
  let parent = if cut == 0 {
    b"/".to_vec()
  } else {
    path[..cut].to_vec()
  };
  Some((parent, name.to_vec()))
}

/// Opens the target directory (making missing parents, 0755) and creates the temporary file.
/// Runs as the user.
fn stage(parent: &[u8], name: &[u8], parents: bool) -> io::Result<Staged> {
  let dir = resolve::open_dir(parent, Links::Follow, parents.then_some(0o755))?;
  let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
  // A directory at the target is refused now rather than after the whole transfer.
  if let Ok(st) = sys::fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) {
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
      return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
  }
  loop {
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let temp =
      CString::new(format!(".tf-upload.{}.{seq}", std::process::id())).expect("no NUL in a number");
    match sys::openat(
      dir.as_raw_fd(),
      &temp,
      libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
      0o600,
    ) {
      Ok(fd) => {
        return Ok(Staged {
          dir,
          temp,
          name,
          file: Arc::new(File::from(fd)),
        })
      }
      Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
      Err(e) => return Err(e),
    }
  }
}

/// Writes the host's data into the staged file. `None` when the stream was cancelled.
async fn receive(
  ctx: &Ctx,
  spec: &UploadSpec,
  io: &mut StreamIo,
  staged: &Staged,
) -> Option<Result<u64, AgentError>> {
  let mut total = 0u64;
  let mut batch: Vec<Bytes> = Vec::new();
  let mut ended = false;
  while !ended {
    let first = io.recv().await?;
    let mut size = 0;
    let push = |m: In, batch: &mut Vec<Bytes>, size: &mut usize| match m {
      In::Data(b) => {
        *size += b.len();
        batch.push(b);
        false
      }
      In::End => true,
      In::Result(_) => false,
    };
    ended = push(first, &mut batch, &mut size);
    // Whatever else already arrived goes in the same job.
    while !ended && size < WRITE_BATCH {
      match io.try_recv() {
        Some(m) => ended = push(m, &mut batch, &mut size),
        None => break,
      }
    }
    total += size as u64;
    if let Some(max) = spec.max_bytes {
      if total > max {
        return Some(Err(too_large(&spec.path, total, max)));
      }
    }
    if batch.is_empty() {
      continue;
    }
    let file = staged.file.clone();
    let data = std::mem::take(&mut batch);
    let written = ctx
      .pool
      .run(move || {
        for b in &data {
          (&*file).write_all(b)?;
        }
        Ok::<_, io::Error>(())
      })
      .await;
    if let Err(e) = written {
      return Some(Err(io_error(&spec.path, &e)));
    }
    io.consumed(size);
  }
  Some(Ok(total))
}

/// What is at a path, as the user sees it.
pub async fn stat(ctx: &Ctx, spec: StatSpec) -> Outcome<Option<StatInfo>> {
  let shown = spec.path.clone();
  let r = async {
    let path = check_path(&shown)?;
    let (me, creds) = who(ctx, spec.user.as_deref())?;
    let follow = spec.follow;
    as_user(ctx, me, creds, &shown, move || {
      let fd = match resolve::open_path(&path, follow) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
      };
      let st = sys::fstat(fd.as_raw_fd())?;
      let kind = kind_of(st.st_mode);
      let link_target = if kind == FileKind::Symlink {
        Some(String::from_utf8_lossy(&sys::readlinkat(fd.as_raw_fd(), c"")?).into_owned())
      } else {
        None
      };
      Ok(Some(StatInfo {
        kind,
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime_ms: sys::mtime_ms(&st),
        link_target,
      }))
    })
    .await
  }
  .await;
  r.into()
}

/// Makes the layout as root: each directory (and missing parent) without following any link,
/// then its owner and mode; then the links; then the activity file.
pub async fn layout(ctx: &Ctx, spec: LayoutSpec) -> Outcome<()> {
  let owner = match ctx.users.resolve(spec.user.as_deref()) {
    Ok(u) => (u.uid, u.gid),
    Err(e) => return Outcome::Err(AgentError::new(ErrorKind::UnknownUser, e)),
  };
  for d in &spec.dirs {
    let path = match check_path(&d.path) {
      Ok(p) => p,
      Err(e) => return Outcome::Err(e),
    };
    let (uid, gid) = if d.user_owned { owner } else { (0, 0) };
    let mode = d.mode & 0o7777;
    let r = ctx
      .pool
      .run(move || {
        let fd = resolve::open_dir(&path, Links::Refuse, Some(0o755))?;
        let dir = sys::openat(fd.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        sys::cvt(unsafe { libc::fchown(dir.as_raw_fd(), uid, gid) })?;
        sys::cvt(unsafe { libc::fchmod(dir.as_raw_fd(), mode) })?;
        Ok::<_, io::Error>(())
      })
      .await;
    if let Err(e) = r {
      return Outcome::Err(io_error(&d.path, &e));
    }
  }
  for l in &spec.links {
    let path = match check_path(&l.path) {
      Ok(p) => p,
      Err(e) => return Outcome::Err(e),
    };
    let Some((parent, name)) = split_parent(&path) else {
      return Outcome::Err(AgentError::new(
        ErrorKind::InvalidPath,
        format!("{}: not a file name", l.path),
      ));
    };
    let target = match CString::new(l.target.as_bytes()) {
      Ok(t) => t,
      Err(_) => {
        return Outcome::Err(AgentError::new(
          ErrorKind::InvalidPath,
          format!("{}: the link target contains a NUL byte", l.path),
        ))
      }
    };
    let r = ctx
      .pool
      .run(move || {
        let dir = resolve::open_dir(&parent, Links::Refuse, Some(0o755))?;
        let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let temp = CString::new(format!(".tf-link.{}.{seq}", std::process::id()))
          .expect("no NUL in a number");
        sys::cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), temp.as_ptr()) })?;
        let r = sys::cvt(unsafe {
          libc::renameat(
            dir.as_raw_fd(),
            temp.as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
          )
        });
        if r.is_err() {
          unsafe { libc::unlinkat(dir.as_raw_fd(), temp.as_ptr(), 0) };
        }
        r.map(|_| ())
      })
      .await;
    if let Err(e) = r {
      return Outcome::Err(io_error(&l.path, &e));
    }
  }
  if spec.activity_file {
    ctx.activity.enable();
  }
  Outcome::Ok(())
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn paths_are_checked() {
    assert!(check_path("/a/b").is_ok());
    for bad in ["a/b", "/a/../b", "/a\0", ""] {
      assert_eq!(
        check_path(bad).unwrap_err().kind,
        ErrorKind::InvalidPath,
        "{bad}"
      );
    }
    assert!(check_path("/a..b/..c").is_ok());
  }

  #[test]
  fn replace_takes_a_new_name_swaps_a_file_and_refuses_a_directory() {
    let root = std::env::temp_dir().join(format!("tf-replace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("dir")).unwrap();
    let dir = File::open(&root).unwrap();
    let c = |s: &str| CString::new(s).unwrap();
    let put = |name: &str, text: &str| std::fs::write(root.join(name), text).unwrap();
    let read = |name: &str| std::fs::read_to_string(root.join(name)).unwrap();
    put("t1", "one");
    replace(dir.as_raw_fd(), &c("t1"), &c("new"), SWAP_MIN).unwrap();
    assert_eq!(read("new"), "one");
    put("t2", "two");
    replace(dir.as_raw_fd(), &c("t2"), &c("new"), SWAP_MIN).unwrap();
    assert_eq!(read("new"), "two");
    assert!(!root.join("t2").exists(), "the old file is gone");
    put("t3", "three");
    let e = replace(dir.as_raw_fd(), &c("t3"), &c("dir"), SWAP_MIN).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
    assert!(root.join("dir").is_dir());
    assert_eq!(read("t3"), "three");
    std::fs::remove_dir_all(&root).unwrap();
  }

  #[test]
  fn parents_split() {
    assert_eq!(
      split_parent(b"/a/b/c"),
      Some((b"/a/b".to_vec(), b"c".to_vec()))
    );
    assert_eq!(split_parent(b"/c"), Some((b"/".to_vec(), b"c".to_vec())));
    assert_eq!(split_parent(b"/"), None);
    assert_eq!(split_parent(b"/a/"), None);
    assert_eq!(split_parent(b"/a/."), None);
  }

  #[test]
  fn errors_are_classified() {
    let e = |n| io_error("/p", &io::Error::from_raw_os_error(n)).kind;
    assert_eq!(e(libc::ENOENT), ErrorKind::NotFound);
    assert_eq!(e(libc::EACCES), ErrorKind::PermissionDenied);
    assert_eq!(e(libc::EROFS), ErrorKind::ReadOnly);
    assert_eq!(e(libc::EBUSY), ErrorKind::Busy);
    assert_eq!(e(libc::ENOTDIR), ErrorKind::NotADirectory);
    assert_eq!(e(libc::EIO), ErrorKind::Io);
  }
}
