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

use std::collections::{HashMap, HashSet};
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
/// Set to `1`, no sandbox gets a link (`docs/operations.md`).
pub const OFF_ENV: &str = "TRUEFORGE_AGENT_NO_LINK";
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
pub fn unreachable(engine: &Engine) {
  engine
    .shared
    .state::<Links>()
    .given_up
    .store(true, Ordering::Relaxed);
}

/// Where this process keeps its sandboxes' link directories (one per user of this machine).
pub fn base() -> PathBuf {
  // SAFETY: geteuid cannot fail.
  let uid = unsafe { libc::geteuid() };
  std::env::temp_dir().join(format!("trueforge-link-{uid}"))
}

/// Whether a sandbox made now on `engine` gets a link: on Linux, with the agent, on a local
/// Docker engine (Podman's SELinux labels and rootless mounts are left alone), under the
/// engine's default runtime or runc (gVisor's sandboxes cannot reach a socket of the host), and
/// unless turned off or refused before.
pub fn wanted(engine: &Engine, agent: bool, runtime: Option<&str>) -> bool {
  cfg!(target_os = "linux")
    && agent
    && !engine.podman
    && engine.host.starts_with("unix://")
    && runtime.is_none_or(|r| matches!(r, "runc" | "io.containerd.runc.v2"))
    && std::env::var_os(OFF_ENV).is_none_or(|v| v != "1")
    && !engine
      .shared
      .state::<Links>()
      .given_up
      .load(Ordering::Relaxed)
}

/// Makes the link directory of a new sandbox (`key`: a name of its own) and the mount that
/// shows it in the sandbox; `None` when it cannot be made here.
pub fn prepare(key: &str) -> Option<(String, Mount)> {
  let dir = base().join(key.replace(['/', '\\', ':'], "-"));
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

/// Makes `dir` (and the base above it) readable by this user alone.
fn make_private(dir: &Path) -> std::io::Result<()> {
  use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
  let base = base();
  std::fs::DirBuilder::new()
    .recursive(true)
    .mode(0o700)
    .create(dir)?;
  for d in [base.as_path(), dir] {
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
    unreachable(engine);
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

/// Whether `dir` is one of this process's user's link directories.
fn ours(dir: &Path) -> bool {
  dir.parent() == Some(base().as_path())
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
  if !dir.is_dir() {
    return None;
  }
  let name = format!("agent-{:032x}.sock", rand::random::<u128>());
  let path = dir.join(&name);
  let listener = tokio::net::UnixListener::bind(&path).ok()?;
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
pub async fn sweep(engine: &Engine) {
  let Ok(entries) = std::fs::read_dir(base()) else {
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

/// The label a linked sandbox carries.
pub fn label(dir: &str) -> HashMap<String, String> {
  HashMap::from([(LABEL.to_string(), dir.to_string())])
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
    assert!(ours(&base().join("01ARZ3NDEKTSV4RRFFQ69G5FAV")));
    assert!(!ours(Path::new(
      "/tmp/trueforge-link-12345/01ARZ3NDEKTSV4RRFFQ69G5FAV"
    )));
    assert!(!ours(&base()));
    assert!(!ours(&base().join("a").join("b")));
  }

  #[test]
  fn the_mount_is_read_only_at_the_target() {
    let key = format!("unit-{}", std::process::id());
    let (dir, mount) = prepare(&key).unwrap();
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
