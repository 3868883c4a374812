//! The provider's behaviour in plain async Rust: what each SandboxProvider method does, built
//! from the client, lifecycle, exec, transfer and image modules. No napi types here.

pub(crate) mod agent;
mod retry;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use std::sync::{Arc, Mutex};

use crate::codemode::{self, Budget, Intake, Launcher, Liveness, Pool, Served};
use crate::config::{Gpus, ProviderConfig};
use crate::engine::runtime::Hold;
use crate::engine::{self, Engine};
use crate::fleet::pool;
use crate::fleet::reaper;
use crate::gpu::{self, GpuPlacement, ImageFn, StartSettings};
use crate::images::{self, Build};
use crate::sandbox::container::{self, Placement, Scope, Target};
use crate::sandbox::devices;
use crate::sandbox::exec::{self, ExecRequest};
use crate::sandbox::layout;
use crate::sandbox::transfer;
use crate::util::errors::{Result, SandboxError};
use crate::util::logging::{Level, Logger};

/// How long `createSandbox()` waits for an absent image to be pulled or built.
const IMAGE_WAIT: Duration = Duration::from_secs(30 * 60);

/// Per-call exec parameters, as the contract's `SandboxExecParams`.
#[derive(Debug, Clone, Default)]
pub struct ExecParams {
  pub sandbox_id: String,
  pub command: String,
  pub cwd: Option<String>,
  pub env: BTreeMap<String, String>,
  pub timeout_seconds: Option<f64>,
}

/// The contract's `ExecResult`: the command ran (any exit code), or it never did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutcome {
  Ran { exit_code: i32, result: String },
  Failed { error: String },
}

/// One provider configuration. Cheap to build: no I/O until the first call.
pub struct Provider {
  cfg: ProviderConfig,
  scope: Scope,
  endpoint: crate::engine::endpoint::Endpoint,
  log: Logger,
  /// How this provider's containers are started and removed (exclusive GPUs under the lock).
  placement: Arc<dyn Placement>,
  /// Keeps the process's background reaper for this engine and namespace alive; `None` before
  /// the first call and after `dispose()`.
  lease: Mutex<Option<Arc<reaper::Lease>>>,
  /// This provider's claim on its engine, taken on the first call; `dispose()` gives it back.
  hold: Mutex<Option<Hold>>,
  /// The Code Mode request bytes all of this provider's relays may hold at once.
  code_mode_pool: Arc<Pool>,
  disposed: std::sync::atomic::AtomicBool,
  /// Whether and with which binaries calls go through the in-sandbox agent.
  agent: crate::sandbox::agent::Setup,
}

impl Provider {
  pub fn new(cfg: ProviderConfig, log: Logger) -> Result<Self> {
    if let Some(build) = &cfg.build {
      images::context::check_readable(build)?;
    }
    let endpoint = engine::effective_endpoint(cfg.docker_host.as_deref(), cfg.tls.as_ref())?;
    let scope = Scope::of(&cfg);
    // GPU discovery, when a restart needs it, runs in the provider's image.
    let image_cfg = cfg.clone();
    let image: ImageFn = Arc::new(move || {
      let cfg = image_cfg.clone();
      Box::pin(async move { Ok(images::source(&cfg).await?.reference) })
    });
    let placement = Arc::new(GpuPlacement::new(StartSettings::of(&cfg, image)));
    let code_mode_pool = Pool::new(
      cfg.code_mode_inflight.per_provider as usize,
      codemode::budget::PROVIDER_OPTION,
    );
    Ok(Self {
      code_mode_pool,
      agent: crate::sandbox::agent::Setup::of(&cfg),
      scope,
      endpoint,
      log,
      placement,
      lease: Mutex::new(None),
      hold: Mutex::new(None),
      disposed: Default::default(),
      cfg,
    })
  }

  /// Ends this instance's background work; when it was the engine's last provider, every
  /// background task on the engine (pool refills, image work, the reaper …) is cancelled and
  /// awaited. Sandboxes are never deleted by it. Calls made after it still work, but start
  /// no reaper and are not counted as the engine's providers.
  pub async fn dispose(&self) {
    self
      .disposed
      .store(true, std::sync::atomic::Ordering::SeqCst);
    self.lease.lock().expect("lease").take();
    let hold = self.hold.lock().expect("hold").take();
    if let Some(hold) = hold {
      let engine = engine::connected(&self.endpoint);
      hold.release().await;
      // The engine's last provider: its sandboxes' agents go too (the next call starts one).
      if let Some(e) = engine.filter(|e| e.shared.stats().providers == 0) {
        if let Some(agents) = e.shared.peek::<crate::sandbox::agent::conn::Conns>() {
          agents.close_all();
        }
      }
    }
  }

  pub fn config(&self) -> &ProviderConfig {
    &self.cfg
  }

  pub fn host(&self) -> &str {
    &self.endpoint.host
  }

  /// How the engine is reached (address, TLS, where it was chosen).
  pub fn endpoint(&self) -> &crate::engine::endpoint::Endpoint {
    &self.endpoint
  }

  /// Starts `target`'s container when it is stopped (or unpauses it). A container started
  /// again runs none of its last life's processes: its agent is tried again on the next call.
  async fn ensure_started(&self, engine: &Engine, target: &Target) -> Result<()> {
    if container::ensure_started(engine, target, self.placement.as_ref(), &self.log).await? {
      crate::sandbox::agent::restarted(engine, &target.container_id);
    }
    Ok(())
  }

  async fn engine(&self) -> Result<Engine> {
    let limit = Duration::from_millis(self.cfg.engine_timeout_ms);
    let mut engine = engine::engine_for(&self.endpoint, limit).await?;
    engine.control_timeout = limit;
    {
      // Checked under the lock `dispose` takes, so a racing dispose never misses a claim.
      let mut hold = self.hold.lock().expect("hold");
      if hold.is_none() && !self.disposed.load(std::sync::atomic::Ordering::SeqCst) {
        *hold = Some(Hold::new(&engine.shared));
      }
    }
    if let Some(older_than) = self.cfg.auto_delete_secs {
      if !self.disposed.load(std::sync::atomic::Ordering::SeqCst) {
        let mut lease = self.lease.lock().expect("lease");
        if lease.is_none() {
          *lease = Some(reaper::lease(
            &engine,
            &self.cfg.namespace,
            Duration::from_secs(older_than),
            self.placement.clone(),
            &self.log,
          ));
        }
      }
    }
    Ok(engine)
  }

  async fn target(&self, sandbox_id: &str) -> Result<(Engine, Target)> {
    // Malformed ids are refused before any engine request.
    container::name_for(&self.cfg.namespace, sandbox_id)?;
    let engine = self.engine().await?;
    let target = container::resolve(&engine, &self.scope, sandbox_id).await?;
    Ok((engine, target))
  }

  /// Creates a sandbox (from the warm pool when it has one) and returns its id. An absent
  /// image is pulled or built first.
  pub async fn create_sandbox(&self) -> Result<String> {
    let engine = self.engine().await?;
    let src = images::source(&self.cfg).await?;
    // Podman does not serialise renames (two claimers can both rename one member), so the
    // pool's claim is not safe there: sandboxes are created cold (docs/podman.md).
    if self.cfg.warm_pool_size > 0 && !engine.podman {
      let fp = pool::fingerprint(&self.cfg, &src.reference);
      let claimed = pool::claim(&engine, &self.scope, &fp).await?;
      pool::refill(&engine, &self.cfg, &src.reference, &fp, &self.log);
      if let Some(t) = claimed {
        self.log.info(
          "sandbox taken from the warm pool",
          json!({ "sandboxId": t.sandbox_id }),
        );
        return Ok(t.sandbox_id);
      }
    }
    let make = || async {
      match self.cfg.gpus {
        Some(Gpus::Exclusive(n)) => {
          gpu::alloc::create_exclusive(&engine, &self.cfg, &src.reference, n, &self.log).await
        }
        _ => {
          crate::sandbox::create::create(&engine, &self.cfg, &src.reference, None, &self.log).await
        }
      }
    };
    let t = match make().await {
      Err(SandboxError::ImageNotAvailable { .. }) => {
        images::ensure(&engine, &src, &self.log, IMAGE_WAIT).await?;
        make().await?
      }
      other => other?,
    };
    Ok(t.sandbox_id)
  }

  /// Fills the warm pool now (in the background); a no-op without `warmPool`.
  pub async fn warm_up(&self) -> Result<()> {
    if self.cfg.warm_pool_size == 0 {
      return Ok(());
    }
    let engine = self.engine().await?;
    if engine.podman {
      self.log.warn(
        "warm pool disabled: the engine is Podman, whose renames are not atomic; sandboxes are created on demand",
        json!({ "dockerHost": self.endpoint.host }),
      );
      return Ok(());
    }
    let src = images::source(&self.cfg).await?;
    images::ensure(&engine, &src, &self.log, IMAGE_WAIT).await?;
    let fp = pool::fingerprint(&self.cfg, &src.reference);
    pool::refill(&engine, &self.cfg, &src.reference, &fp, &self.log);
    Ok(())
  }

  /// Removes this namespace's sandboxes stopped for longer than the delete interval.
  pub async fn reap_stale(&self) -> Result<Vec<String>> {
    let engine = self.engine().await?;
    let Some(secs) = self.cfg.auto_delete_secs else {
      return Ok(Vec::new());
    };
    reaper::reap(
      &engine,
      &self.cfg.namespace,
      Duration::from_secs(secs),
      false,
      self.placement.as_ref(),
      &self.log,
    )
    .await
  }

  /// Runs a command. `Err` only for `SandboxNotAvailable`; every other failure is an outcome.
  pub async fn exec(&self, p: ExecParams) -> Result<ExecOutcome> {
    match self.exec_inner(&p).await {
      Ok(o) => Ok(o),
      Err(e @ SandboxError::SandboxNotAvailable { .. }) => Err(e),
      Err(e) => {
        let error = e.to_string();
        // The error may carry the command's early output, which the sandbox controls.
        self.log.sandbox_text(
          Level::Warn,
          "exec failed",
          &p.sandbox_id,
          "error",
          error.as_bytes(),
          json!({ "sandboxId": p.sandbox_id }),
        );
        Ok(ExecOutcome::Failed { error })
      }
    }
  }

  fn exec_timeout(&self, seconds: Option<f64>) -> Result<Duration> {
    match seconds {
      None => Ok(Duration::from_millis(self.cfg.exec_timeout_ms)),
      Some(s) if s.is_finite() && s > 0.0 && s <= 7.0 * 86_400.0 => Ok(Duration::from_secs_f64(s)),
      Some(s) => Err(SandboxError::InvalidArgument {
        argument: "timeoutSeconds".into(),
        reason: format!("{s} is not a positive number of seconds up to a week"),
      }),
    }
  }

  async fn exec_inner(&self, p: &ExecParams) -> Result<ExecOutcome> {
    let timeout = self.exec_timeout(p.timeout_seconds)?;
    exec::validate_command(&p.command)?;
    exec::validate_env(&p.env)?;
    let cwd = exec::working_dir(&p.sandbox_id, p.cwd.as_deref())?;
    let (engine, target) = self.target(&p.sandbox_id).await?;
    let req = ExecRequest {
      command: p.command.clone(),
      cwd,
      env: p.env.clone(),
      timeout,
      max_output: self.cfg.max_output_bytes as usize,
      user: target.user.clone(),
    };
    let never_started =
      |text: String| SandboxError::Internal(format!("the command could not be started: {text}"));
    let out = match self.exec_by_agent(&engine, target.clone(), &req).await? {
      Some(out) => out,
      None => {
        // The engine's exec; a sandbox made for the agent still needs its activity recorded.
        let run = self.with_running(&engine, target.clone(), never_started, |t| {
          let (engine, req) = (&engine, &req);
          async move { exec::run(engine, &t.container_id, req).await }
        });
        // Boxed: the engine's path is the larger future, and the rarer one.
        match Box::pin(crate::sandbox::agent::activity::around(
          &engine, &target, None, run,
        ))
        .await?
        {
          Ok(out) => out,
          Err(e) => return Err(self.unless_gone(&engine, &target, e).await),
        }
      }
    };
    if out.timed_out {
      self.log.info(
        "exec timed out",
        json!({ "sandboxId": p.sandbox_id, "seconds": timeout.as_secs_f64() }),
      );
    }
    Ok(ExecOutcome::Ran {
      exit_code: out.exit_code,
      result: out.output,
    })
  }

  /// Launches a Code Mode relay in a sandbox: a stopped container is started first (files
  /// kept), a stale cache entry re-resolved, a gone one is `SandboxNotAvailable`.
  async fn launch_code_mode_relay(
    &self,
    sandbox_id: &str,
    socket: &str,
    intake: Intake,
  ) -> Result<Served> {
    let (engine, target) = self.target(sandbox_id).await?;
    let budget = Budget::new(
      &engine,
      sandbox_id,
      self.cfg.code_mode_inflight.per_sandbox as usize,
      self.code_mode_pool.clone(),
    );
    let lane = self.cfg.code_mode_lane;
    // Opening the socket replaces whatever listened there: safe to repeat on a new agent.
    let by_agent = self.repeatable_by_agent(&engine, target.clone(), |c, t| {
      let (engine, intake, budget, log) = (&engine, intake.clone(), budget.clone(), &self.log);
      async move {
        #[cfg(unix)]
        if lane && codemode::lane::socket_of(engine).is_some() {
          let (i, b) = (intake.clone(), budget.clone());
          match codemode::lane::open(engine, &c, &t, socket, i, b, log).await {
            Ok(lane) => return Ok(Served::Lane(Box::new(lane))),
            Err(why) => log.debug(
              "Code Mode lane not available; the agent's connection carries the calls",
              json!({ "sandboxId": t.sandbox_id, "reason": why }),
            ),
          }
        }
        codemode::by_agent::listen(engine, c, &t, socket, intake, budget, log)
          .await
          .map(Served::Agent)
      }
    });
    if let Some(served) = by_agent.await? {
      return Ok(served);
    }
    let ro = self.cfg.read_only_rootfs;
    self
      .with_running(&engine, target, codemode::relay::never_listened, |t| {
        let (engine, intake, budget, log) = (&engine, intake.clone(), budget.clone(), &self.log);
        async move { codemode::launch(engine, &t, socket, ro, intake, budget, log).await }
      })
      .await
      .map(|r| Served::Python(Box::new(r)))
  }

  /// Writes a file; relative paths are taken from the sandbox root.
  pub async fn upload_file(
    &self,
    sandbox_id: &str,
    remote_path: &str,
    content: Bytes,
  ) -> Result<()> {
    // An id outside the grammar is refused first, before the path and before any request.
    container::name_for(&self.cfg.namespace, sandbox_id)?;
    let path = layout::resolve_file_target(sandbox_id, remote_path)?;
    let size = content.len() as u64;
    if let Some(max) = self.cfg.upload_max_bytes.filter(|max| size > *max) {
      return Err(SandboxError::FileTooLarge {
        path: remote_path.to_string(),
        size,
        max,
      });
    }
    let (engine, mut target) = self.target(sandbox_id).await?;
    let by_agent =
      self.upload_by_agent(&engine, target.clone(), remote_path, &path, content.clone());
    if by_agent.await?.is_some() {
      return Ok(());
    }
    crate::sandbox::agent::activity::by_engine(&engine, &target);
    if target.exclusive_gpus {
      // Files go only into a running exclusive sandbox: a stopped one may be moving to other
      // GPUs, and a write into the container it leaves would be lost.
      self.ensure_started(&engine, &target).await?;
      target = container::resolve(&engine, &self.scope, sandbox_id).await?;
    }
    let ro = self.cfg.read_only_rootfs;
    self
      .after_404(&engine, target, |t| {
        let (engine, path, content) = (&engine, &path, content.clone());
        async move {
          transfer::upload(
            engine,
            &t.container_id,
            remote_path,
            path,
            content,
            t.owner,
            ro,
          )
          .await
        }
      })
      .await
  }

  /// Reads a regular file (symlinks followed inside the container).
  pub async fn download_file(&self, sandbox_id: &str, path: &str) -> Result<Vec<u8>> {
    container::name_for(&self.cfg.namespace, sandbox_id)?;
    let abs = layout::resolve_path(sandbox_id, path)?;
    let (engine, target) = self.target(sandbox_id).await?;
    if let Some(bytes) = self
      .download_by_agent(&engine, target.clone(), path, &abs)
      .await?
    {
      return Ok(bytes);
    }
    crate::sandbox::agent::activity::by_engine(&engine, &target);
    let max = self.cfg.file_max_bytes;
    let touch = self.cfg.auto_stop_secs.is_some();
    self
      .after_404(&engine, target, |t| {
        let (engine, abs) = (&engine, &abs);
        async move {
          let bytes = transfer::download(engine, &t.container_id, path, abs, max).await?;
          // A download is activity too; recording it must not delay the caller.
          if touch {
            let (task_engine, container, owner) = (engine.clone(), t.container_id, t.owner);
            engine.shared.background.spawn_cancellable(async move {
              transfer::touch_activity(&task_engine, &container, owner).await
            });
          }
          Ok(bytes)
        }
      })
      .await
  }

  /// Deletes a sandbox now. Idempotent: true when something was removed.
  pub async fn remove_sandbox(&self, sandbox_id: &str) -> Result<bool> {
    if container::name_for(&self.cfg.namespace, sandbox_id).is_err() {
      return Ok(false);
    }
    let engine = self.engine().await?;
    let removed = container::remove(
      &engine,
      &self.scope,
      sandbox_id,
      self.placement.as_ref(),
      &self.log,
    )
    .await?;
    if removed {
      self
        .log
        .info("sandbox removed", json!({ "sandboxId": sandbox_id }));
    }
    Ok(removed)
  }

  pub async fn build_image(&self) -> Result<Build> {
    let engine = self.engine().await?;
    let src = images::source(&self.cfg).await?;
    images::build(&engine, &src, &self.log).await
  }

  pub async fn image_status(&self) -> Result<Build> {
    let engine = self.engine().await?;
    let src = images::source(&self.cfg).await?;
    images::status(&engine, &src, &self.log).await
  }

  /// Text appended to the agent's system prompt.
  pub fn additional_instructions(&self) -> String {
    let gpu = gpu_instructions(self.cfg.gpus.as_ref());
    let network = network_instructions(&self.cfg.egress.mode);
    format!(
      "You work in a Docker container (image {image}) that is yours alone for this session. \
       Each command runs in a fresh shell whose working directory is your sandbox root; files you \
       write persist between commands. Files the user uploads are in {uploads}; tool results too \
       large for the conversation are saved in {results}. A command that runs longer than its \
       timeout is killed with everything it started; start long-lived servers in the background \
       (`cmd > log 2>&1 &`). {gpu}{network}",
      image = self.cfg.image,
      uploads = layout::UPLOADS_DIR,
      results = layout::TOOL_RESULTS_DIR,
    )
  }
}

impl Launcher for Provider {
  async fn launch_relay(&self, sandbox_id: &str, socket: &str, intake: Intake) -> Result<Served> {
    container::name_for(&self.cfg.namespace, sandbox_id)?;
    self
      .launch_code_mode_relay(sandbox_id, socket, intake)
      .await
  }

  async fn liveness(&self, sandbox_id: &str) -> Liveness {
    let (Ok(name), Ok(engine)) = (
      container::name_for(&self.cfg.namespace, sandbox_id),
      self.engine().await,
    ) else {
      return Liveness::Unknown;
    };
    match engine.inspect_container("inspect the sandbox", &name).await {
      Ok(Some(info)) => match info.state {
        Some(s) if s.running == Some(true) => Liveness::Running(s.started_at.unwrap_or_default()),
        _ => Liveness::Stopped,
      },
      Ok(None) => Liveness::Stopped,
      Err(_) => Liveness::Unknown,
    }
  }
}

/// What the agent is told about the network: nothing when it is the engine's own.
pub fn network_instructions(mode: &crate::egress::Mode) -> String {
  use crate::egress::Mode;
  match mode {
    Mode::Open => String::new(),
    Mode::Off => " The sandbox has no network access.".to_string(),
    Mode::Policy(p) => format!(
      " There is no direct network access: connections go through a proxy set in the \
       environment (HTTP_PROXY, HTTPS_PROXY, and ALL_PROXY for SOCKS5), which pip, npm, git, \
       curl and most HTTP libraries use; tools that ignore those variables cannot connect. The \
       proxy allows only some hosts ({}); a refused connection gets a 403 (or a SOCKS refusal) \
       naming the host and the rule.",
      p.summary()
    ),
  }
}

/// What the agent is told about its GPUs. The instructions are the same for every sandbox of a
/// provider, so a sandbox's own GPUs are named by `$TRUEFORGE_GPUS` inside it.
pub fn gpu_instructions(gpus: Option<&Gpus>) -> String {
  let var = devices::ENV_GPUS;
  match gpus {
    None => "No GPU is attached.".to_string(),
    Some(Gpus::All) => "Every GPU of the host is attached; `nvidia-smi -L` lists them.".into(),
    Some(Gpus::Count(n)) => format!("{n} GPU(s) are attached; `nvidia-smi -L` lists them."),
    Some(Gpus::Devices(ids)) => format!(
      "GPUs {} are attached (${var} names them); `nvidia-smi -L` lists them.",
      ids.join(", ")
    ),
    Some(Gpus::Cdi(names)) => format!(
      "GPUs are attached as CDI devices {} (${var} names them); `nvidia-smi -L` lists them.",
      names.join(", ")
    ),
    Some(Gpus::Exclusive(n)) => format!(
      "{n} GPU(s) are yours alone while this sandbox runs: no other sandbox uses them, so \
       timings are not disturbed by other agents' work. ${var} names them; `nvidia-smi -L` \
       lists them."
    ),
  }
}
