//! Files through the real agent: as the sandbox user, links followed only with the user's
//! permissions, never blocking on a FIFO, temporary file and rename, caps, typed errors; both
//! with `openat2` and with the fallbacks of systems that lack it and `setfsuid` (gVisor).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use trueforge_agent_proto::client::{AgentClient, ClientError};
use trueforge_agent_proto::msg::{
  DownloadSpec, ErrorKind, FileKind, LayoutDir, LayoutLink, LayoutSpec, StatSpec, UploadSpec,
};

const NOBODY: &str = "nobody";

async fn agents() -> Vec<(&'static str, Agent)> {
  let fallback = start_with(Options {
    env: vec![
      ("TRUEFORGE_AGENT_NO_OPENAT2".into(), "1".into()),
      ("TRUEFORGE_AGENT_NO_SPLICE".into(), "1".into()),
      // As under gVisor: no setfsuid, so a worker thread takes the user's effective ids.
      ("TRUEFORGE_AGENT_NO_FS_IDS".into(), "1".into()),
    ],
    ..Default::default()
  })
  .await;
  assert!(!fallback.client.hello().openat2);
  assert!(!fallback.client.hello().fs_ids);
  let linux = start().await;
  assert!(linux.client.hello().fs_ids);
  // Over the host's socket, downloads are spliced into it and drained from it.
  let linked = start_with(Options {
    link: true,
    ..Default::default()
  })
  .await;
  vec![
    ("openat2", linux),
    ("fallback", fallback),
    ("linked", linked),
  ]
}

fn up(path: &str, user: Option<&str>) -> UploadSpec {
  UploadSpec {
    path: path.into(),
    user: user.map(str::to_string),
    mode: 0o644,
    max_bytes: None,
    parents: true,
  }
}

fn down(path: &str, user: Option<&str>) -> DownloadSpec {
  DownloadSpec {
    path: path.into(),
    user: user.map(str::to_string),
    max_bytes: 1 << 30,
  }
}

fn kind_of(r: Result<impl std::fmt::Debug, ClientError>) -> ErrorKind {
  match r {
    Err(ClientError::Agent(e)) => e.kind,
    other => panic!("expected an agent error, got {other:?}"),
  }
}

/// A directory the sandbox user may write in, and a root-only one beside it.
fn sandbox() -> TempDir {
  let t = TempDir::new("files");
  std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o777)).unwrap();
  std::fs::create_dir(t.0.join("rootonly")).unwrap();
  std::fs::set_permissions(t.0.join("rootonly"), std::fs::Permissions::from_mode(0o700)).unwrap();
  std::fs::write(t.0.join("rootonly/secret"), b"root's secret").unwrap();
  std::fs::set_permissions(
    t.0.join("rootonly/secret"),
    std::fs::Permissions::from_mode(0o600),
  )
  .unwrap();
  t
}

fn data(n: usize) -> Vec<u8> {
  (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_as_the_user_with_modes_and_owners() {
  for (mode, a) in agents().await {
    let t = sandbox();
    let c = &a.client;
    let body = data((1 << 20) + 1);
    let path = t.path("a/b/c.bin");
    let done = c
      .upload_bytes(up(&path, Some(NOBODY)), Bytes::from(body.clone()))
      .await
      .unwrap();
    assert_eq!(done.size, body.len() as u64, "{mode}");
    assert_eq!(
      c.download_bytes(down(&path, Some(NOBODY))).await.unwrap(),
      body
    );
    let md = std::fs::metadata(&path).unwrap();
    assert_eq!(
      (md.uid(), md.gid(), md.mode() & 0o7777),
      (65534, 65534, 0o644)
    );
    for dir in ["a", "a/b"] {
      let md = std::fs::metadata(t.path(dir)).unwrap();
      assert_eq!((md.uid(), md.mode() & 0o7777), (65534, 0o755), "{dir}");
    }
    let mut spec = up(&t.path("x.sh"), Some(NOBODY));
    spec.mode = 0o750;
    c.upload_bytes(spec, Bytes::from_static(b"#!/bin/sh\n"))
      .await
      .unwrap();
    assert_eq!(
      std::fs::metadata(t.path("x.sh")).unwrap().mode() & 0o7777,
      0o750
    );
    // A read-only file of the user's is replaced.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    c.upload_bytes(up(&path, Some(NOBODY)), Bytes::from_static(b"new"))
      .await
      .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    // An empty file, and a path straight under /.
    c.upload_bytes(up(&t.path("empty"), None), Bytes::new())
      .await
      .unwrap();
    assert_eq!(
      c.download_bytes(down(&t.path("empty"), None))
        .await
        .unwrap(),
      b""
    );
    let info = c
      .stat(StatSpec {
        path: path.clone(),
        user: Some(NOBODY.into()),
        follow: false,
      })
      .await
      .unwrap()
      .unwrap();
    assert_eq!((info.kind, info.size, info.uid), (FileKind::File, 3, 65534));
    assert!(leftovers(&t).is_empty(), "{mode}: {:?}", leftovers(&t));
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_of_every_size_arrive_whole_spliced_or_copied() {
  // Around the chunk (256 KiB) and the default pipe (64 KiB), and many chunks through both of
  // a download's pipes; two downloads at once share stdout frame by frame.
  let sizes = [
    0usize,
    1,
    (64 << 10) - 1,
    64 << 10,
    (256 << 10) - 1,
    256 << 10,
    (256 << 10) + 1,
    (3 << 20) + 17,
  ];
  for (mode, a) in agents().await {
    let t = sandbox();
    for (i, n) in sizes.iter().enumerate() {
      let body: Vec<u8> = data(*n).iter().map(|b| b ^ i as u8).collect();
      std::fs::write(t.path(&format!("f{i}")), &body).unwrap();
    }
    for (i, n) in sizes.iter().enumerate() {
      let got = a
        .client
        .download_bytes(down(&t.path(&format!("f{i}")), Some(NOBODY)));
      let other = a.client.download_bytes(down(&t.path("f7"), None));
      let (got, other) = tokio::join!(got, other);
      let want: Vec<u8> = data(*n).iter().map(|b| b ^ i as u8).collect();
      assert!(got.unwrap() == want, "{mode}: {n} bytes");
      assert_eq!(other.unwrap().len(), sizes[7], "{mode}");
    }
    assert!(a.client.ping().await.is_ok());
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spliced_download_is_checked_again_only_after_the_host_has_read_it() {
  use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
  use std::process::Stdio;
  use tokio::io::{AsyncReadExt, AsyncWriteExt};
  // The agent's stdout is a deep pipe that the host stops reading: the whole file then sits in
  // it as the file's own pages. Rewritten in place before the host reads them, the file must
  // not arrive as if it were whole: the download says it changed.
  let t = sandbox();
  let path = t.path("f");
  // Spliced (over 512 KiB), and small enough to sit whole in a 1 MiB pipe, headers and all.
  let body = data(768 << 10);
  std::fs::write(&path, &body).unwrap();
  let mut fds = [0; 2];
  assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
  let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
  let deep = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
  assert_eq!(deep, 1 << 20);
  let mut child = command(&agent_bin())
    .stdin(Stdio::piped())
    .stdout(Stdio::from(write))
    .stderr(Stdio::inherit())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
  let stdin = child.stdin.take().unwrap();
  let unread = |fd: i32| {
    let mut n: libc::c_int = 0;
    unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    n as usize
  };
  let raw = read.as_raw_fd();
  let mut from_agent = tokio::net::unix::pipe::Receiver::from_owned_fd(read).unwrap();
  let (to_client, mut forward) = tokio::io::duplex(64 << 10);
  let (gate, mut open) = tokio::sync::watch::channel(true);
  tokio::spawn(async move {
    let mut buf = vec![0u8; 64 << 10];
    loop {
      let n = from_agent.read(&mut buf).await.unwrap_or(0);
      // What was read while the gate was shut waits for it to open.
      if n == 0 || open.wait_for(|o| *o).await.is_err() {
        return;
      }
      if forward.write_all(&buf[..n]).await.is_err() {
        return;
      }
    }
  });
  let client = AgentClient::connect(to_client, stdin, Default::default())
    .await
    .unwrap();
  gate.send(true).unwrap();
  let _ = gate.send(false);
  let download = client.download_bytes(down(&path, None));
  let meddle = async {
    // Every byte of the file is in the pipe (bar what the forwarder holds) before it is
    // rewritten.
    let started = Instant::now();
    while unread(raw) + (64 << 10) < body.len() {
      assert!(
        started.elapsed() < Duration::from_secs(20),
        "{}",
        unread(raw)
      );
      tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let flipped: Vec<u8> = body.iter().map(|b| !b).collect();
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, &flipped).unwrap();
    drop(f);
    gate.send(true).unwrap();
  };
  let (got, ()) = tokio::join!(download, meddle);
  match got {
    Err(ClientError::Agent(e)) => assert_eq!(e.kind, ErrorKind::Changed, "{e:?}"),
    Ok(b) => assert!(b == body, "the download mixed the old file with the new"),
    Err(e) => panic!("{e}"),
  }
  assert!(client.ping().await.is_ok());
  drop(child);
}

/// Temporary upload files left anywhere under `t`.
fn leftovers(t: &TempDir) -> Vec<String> {
  let mut out = Vec::new();
  let mut stack = vec![t.0.clone()];
  while let Some(d) = stack.pop() {
    let Ok(rd) = std::fs::read_dir(&d) else {
      continue;
    };
    for e in rd.flatten() {
      let name = e.file_name().to_string_lossy().into_owned();
      if name.starts_with(".tf-") {
        out.push(e.path().to_string_lossy().into_owned());
      }
      if e.file_type().map(|f| f.is_dir()).unwrap_or(false) {
        stack.push(e.path());
      }
    }
  }
  out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_are_followed_only_with_the_users_permissions() {
  for (mode, a) in agents().await {
    let t = sandbox();
    let c = &a.client;
    std::os::unix::fs::symlink(t.path("rootonly/secret"), t.path("planted")).unwrap();
    std::os::unix::fs::symlink(t.path("rootonly"), t.path("d_root")).unwrap();
    // A planted link to a file the user cannot read is refused; root reads it.
    assert_eq!(
      kind_of(
        c.download_bytes(down(&t.path("planted"), Some(NOBODY)))
          .await
      ),
      ErrorKind::PermissionDenied,
      "{mode}"
    );
    assert_eq!(
      c.download_bytes(down(&t.path("planted"), None))
        .await
        .unwrap(),
      b"root's secret"
    );
    // A parent link into a root-only directory creates nothing there.
    assert_eq!(
      kind_of(
        c.upload_bytes(
          up(&t.path("d_root/new"), Some(NOBODY)),
          Bytes::from_static(b"x")
        )
        .await
      ),
      ErrorKind::PermissionDenied,
      "{mode}"
    );
    assert_eq!(
      kind_of(
        c.upload_bytes(
          up(&t.path("d_root/deeper/new"), Some(NOBODY)),
          Bytes::from_static(b"x")
        )
        .await
      ),
      ErrorKind::PermissionDenied
    );
    assert!(!t.0.join("rootonly/new").exists());
    assert!(!t.0.join("rootonly/deeper").exists());
    // Replacing a file by a link makes the next upload replace the link, not write through it.
    std::os::unix::fs::symlink(t.path("rootonly/secret"), t.path("swap")).unwrap();
    c.upload_bytes(up(&t.path("swap"), None), Bytes::from_static(b"mine"))
      .await
      .unwrap();
    assert_eq!(
      std::fs::read(t.path("rootonly/secret")).unwrap(),
      b"root's secret"
    );
    assert!(!std::fs::symlink_metadata(t.path("swap"))
      .unwrap()
      .is_symlink());
    // Magic links are not followed as such (the agent's own fd 0 is not reachable).
    let k = kind_of(c.download_bytes(down("/proc/self/fd/0", None)).await);
    assert!(
      matches!(k, ErrorKind::InvalidPath | ErrorKind::NotRegularFile),
      "{mode}: {k:?}"
    );
    let link = c
      .stat(StatSpec {
        path: t.path("planted"),
        user: Some(NOBODY.into()),
        follow: false,
      })
      .await
      .unwrap()
      .unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(
      link.link_target.as_deref(),
      Some(t.path("rootonly/secret").as_str())
    );
    assert_eq!(
      kind_of(
        c.stat(StatSpec {
          path: t.path("planted"),
          user: Some(NOBODY.into()),
          follow: true,
        })
        .await
      ),
      ErrorKind::PermissionDenied
    );
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_devices_and_directories_are_refused_without_blocking() {
  for (mode, a) in agents().await {
    let t = sandbox();
    let c = &a.client;
    let fifo = t.path("fifo");
    assert!(std::process::Command::new("mkfifo")
      .arg(&fifo)
      .status()
      .unwrap()
      .success());
    let started = Instant::now();
    match c.download_bytes(down(&fifo, None)).await {
      Err(ClientError::Agent(e)) => {
        assert_eq!(e.kind, ErrorKind::NotRegularFile, "{mode}");
        assert_eq!(e.file_kind, Some(FileKind::Fifo));
      }
      other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    // A Unix socket cannot even be opened (ENXIO): it is refused as one.
    let sock = t.path("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    match c.download_bytes(down(&sock, None)).await {
      Err(ClientError::Agent(e)) => {
        assert_eq!(e.kind, ErrorKind::NotRegularFile, "{mode}");
        assert_eq!(e.file_kind, Some(FileKind::Socket));
      }
      other => panic!("{other:?}"),
    }
    assert_eq!(
      kind_of(c.download_bytes(down("/dev/zero", None)).await),
      ErrorKind::NotRegularFile
    );
    assert_eq!(
      kind_of(c.download_bytes(down(&t.path("rootonly"), None)).await),
      ErrorKind::IsDirectory
    );
    assert_eq!(
      kind_of(
        c.upload_bytes(up(&t.path("rootonly"), None), Bytes::from_static(b"x"))
          .await
      ),
      ErrorKind::IsDirectory
    );
    assert_eq!(
      kind_of(c.download_bytes(down(&t.path("missing"), None)).await),
      ErrorKind::NotFound
    );
    std::fs::write(t.path("file"), b"f").unwrap();
    assert_eq!(
      kind_of(c.download_bytes(down(&t.path("file/x"), None)).await),
      ErrorKind::NotADirectory
    );
    assert!(c
      .stat(StatSpec {
        path: t.path("missing"),
        user: None,
        follow: true
      })
      .await
      .unwrap()
      .is_none());
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_fifo_swap_racing_downloads_never_hangs() {
  let a = start().await;
  let t = sandbox();
  let target = t.path("swap");
  std::fs::write(&target, vec![b'x'; 100_000]).unwrap();
  let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
  let swapper = {
    let (stop, target, file, fifo) = (
      stop.clone(),
      target.clone(),
      t.path("swap.file"),
      t.path("swap.fifo"),
    );
    std::thread::spawn(move || {
      let mut n = 0;
      let c = std::ffi::CString::new(fifo.as_str()).unwrap();
      while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        // Both ready before either lands, so each state lasts about as long as the other.
        let _ = std::fs::write(&file, vec![b'x'; 100_000]);
        let _ = std::fs::remove_file(&fifo);
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
        let _ = std::fs::rename(&file, &target);
        std::thread::sleep(Duration::from_micros(300));
        let _ = std::fs::rename(&fifo, &target);
        std::thread::sleep(Duration::from_micros(300));
        n += 2;
      }
      n
    })
  };
  let started = Instant::now();
  let (mut ok, mut refused) = (0, 0);
  while ok + refused < 100
    || (started.elapsed() < Duration::from_secs(5) && (ok < 5 || refused < 5))
  {
    let r = tokio::time::timeout(
      Duration::from_secs(5),
      a.client.download_bytes(down(&target, Some(NOBODY))),
    )
    .await
    .expect("a download hung");
    match r {
      Ok(b) => {
        assert_eq!(b.len(), 100_000);
        ok += 1;
      }
      Err(ClientError::Agent(e)) => {
        assert!(
          matches!(
            e.kind,
            ErrorKind::NotRegularFile | ErrorKind::NotFound | ErrorKind::Changed
          ),
          "{e:?}"
        );
        refused += 1;
      }
      Err(e) => panic!("{e:?}"),
    }
  }
  stop.store(true, std::sync::atomic::Ordering::Relaxed);
  let swaps = swapper.join().unwrap();
  assert!(swaps > 10, "{swaps}");
  assert!(started.elapsed() < Duration::from_secs(30));
  eprintln!("{ok} downloads saw the file, {refused} were refused ({swaps} swaps)");
  assert!(a.client.ping().await.is_ok());
  assert_eq!(a.run("echo alive").await.output, "alive\n");
}

/// How downloads of a file rewritten in place went: (whole first version, whole second,
/// changed, a mix of the two).
async fn downloads_while_rewritten(a: &Agent, size: usize, for_how_long: Duration) -> [u32; 4] {
  let t = sandbox();
  let path = t.path("rewritten");
  let (one, two) = (vec![b'A'; size], vec![b'B'; size]);
  std::fs::write(&path, &one).unwrap();
  let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
  let writer = {
    let (stop, path, one, two) = (stop.clone(), path.clone(), one.clone(), two.clone());
    // In place and whole, one write(2) per version, as `dd conv=notrunc bs=<size>` does.
    std::thread::spawn(move || {
      let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
      let mut n = 0u32;
      while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let v = if n.is_multiple_of(2) { &two } else { &one };
        assert_eq!(
          std::os::unix::fs::FileExt::write_at(&f, v, 0).unwrap(),
          size
        );
        n += 1;
      }
      n
    })
  };
  let mut counts = [0u32; 4];
  let started = Instant::now();
  while started.elapsed() < for_how_long {
    match a.client.download_bytes(down(&path, Some(NOBODY))).await {
      Ok(b) if b == one => counts[0] += 1,
      Ok(b) if b == two => counts[1] += 1,
      Ok(_) => counts[3] += 1,
      Err(ClientError::Agent(e)) if e.kind == ErrorKind::Changed => counts[2] += 1,
      Err(e) => panic!("{e:?}"),
    }
  }
  stop.store(true, std::sync::atomic::Ordering::Relaxed);
  assert!(writer.join().unwrap() > 10);
  counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_in_place_downloads_whole_or_changed_never_mixed() {
  // Spliced (4 MiB) and copied (256 KiB); with a watch, and without one (the copy then hashed
  // and compared with the file read again).
  let no_inotify = start_with(Options {
    env: vec![("TRUEFORGE_AGENT_NO_INOTIFY".into(), "1".into())],
    ..Default::default()
  })
  .await;
  let mut agents = agents().await;
  agents.push(("no inotify", no_inotify));
  for (mode, a) in &agents {
    for size in [4 << 20, 256 << 10] {
      let [one, two, changed, mixed] =
        downloads_while_rewritten(a, size, Duration::from_millis(1500)).await;
      eprintln!("{mode}, {size} bytes: whole {one} + {two}, changed {changed}, mixed {mixed}");
      assert_eq!(mixed, 0, "{mode}, {size} bytes");
      assert!(one + two + changed > 0);
    }
    // Nothing left watched, nothing stuck: an unchanged file downloads whole.
    let t = sandbox();
    std::fs::write(t.path("still"), data(5 << 20)).unwrap();
    let got = a.client.download_bytes(down(&t.path("still"), None)).await;
    assert!(got.unwrap() == data(5 << 20), "{mode}");
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_to_a_kernel_file_is_refused_with_its_kind() {
  let a = start().await;
  let t = sandbox();
  for (name, target) in [
    ("attr", "/proc/thread-self/attr/current"),
    ("cpuinfo", "/proc/cpuinfo"),
    ("uevent", "/sys/kernel/uevent_seqnum"),
  ] {
    std::os::unix::fs::symlink(target, t.path(name)).unwrap();
    match a.client.download_bytes(down(&t.path(name), None)).await {
      Err(ClientError::Agent(e)) => {
        assert_eq!(e.kind, ErrorKind::NotRegularFile, "{name}: {e:?}");
        assert_eq!(e.file_kind, Some(FileKind::KernelFile), "{name}");
        assert!(e.message.contains("kernel file"), "{}", e.message);
      }
      other => panic!("{name}: {other:?}"),
    }
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_refuse_and_leave_nothing_behind() {
  let a = start().await;
  let t = sandbox();
  let c = &a.client;
  let path = t.path("f");
  std::fs::write(&path, b"original").unwrap();
  let mut d = down(&path, None);
  d.max_bytes = 3;
  match c.download(d).await {
    Err(ClientError::Agent(e)) => {
      assert_eq!(e.kind, ErrorKind::TooLarge);
      assert_eq!((e.size, e.max), (Some(8), Some(3)));
    }
    Err(e) => panic!("{e:?}"),
    Ok(_) => panic!("a download over the cap started"),
  }
  let mut u = up(&path, None);
  u.max_bytes = Some(1000);
  assert_eq!(
    kind_of(c.upload_bytes(u, Bytes::from(vec![1u8; 300_000])).await),
    ErrorKind::TooLarge
  );
  assert_eq!(std::fs::read(&path).unwrap(), b"original");
  // An abandoned upload is removed too.
  let c2 = c.clone();
  let p2 = path.clone();
  let task = tokio::spawn(async move {
    let (mut w, r) = tokio::io::duplex(1024);
    tokio::spawn(async move {
      use tokio::io::AsyncWriteExt;
      let _ = w.write_all(&[7u8; 4096]).await;
      tokio::time::sleep(Duration::from_secs(60)).await;
    });
    c2.upload(up(&p2, None), r).await
  });
  tokio::time::sleep(Duration::from_millis(300)).await;
  assert_eq!(leftovers(&t).len(), 1);
  task.abort();
  for _ in 0..50 {
    if leftovers(&t).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
  }
  assert!(leftovers(&t).is_empty(), "{:?}", leftovers(&t));
  assert_eq!(std::fs::read(&path).unwrap(), b"original");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_nobody_reads_does_not_stall_commands() {
  let a = start().await;
  let t = sandbox();
  let big = t.path("big");
  std::fs::write(&big, vec![0u8; 20 << 20]).unwrap();
  let held = a.client.download(down(&big, None)).await.unwrap();
  let started = Instant::now();
  for i in 0..20 {
    assert_eq!(a.run(&format!("echo {i}")).await.output, format!("{i}\n"));
  }
  assert!(started.elapsed() < Duration::from_secs(5));
  drop(held);
  assert!(a.client.ping().await.is_ok());
}

fn mount(args: &[&str]) -> bool {
  std::process::Command::new("mount")
    .args(args)
    .stderr(std::process::Stdio::null())
    .status()
    .is_ok_and(|s| s.success())
}

fn umount(path: &str) {
  let _ = std::process::Command::new("umount").arg(path).status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_points_and_read_only_file_systems_have_their_own_errors() {
  let a = start().await;
  let t = sandbox();
  let c = &a.client;
  std::fs::write(t.path("src"), b"bind").unwrap();
  std::fs::write(t.path("hosts"), b"").unwrap();
  if mount(&["--bind", &t.path("src"), &t.path("hosts")]) {
    let r = c
      .upload_bytes(up(&t.path("hosts"), None), Bytes::from_static(b"x"))
      .await;
    umount(&t.path("hosts"));
    assert_eq!(kind_of(r), ErrorKind::Busy);
  } else {
    eprintln!("skipped the bind mount case: mount is not allowed here");
  }
  std::fs::create_dir(t.path("ro")).unwrap();
  if mount(&["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", &t.path("ro")]) {
    let r = c
      .upload_bytes(up(&t.path("ro/f"), None), Bytes::from_static(b"x"))
      .await;
    umount(&t.path("ro"));
    assert_eq!(kind_of(r), ErrorKind::ReadOnly);
  } else {
    eprintln!("skipped the read-only case: mount is not allowed here");
  }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_makes_owned_directories_without_following_links() {
  let a = start().await;
  let t = sandbox();
  let c = &a.client;
  let spec = |dirs: Vec<(&str, u32, bool)>, links: Vec<(&str, &str)>| LayoutSpec {
    dirs: dirs
      .into_iter()
      .map(|(p, mode, user_owned)| LayoutDir {
        path: t.path(p),
        mode,
        user_owned,
      })
      .collect(),
    user: Some(NOBODY.into()),
    links: links
      .into_iter()
      .map(|(p, target)| LayoutLink {
        path: t.path(p),
        target: target.into(),
      })
      .collect(),
    activity_file: false,
  };
  c.layout(spec(
    vec![
      ("tf", 0o755, true),
      ("tf/uploads", 0o755, true),
      ("tf/codemode/bin", 0o755, false),
      ("ws/01ARZ", 0o700, true),
    ],
    vec![("tf/codemode/bin/mcp-client", "/opt/agent")],
  ))
  .await
  .unwrap();
  let md = |p: &str| std::fs::symlink_metadata(t.path(p)).unwrap();
  assert_eq!((md("tf").uid(), md("tf").mode() & 0o7777), (65534, 0o755));
  assert_eq!(md("tf/codemode/bin").uid(), 0);
  assert_eq!(
    (md("ws/01ARZ").uid(), md("ws/01ARZ").mode() & 0o7777),
    (65534, 0o700)
  );
  assert_eq!(
    std::fs::read_link(t.path("tf/codemode/bin/mcp-client")).unwrap(),
    std::path::PathBuf::from("/opt/agent")
  );
  // Run again: links are replaced, directories kept.
  c.layout(spec(
    vec![("tf", 0o755, true)],
    vec![("tf/codemode/bin/mcp-client", "/x")],
  ))
  .await
  .unwrap();
  assert_eq!(
    std::fs::read_link(t.path("tf/codemode/bin/mcp-client")).unwrap(),
    std::path::PathBuf::from("/x")
  );
  // A link planted in a layout path is never followed (root would chown its target).
  std::os::unix::fs::symlink(t.path("rootonly"), t.path("tf/evil")).unwrap();
  assert_eq!(
    kind_of(
      c.layout(spec(vec![("tf/evil/sub", 0o755, true)], vec![]))
        .await
    ),
    ErrorKind::InvalidPath
  );
  assert_eq!(md("rootonly").uid(), 0);
  assert!(!t.0.join("rootonly/sub").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_are_recorded_in_a_root_owned_activity_file() {
  if std::env::var_os("TRUEFORGE_AGENT_BIN").is_some() {
    // Only a debug build lets a test move the layout root; scripts/ci/agent-smoke.sh checks the
    // release binaries' activity file in a container.
    eprintln!("skipped: the binary under test is not a debug build");
    return;
  }
  let t = sandbox();
  let root = t.path("layout");
  std::fs::create_dir(&root).unwrap();
  std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
  let a = start_with(Options {
    env: vec![("TRUEFORGE_AGENT_TEST_LAYOUT_ROOT".into(), root.clone())],
    ..Default::default()
  })
  .await;
  let c: &AgentClient = &a.client;
  assert_eq!(c.activity().await.unwrap().last_call_unix_ms, None);
  c.ping().await.unwrap();
  assert_eq!(c.activity().await.unwrap().last_call_unix_ms, None);
  a.run("true").await;
  let info = c.activity().await.unwrap();
  assert!(info.last_call_unix_ms.is_some());
  let file = format!("{root}/.trueforge-agent-activity");
  let md = std::fs::metadata(&file).unwrap();
  assert_eq!((md.uid(), md.mode() & 0o7777, md.nlink()), (0, 0o644, 1));
  // The sandbox user can neither write it nor keep a file of its own in its place.
  let out = a
    .run_as(
      NOBODY,
      &format!("touch {file} 2>&1; rm -f {file}; echo fake > {file}; stat -c %U {file}"),
    )
    .await;
  assert!(out.output.contains("Permission denied"), "{}", out.output);
  assert!(out.output.ends_with("nobody\n"), "{}", out.output);
  c.layout(LayoutSpec {
    dirs: vec![],
    user: None,
    links: vec![],
    activity_file: true,
  })
  .await
  .unwrap();
  let md = std::fs::metadata(&file).unwrap();
  assert_eq!((md.uid(), md.size()), (0, 0));
  // Running commands keep it fresh.
  let before = std::fs::metadata(&file).unwrap().mtime_nsec();
  a.run("sleep 2.2").await;
  assert_ne!(std::fs::metadata(&file).unwrap().mtime_nsec(), before);
}
