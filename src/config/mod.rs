//! Provider options: parsed from the JavaScript object, validated, defaults applied. Pure logic,
//! no I/O, so every rule here is unit-tested. `ProviderConfig` is here; each option's rules are
//! in the module of its concern.

pub mod capabilities;
pub mod check;
pub mod container;
pub mod egress;
pub mod gpus;
pub mod image;
pub mod lifecycle;
pub mod maps;
pub mod options;
pub mod scope;
pub mod sizes;

use std::collections::BTreeMap;

use serde_json::Value;

pub use crate::config::capabilities::DEFAULT_CAPABILITIES;
use crate::config::check::{bad, boolean, typed};
use crate::config::container::{parse_network, parse_resources, parse_runtime, parse_user};
pub use crate::config::container::{
  validate_network, validate_user, Resources, DEFAULT_MEMORY_BYTES, DEFAULT_PIDS_LIMIT,
  MAX_LINUX_ID,
};
pub use crate::config::gpus::Gpus;
use crate::config::gpus::{parse_gpu_wait, parse_gpus};
use crate::config::image::{build_option, parse_registry_auth};
pub use crate::config::image::{validate_image_ref, BuildSpec, RegistryCredential};
pub use crate::config::lifecycle::{
  minutes, DEFAULT_AUTO_DELETE_MINUTES, DEFAULT_AUTO_STOP_MINUTES,
};
use crate::config::lifecycle::{minutes_of, parse_warm_pool};
pub use crate::config::maps::validate_env_name;
use crate::config::maps::{parse_env, parse_labels};
use crate::config::options::ProviderOptions;
use crate::config::scope::parse_tenant;
pub use crate::config::scope::{validate_namespace, DEFAULT_NAMESPACE};
use crate::config::sizes::Sizes;
pub use crate::config::sizes::{
  InflightBounds, DEFAULT_CODE_MODE_PROVIDER_INFLIGHT, DEFAULT_CODE_MODE_SANDBOX_INFLIGHT,
  DEFAULT_ENGINE_TIMEOUT_MS, DEFAULT_EXEC_TIMEOUT_MS, DEFAULT_FILE_MAX_BYTES,
  DEFAULT_MAX_OUTPUT_BYTES,
};
use crate::util::errors::{Result, SandboxError};

/// Validated provider configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
  pub image: String,
  /// The engine address, normalised (`unix:///…`, `tcp://…`); `None` means the default.
  pub docker_host: Option<String>,
  /// The `tls` option (`endpoint::parse_tls_option`); `None` = as the environment says.
  pub tls: Option<crate::engine::endpoint::TlsChoice>,
  pub namespace: String,
  pub exec_timeout_ms: u64,
  /// Cap on `downloadFile`.
  pub file_max_bytes: u64,
  /// Cap on `uploadFile`; `None` = none beyond what the engine accepts.
  pub upload_max_bytes: Option<u64>,
  pub max_output_bytes: u64,
  pub gpus: Option<Gpus>,
  /// The GPUs exclusive allocation hands out (`gpuDevices`); empty = discovered on the engine.
  pub gpu_devices: Vec<String>,
  /// How long `createSandbox()` waits for exclusive GPUs to free up (`gpuWaitMs`); 0 = not at all.
  pub gpu_wait_ms: u64,
  pub env: BTreeMap<String, String>,
  pub labels: BTreeMap<String, String>,
  /// Seconds without activity before a sandbox stops itself; `None` = never.
  pub auto_stop_secs: Option<u64>,
  /// Seconds stopped before the reaper removes a sandbox; `None` = never.
  pub auto_delete_secs: Option<u64>,
  pub capabilities: Vec<String>,
  pub no_new_privileges: bool,
  pub resources: Resources,
  /// The network sandboxes join; `None`: ours, one per namespace and tenant (`sandbox::network`).
  pub network: Option<String>,
  pub user: Option<String>,
  pub read_only_rootfs: bool,
  pub runtime: Option<String>,
  pub tenant: Option<String>,
  pub build: Option<BuildSpec>,
  pub registry_auth: BTreeMap<String, RegistryCredential>,
  /// Ready sandboxes kept per configuration; 0 = no pool.
  pub warm_pool_size: u32,
  /// Deadline for one engine request that is not a command or a transfer.
  pub engine_timeout_ms: u64,
  /// Use the in-sandbox agent (`agent`).
  pub agent: bool,
  /// Link new sandboxes' agents to this process (`agentLink`).
  pub agent_link: bool,
  /// Serve Code Mode on lanes the JavaScript thread reads (`codeModeLane`).
  pub code_mode_lane: bool,
  /// Large uploads written by the engine into the agent's staging directory (`stagedUploads`).
  pub staged_uploads: bool,
  /// Where the agent binaries are (`agent-bin/` beside index.js). Not an option: index.js
  /// passes it; `None` leaves the agent without binaries (calls take the engine's endpoints).
  pub agent_bin_dir: Option<std::path::PathBuf>,
  /// Code Mode request bytes held in the process at once.
  pub code_mode_inflight: InflightBounds,
  /// What sandboxes may reach (`egress`, `egress*`).
  pub egress: egress::Egress,
}

pub use crate::util::labels::LABEL_PREFIX;

impl ProviderConfig {
  /// Parses the options object given to the constructor (less `errors` and `logger`).
  pub fn from_json(value: Value) -> Result<Self> {
    ProviderOptions::from_json(value)?.try_into()
  }

  /// For tests: `options` with `image: 'x'` added.
  #[cfg(test)]
  pub fn with_image(options: Value) -> Result<Self> {
    let mut o = serde_json::json!({ "image": "x" });
    for (k, v) in options.as_object().expect("an object") {
      o[k] = v.clone();
    }
    Self::from_json(o)
  }
}

/// Each option is checked in turn and refused by name; the first refusal is the one reported.
impl TryFrom<ProviderOptions> for ProviderConfig {
  type Error = SandboxError;

  fn try_from(mut o: ProviderOptions) -> Result<Self> {
    let egress_options = egress::Options::take(&mut o);
    let image = typed(o.image.take(), "image", |_| {
      "expected a string such as 'python:3.12'".into()
    })?
    .ok_or_else(|| bad("image", "required: the image every sandbox runs"))
    .and_then(|s| validate_image_ref(&s))?;
    let docker_host = typed(o.docker_host.take(), "dockerHost", |_| {
      "expected a string such as unix:///var/run/docker.sock".into()
    })?
    .map(|s| crate::engine::endpoint::normalize_docker_host(&s, "dockerHost"))
    .transpose()?;
    let tls = crate::engine::endpoint::parse_tls_option(&o.tls.take().unwrap_or(Value::Null))?;
    let namespace = typed(o.namespace.take(), "namespace", |_| {
      "expected a string of [a-z0-9-], 1 to 32 long".into()
    })?
    .map_or_else(
      || Ok(DEFAULT_NAMESPACE.to_string()),
      |s| validate_namespace(&s),
    )?;
    let Sizes {
      exec_timeout_ms,
      file_max_bytes,
      upload_max_bytes,
      max_output_bytes,
      engine_timeout_ms,
      code_mode_inflight,
    } = Sizes::take(&mut o)?;
    let gpus = o.gpus.map(parse_gpus).transpose()?;
    let gpu_devices = gpus::parse_devices(o.gpu_devices, gpus.as_ref())?;
    let gpu_wait_ms = parse_gpu_wait(o.gpu_wait_ms)?;
    let env = parse_env(o.env)?;
    let labels = parse_labels(o.labels)?;
    let auto_stop_secs = minutes_of(
      "autoStopIntervalInMinutes",
      o.auto_stop_interval_in_minutes,
      DEFAULT_AUTO_STOP_MINUTES,
    )?;
    let auto_delete_secs = minutes_of(
      "autoDeleteIntervalInMinutes",
      o.auto_delete_interval_in_minutes,
      DEFAULT_AUTO_DELETE_MINUTES,
    )?;
    let capabilities = capabilities::parse(o.capabilities)?;
    let no_new_privileges = boolean("noNewPrivileges", o.no_new_privileges, true)?;
    let resources = parse_resources(o.resources)?;
    let network = parse_network(o.network)?;
    let user = parse_user(o.user)?;
    let read_only_rootfs = boolean("readOnlyRootfs", o.read_only_rootfs, false)?;
    let runtime = parse_runtime(o.runtime)?;
    let tenant = parse_tenant(o.tenant_name)?;
    let build = build_option(o.build)?;
    let registry_auth = parse_registry_auth(o.registry_auth)?;
    let warm_pool_size = typed(o.warm_pool, "warmPool", |v| {
      format!("expected {{ size: number }}, got {v}")
    })?
    .map_or(Ok(0), parse_warm_pool)?;
    let agent = boolean("agent", o.agent, true)?;
    let egress = egress::parse(egress_options, agent, network.as_deref())?;
    check_warm_pool(warm_pool_size, gpus.as_ref())?;
    Ok(Self {
      engine_timeout_ms,
      agent,
      agent_link: boolean("agentLink", o.agent_link, true)?,
      code_mode_lane: boolean("codeModeLane", o.code_mode_lane, true)?,
      staged_uploads: boolean("stagedUploads", o.staged_uploads, true)?,
      agent_bin_dir: None,
      image,
      docker_host,
      tls,
      namespace,
      exec_timeout_ms,
      file_max_bytes,
      upload_max_bytes,
      max_output_bytes,
      gpus,
      gpu_devices,
      gpu_wait_ms,
      env,
      labels,
      auto_stop_secs,
      auto_delete_secs,
      capabilities,
      no_new_privileges,
      resources,
      network,
      user,
      read_only_rootfs,
      runtime,
      tenant,
      build,
      registry_auth,
      warm_pool_size,
      code_mode_inflight,
      egress,
    })
  }
}

/// A warm pool keeps idle members: none may hold exclusive GPUs.
fn check_warm_pool(size: u32, gpus: Option<&Gpus>) -> Result<()> {
  if size > 0 && matches!(gpus, Some(Gpus::Exclusive(_))) {
    return Err(bad(
      "warmPool",
      "cannot be combined with exclusive GPUs: idle pool members would hold GPUs nobody uses",
    ));
  }
  Ok(())
}

#[cfg(test)]
mod tests;
