//! The agent's life: set itself up (non-dumpable, child subreaper, its stream moved off fds 0
//! and 1), say hello, then serve frames until the host goes: from stdin until it closes, or,
//! linked (`--link`), from a Unix socket of the host's until it closes or stdin does.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use trueforge_agent_proto::frame::{self, Frame, Kind, AGENT_STREAM};
use trueforge_agent_proto::msg::{
  AgentError, ErrorKind, Hello, Outcome, PingInfo, Request, AGENT_NAME,
};

use crate::base::conn::{Conn, Out, Pipe};
use crate::base::pool::Pool;
use crate::base::sys::{self, Identity};
use crate::base::users::Users;
use crate::codemode::relay;
use crate::egress;
use crate::exec::command;
use crate::files::{ops, resolve, staged};
use crate::state::activity::{self, Activity};
use crate::state::ctx::Ctx;
use crate::state::held::Relays;
use crate::state::watch::Watcher;

/// Bytes of stdin buffer taken at a time.
const READ_BLOCK: usize = 4 << 20;

/// What the stdin and stdout pipes are asked to hold.
const STREAM_PIPE: usize = 1 << 20;

/// Threads for file work.
const FILE_THREADS: usize = 2;

/// Runs the agent, on the host's socket at `link` where it can be reached; returns the exit
/// code.
pub fn run(link: Option<&str>) -> i32 {
  match start(link) {
    Ok(code) => code,
    Err(e) => {
      eprintln!("trueforge-agent: {e}");
      2
    }
  }
}

fn start(link: Option<&str>) -> std::io::Result<i32> {
  let stream = Stream::open(sys::take_host_stream()?, link)?;
  // Orphans of finished commands are reparented here (and reaped), not to PID 1; where that
  // cannot be, commands are kept in their sessions (`contain`). Before any thread starts.
  let contained = crate::exec::contain::init();
  let me = Identity::current();
  let openat2 = resolve::probe();
  let base_env = capture_env(me.uid);
  let pool = Pool::start(FILE_THREADS)?;
  let rt = tokio::runtime::Builder::new_current_thread()
    .enable_io()
    .enable_time()
    .build()?;
  let local = tokio::task::LocalSet::new();
  let caps = Caps {
    openat2,
    subreaper: contained.subreaper,
    session_guard: contained.session_guard,
    fs_ids: sys::has_fs_ids(),
  };
  local.block_on(&rt, serve(stream, me, caps, base_env, pool))
}

/// Where the frames travel.
struct Stream {
  input: OwnedFd,
  output: OwnedFd,
  /// Linked: the exec's stdin, read only to hear the host go (its end ends the agent), and
  /// its stdout, held open and never written.
  lifeline: Option<(OwnedFd, OwnedFd)>,
}

impl Stream {
  /// The host's Unix socket at `link` when it can be reached (one hop fewer each way than the
  /// engine's exec stream, which relays every byte through the engine and its shim); else, and
  /// without `link`, the exec's own stdin and stdout. Why a link failed goes to stderr, which
  /// the host keeps for its messages.
  fn open((stdin, stdout): (OwnedFd, OwnedFd), link: Option<&str>) -> std::io::Result<Stream> {
    let plain = |stdin, stdout| Stream {
      input: stdin,
      output: stdout,
      lifeline: None,
    };
    let Some(path) = link else {
      return Ok(plain(stdin, stdout));
    };
    match std::os::unix::net::UnixStream::connect(path) {
      Ok(socket) => {
        let output = OwnedFd::from(socket);
        Ok(Stream {
          input: sys::dup(output.as_raw_fd())?,
          output,
          lifeline: Some((stdin, stdout)),
        })
      }
      Err(e) => {
        eprintln!("trueforge-agent: the host's socket {path} cannot be reached ({e}): serving on stdin and stdout");
        Ok(plain(stdin, stdout))
      }
    }
  }
}

/// Resolves when the host's end of `lifeline` closes (never without one).
async fn host_gone(lifeline: Option<OwnedFd>) {
  let Some(fd) = lifeline else {
    return std::future::pending().await;
  };
  let Ok(mut stdin) =
    sys::set_nonblocking(fd.as_raw_fd()).and_then(|_| pipe::Receiver::from_owned_fd_unchecked(fd))
  else {
    return;
  };
  let mut b = [0u8; 64];
  while let Ok(1..) = stdin.read(&mut b).await {}
}

/// The inherited environment, less the agent's own variables and a HOME the engine set for
/// the agent's user (root's home): commands get their own user's home instead.
fn capture_env(uid: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
  use std::os::unix::ffi::OsStrExt;
  let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
  let own_home = crate::base::users::resolve(Some(&uid.to_string()), &passwd, "")
    .ok()
    .filter(|u| u.name.is_some())
    .map(|u| u.home)
    .unwrap_or_else(|| "/root".into());
  std::env::vars_os()
    .filter(|(k, _)| !k.as_bytes().starts_with(b"TRUEFORGE_AGENT"))
    .filter(|(k, v)| !(k == "HOME" && v.as_bytes() == own_home.as_bytes()))
    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

/// What this system lets the agent do, for its hello.
struct Caps {
  openat2: bool,
  subreaper: bool,
  session_guard: bool,
  fs_ids: bool,
}

async fn serve(
  stream: Stream,
  me: Identity,
  caps: Caps,
  base_env: Vec<(Vec<u8>, Vec<u8>)>,
  pool: Pool,
) -> std::io::Result<i32> {
  let Stream {
    input,
    output,
    lifeline,
  } = stream;
  let (stdin, _stdout) = lifeline.unzip();
  let linked = stdin.is_some();
  sys::set_nonblocking(input.as_raw_fd())?;
  sys::set_nonblocking(output.as_raw_fd())?;
  // Deep pipes: a large transfer moves through them in few steps, waking this thread (and the
  // engine's shim at the other end) far less often than with the default 64 KiB.
  let _ = sys::grow_pipe(output.as_raw_fd(), STREAM_PIPE);
  let _ = sys::grow_pipe(input.as_raw_fd(), STREAM_PIPE);
  let mut input = pipe::Receiver::from_owned_fd_unchecked(input)?;
  let output = pipe::Sender::from_owned_fd_unchecked(output)?;
  let (out_tx, out_rx) = mpsc::unbounded_channel();
  let conn = Conn::new(out_tx);
  let ctx = Rc::new(Ctx {
    conn: conn.clone(),
    // CAP_SETGID is capability 6.
    can_set_groups: sys::cap_eff() & (1 << 6) != 0,
    me,
    users: Users::default(),
    base_env,
    pool,
    activity: Activity::default(),
    running: Default::default(),
    procs: Default::default(),
    started: Instant::now(),
    relays: Relays::new(),
    egress: Default::default(),
    splice: std::env::var_os("TRUEFORGE_AGENT_NO_SPLICE").is_none_or(|v| v != "1"),
    watcher: Watcher::new(std::env::var_os("TRUEFORGE_AGENT_NO_INOTIFY").is_none_or(|v| v != "1")),
  });
  tokio::task::spawn_local(write_loop(output, out_rx, linked));
  let mut children = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
  let c = ctx.clone();
  tokio::task::spawn_local(async move {
    while children.recv().await.is_some() {
      // Each pid freed may be what a command waiting for processes needs.
      c.procs.reaped(sys::reap_all());
    }
  });
  let c = ctx.clone();
  tokio::task::spawn_local(async move { activity::ticker(&c.activity, || c.running.get()).await });
  conn.send(&Frame::json(
    Kind::Hello,
    0,
    &Hello {
      agent: AGENT_NAME.into(),
      version: trueforge_agent_proto::VERSION.into(),
      protocol: trueforge_agent_proto::PROTOCOL,
      pid: std::process::id(),
      uid: ctx.me.uid,
      arch: std::env::consts::ARCH.into(),
      cap_eff: sys::cap_eff(),
      openat2: caps.openat2,
      subreaper: caps.subreaper,
      session_guard: caps.session_guard,
      fs_ids: caps.fs_ids,
    },
  ));
  let why = read_frames(&ctx, &mut input, stdin).await;
  if let Some(why) = &why {
    eprintln!("trueforge-agent: {why}");
  }
  // Commands still running are killed by their shepherds as their control pipes close with
  // this process.
  ctx.relays.close_all(&ctx.me);
  ctx.conn.close_all();
  Ok(if why.is_some() { 3 } else { 0 })
}

/// Reads the host's frames and dispatches them until the host goes (`None`) or breaks the
/// protocol (why).
async fn read_frames(
  ctx: &Rc<Ctx>,
  input: &mut pipe::Receiver,
  lifeline: Option<OwnedFd>,
) -> Option<String> {
  let mut buf = BytesMut::with_capacity(READ_BLOCK);
  let gone = host_gone(lifeline);
  tokio::pin!(gone);
  loop {
    loop {
      match frame::decode(&mut buf) {
        Ok(Some(f)) => {
          if let Err(e) = dispatch(ctx, f) {
            return Some(e);
          }
        }
        Ok(None) => break,
        Err(e) => return Some(e.to_string()),
      }
    }
    // Room in large blocks: decoded payloads keep pieces of the buffer alive until they are
    // written, and a fresh small block per read would cost a mapping and its page faults each.
    if buf.capacity() - buf.len() < 64 * 1024 {
      buf.reserve(READ_BLOCK);
    }
    let read = tokio::select! {
      r = input.read_buf(&mut buf) => r,
      _ = &mut gone => Ok(0),
    };
    match read {
      Ok(0) => return None,
      Ok(_) => {}
      Err(e) => return Some(format!("reading stdin failed: {e}")),
    }
  }
}

/// Handles one frame from the host.
fn dispatch(ctx: &Rc<Ctx>, f: Frame) -> Result<(), String> {
  if f.kind != Kind::Open {
    return ctx.conn.route(f);
  }
  if f.id == 0 || f.id & AGENT_STREAM != 0 {
    return Err(format!(
      "the host opened stream {} in the agent's range",
      f.id
    ));
  }
  let req: Request = match serde_json::from_slice(&f.payload) {
    Ok(r) => r,
    Err(e) => {
      // A newer host's request, say: refuse it, keep serving.
      ctx.conn.send(&Frame::json(
        Kind::Result,
        f.id,
        &Outcome::<()>::Err(AgentError::new(
          ErrorKind::InvalidRequest,
          format!("a request this agent cannot read: {e}"),
        )),
      ));
      return Ok(());
    }
  };
  // The two queries are answered here, without a stream, and are not activity.
  match req {
    Request::Ping => {
      let info = PingInfo {
        uptime_ms: ctx.started.elapsed().as_millis() as u64,
        egress_turned_away: ctx.egress.turned_away(),
      };
      ctx
        .conn
        .send(&Frame::json(Kind::Result, f.id, &Outcome::Ok(info)));
      return Ok(());
    }
    Request::Activity => {
      let info = ctx.activity.info(ctx.running.get());
      ctx
        .conn
        .send(&Frame::json(Kind::Result, f.id, &Outcome::Ok(info)));
      return Ok(());
    }
    _ => ctx.activity.record(),
  }
  let mut io = ctx.conn.register(f.id)?;
  let c = ctx.clone();
  match req {
    Request::Ping | Request::Activity => unreachable!("answered above"),
    Request::Exec(spec) => {
      tokio::task::spawn_local(command::run(c, spec, io));
    }
    Request::Upload(spec) => {
      tokio::task::spawn_local(ops::upload(c, spec, io));
    }
    Request::UploadStaged(spec) => {
      tokio::task::spawn_local(staged::upload(c, spec, io));
    }
    Request::Download(spec) => {
      tokio::task::spawn_local(ops::download(c, spec, io));
    }
    Request::Stat(spec) => {
      tokio::task::spawn_local(async move {
        let o = ops::stat(&c, spec).await;
        io.result(&o);
      });
    }
    Request::Layout(spec) => {
      tokio::task::spawn_local(async move {
        let o = ops::layout(&c, spec).await;
        io.result(&o);
      });
    }
    Request::CodeModeListen(spec) => {
      tokio::task::spawn_local(async move {
        let o = relay::listen(c.clone(), spec).await;
        io.result(&o);
      });
    }
    Request::CodeModeClose { socket } => {
      let o = relay::close(ctx, &socket);
      io.result(&o);
    }
    Request::EgressListen(spec) => {
      let o = egress::listen(ctx, spec);
      io.result(&o);
    }
    Request::EgressClose => {
      let o = egress::close(ctx);
      io.result(&o);
    }
  }
  Ok(())
}

/// Writes queued frames to stdout (or the host's socket), several per write when they pile up.
/// If the host stops reading for good (stdout closed), the agent has nobody to serve and exits.
async fn write_loop(mut out: pipe::Sender, mut rx: mpsc::UnboundedReceiver<Out>, socket: bool) {
  let mut batch = BytesMut::new();
  // Bytes written to stdout so far, for `Out::Drained`.
  let written = Rc::new(std::cell::Cell::new(0u64));
  // A spliced frame met while gathering small ones, written after them.
  let mut held: Option<Out> = None;
  loop {
    let first = match held.take() {
      Some(o) => o,
      None => match rx.recv().await {
        Some(o) => o,
        None => return,
      },
    };
    let before = written.get();
    let r = match first {
      Out::Bytes(first) if rx.is_empty() => out.write_all(&first).await.map(|_| first.len()),
      Out::Bytes(first) => {
        batch.extend_from_slice(&first);
        while batch.len() < 256 * 1024 {
          match rx.try_recv() {
            Ok(Out::Bytes(b)) => batch.extend_from_slice(&b),
            Ok(spliced) => {
              held = Some(spliced);
              break;
            }
            Err(_) => break,
          }
        }
        let r = out.write_all(&batch).await.map(|_| batch.len());
        batch.clear();
        r
      }
      Out::Spliced {
        head,
        pipe,
        len,
        done,
      } => {
        let r = match out.write_all(&head).await {
          Ok(()) => splice_out(&mut out, &pipe, len).await,
          Err(e) => Err(e),
        };
        let _ = done.send(r.is_ok());
        r.map(|_| head.len() + len)
      }
      Out::Drained(done) => {
        let fd = out.as_raw_fd();
        tokio::task::spawn_local(until_read(fd, socket, written.clone(), before, done));
        Ok(0)
      }
    };
    match r {
      Ok(n) => written.set(before + n as u64),
      Err(e) => {
        eprintln!("trueforge-agent: writing to stdout failed: {e}");
        std::process::exit(0);
      }
    }
  }
}

/// Answers `done` once the reader of stdout (`fd`) has taken the first `mark` bytes ever
/// written: what is still in the pipe is the last of what was written.
async fn until_read(
  fd: std::os::fd::RawFd,
  socket: bool,
  written: Rc<std::cell::Cell<u64>>,
  mark: u64,
  done: tokio::sync::oneshot::Sender<()>,
) {
  loop {
    let left = match socket {
      true => sys::unsent(fd),
      false => sys::unread(fd),
    };
    match left {
      Ok(n) if written.get().saturating_sub(n as u64) >= mark => break,
      Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
      Err(_) => break,
    }
  }
  let _ = done.send(());
}

/// Moves `len` bytes from `pipe` to stdout, pipe to pipe (no copy); copied through memory
/// where stdout takes no splice.
async fn splice_out(out: &mut pipe::Sender, pipe: &Pipe, len: usize) -> std::io::Result<()> {
  let (from, to) = (pipe.read.as_raw_fd(), out.as_raw_fd());
  let mut left = len;
  while left > 0 {
    out.writable().await?;
    let moved = out.try_io(|| {
      sys::splice(
        from,
        None,
        to,
        left,
        libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
      )
    });
    match moved {
      Ok(0) => return Err(std::io::Error::other("the download's pipe ran dry")),
      Ok(n) => left -= n,
      Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
      Err(e) if e.raw_os_error() == Some(libc::EINVAL) && left == len => {
        let mut buf = vec![0u8; len];
        (&File::from(sys::dup(from)?)).read_exact(&mut buf)?;
        return out.write_all(&buf).await;
      }
      Err(e) => return Err(e),
    }
  }
  Ok(())
}
