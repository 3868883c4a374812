//! Provider options: parsed from the JavaScript object, validated, defaults applied. Pure logic,
//! no I/O, so every rule here is unit-tested.

pub mod capabilities;
pub mod check;
pub mod egress;
pub mod gpus;
pub mod options;

use std::collections::BTreeMap;

use serde_json::{Number, Value};

pub use crate::config::capabilities::DEFAULT_CAPABILITIES;
use crate::config::check::{bad, must, typed};
pub use crate::config::gpus::Gpus;
use crate::config::gpus::{parse_gpu_wait, parse_gpus};
use crate::config::options::{BuildOptions, Given, ProviderOptions, WarmPoolOptions};
use crate::util::errors::{Result, SandboxError};

/// Default for `execTimeoutMs`.
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 60_000;
/// Default for `fileMaxBytes` (the download cap): TrueForge's own download limit, 20 MiB.
pub const DEFAULT_FILE_MAX_BYTES: u64 = 20 * 1024 * 1024;
/// Largest `uploadMaxBytes` accepted: JavaScript's largest exact integer. An upload is streamed
/// from the caller's buffer, so its cap guards the sandbox's disk, not the host's memory.
const MAX_UPLOAD_CAP: u64 = (1 << 53) - 1;
/// Default for `maxOutputBytes`.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 10 * 1024 * 1024;
/// Default for `namespace`.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Largest exec timeout accepted (a week): beyond that a typo is likelier than intent.
const MAX_EXEC_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;
/// Caps above 1 GiB would let one call hold that much in the host process.
const MAX_BYTES_CAP: u64 = 1024 * 1024 * 1024;
/// Default for `codeModeSandboxInflightBytes`: one request of the largest size Code Mode takes.
pub const DEFAULT_CODE_MODE_SANDBOX_INFLIGHT: u64 = 64 * 1024 * 1024;
/// Default for `codeModeProviderInflightBytes`: four sandboxes' worth.
pub const DEFAULT_CODE_MODE_PROVIDER_INFLIGHT: u64 = 256 * 1024 * 1024;
/// Smallest in-flight bound accepted: below it ordinary requests would be refused.
const MIN_INFLIGHT: u64 = 64 * 1024;
/// Largest `codeModeProviderInflightBytes` accepted.
const MAX_PROVIDER_INFLIGHT: u64 = 16 * 1024 * 1024 * 1024;
/// Default for `engineTimeoutMs`.
pub const DEFAULT_ENGINE_TIMEOUT_MS: u64 = 30_000;
/// Largest `engineTimeoutMs` accepted: ten minutes.
const MAX_ENGINE_TIMEOUT_MS: u64 = 600_000;
/// Default for `autoStopIntervalInMinutes`.
pub const DEFAULT_AUTO_STOP_MINUTES: f64 = 15.0;
/// Default for `autoDeleteIntervalInMinutes` (five days).
pub const DEFAULT_AUTO_DELETE_MINUTES: f64 = 7200.0;
/// Default for `resources.memoryBytes`: 8 GiB, swap never above it.
pub const DEFAULT_MEMORY_BYTES: u64 = 8 << 30;
/// Default for `resources.pidsLimit`: ample for builds, fatal to fork bombs.
pub const DEFAULT_PIDS_LIMIT: u64 = 4096;

/// Container resource limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
  pub memory_bytes: Option<u64>,
  pub nano_cpus: Option<u64>,
  pub pids_limit: Option<u64>,
}

/// An image built from a local context directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSpec {
  pub context: String,
  pub dockerfile: String,
  pub args: BTreeMap<String, String>,
}

/// Credentials for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryCredential {
  Basic { username: String, password: String },
  IdentityToken(String),
}

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

/// Bounds on the Code Mode request bytes held at once (`codeMode*InflightBytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InflightBounds {
  pub per_sandbox: u64,
  pub per_provider: u64,
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
    if warm_pool_size > 0 && matches!(gpus, Some(Gpus::Exclusive(_))) {
      return Err(bad(
        "warmPool",
        "cannot be combined with exclusive GPUs: idle pool members would hold GPUs nobody uses",
      ));
    }
    Ok(Self {
      engine_timeout_ms,
      agent,
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

/// The `build` option, checked.
fn build_option(v: Option<Given<BuildOptions>>) -> Result<Option<BuildSpec>> {
  typed(v, "build", |v| {
    format!("expected {{ context, dockerfile?, args? }}, got {v}")
  })?
  .map(parse_build)
  .transpose()
}

/// The time and size limits of calls and engine requests, checked in the order the options are
/// reported.
struct Sizes {
  exec_timeout_ms: u64,
  file_max_bytes: u64,
  upload_max_bytes: Option<u64>,
  max_output_bytes: u64,
  engine_timeout_ms: u64,
  code_mode_inflight: InflightBounds,
}

impl Sizes {
  fn take(o: &mut ProviderOptions) -> Result<Self> {
    let exec_timeout_ms = positive_int(
      "execTimeoutMs",
      o.exec_timeout_ms.take(),
      DEFAULT_EXEC_TIMEOUT_MS,
      MAX_EXEC_TIMEOUT_MS,
    )?;
    let file_max_bytes = positive_int(
      "fileMaxBytes",
      o.file_max_bytes.take(),
      DEFAULT_FILE_MAX_BYTES,
      MAX_BYTES_CAP,
    )?;
    let upload_max_bytes = o
      .upload_max_bytes
      .take()
      .map(|v| positive_int("uploadMaxBytes", Some(v), 0, MAX_UPLOAD_CAP))
      .transpose()?;
    let max_output_bytes = positive_int(
      "maxOutputBytes",
      o.max_output_bytes.take(),
      DEFAULT_MAX_OUTPUT_BYTES,
      MAX_BYTES_CAP,
    )?;
    if max_output_bytes < 1024 {
      return Err(bad(
        "maxOutputBytes",
        "must be at least 1024 so that head and tail both fit",
      ));
    }
    let engine_timeout_ms = positive_int(
      "engineTimeoutMs",
      o.engine_timeout_ms.take(),
      DEFAULT_ENGINE_TIMEOUT_MS,
      MAX_ENGINE_TIMEOUT_MS,
    )?;
    let inflight = |option: &str, v, default, max| {
      let n = positive_int(option, v, default, max)?;
      if n < MIN_INFLIGHT {
        return Err(bad(
          option,
          format!("{n} is below the minimum {MIN_INFLIGHT}"),
        ));
      }
      Ok(n)
    };
    let code_mode_inflight = InflightBounds {
      per_sandbox: inflight(
        "codeModeSandboxInflightBytes",
        o.code_mode_sandbox_inflight_bytes.take(),
        DEFAULT_CODE_MODE_SANDBOX_INFLIGHT,
        MAX_BYTES_CAP,
      )?,
      per_provider: inflight(
        "codeModeProviderInflightBytes",
        o.code_mode_provider_inflight_bytes.take(),
        DEFAULT_CODE_MODE_PROVIDER_INFLIGHT,
        MAX_PROVIDER_INFLIGHT,
      )?,
    };
    Ok(Self {
      exec_timeout_ms,
      file_max_bytes,
      upload_max_bytes,
      max_output_bytes,
      engine_timeout_ms,
      code_mode_inflight,
    })
  }
}

type StringMap = Option<Given<BTreeMap<String, Given<String>>>>;

fn parse_env(v: StringMap) -> Result<BTreeMap<String, String>> {
  let env = string_map("env", v)?;
  for (k, v) in &env {
    validate_env_name(k).map_err(|r| bad("env", format!("variable {k:?}: {r}")))?;
    if v.contains('\0') {
      return Err(bad(
        "env",
        format!("variable {k:?}: value contains a NUL byte"),
      ));
    }
  }
  Ok(env)
}

fn parse_labels(v: StringMap) -> Result<BTreeMap<String, String>> {
  let labels = string_map("labels", v)?;
  for k in labels.keys() {
    if k.is_empty() || k.contains('\0') {
      return Err(bad(
        "labels",
        format!("label key {k:?} is empty or has a NUL byte"),
      ));
    }
    if k.starts_with(LABEL_PREFIX) {
      return Err(bad(
        "labels",
        format!("label key {k:?} uses the reserved prefix {LABEL_PREFIX}"),
      ));
    }
  }
  Ok(labels)
}

fn parse_network(v: Option<Given<String>>) -> Result<Option<String>> {
  typed(v, "network", |v| {
    format!("expected 'bridge', 'none' or a network name, got {v}")
  })?
  .map(|n| validate_network(&n))
  .transpose()
}

fn parse_user(v: Option<Given<String>>) -> Result<Option<String>> {
  typed(v, "user", |v| {
    format!("expected 'uid:gid' or a user name, got {v}")
  })?
  .map(|u| validate_user(&u))
  .transpose()
}

fn parse_runtime(v: Option<Given<String>>) -> Result<Option<String>> {
  let expected = |v: &Value| format!("expected a runtime name such as 'runsc', got {v}");
  typed(v, "runtime", expected)?
    .map(|r| match is_simple_name(&r, 64) {
      true => Ok(r),
      false => Err(bad("runtime", expected(&Value::String(r)))),
    })
    .transpose()
}

fn parse_tenant(v: Option<Given<String>>) -> Result<Option<String>> {
  let expected = |v: &Value| format!("expected a non-empty string up to 128 bytes, got {v}");
  typed(v, "tenantName", expected)?
    .map(
      |t| match !t.is_empty() && t.len() <= 128 && !t.contains(['\0', '\n']) {
        true => Ok(t),
        false => Err(bad("tenantName", expected(&Value::String(t)))),
      },
    )
    .transpose()
}

fn parse_warm_pool(w: WarmPoolOptions) -> Result<u32> {
  let expected =
    |got: &dyn std::fmt::Display| format!("expected a whole number from 0 to 64, got {got}");
  let n = typed(w.size, "warmPool.size", |v| expected(v))?
    .ok_or_else(|| bad("warmPool.size", expected(&"nothing")))?;
  n.as_u64()
    .filter(|size| *size <= 64)
    .map(|size| size as u32)
    .ok_or_else(|| bad("warmPool.size", expected(&n)))
}

fn positive_int(option: &str, v: Option<Given<Number>>, default: u64, max: u64) -> Result<u64> {
  let n = typed(v, option, |v| format!("expected a number, got {v}"))?;
  let Some(n) = n else { return Ok(default) };
  let f = n.as_f64().unwrap_or(f64::NAN);
  if !f.is_finite() || f <= 0.0 || f.fract() != 0.0 {
    return Err(bad(
      option,
      format!("expected a positive whole number, got {n}"),
    ));
  }
  if f > max as f64 {
    return Err(bad(option, format!("{n} is above the maximum {max}")));
  }
  Ok(f as u64)
}

fn boolean(option: &str, v: Option<Given<bool>>, default: bool) -> Result<bool> {
  let b = typed(v, option, |v| format!("expected true or false, got {v}"))?;
  Ok(b.unwrap_or(default))
}

/// Minutes (fractions allowed, 0 = never) as whole seconds, at least one.
pub fn minutes(option: &str, v: Option<Value>, default: f64) -> Result<Option<u64>> {
  minutes_of(option, v.map(Given::from_value), default)
}

fn minutes_of(option: &str, v: Option<Given<Number>>, default: f64) -> Result<Option<u64>> {
  let m = typed(v, option, |v| {
    format!("expected a number of minutes, got {v}")
  })?
  .map_or(default, |n| n.as_f64().unwrap_or(f64::NAN));
  if !m.is_finite() || !(0.0..=5_256_000.0).contains(&m) {
    return Err(bad(
      option,
      format!("{m} is not a number of minutes from 0 (never) to ten years"),
    ));
  }
  if m == 0.0 {
    return Ok(None);
  }
  Ok(Some(((m * 60.0).round() as u64).max(1)))
}

fn parse_resources(v: Option<Value>) -> Result<Resources> {
  let mut r = Resources {
    memory_bytes: Some(DEFAULT_MEMORY_BYTES),
    nano_cpus: None,
    pids_limit: Some(DEFAULT_PIDS_LIMIT),
  };
  let Some(v) = v else { return Ok(r) };
  let Value::Object(m) = v else {
    return Err(bad(
      "resources",
      format!("expected {{ memoryBytes?, nanoCpus?, pidsLimit? }}, got {v}"),
    ));
  };
  for (k, val) in m {
    // null means "no limit" for memory and CPU; pids are always limited.
    let n = |name: &str, min: u64, max: u64| -> Result<Option<u64>> {
      match &val {
        Value::Null if name != "resources.pidsLimit" => Ok(None),
        v => positive_int(name, Some(Given::from_value(v.clone())), 0, max).and_then(|x| {
          if x < min {
            Err(bad(name, format!("{x} is below the minimum {min}")))
          } else {
            Ok(Some(x))
          }
        }),
      }
    };
    match k.as_str() {
      "memoryBytes" => r.memory_bytes = n("resources.memoryBytes", 6 << 20, 1 << 44)?,
      "nanoCpus" => r.nano_cpus = n("resources.nanoCpus", 10_000_000, 1024 * 1_000_000_000)?,
      "pidsLimit" => r.pids_limit = n("resources.pidsLimit", 16, 4_194_304)?,
      other => {
        return Err(bad(
          &format!("resources.{other}"),
          "unknown; known ones are memoryBytes, nanoCpus, pidsLimit",
        ))
      }
    }
  }
  Ok(r)
}

fn is_simple_name(s: &str, max: usize) -> bool {
  !s.is_empty()
    && s.len() <= max
    && s
      .bytes()
      .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    && s.as_bytes()[0].is_ascii_alphanumeric()
}

/// `bridge`, `none` or a user-defined network; never the host's or another container's stack.
pub fn validate_network(n: &str) -> Result<String> {
  if n == "host" || n.starts_with("container:") {
    return Err(bad(
      "network",
      format!("{n:?} would share a network stack with the host or another container"),
    ));
  }
  if !is_simple_name(n, 128) {
    return Err(bad("network", format!("{n:?} is not a network name")));
  }
  Ok(n.to_string())
}

/// Linux's largest user or group id: 4294967295 is `(uid_t)-1`, "no id", which no user can have.
pub const MAX_LINUX_ID: u64 = 4_294_967_294;

/// `uid`, `uid:gid`, `name` or `name:group`; numeric ids within Linux's range.
pub fn validate_user(u: &str) -> Result<String> {
  let part_ok = |p: &str| is_simple_name(p, 32);
  let (user, group) = match u.split_once(':') {
    Some((a, b)) => (a, Some(b)),
    None => (u, None),
  };
  if !part_ok(user) || !group.is_none_or(part_ok) {
    return Err(bad(
      "user",
      format!("{u:?} is not 'uid', 'uid:gid' or a user name"),
    ));
  }
  for (what, id) in [("uid", Some(user)), ("gid", group)] {
    let Some(id) = id.filter(|p| p.bytes().all(|b| b.is_ascii_digit())) else {
      continue;
    };
    if id.parse::<u64>().map_or(true, |n| n > MAX_LINUX_ID) {
      return Err(bad(
        "user",
        format!("{what} {id} is out of range: Linux ids go from 0 to {MAX_LINUX_ID}"),
      ));
    }
  }
  Ok(u.to_string())
}

fn parse_build(b: BuildOptions) -> Result<BuildSpec> {
  let invalid = |v: &Value| format!("invalid value {v}");
  let args = typed(b.args, "build.args", invalid)?
    .map(|m| string_map("build.args", Some(Given::Typed(m))))
    .transpose()?
    .unwrap_or_default();
  let context = typed(b.context, "build.context", invalid)?
    .map(|c| match c.is_empty() {
      true => Err(bad("build.context", invalid(&Value::String(c)))),
      false => Ok(c),
    })
    .transpose()?
    .ok_or_else(|| bad("build.context", "required: the directory to build from"))?;
  let dockerfile = typed(b.dockerfile, "build.dockerfile", invalid)?
    .map(
      |d| match d.is_empty() || d.contains("..") || d.starts_with('/') {
        true => Err(bad("build.dockerfile", invalid(&Value::String(d)))),
        false => Ok(d),
      },
    )
    .transpose()?
    .unwrap_or_else(|| "Dockerfile".to_string());
  Ok(BuildSpec {
    context,
    dockerfile,
    args,
  })
}

fn parse_registry_auth(v: Option<Value>) -> Result<BTreeMap<String, RegistryCredential>> {
  let Some(v) = v else {
    return Ok(BTreeMap::new());
  };
  let Value::Object(m) = v else {
    return Err(bad(
      "registryAuth",
      "expected { 'registry.example:5000': { username, password } | { identityToken } }",
    ));
  };
  let mut out = BTreeMap::new();
  for (registry, cred) in m {
    let name = format!("registryAuth.{registry}");
    let Value::Object(c) = cred else {
      return Err(bad(
        &name,
        "expected { username, password } or { identityToken }",
      ));
    };
    let get = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
    let cred = match (get("username"), get("password"), get("identityToken")) {
      (Some(username), Some(password), None) => RegistryCredential::Basic { username, password },
      (None, None, Some(t)) => RegistryCredential::IdentityToken(t),
      _ => {
        return Err(bad(
          &name,
          "give either username and password, or identityToken",
        ))
      }
    };
    out.insert(registry, cred);
  }
  Ok(out)
}

fn string_map(option: &str, v: StringMap) -> Result<BTreeMap<String, String>> {
  let m = typed(v, option, |v| {
    format!("expected an object of strings, got {v}")
  })?;
  m.unwrap_or_default()
    .into_iter()
    .map(|(k, v)| {
      let s = must(v, option, |v| {
        format!("value of {k:?} must be a string, got {v}")
      })?;
      Ok((k, s))
    })
    .collect()
}

/// An image reference as the engine takes it: no whitespace or control characters, sane length.
pub fn validate_image_ref(s: &str) -> Result<String> {
  let s = s.trim();
  if s.is_empty() {
    return Err(bad("image", "must not be empty"));
  }
  if s.len() > 512 {
    return Err(bad("image", "longer than 512 characters"));
  }
  let ok = s
    .chars()
    .all(|c| c.is_ascii_alphanumeric() || "._-/:@+".contains(c));
  if !ok || s.starts_with(['-', '.', '/', ':', '@']) {
    return Err(bad(
      "image",
      format!("{s:?} is not a valid image reference"),
    ));
  }
  image_ref_rule(s).map_err(|rule| bad("image", format!("{s:?}: {rule}")))?;
  Ok(s.to_string())
}

/// The rules of Docker's reference grammar, `[registry[:port]/]repository[:tag][@digest]`, that
/// the engine would otherwise refuse only at pull or create. `Err` names the rule broken.
fn image_ref_rule(s: &str) -> std::result::Result<(), String> {
  let (name_tag, digest) = match s.split_once('@') {
    Some((n, d)) => (n, Some(d)),
    None => (s, None),
  };
  if let Some(d) = digest {
    let ok = d.split_once(':').is_some_and(|(alg, hex)| {
      !alg.is_empty() && !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if !ok {
      return Err(format!(
        "digest {d:?} must be algorithm:hex, as sha256:<64 hex digits>"
      ));
    }
  }
  let after_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
  let (name, tag) = match name_tag[after_slash..].rfind(':') {
    Some(i) => (
      &name_tag[..after_slash + i],
      Some(&name_tag[after_slash + i + 1..]),
    ),
    None => (name_tag, None),
  };
  if let Some(t) = tag {
    let ok = !t.is_empty()
      && t.len() <= 128
      && !t.starts_with(['.', '-'])
      && t
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !ok {
      return Err(format!(
        "tag {t:?} must be 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'"
      ));
    }
  }
  // As Docker: the first part is a registry when it has a '.' or ':', is localhost, or has
  // upper case; its port, if any, is a number.
  let repository = match name.split_once('/') {
    Some((reg, rest))
      if reg.contains(['.', ':'])
        || reg == "localhost"
        || reg.bytes().any(|b| b.is_ascii_uppercase()) =>
    {
      if let Some((_, port)) = reg.split_once(':') {
        if port.parse::<u16>().map_or(true, |p| p == 0) || !port.bytes().all(|b| b.is_ascii_digit())
        {
          return Err(format!(
            "registry port {port:?} is not a number from 1 to 65535"
          ));
        }
      }
      rest
    }
    _ => name,
  };
  if repository.bytes().any(|b| b.is_ascii_uppercase()) {
    return Err(format!(
      "the repository {repository:?} must be lowercase (tags may have upper case, as in repo:Tag)"
    ));
  }
  let component_ok = |c: &str| {
    !c.is_empty()
      && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
      && c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
      && c
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
  };
  if let Some(c) = repository.split('/').find(|c| !component_ok(c)) {
    return Err(format!(
      "repository part {c:?} must be letters and digits joined by '.', '_' or '-'"
    ));
  }
  Ok(())
}

/// Namespaces scope container names, so they obey name rules: `[a-z0-9-]{1,32}`.
pub fn validate_namespace(s: &str) -> Result<String> {
  let ok = !s.is_empty()
    && s.len() <= 32
    && s
      .bytes()
      .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    && !s.starts_with('-');
  if ok {
    Ok(s.to_string())
  } else {
    Err(bad(
      "namespace",
      format!("{s:?} must match [a-z0-9-]{{1,32}} and not start with '-'"),
    ))
  }
}

/// Environment variable names: what a POSIX shell can export. Rejects `=`, NUL and empties.
pub fn validate_env_name(k: &str) -> std::result::Result<(), String> {
  if k.is_empty() {
    return Err("name is empty".into());
  }
  if k.len() > 1024 {
    return Err("name is longer than 1024 bytes".into());
  }
  let first_ok = k.as_bytes()[0].is_ascii_alphabetic() || k.as_bytes()[0] == b'_';
  if !first_ok || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
    return Err("name must match [A-Za-z_][A-Za-z0-9_]*".into());
  }
  Ok(())
}

#[cfg(test)]
mod tests {
  use super::*;
  use serde_json::json;

  fn err_option(v: Value) -> String {
    match ProviderConfig::from_json(v) {
      Err(SandboxError::InvalidOption { option, .. }) => option,
      other => panic!("expected InvalidOption, got {other:?}"),
    }
  }

  #[test]
  fn defaults() {
    let c = ProviderConfig::from_json(json!({ "image": "busybox:1" })).unwrap();
    assert_eq!(c.namespace, "default");
    assert_eq!(c.exec_timeout_ms, 60_000);
    assert_eq!(c.file_max_bytes, 20 << 20);
    assert_eq!(c.upload_max_bytes, None);
    assert_eq!(c.max_output_bytes, 10 << 20);
    assert_eq!(c.gpus, None);
    assert_eq!(c.docker_host, None);
    assert_eq!(
      c.code_mode_inflight,
      InflightBounds {
        per_sandbox: 64 << 20,
        per_provider: 256 << 20
      }
    );
  }

  #[test]
  fn code_mode_inflight_bounds_are_checked() {
    let c = ProviderConfig::with_image(json!({
      "codeModeSandboxInflightBytes": 1 << 20, "codeModeProviderInflightBytes": 3u64 << 30
    }))
    .unwrap();
    assert_eq!(c.code_mode_inflight.per_sandbox, 1 << 20);
    assert_eq!(c.code_mode_inflight.per_provider, 3 << 30);
    for (option, v) in [
      ("codeModeSandboxInflightBytes", json!(1024)),
      ("codeModeSandboxInflightBytes", json!((1u64 << 30) + 1)),
      ("codeModeSandboxInflightBytes", json!("64MiB")),
      ("codeModeSandboxInflightBytes", json!(1.5)),
      ("codeModeProviderInflightBytes", json!(0)),
      ("codeModeProviderInflightBytes", json!((16u64 << 30) + 1)),
    ] {
      let mut o = json!({ "image": "x" });
      o[option] = v.clone();
      assert_eq!(err_option(o), option, "{option}: {v}");
    }
  }

  #[test]
  fn each_bad_option_is_named() {
    assert_eq!(err_option(json!({})), "image");
    assert_eq!(err_option(json!({ "image": 3 })), "image");
    assert_eq!(err_option(json!({ "image": "a b" })), "image");
    assert_eq!(
      err_option(json!({ "image": "x", "namespace": "Bad" })),
      "namespace"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "namespace": "" })),
      "namespace"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "namespace": "a".repeat(33) })),
      "namespace"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "execTimeoutMs": 0 })),
      "execTimeoutMs"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "execTimeoutMs": -5 })),
      "execTimeoutMs"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "execTimeoutMs": 1.5 })),
      "execTimeoutMs"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "execTimeoutMs": "10" })),
      "execTimeoutMs"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "fileMaxBytes": 1e12 })),
      "fileMaxBytes"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "uploadMaxBytes": -1 })),
      "uploadMaxBytes"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "uploadMaxBytes": 1e16 })),
      "uploadMaxBytes"
    );
    let big = ProviderConfig::from_json(json!({ "image": "x", "uploadMaxBytes": 1e12 })).unwrap();
    assert_eq!(big.upload_max_bytes, Some(1_000_000_000_000));
    assert_eq!(
      ProviderConfig::from_json(json!({ "image": "x", "uploadMaxBytes": null }))
        .unwrap()
        .upload_max_bytes,
      None
    );
    assert_eq!(
      err_option(json!({ "image": "x", "maxOutputBytes": 10 })),
      "maxOutputBytes"
    );
    assert_eq!(err_option(json!({ "image": "x", "gpus": "some" })), "gpus");
    assert_eq!(err_option(json!({ "image": "x", "gpus": 0 })), "gpus");
    assert_eq!(err_option(json!({ "image": "x", "gpus": [] })), "gpus");
    assert_eq!(
      err_option(json!({ "image": "x", "gpus": ["0;rm"] })),
      "gpus"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "env": { "A=B": "1" } })),
      "env"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "env": { "A": 1 } })),
      "env"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "labels": { "trueforge.sandbox.id": "1" } })),
      "labels"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "dockerHost": "npipe:////./pipe/docker_engine" })),
      "dockerHost"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "dockerHost": "unix://rel" })),
      "dockerHost"
    );
    assert_eq!(err_option(json!({ "image": "x", "imgae": "y" })), "imgae");
  }

  #[test]
  fn hardening_and_lifecycle_options() {
    let c = ProviderConfig::from_json(json!({ "image": "x" })).unwrap();
    assert_eq!(c.auto_stop_secs, Some(900));
    assert_eq!(c.auto_delete_secs, Some(7200 * 60));
    assert_eq!(c.capabilities.len(), DEFAULT_CAPABILITIES.len());
    assert!(c.no_new_privileges);
    assert_eq!(c.resources.pids_limit, Some(DEFAULT_PIDS_LIMIT));
    assert_eq!(c.network, None);
    assert!(!c.read_only_rootfs);
    let c = ProviderConfig::from_json(json!({
      "image": "x", "autoStopIntervalInMinutes": 0.05, "autoDeleteIntervalInMinutes": 0,
      "resources": { "memoryBytes": 67108864, "pidsLimit": 64, "nanoCpus": null },
      "network": "none", "user": "1000:1000", "readOnlyRootfs": true, "runtime": "runsc",
      "tenantName": "acme", "capabilities": ["cap_chown"], "warmPool": { "size": 2 },
      "build": { "context": "/ctx", "args": { "V": "1" } },
      "registryAuth": { "localhost:5000": { "username": "u", "password": "p" } }
    }))
    .unwrap();
    assert_eq!(c.auto_stop_secs, Some(3));
    assert_eq!(c.auto_delete_secs, None);
    assert_eq!(
      c.resources,
      Resources {
        memory_bytes: Some(64 << 20),
        nano_cpus: None,
        pids_limit: Some(64)
      }
    );
    assert_eq!(c.capabilities, vec!["CHOWN".to_string()]);
    assert_eq!(c.warm_pool_size, 2);
    assert_eq!(c.build.unwrap().dockerfile, "Dockerfile");
    assert_eq!(
      err_option(json!({ "image": "x", "network": "host" })),
      "network"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "network": "container:abc" })),
      "network"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "capabilities": ["SYS_ADMIN"] })),
      "capabilities"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "capabilities": ["ALL"] })),
      "capabilities"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "resources": { "pidsLimit": null } })),
      "resources.pidsLimit"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "resources": { "swap": 1 } })),
      "resources.swap"
    );
    assert_eq!(err_option(json!({ "image": "x", "user": "a;b" })), "user");
    assert_eq!(
      err_option(json!({ "image": "x", "autoStopIntervalInMinutes": -1 })),
      "autoStopIntervalInMinutes"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "build": {} })),
      "build.context"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "registryAuth": { "r": { "username": "u" } } })),
      "registryAuth.r"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "warmPool": { "size": -1 } })),
      "warmPool.size"
    );
  }

  fn refusal(v: Value) -> (String, String) {
    match ProviderConfig::from_json(v) {
      Err(SandboxError::InvalidOption { option, reason }) => (option, reason),
      other => panic!("expected InvalidOption, got {other:?}"),
    }
  }

  #[test]
  fn try_from_refuses_field_by_field() {
    let ok = || ProviderOptions {
      image: Some(Given::Typed("busybox:1".into())),
      ..ProviderOptions::default()
    };
    let refused = |o: ProviderOptions| match ProviderConfig::try_from(o) {
      Err(SandboxError::InvalidOption { option, reason }) => (option, reason),
      other => panic!("expected InvalidOption, got {other:?}"),
    };
    assert_eq!(ProviderConfig::try_from(ok()).unwrap().image, "busybox:1");
    assert_eq!(
      refused(ProviderOptions::default()),
      (
        "image".into(),
        "required: the image every sandbox runs".into()
      )
    );
    assert_eq!(
      refused(ProviderOptions {
        image: Some(Given::Mistyped(json!(3))),
        ..ProviderOptions::default()
      }),
      (
        "image".into(),
        "expected a string such as 'python:3.12'".into()
      )
    );
    assert_eq!(
      refused(ProviderOptions {
        exec_timeout_ms: Some(Given::Mistyped(json!("10"))),
        ..ok()
      }),
      (
        "execTimeoutMs".into(),
        "expected a number, got \"10\"".into()
      )
    );
    assert_eq!(
      refused(ProviderOptions {
        no_new_privileges: Some(Given::Mistyped(json!(1))),
        ..ok()
      }),
      (
        "noNewPrivileges".into(),
        "expected true or false, got 1".into()
      )
    );
    assert_eq!(
      refused(ProviderOptions {
        runtime: Some(Given::Typed("a b".into())),
        ..ok()
      }),
      (
        "runtime".into(),
        "expected a runtime name such as 'runsc', got \"a b\"".into()
      )
    );
  }

  /// Options of the wrong type, with the option and reason each refusal names.
  fn wrong_type_cases() -> Vec<(Value, &'static str, &'static str)> {
    vec![
      (
        json!({ "execTimeoutMs": 1.5 }),
        "execTimeoutMs",
        "expected a positive whole number, got 1.5",
      ),
      (
        json!({ "fileMaxBytes": 1e12 }),
        "fileMaxBytes",
        "1000000000000.0 is above the maximum 1073741824",
      ),
      (
        json!({ "env": { "A": 1 } }),
        "env",
        "value of \"A\" must be a string, got 1",
      ),
      (
        json!({ "env": ["A"] }),
        "env",
        "expected an object of strings, got [\"A\"]",
      ),
      (
        json!({ "capabilities": [null] }),
        "capabilities",
        "null is not a capability name",
      ),
      (
        json!({ "capabilities": "CHOWN" }),
        "capabilities",
        "expected a list such as ['CHOWN', 'SETUID'], got \"CHOWN\"",
      ),
      (
        json!({ "autoStopIntervalInMinutes": "5" }),
        "autoStopIntervalInMinutes",
        "expected a number of minutes, got \"5\"",
      ),
      (
        json!({ "network": 1 }),
        "network",
        "expected 'bridge', 'none' or a network name, got 1",
      ),
      (
        json!({ "tenantName": "" }),
        "tenantName",
        "expected a non-empty string up to 128 bytes, got \"\"",
      ),
      (
        json!({ "gpuWaitMs": -1 }),
        "gpuWaitMs",
        "expected a whole number of milliseconds from 0 to 3600000, got -1",
      ),
      (
        json!({ "build": "." }),
        "build",
        "expected { context, dockerfile?, args? }, got \".\"",
      ),
      (
        json!({ "build": { "context": "/c", "dockerfile": "../D" } }),
        "build.dockerfile",
        "invalid value \"../D\"",
      ),
      (
        json!({ "build": { "context": "/c", "args": [] } }),
        "build.args",
        "invalid value []",
      ),
      (
        json!({ "build": { "context": "/c", "args": { "V": 1 } } }),
        "build.args",
        "value of \"V\" must be a string, got 1",
      ),
      (
        json!({ "build": { "context": "" } }),
        "build.context",
        "invalid value \"\"",
      ),
      (
        json!({ "warmPool": [2] }),
        "warmPool",
        "expected { size: number }, got [2]",
      ),
      (
        json!({ "warmPool": {} }),
        "warmPool.size",
        "expected a whole number from 0 to 64, got nothing",
      ),
      (
        json!({ "warmPool": { "size": 65 } }),
        "warmPool.size",
        "expected a whole number from 0 to 64, got 65",
      ),
    ]
  }

  #[test]
  fn wrong_types_keep_their_messages() {
    for (extra, option, reason) in wrong_type_cases() {
      let mut v = json!({ "image": "x" });
      for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
      }
      assert_eq!(
        refusal(v),
        (option.to_string(), reason.to_string()),
        "{extra}"
      );
    }
  }

  #[test]
  fn unknown_keys_of_nested_options_are_listed_from_their_structs() {
    assert_eq!(
      refusal(json!({ "image": "x", "build": { "context": "/c", "target": "t" } })),
      (
        "build.target".into(),
        "unknown; known ones are context, dockerfile, args".into()
      )
    );
    assert_eq!(
      refusal(json!({ "image": "x", "warmPool": { "size": 1, "idle": 5 } })).0,
      "warmPool.idle"
    );
    let (option, reason) = refusal(json!({ "image": "x", "imgae": "y" }));
    assert_eq!(option, "imgae");
    assert!(reason.starts_with("unknown option; known ones are image, dockerHost,"));
    let c = ProviderConfig::from_json(json!({
      "image": "x", "build": { "context": "/c", "dockerfile": null, "args": null },
      "warmPool": { "size": 0 }
    }))
    .unwrap();
    assert_eq!(c.build.unwrap().dockerfile, "Dockerfile");
    assert_eq!(c.warm_pool_size, 0);
  }

  #[test]
  fn gpus_forms() {
    let g = |v: Value| {
      ProviderConfig::from_json(json!({ "image": "x", "gpus": v }))
        .unwrap()
        .gpus
    };
    assert_eq!(g(json!("all")), Some(Gpus::All));
    assert_eq!(g(json!(2)), Some(Gpus::Count(2)));
    assert_eq!(
      g(json!(["0", "GPU-abc-1"])),
      Some(Gpus::Devices(vec!["0".into(), "GPU-abc-1".into()]))
    );
    assert_eq!(g(Value::Null), None);
  }

  #[test]
  fn docker_hosts() {
    assert_eq!(
      crate::engine::endpoint::normalize_docker_host("tcp://1.2.3.4:2375", "h").unwrap(),
      "tcp://1.2.3.4:2375"
    );
    assert_eq!(
      crate::engine::endpoint::normalize_docker_host("http://h:1", "h").unwrap(),
      "tcp://h:1"
    );
    assert_eq!(
      crate::engine::endpoint::normalize_docker_host("unix:///run/d.sock", "h").unwrap(),
      "unix:///run/d.sock"
    );
    assert!(crate::engine::endpoint::normalize_docker_host("h:1", "h").is_err());
    assert_eq!(
      crate::engine::endpoint::normalize_docker_host("ssh://me@h:22/", "h").unwrap(),
      "ssh://me@h:22"
    );
    assert!(crate::engine::endpoint::normalize_docker_host("ssh://-oProxyCommand=x", "h").is_err());
  }

  #[test]
  fn images_and_users_that_cannot_work_are_refused_with_the_rule() {
    let reason = |v: Value, option: &str| {
      let (o, r) = refusal(v);
      assert_eq!(o, option);
      r
    };
    let image = |i: &str| reason(json!({ "image": i }), "image");
    assert!(image("UPPER:tag").contains("the repository \"UPPER\" must be lowercase"));
    assert!(image("reg.example:5000/Team/app").contains("\"Team/app\" must be lowercase"));
    assert!(image("app:").contains("tag \"\" must be 1 to 128"));
    assert!(image("app:-x").contains("not starting with '.' or '-'"));
    assert!(image(&format!("app:{}", "t".repeat(129))).contains("1 to 128"));
    assert!(image("app@sha256").contains("must be algorithm:hex"));
    assert!(image("reg:99999/app").contains("registry port \"99999\""));
    assert!(image("a//b").contains("repository part \"\""));
    assert!(image("a/-b").contains("repository part \"-b\""));
    for ok in [
      "busybox",
      "python:3.12",
      "python:3.12-SLIM_x",
      "localhost:5000/team/app:v1",
      "Registry/app",
      "reg.example:5000/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
      "ghcr.io/o/r:v1@sha256:0123456789abcdef",
      "my_app.v2-x/a__b",
    ] {
      assert_eq!(
        ProviderConfig::from_json(json!({ "image": ok })).unwrap().image,
        ok
      );
    }
    let user = |u: &str| reason(json!({ "image": "x", "user": u }), "user");
    assert_eq!(
      user("4294967295"),
      "uid 4294967295 is out of range: Linux ids go from 0 to 4294967294"
    );
    assert!(user("1000:4294967295").starts_with("gid 4294967295 is out of range"));
    assert!(
      user("99999999999999999999999").starts_with("uid 99999999999999999999999 is out of range")
    );
    assert!(user("a:b:c").contains("is not 'uid', 'uid:gid' or a user name"));
    for ok in [
      "4294967294",
      "0:4294967294",
      "1000:1000",
      "app",
      "app:staff",
      "1000:staff",
    ] {
      let c = ProviderConfig::from_json(json!({ "image": "x", "user": ok })).unwrap();
      assert_eq!(c.user.as_deref(), Some(ok));
    }
  }
}
