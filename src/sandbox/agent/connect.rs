//! Finding a container's agent, or starting one: a connection still alive is used (pinged
//! first when it has been quiet), else a new agent is started, given the static Code Mode
//! client's layout and, under a policy, its egress port. An agent that cannot start puts its
//! sandbox on the engine's endpoints (`down`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::engine::Engine;
use crate::sandbox::agent::binaries::{Arch, Binary, Setup};
use crate::sandbox::agent::conn::{launch, watch, Conn, Conns, Failure};
use crate::sandbox::agent::down::{Cause, Downs};
use crate::sandbox::agent::{egress, ops, place, volume};
use crate::sandbox::body::non_root;
use crate::sandbox::container::Target;
use crate::sandbox::exec::StartError;
use crate::util::bounded::bounded_insert;
use crate::util::logging::Logger;
use crate::util::timestamps;

/// CapEff bits: CAP_SETGID, CAP_SETUID.
const CAP_SETGID: u64 = 1 << 6;
const CAP_SETUID: u64 = 1 << 7;

/// Image id → its platform, per engine.
#[derive(Default)]
struct Archs(Mutex<HashMap<String, Arch>>);

/// The container's agent, started (or replaced) when there is none alive.
pub async fn connect(
  engine: &Engine,
  target: &Target,
  setup: &Setup,
  log: &Logger,
) -> Result<Arc<Conn>, Failure> {
  if !setup.enabled {
    return Err(Failure::Unavailable("the `agent` option is false".into()));
  }
  let (conns, downs) = (
    engine.shared.state::<Conns>(),
    engine.shared.state::<Downs>(),
  );
  let container = target.container_id.as_str();
  if let Some(why) = downs.down(container) {
    return Err(Failure::Unavailable(why));
  }
  let slot = conns.slot(container);
  let mut held = slot.lock().await;
  if let Some(c) = held.as_ref().filter(|c| !c.client.is_closed()) {
    // Where the stream ends with the agent, its end already told whether it is there.
    let stream_tells = target.agent.runc_family && !engine.podman;
    if stream_tells
      || c.client.silent_for() < PROBE_AFTER
      || still_there(engine, container, c).await?
    {
      return Ok(c.clone());
    }
    c.client.close();
  }
  *held = None;
  match start(engine, target, setup, log).await {
    Ok(c) => {
      *held = Some(c.clone());
      drop(held);
      watch(engine, container, slot, c.clone());
      Ok(c)
    }
    Err(e) => {
      drop(held);
      conns.release(container, &slot, None);
      if let Failure::Unavailable(why) = &e {
        downs.fall_back(target, Cause::Start, why, log);
      }
      Err(e)
    }
  }
}

/// A connection quiet for this long is pinged before a call is sent on it (except on Docker's
/// runc and crun: there the engine ends the stream within moments of the agent or its
/// container going, so after a quiet spell the stream has already said what a ping would).
const PROBE_AFTER: Duration = Duration::from_millis(100);
/// How long that ping may take before the connection is used anyway.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// Whether a quiet agent still answers. Its container may have stopped (or the agent died)
/// while its engine has not closed the stream yet: a call sent then would be lost with no way
/// to know whether it ran, while a ping that fails proves nothing was sent, so a new agent can
/// take the call. A slow answer is not a failure while the container runs; once it stopped (or
/// started again), the agent is gone (gVisor's engine keeps the stream of a stopped sandbox's
/// exec open), and the caller starts the container (or a new agent) again.
async fn still_there(engine: &Engine, container: &str, c: &Conn) -> Result<bool, Failure> {
  match tokio::time::timeout(PROBE_WAIT, c.client.ping()).await {
    Ok(Ok(_)) => Ok(true),
    Ok(Err(_)) => Ok(false),
    Err(_) => {
      // An engine that does not answer either (frozen, say) tells nothing: the call goes on
      // the connection, under its own deadline, as it would have without the ping.
      let inspect = engine.inspect_container("inspect the sandbox container", container);
      let Ok(info) = tokio::time::timeout(PROBE_WAIT, inspect).await else {
        return Ok(true);
      };
      let info = info.map_err(|e| Failure::Start(StartError::Other(e)))?;
      let state = info.and_then(|i| i.state);
      let started = state
        .as_ref()
        .and_then(|s| s.started_at.as_deref())
        .and_then(timestamps::parse_time_ms);
      match state.and_then(|s| s.running) {
        // Started again since this connection was made: its agent is gone, whatever its
        // stream looks like.
        Some(true) if started.is_some_and(|t| t > c.made_ms()) => Ok(false),
        Some(true) => Ok(true),
        _ => {
          c.client.close();
          Err(Failure::Start(StartError::NotRunning))
        }
      }
    }
  }
}

/// The provider started `container` again: its agent is tried again on the next call (a
/// warning already given is not given again for the same reason), and a connection to the agent
/// of its last life is closed. That one is dead, but its stream may not have ended: under gVisor
/// the engine keeps an exec's stream open after its sandbox stopped, and a call sent on it would
/// wait for the silence watch (30 s) to give it up.
pub fn restarted(engine: &Engine, container: &str) {
  engine.shared.state::<Downs>().restarted(container);
  engine.shared.state::<Conns>().close_conn(container);
}

async fn start(
  engine: &Engine,
  target: &Target,
  setup: &Setup,
  log: &Logger,
) -> Result<Arc<Conn>, Failure> {
  let bundle = setup
    .binaries
    .bundle()
    .await
    .map_err(Failure::Unavailable)?;
  let arch = image_arch(engine, &target.agent.image).await?;
  let binary = bundle.get(arch).ok_or_else(|| {
    Failure::Unavailable(format!(
      "its image is built for {} and this package carries no agent binary for that platform",
      arch.name()
    ))
  })?;
  let path = binary_path(engine, target, &bundle.tag, binary).await?;
  let user = target.user.as_deref();
  // Podman drops every capability of a sandbox whose user is not root (`body::podman_adjust`):
  // there the agent starts as that user at once.
  let first = (engine.podman && non_root(user)).then_some(user).flatten();
  let link = target.agent.link.as_deref();
  let mut conn = launch(engine, &target.container_id, &path, arch, first, link).await?;
  let switch = CAP_SETUID | CAP_SETGID;
  if first.is_none() && conn.hello().cap_eff & switch != switch && non_root(user) {
    // No capability to switch users: the agent runs as the sandbox's user itself.
    conn.client.close();
    conn = launch(engine, &target.container_id, &path, arch, user, link).await?;
  }
  // The static `mcp-client` and its directories, in sandboxes made by an earlier version too.
  // Best effort: a workload that planted a link there only loses the static client.
  let _ = ops::lay_out(&conn, ops::code_mode_layout(&conn, target)).await;
  let conn = Arc::new(conn);
  // Under a policy the sandbox has no network but this: a port that cannot be opened leaves it
  // with none at all, which is safe, and says so.
  if let Err(why) = egress::attach(engine, &conn, target, log).await {
    log.warn(
      "the sandbox's egress port is not open: it reaches nothing outside",
      serde_json::json!({ "sandboxId": target.sandbox_id, "reason": why }),
    );
  }
  Ok(conn)
}

/// The platform of an image (cached per image id).
async fn image_arch(engine: &Engine, image: &str) -> Result<Arch, Failure> {
  let archs = engine.shared.state::<Archs>();
  if let Some(a) = archs.0.lock().expect("archs").get(image) {
    return Ok(*a);
  }
  let info = engine
    .inspect_image(image)
    .await
    .map_err(|e| Failure::Start(StartError::Other(e)))?
    .ok_or_else(|| {
      Failure::Unavailable(format!(
        "its image {image} is no longer in the engine, so its platform is unknown"
      ))
    })?;
  let name = info.architecture.unwrap_or_default();
  let arch = Arch::of_image(&name).ok_or_else(|| {
    Failure::Unavailable(format!(
      "its image is built for {name:?}, a platform the agent is not built for"
    ))
  })?;
  bounded_insert(&mut archs.0.lock().expect("archs"), image.to_string(), arch);
  Ok(arch)
}

/// The binary's path: in the container's agent volume when it mounts ours, else placed.
async fn binary_path(
  engine: &Engine,
  target: &Target,
  tag: &str,
  binary: &Binary,
) -> Result<String, Failure> {
  let mount = volume::mount_dir(tag);
  if target.agent.mounted.as_deref() == Some(mount.as_str()) {
    return Ok(format!("{mount}/{}", binary.arch.file_name()));
  }
  let placed = place::ensure(
    engine,
    &target.container_id,
    target.agent.read_only_root,
    tag,
    binary,
  )
  .await
  .map_err(|e| Failure::Start(StartError::from_engine(e)))?;
  placed.map_err(|why| Failure::Unavailable(format!("the agent cannot be placed: {why}")))
}
