//! Creating a sandbox: the container, its layout, its start; on any failure the container is
//! removed (later, in the background, when the engine did not answer).

use bollard::models::ContainerCreateBody;
use serde_json::json;

use crate::config::{Gpus, ProviderConfig};
use crate::engine::Engine;
use crate::sandbox::agent::link;
use crate::sandbox::body::{container_body_with, network_of, podman_adjust};
use crate::sandbox::container::{name_for, pool_name, remember, Target};
use crate::sandbox::exec::StartError;
use crate::sandbox::owner::resolve_owner;
use crate::sandbox::{agent, devices, layout, network, transfer};
use crate::util::errors::{Result, SandboxError};
use crate::util::ids;
use crate::util::labels::LABEL_USER;
use crate::util::logging::Logger;

/// The `USER` an image runs as, if it names one.
async fn image_user(engine: &Engine, image: &str) -> Result<Option<String>> {
  let info = engine.inspect_image(image).await?;
  Ok(
    info
      .and_then(|i| i.config)
      .and_then(|c| c.user)
      .filter(|u| !u.is_empty()),
  )
}

/// Creates, lays out and starts a sandbox from `image` (the resolved reference). A pool member
/// (`pool` = the configuration's fingerprint) gets a name no id resolves to until it is claimed.
/// On any failure the container is removed.
pub async fn create(
  engine: &Engine,
  cfg: &ProviderConfig,
  image: &str,
  pool: Option<&str>,
  log: &Logger,
) -> Result<Target> {
  create_with(engine, cfg, image, pool, log, None).await
}

/// `create` with the GPUs picked for an exclusive sandbox (`gpu::create_exclusive`). An engine
/// that cannot give the GPUs asked for fails with `GpuUnsupported`.
pub async fn create_with(
  engine: &Engine,
  cfg: &ProviderConfig,
  image: &str,
  pool: Option<&str>,
  log: &Logger,
  gpus_picked: Option<&[String]>,
) -> Result<Target> {
  if devices::needs_cdi(cfg, gpus_picked) {
    let names = match (&cfg.gpus, gpus_picked) {
      (_, Some(p)) => p.to_vec(),
      (Some(Gpus::Cdi(n)), None) => n.clone(),
      _ => Vec::new(),
    };
    devices::check_cdi_support(engine, &names)?;
  }
  // Under an egress policy or 'none' the sandbox joins no network: no network work at all.
  let joins = !cfg.egress.no_network();
  let ours = joins && network::wanted(engine, cfg.network.as_deref(), log);
  // A network removed since this process last saw it is made again; one with a twin for a
  // moment (another process made it at the same time) is settled on again, a little later.
  for attempt in 0..NETWORK_TRIES {
    let net = match ours {
      true => Some(network::ensure(engine, &cfg.namespace, cfg.tenant.as_deref()).await?),
      // Not ours and no option: the engine's default bridge.
      false if joins && cfg.network.is_none() => Some("bridge".to_string()),
      false => None,
    };
    let spec = Spec {
      image,
      pool,
      gpus_picked,
      network: net.as_deref(),
    };
    match create_inner(engine, cfg, &spec, log).await {
      Err(e) if attempt + 1 < NETWORK_TRIES && ours && network::is_missing(&e) => {
        network::forget(engine, &network_of(cfg));
        tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
      }
      other => return other.map_err(|e| devices::explain(e, cfg.gpus.as_ref(), gpus_picked)),
    }
  }
  unreachable!("the loop returns on its last attempt")
}

/// Creates tried when our network turns out missing or briefly doubled.
const NETWORK_TRIES: u32 = 5;

/// What one create makes, beside the provider's configuration.
struct Spec<'a> {
  image: &'a str,
  /// The pool's fingerprint, for a pool member.
  pool: Option<&'a str>,
  gpus_picked: Option<&'a [String]>,
  /// The network to join, ours by id (`None`: the `network` option's).
  network: Option<&'a str>,
}

async fn create_inner(
  engine: &Engine,
  cfg: &ProviderConfig,
  spec: &Spec<'_>,
  log: &Logger,
) -> Result<Target> {
  let Spec {
    image,
    pool,
    gpus_picked,
    ..
  } = *spec;
  let sandbox_id = ids::new_sandbox_id();
  let final_name = name_for(&cfg.namespace, &sandbox_id)?;
  let name = if pool.is_some() {
    pool_name(&final_name)
  } else {
    final_name
  };
  let body = shape(engine, cfg, spec, &sandbox_id, log).await?;
  let linked = link_of(&body);
  // Kept only where a refused link may need a second create.
  let mut without_link = linked.is_some().then(|| unlinked(&body));
  // Not retried, but for a link the engine refused: a create that reached the engine would
  // collide with its own name.
  let mut created = engine
    .create_container("create the sandbox container", Some(&name), body)
    .await;
  if let (Err(e), Some(dir)) = (&created, &linked) {
    link::remove(dir);
    if let Some(body) = without_link
      .take()
      .filter(|_| link::refused(engine, e, dir))
    {
      log.info(
        "the engine does not see this process's files: its sandboxes get no link",
        json!({ "engine": engine.host.to_string(), "error": e.to_string() }),
      );
      created = engine
        .create_container("create the sandbox container", Some(&name), body)
        .await;
    }
  }
  let container_id = match created {
    Ok(id) => id,
    Err(e) => {
      // No answer does not mean nothing happened: a hung engine may still run the buffered
      // request once it wakes. Remove the container by name when it does.
      if matches!(
        e,
        SandboxError::EngineTimeout { .. } | SandboxError::EngineUnreachable { .. }
      ) {
        remove_later(engine, &name, log);
      }
      return Err(create_failed(e, image));
    }
  };
  let made = Made {
    sandbox_id: &sandbox_id,
    name: &name,
    container_id: &container_id,
    exclusive_gpus: gpus_picked.is_some(),
  };
  match finish(engine, cfg, &made, log).await {
    Ok(t) => {
      // A pool member is nobody's until claimed (the claim caches it under its final name).
      if pool.is_none() {
        remember(engine, &t);
      }
      log.info(
        "sandbox created",
        json!({ "sandboxId": sandbox_id, "container": name, "image": image }),
      );
      Ok(t)
    }
    Err(e) => {
      clean_up(engine, &name, &container_id, &e, log).await;
      if let Some(dir) = &linked {
        link::remove(dir);
      }
      Err(e)
    }
  }
}

/// The new sandbox's container definition: the provider's, on our network, with Podman's
/// adjustments and the agent volume mounted read-only.
async fn shape(
  engine: &Engine,
  cfg: &ProviderConfig,
  spec: &Spec<'_>,
  sandbox_id: &str,
  log: &Logger,
) -> Result<ContainerCreateBody> {
  if let (Some(_), Some(runtime)) = (&cfg.gpus, &cfg.runtime) {
    gvisor_gpus(engine, runtime).await?;
  }
  let mut body = container_body_with(cfg, sandbox_id, spec.image, spec.pool, spec.gpus_picked);
  // By id: two networks may share our name (see `network`).
  if let (Some(id), Some(hc)) = (spec.network, body.host_config.as_mut()) {
    hc.network_mode = Some(id.to_string());
  }
  if engine.podman {
    // One more request, on Podman only: who the image runs as decides its capabilities there.
    let image_user = match cfg.user {
      Some(_) => None,
      None => image_user(engine, spec.image).await?,
    };
    podman_adjust(cfg, image_user.as_deref(), &mut body)?;
  }
  if cfg.agent && !engine.podman {
    // The sandbox's user goes in a label and the main process runs as root (`LABEL_USER`);
    // commands and files still run as that user. Podman drops every capability of a sandbox
    // whose user is not root anyway, so there the agent runs as that user (`agent::conn`).
    let user = match &cfg.user {
      Some(u) => Some(u.clone()),
      None => image_user(engine, spec.image).await?,
    };
    body
      .labels
      .get_or_insert_with(Default::default)
      .insert(LABEL_USER.into(), user.unwrap_or_default());
    body.user = Some("0:0".into());
  }
  let setup = agent::Setup::of(cfg);
  if let (Some(mount), Some(hc)) = (
    agent::volume::mount_for_create(engine, &setup, log).await,
    body.host_config.as_mut(),
  ) {
    hc.mounts.get_or_insert_with(Vec::new).push(mount);
  }
  if link::wanted(engine, cfg.agent && cfg.agent_link, cfg.runtime.as_deref()) {
    let key = ids::parse_sandbox_id(sandbox_id).unwrap_or(sandbox_id);
    if let (Some((dir, mount)), Some(hc)) = (link::prepare(engine, key), body.host_config.as_mut())
    {
      hc.mounts.get_or_insert_with(Vec::new).push(mount);
      body
        .labels
        .get_or_insert_with(Default::default)
        .insert(link::LABEL.into(), dir);
      link::sweep_soon(engine);
    }
  }
  Ok(body)
}

/// The link directory a container definition mounts, if any.
fn link_of(body: &ContainerCreateBody) -> Option<String> {
  body.labels.as_ref()?.get(link::LABEL).cloned()
}

/// A container definition without its link.
fn unlinked(body: &ContainerCreateBody) -> ContainerCreateBody {
  let mut body = body.clone();
  if let Some(labels) = body.labels.as_mut() {
    labels.remove(link::LABEL);
  }
  if let Some(mounts) = body.host_config.as_mut().and_then(|h| h.mounts.as_mut()) {
    mounts.retain(|m| m.target.as_deref() != Some(link::TARGET));
  }
  body
}

/// GPUs reach a gVisor sandbox only through gVisor's nvproxy, which the engine must pass to
/// `runsc` (`--nvproxy` in the runtime's arguments); without it the sandbox would start with no
/// usable GPU. Refused with what to change. Any other runtime, or one the engine does not list,
/// is left to the create.
async fn gvisor_gpus(engine: &Engine, runtime: &str) -> Result<()> {
  let info = engine.info().await?;
  let Some(rt) = info.runtimes.as_ref().and_then(|r| r.get(runtime)) else {
    return Ok(());
  };
  let path = rt.path.as_deref().unwrap_or("");
  let is_runsc = runtime == "runsc" || path.rsplit('/').next() == Some("runsc");
  if !is_runsc || nvproxy_on(rt.runtime_args.as_deref().unwrap_or(&[])) {
    return Ok(());
  }
  Err(SandboxError::InvalidOption {
    option: "gpus".into(),
    reason: format!(
      "the runtime {runtime:?} is gVisor's runsc, which gives a sandbox GPUs only through its nvproxy, and this engine runs it without `--nvproxy`: add \"--nvproxy\" to the runtimeArgs of {runtime:?} in the engine's daemon.json (a gVisor release with nvproxy is needed: 2023 or later; Debian 12's 20221219 has none) and restart the engine, or leave `gpus` out (see docs/gvisor.md)"
    ),
  })
}

/// Whether runsc's arguments turn nvproxy on (`--nvproxy`, `--nvproxy=true`).
fn nvproxy_on(args: &[String]) -> bool {
  let mut on = false;
  for a in args {
    match a.trim_start_matches('-') {
      "nvproxy" | "nvproxy=true" => on = true,
      "nvproxy=false" => on = false,
      _ => {}
    }
  }
  on
}

/// What the engine says about a failed create, as the caller's error: an absent image is
/// `ImageNotAvailable` (the caller pulls or builds it), a missing runtime says so.
fn create_failed(e: SandboxError, image: &str) -> SandboxError {
  match e {
    SandboxError::Engine {
      status: 404,
      detail,
      ..
    } if detail.contains("image") => SandboxError::ImageNotAvailable {
      image: image.to_string(),
      reason: format!(
        "{detail}; call buildImage() and wait until getImageBuildStatus() says ready"
      ),
    },
    SandboxError::Engine { detail, .. } if detail.contains("runtime") => {
      SandboxError::CreateFailed {
        step: "create the container".into(),
        detail: format!("{detail}; the `runtime` option names a runtime this engine does not have"),
      }
    }
    SandboxError::Engine { detail, .. } => SandboxError::CreateFailed {
      step: "create the container".into(),
      detail,
    },
    other => other,
  }
}

/// A container just created for a sandbox.
struct Made<'a> {
  sandbox_id: &'a str,
  name: &'a str,
  container_id: &'a str,
  exclusive_gpus: bool,
}

/// Lays out and starts a created container: who owns its files, the layout, the start (and,
/// with the agent, the agent, started now so the first call finds it running).
async fn finish(
  engine: &Engine,
  cfg: &ProviderConfig,
  made: &Made<'_>,
  log: &Logger,
) -> Result<Target> {
  let info = engine
    .inspect_container("inspect the new sandbox", made.container_id)
    .await?
    .ok_or_else(|| SandboxError::CreateFailed {
      step: "inspect the new container".into(),
      detail: "it was removed while it was being made".into(),
    })?;
  let user = agent::sandbox_user(&info);
  let mut target = Target {
    sandbox_id: made.sandbox_id.to_string(),
    name: made.name.to_string(),
    container_id: made.container_id.to_string(),
    owner: None,
    tenant: cfg.tenant.clone(),
    exclusive_gpus: made.exclusive_gpus,
    saved: Default::default(),
    agent: agent::Facts::of(&info).into(),
    user,
  };
  let dirs = layout_dirs(made.sandbox_id, cfg.read_only_rootfs);
  if cfg.agent {
    start(engine, made).await?;
    if lay_out_by_agent(engine, cfg, &mut target, &dirs, log).await? {
      return Ok(target);
    }
  }
  target.owner = resolve_owner(engine, made.container_id, target.user.as_deref()).await?;
  transfer::make_layout(
    engine,
    made.container_id,
    &dirs,
    target.owner,
    cfg.read_only_rootfs,
  )
  .await
  .map_err(|e| step_failed("create the sandbox layout", e))?;
  if !cfg.agent {
    start(engine, made).await?;
  }
  Ok(target)
}

async fn start(engine: &Engine, made: &Made<'_>) -> Result<()> {
  let started = engine
    .start_container("start the sandbox container", made.container_id)
    .await
    .map_err(|e| step_failed("start the container", e))?;
  if !started {
    return Err(SandboxError::CreateFailed {
      step: "start the container".into(),
      detail: "it was removed while it was being made".into(),
    });
  }
  Ok(())
}

/// Starts the new sandbox's agent and makes the layout through it (as root, then given to the
/// sandbox's user; who that is, numerically, is read back). `false` when the agent cannot run
/// there, or died doing that (`agent::down`): the caller makes the layout through the archive
/// endpoint, and the sandbox's calls take the engine's endpoints. Only a container that stopped
/// or went fails the creation.
async fn lay_out_by_agent(
  engine: &Engine,
  cfg: &ProviderConfig,
  target: &mut Target,
  dirs: &[String],
  log: &Logger,
) -> Result<bool> {
  let conn = match agent::connect(engine, target, &agent::Setup::of(cfg), log).await {
    Ok(c) => c,
    Err(agent::Failure::Unavailable(_)) => return Ok(false),
    Err(agent::Failure::Start(e)) => return Err(not_started(e)),
  };
  match lay_out_with(engine, cfg, target, dirs, &conn).await {
    Err(SandboxError::AgentLost { detail }) => {
      conn.client.close();
      let runs = engine
        .inspect_container("inspect the new sandbox", &target.container_id)
        .await?
        .and_then(|i| i.state)
        .and_then(|s| s.running)
        == Some(true);
      if !runs {
        return Err(not_started(StartError::NotRunning));
      }
      let stderr = conn.stderr();
      let why = match stderr.trim() {
        "" => format!("it died while it laid out the new sandbox ({detail})"),
        text => format!("it died while it laid out the new sandbox ({detail}); it said: {text}"),
      };
      let state = engine.shared.state::<agent::down::Downs>();
      state.fall_back(target, agent::down::Cause::Create, &why, log);
      Ok(false)
    }
    other => other.map(|()| true),
  }
}

/// A new sandbox whose container stopped or went while its agent started.
fn not_started(e: StartError) -> SandboxError {
  let detail = match e {
    StartError::NotRunning => "the container stopped right after it started".into(),
    StartError::Gone => "the container was removed while it was being made".into(),
    StartError::NeverStarted(text) => text,
    StartError::Other(e) => return e,
  };
  SandboxError::CreateFailed {
    step: "start the sandbox agent".into(),
    detail,
  }
}

/// The layout through a running agent.
async fn lay_out_with(
  engine: &Engine,
  cfg: &ProviderConfig,
  target: &mut Target,
  dirs: &[String],
  conn: &agent::Conn,
) -> Result<()> {
  if conn.as_user {
    // An agent that runs as the sandbox's user cannot make root's directories: the archive
    // endpoint makes the layout (the container has not run anything of the user's yet), then the
    // agent its Code Mode part inside it.
    target.owner = resolve_owner(engine, &target.container_id, target.user.as_deref()).await?;
    let ro = cfg.read_only_rootfs;
    transfer::make_layout(engine, &target.container_id, dirs, target.owner, ro)
      .await
      .map_err(|e| step_failed("create the sandbox layout", e))?;
    let _ = agent::ops::lay_out(conn, agent::ops::code_mode_layout(conn, target)).await;
    return Ok(());
  }
  // /tmp holds the agent's activity file; an image without one gets it (1777, root's).
  let tmp = trueforge_agent_proto::msg::LayoutSpec {
    dirs: vec![trueforge_agent_proto::msg::LayoutDir {
      path: "/tmp".into(),
      mode: 0o1777,
      user_owned: false,
    }],
    user: None,
    links: Vec::new(),
    activity_file: false,
  };
  let _ = agent::ops::lay_out(conn, tmp).await;
  agent::ops::lay_out(conn, agent::ops::new_layout(dirs, conn, target)).await?;
  target.owner = agent::ops::owner_of(conn, &target.sandbox_id).await?;
  Ok(())
}

/// The directories a new sandbox gets: the layout and its root. With a read-only root the
/// volumes at /workspace and /trueforge take the entries.
fn layout_dirs(sandbox_id: &str, read_only_rootfs: bool) -> Vec<String> {
  let mut dirs: Vec<String> = layout::LAYOUT_DIRS
    .iter()
    .filter(|d| !read_only_rootfs || **d != layout::LAYOUT_ROOT)
    .map(|d| d.to_string())
    .collect();
  if !read_only_rootfs {
    dirs.push(ids::WORKSPACE_ROOT.to_string());
  }
  dirs.push(sandbox_id.to_string());
  dirs
}

/// Removes a container whose making failed (now, or in the background when the engine does
/// not answer).
async fn clean_up(engine: &Engine, name: &str, container_id: &str, e: &SandboxError, log: &Logger) {
  log.warn(
    "sandbox creation failed; removing its container",
    json!({ "container": name, "error": e.to_string() }),
  );
  if engine.force_remove(container_id).await.is_err() {
    remove_later(engine, container_id, log);
  }
}

/// Removes a half-made container in the background once the engine answers again: polls for up
/// to ten minutes and, once the engine responds, keeps checking for half a minute more (a
/// request it buffered while hung may land late). When the engine's last provider is disposed
/// meanwhile, one last removal is tried (for at most `STOP_GRACE`, which dispose awaits) and
/// the rest is left to the reaper: the container carries our labels, so it is found.
fn remove_later(engine: &Engine, name_or_id: &str, log: &Logger) {
  let (task_engine, target, log) = (engine.clone(), name_or_id.to_string(), log.clone());
  engine.shared.background.spawn(|stop| async move {
    let engine = task_engine;
    let started = std::time::Instant::now();
    let mut answered_at: Option<std::time::Instant> = None;
    while started.elapsed() < std::time::Duration::from_secs(600) {
      match engine.force_remove(&target).await {
        Ok(_) => {
          let since = *answered_at.get_or_insert_with(std::time::Instant::now);
          if since.elapsed() > std::time::Duration::from_secs(30) {
            return;
          }
        }
        Err(e) => log.debug(
          "half-made sandbox not removed yet",
          json!({ "container": target, "error": e.to_string() }),
        ),
      }
      tokio::select! {
        _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
        _ = stop.cancelled() => {
          let _ = tokio::time::timeout(STOP_GRACE, engine.force_remove(&target)).await;
          return;
        }
      }
    }
    log.warn(
      "gave up removing a half-made sandbox; the reaper will",
      json!({ "container": target }),
    );
  });
}

/// How long a stopped clean-up still tries: dispose waits for it, so it stays short even when
/// the engine does not answer.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

fn step_failed(step: &str, e: SandboxError) -> SandboxError {
  match e {
    SandboxError::Engine { detail, .. } => SandboxError::CreateFailed {
      step: step.into(),
      detail,
    },
    other => other,
  }
}

#[cfg(test)]
mod tests {
  use super::nvproxy_on;

  #[test]
  fn nvproxy_is_on_only_when_runsc_is_told_so_last() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(nvproxy_on(&args(&["--nvproxy"])));
    assert!(nvproxy_on(&args(&["--platform=ptrace", "--nvproxy=true"])));
    assert!(!nvproxy_on(&args(&[])));
    assert!(!nvproxy_on(&args(&["--nvproxy", "--nvproxy=false"])));
    assert!(!nvproxy_on(&args(&["--nvproxy-docker"])));
  }
}
