//! Links: the agent's protocol over a Unix socket of this process's (`trueforge-agent --link`)
//! instead of the engine's exec stream, which the engine relays byte by byte through itself and
//! its shim, two hops that cost a short command more than the rest of the host's share of it.
//! A sandbox made on a local Docker engine mounts a directory of its own from this machine,
//! read-only, at `TARGET`; an agent start listens there, on a socket of a random name, only
//! until the agent has connected. Where the engine does not see this process's files (another
//! machine, a VM, a container of its own) the create refuses the mount and sandboxes are made
//! without one from then on; where the agent cannot reach the socket (gVisor, a policy) it
//! serves on its exec stream as before. Read by the container lookup and the create, so it
//! depends on no other agent module.

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bollard::models::{Mount, MountType};

use crate::engine::Engine;
use crate::util::errors::SandboxError;

/// Where a sandbox sees its link directory.
pub const TARGET: &str = "/.trueforge-link";
/// The label naming a sandbox's link directory on this machine, for the sweep.
pub const LABEL: &str = "trueforge.link";
/// A directory younger than this is never swept: its container may be being created.
const SWEEP_MIN_AGE: Duration = Duration::from_secs(600);
/// At most one sweep per engine this often.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Per engine: whether links are given up (a create refused a link's mount: the engine does not
/// see this process's files; or an agent could not reach its socket: the engine's runtime keeps
/// sandboxes from the host's sockets, as gVisor does), and when the last sweep started.
#[derive(Default)]
pub struct Links {
  given_up: AtomicBool,
  swept_ms: AtomicU64,
}

/// An agent with a socket to link to could not reach it: later sandboxes of `engine` are made
/// without a link (an agent started after a sandbox's directory was lost never gets here).
pub fn give_up(engine: &Engine) {
  engine
    .shared
    .state::<Links>()
    .given_up
    .store(true, Ordering::Relaxed);
}

/// Where this process's user keeps its sandboxes' link directories. In the temporary
/// directory, which the engine sees where it runs beside this process (rootless engines too).
fn base() -> PathBuf {
  // SAFETY: geteuid cannot fail.
  let uid = unsafe { libc::geteuid() };
  std::env::temp_dir().join(format!("trueforge-link-{uid}"))
}

/// `base`, made if need be, once it is shown to be this user's alone: a real directory (not a
/// link), owned by this user, that nobody else may enter. In a shared temporary directory
/// another user could have made it first, and then swap a sandbox's directory for a link to any
/// path of this machine, which the engine would mount into the sandbox.
fn base_checked() -> Option<PathBuf> {
  checked(base())
}

fn checked(base: PathBuf) -> Option<PathBuf> {
  use std::os::unix::fs::{DirBuilderExt, MetadataExt};
  let _ = std::fs::DirBuilder::new().mode(0o700).create(&base);
  let meta = std::fs::symlink_metadata(&base).ok()?;
  // SAFETY: geteuid cannot fail.
  let uid = unsafe { libc::geteuid() };
  (meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0).then_some(base)
}

/// The directory of `engine`'s link directories: engines beside each other keep theirs apart,
/// so that one's sweep never takes another's.
fn engine_dir(base: &Path, host: &str) -> PathBuf {
  // FNV-1a: the same name in every process and version.
  let key = host.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
  });
  base.join(format!("{key:016x}"))
}

/// Whether a sandbox made now on `engine` gets a link: on Linux, with the agent and `agentLink`
/// (`on`), on a local Docker engine (Podman's SELinux labels and rootless mounts are left
/// alone), under the engine's default runtime or runc (gVisor's sandboxes cannot reach a socket
/// of the host), and unless given up before.
pub fn wanted(engine: &Engine, on: bool, runtime: Option<&str>) -> bool {
  cfg!(target_os = "linux")
    && on
    && !engine.podman
    && engine.host.starts_with("unix://")
    && runtime.is_none_or(|r| matches!(r, "runc" | "io.containerd.runc.v2"))
    && !engine
      .shared
      .state::<Links>()
      .given_up
      .load(Ordering::Relaxed)
}

/// Makes the link directory of a new sandbox of `engine` (`key`: a name of its own) and the
/// mount that shows it in the sandbox; `None` when it cannot be made here.
pub fn prepare(engine: &Engine, key: &str) -> Option<(String, Mount)> {
  prepare_in(&engine.host, key)
}

fn prepare_in(host: &str, key: &str) -> Option<(String, Mount)> {
  let dir = engine_dir(&base_checked()?, host).join(key.replace(['/', '\\', ':'], "-"));
  make_private(&dir).ok()?;
  let source = dir.to_str()?.to_string();
  let mount = Mount {
    target: Some(TARGET.into()),
    source: Some(source.clone()),
    typ: Some(MountType::BIND),
    read_only: Some(true),
    ..Default::default()
  };
  Some((source, mount))
}

/// Makes `dir` and its engine's directory, inside the checked base, this user's alone.
fn make_private(dir: &Path) -> std::io::Result<()> {
  use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
  std::fs::DirBuilder::new()
    .recursive(true)
    .mode(0o700)
    .create(dir)?;
  for d in dir.parent().into_iter().chain([dir]) {
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
  }
  Ok(())
}

/// Whether a failed create is the engine refusing a link's mount: its source is not on the
/// engine's machine. The engine's link is then given up, and the create made without one.
pub fn refused(engine: &Engine, e: &SandboxError, dir: &str) -> bool {
  let SandboxError::Engine { detail, .. } = e else {
    return false;
  };
  let refused = is_refusal(detail, dir);
  if refused {
    give_up(engine);
  }
  refused
}

/// Whether an engine's answer to a create refuses the mount of the link directory `dir`.
fn is_refusal(detail: &str, dir: &str) -> bool {
  detail.contains("bind source path does not exist") || detail.contains(dir)
}

/// The link directory a container mounts (its source on the engine's machine), if any.
pub fn mounted(info: &bollard::models::ContainerInspectResponse) -> Option<String> {
  info
    .mounts
    .iter()
    .flatten()
    .find_map(|m| (m.destination.as_deref() == Some(TARGET)).then(|| m.source.clone())?)
}

/// Whether `dir` is one of this process's user's link directories (in the checked base).
fn ours(dir: &Path) -> bool {
  let above = dir
    .parent()
    .filter(|_| dir.file_name().is_some())
    .and_then(Path::parent);
  above.is_some_and(|b| b == base().as_path() && base_checked().is_some())
}

/// Makes a sandbox's link directory again before its container starts: a mount whose source
/// is gone (the machine restarted, or the temporary directory was cleaned) would fail the start.
pub fn ensure(dir: Option<&str>) {
  if let Some(dir) = dir.map(Path::new).filter(|d| ours(d) && !d.exists()) {
    let _ = make_private(dir);
  }
}

/// Removes a link directory (its sandbox is gone).
pub fn remove(dir: &str) {
  let dir = Path::new(dir);
  if ours(dir) {
    let _ = std::fs::remove_dir_all(dir);
  }
}

/// A socket for one agent start in the link directory `dir`, and its path in the sandbox;
/// `None` where the directory is not this process's to use (gone, another machine's, another
/// user's).
pub fn listen(dir: &str) -> Option<(tokio::net::UnixListener, Socket)> {
  let dir = Path::new(dir);
  if !ours(dir) || !dir.is_dir() {
    return None;
  }
  let name = format!("agent-{:032x}.sock", rand::random::<u128>());
  let path = dir.join(&name);
  // Bound through the directory's descriptor: a socket's path may be at most 107 bytes, which
  // a deep temporary directory would pass.
  let at = std::fs::File::open(dir).ok()?;
  let short = format!("/proc/self/fd/{}/{name}", at.as_raw_fd());
  let listener = tokio::net::UnixListener::bind(&short).ok()?;
  drop(at);
  Some((
    listener,
    Socket {
      path,
      inside: format!("{TARGET}/{name}"),
    },
  ))
}

/// A listening socket's file, removed when this is dropped (once the agent connected, or gave
/// up).
pub struct Socket {
  path: PathBuf,
  /// Its path in the sandbox.
  pub inside: String,
}

impl Drop for Socket {
  fn drop(&mut self) {
    let _ = std::fs::remove_file(&self.path);
  }
}

/// Sweeps in the background, unless a sweep of `engine` started less than `SWEEP_EVERY` ago.
pub fn sweep_soon(engine: &Engine) {
  let links = engine.shared.state::<Links>();
  let now = crate::util::timestamps::now_ms();
  let last = links.swept_ms.load(Ordering::Relaxed);
  let due = now.saturating_sub(last) >= SWEEP_EVERY.as_millis() as u64;
  if !due
    || links
      .swept_ms
      .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
      .is_err()
  {
    return;
  }
  let task_engine = engine.clone();
  engine
    .shared
    .background
    .spawn_cancellable(async move { sweep(&task_engine).await });
}

/// Removes this user's link directories that no container of `engine` mounts any more (their
/// sandboxes were removed, by any process or by hand), once they are old enough that no create
/// can be making one.
async fn sweep(engine: &Engine) {
  let Some(base) = base_checked() else {
    return;
  };
  let Ok(entries) = std::fs::read_dir(engine_dir(&base, &engine.host)) else {
    return;
  };
  let old: Vec<PathBuf> = entries
    .flatten()
    .filter(|e| {
      e.metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= SWEEP_MIN_AGE)
    })
    .map(|e| e.path())
    .collect();
  if old.is_empty() {
    return;
  }
  let Ok(live) = engine
    .list_labelled("list the sandboxes with links", vec![LABEL.into()])
    .await
  else {
    return;
  };
  let kept: HashSet<String> = live
    .into_iter()
    .filter_map(|c| c.labels.unwrap_or_default().remove(LABEL))
    .collect();
  for dir in old {
    if dir.to_str().is_some_and(|d| !kept.contains(d)) {
      let _ = std::fs::remove_dir_all(&dir);
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn a_missing_mount_source_is_a_refusal_of_the_link() {
    let dir = "/tmp/trueforge-link-0/01ARZ3NDEKTSV4RRFFQ69G5FAV";
    let docker =
      format!("invalid mount config for type \"bind\": bind source path does not exist: {dir}");
    assert!(is_refusal(&docker, dir));
    assert!(is_refusal(
      &format!("error while mounting {dir}: denied"),
      dir
    ));
    assert!(!is_refusal("No such image: busybox:nope", dir));
  }

  #[test]
  fn only_this_users_link_directories_are_made_or_removed() {
    let ulid = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    assert!(base_checked().is_some());
    assert!(ours(&base().join("0123456789abcdef").join(ulid)));
    assert!(!ours(
      &PathBuf::from("/tmp/trueforge-link-12345/0123456789abcdef").join(ulid)
    ));
    assert!(!ours(&base().join(ulid)));
    assert!(!ours(&base()));
    assert!(!ours(&base().join("a").join("b").join("c")));
  }

  #[test]
  fn a_base_anyone_else_could_have_made_or_entered_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = std::env::temp_dir().join(format!("tf-link-unit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir(&root).unwrap();
    // Made here: this user's, 0700.
    let fresh = root.join("fresh");
    assert_eq!(checked(fresh.clone()), Some(fresh.clone()));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&fresh), 0o700);
    // Open to others.
    let open = root.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(checked(open), None);
    // A link to a directory of ours.
    let link = root.join("link");
    std::os::unix::fs::symlink(&fresh, &link).unwrap();
    assert_eq!(checked(link), None);
    // A file.
    let file = root.join("file");
    std::fs::write(&file, b"").unwrap();
    assert_eq!(checked(file), None);
    // Another user's (only root can make one here).
    if unsafe { libc::geteuid() } == 0 {
      let theirs = root.join("theirs");
      std::fs::create_dir(&theirs).unwrap();
      std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
      std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
      assert_eq!(checked(theirs), None);
    }
    std::fs::remove_dir_all(&root).unwrap();
  }

  #[test]
  fn a_socket_is_had_however_deep_the_temporary_directory() {
    let key = format!("unit-{}-{}", std::process::id(), "d".repeat(80));
    let (dir, _) = prepare_in("unix:///var/run/docker.sock", &key).unwrap();
    assert!(dir.len() > 108);
    let rt = tokio::runtime::Builder::new_current_thread()
      .enable_io()
      .build()
      .unwrap();
    let file = rt.block_on(async {
      let (_listener, socket) = listen(&dir).expect("a socket");
      assert!(socket.inside.starts_with("/.trueforge-link/agent-"));
      assert!(socket.path.exists());
      socket.path.clone()
    });
    // Removed with its `Socket`.
    assert!(!file.exists());
    remove(&dir);
  }

  #[test]
  fn engines_keep_their_directories_apart() {
    let (a, b) = (
      "unix:///var/run/docker.sock",
      "unix:///var/run/docker-gvisor.sock",
    );
    let base = base();
    assert_ne!(engine_dir(&base, a), engine_dir(&base, b));
    // The same name in every process and version.
    assert_eq!(
      engine_dir(&base, a),
      base.join(format!("{:016x}", 0x22d8_9489_e224_172cu64))
    );
  }

  #[test]
  fn the_mount_is_read_only_at_the_target() {
    let key = format!("unit-{}", std::process::id());
    let (dir, mount) = prepare_in("unix:///var/run/docker.sock", &key).unwrap();
    assert_eq!(mount.target.as_deref(), Some(TARGET));
    assert_eq!(mount.source.as_deref(), Some(dir.as_str()));
    assert_eq!(mount.read_only, Some(true));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    remove(&dir);
    assert!(!Path::new(&dir).exists());
    ensure(Some(&dir));
    assert!(Path::new(&dir).is_dir());
    remove(&dir);
  }
}
