//! The provider's behaviour in plain async Rust: what each SandboxProvider method does, built
//! from the client, lifecycle, exec, transfer and image modules. No napi types here.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use crate::client::{self, Engine};
use crate::config::ProviderConfig;
use crate::errors::{Result, SandboxError};
use crate::exec::{self, ExecRequest, StartError};
use crate::image::{self, Build};
use crate::layout;
use crate::lifecycle::{self, Target};
use crate::logging::Logger;
use crate::transfer;

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
  host: String,
  log: Logger,
}

impl Provider {
  pub fn new(cfg: ProviderConfig, log: Logger) -> Result<Self> {
    let host = client::effective_host(cfg.docker_host.as_deref())?;
    Ok(Self { cfg, host, log })
  }

  pub fn config(&self) -> &ProviderConfig {
    &self.cfg
  }

  pub fn host(&self) -> &str {
    &self.host
  }

  async fn engine(&self) -> Result<Engine> {
    client::engine_for(&self.host).await
  }

  async fn target(&self, sandbox_id: &str) -> Result<(Engine, Target)> {
    // Malformed ids are refused before any engine request.
    lifecycle::name_for(&self.cfg.namespace, sandbox_id)?;
    let engine = self.engine().await?;
    let target = lifecycle::resolve(&engine, &self.cfg.namespace, sandbox_id).await?;
    Ok((engine, target))
  }

  /// Creates a sandbox and returns its id.
  pub async fn create_sandbox(&self) -> Result<String> {
    let engine = self.engine().await?;
    let t = lifecycle::create(&engine, &self.cfg, &self.log).await?;
    Ok(t.sandbox_id)
  }

  /// Runs a command. `Err` only for `SandboxNotAvailable`; every other failure is an outcome.
  pub async fn exec(&self, p: ExecParams) -> Result<ExecOutcome> {
    match self.exec_inner(&p).await {
      Ok(o) => Ok(o),
      Err(e @ SandboxError::SandboxNotAvailable { .. }) => Err(e),
      Err(e) => {
        self.log.warn(
          "exec failed",
          json!({ "sandboxId": p.sandbox_id, "error": e.to_string() }),
        );
        Ok(ExecOutcome::Failed {
          error: e.to_string(),
        })
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
    exec::validate_env(&p.env)?;
    let cwd = exec::working_dir(&p.sandbox_id, p.cwd.as_deref())?;
    let (engine, mut target) = self.target(&p.sandbox_id).await?;
    let req = ExecRequest {
      command: p.command.clone(),
      cwd,
      env: p.env.clone(),
      timeout,
      max_output: self.cfg.max_output_bytes as usize,
    };
    // At most: one restart of a stopped container, one re-resolve of a stale cache entry.
    for attempt in 0..3 {
      match exec::run(&engine, &target.container_id, &req).await {
        Ok(out) => {
          if out.timed_out {
            self.log.info(
              "exec timed out",
              json!({ "sandboxId": p.sandbox_id, "seconds": timeout.as_secs_f64() }),
            );
          }
          return Ok(ExecOutcome::Ran {
            exit_code: out.exit_code,
            result: out.output,
          });
        }
        Err(StartError::NotRunning) if attempt < 2 => {
          lifecycle::ensure_started(&engine, &target, &self.log).await?
        }
        Err(StartError::Gone) if attempt < 2 => {
          lifecycle::forget(&engine, &target.name);
          target = lifecycle::resolve(&engine, &self.cfg.namespace, &p.sandbox_id).await?;
        }
        Err(StartError::NotRunning) => {
          return Err(SandboxError::Internal(
            "the sandbox container stopped again right after it was started".into(),
          ))
        }
        Err(StartError::Gone) => {
          return Err(SandboxError::SandboxNotAvailable {
            sandbox_id: p.sandbox_id.clone(),
          })
        }
        Err(StartError::Other(e)) => return Err(e),
      }
    }
    unreachable!("the loop returns on its last attempt")
  }

  /// Writes a file; relative paths are taken from the sandbox root.
  pub async fn upload_file(
    &self,
    sandbox_id: &str,
    remote_path: &str,
    content: Bytes,
  ) -> Result<()> {
    let path = layout::resolve_file_target(sandbox_id, remote_path)?;
    let size = content.len() as u64;
    if size > self.cfg.file_max_bytes {
      return Err(SandboxError::FileTooLarge {
        path: remote_path.to_string(),
        size,
        max: self.cfg.file_max_bytes,
      });
    }
    let (engine, target) = self.target(sandbox_id).await?;
    match transfer::upload(
      &engine,
      &target.container_id,
      remote_path,
      &path,
      content,
      target.owner,
    )
    .await
    {
      Err(e) if client::status_of(&e) == Some(404) => {
        if lifecycle::still_exists(&engine, &self.cfg.namespace, &target).await? {
          Err(e)
        } else {
          Err(SandboxError::SandboxNotAvailable {
            sandbox_id: sandbox_id.to_string(),
          })
        }
      }
      other => other,
    }
  }

  /// Reads a regular file (symlinks followed inside the container).
  pub async fn download_file(&self, sandbox_id: &str, path: &str) -> Result<Vec<u8>> {
    let abs = layout::resolve_path(sandbox_id, path)?;
    let (engine, target) = self.target(sandbox_id).await?;
    match transfer::download(
      &engine,
      &target.container_id,
      path,
      &abs,
      self.cfg.file_max_bytes,
    )
    .await
    {
      Err(e @ SandboxError::FileNotFound { .. }) => {
        if lifecycle::still_exists(&engine, &self.cfg.namespace, &target).await? {
          Err(e)
        } else {
          Err(SandboxError::SandboxNotAvailable {
            sandbox_id: sandbox_id.to_string(),
          })
        }
      }
      other => other,
    }
  }

  /// Deletes a sandbox now. Idempotent: true when something was removed.
  pub async fn remove_sandbox(&self, sandbox_id: &str) -> Result<bool> {
    if lifecycle::name_for(&self.cfg.namespace, sandbox_id).is_err() {
      return Ok(false);
    }
    let engine = self.engine().await?;
    let removed = lifecycle::remove(&engine, &self.cfg.namespace, sandbox_id).await?;
    if removed {
      self
        .log
        .info("sandbox removed", json!({ "sandboxId": sandbox_id }));
    }
    Ok(removed)
  }

  pub async fn build_image(&self) -> Result<Build> {
    let engine = self.engine().await?;
    image::build(&engine, &self.cfg.image, &self.log).await
  }

  pub async fn image_status(&self) -> Result<Build> {
    let engine = self.engine().await?;
    image::status(&engine, &self.cfg.image).await
  }

  /// Text appended to the agent's system prompt.
  pub fn additional_instructions(&self) -> String {
    let gpu = match &self.cfg.gpus {
      None => "No GPU is attached.".to_string(),
      Some(_) => "GPUs are attached; `nvidia-smi` lists them.".to_string(),
    };
    format!(
      "You work in a Docker container (image {image}) that is yours alone for this session. \
       Each command runs in a fresh shell whose working directory is your sandbox root; files you \
       write persist between commands. Files the user uploads are in {uploads}; tool results too \
       large for the conversation are saved in {results}. A command that runs longer than its \
       timeout is killed with everything it started; start long-lived servers in the background \
       (`cmd > log 2>&1 &`). {gpu}",
      image = self.cfg.image,
      uploads = layout::UPLOADS_DIR,
      results = layout::TOOL_RESULTS_DIR,
    )
  }
}
