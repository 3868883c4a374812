//! Provider options: parsed from the JavaScript object, validated, defaults applied. Pure logic,
//! no I/O, so every rule here is unit-tested.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::errors::{Result, SandboxError};

/// Default for `execTimeoutMs`.
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 60_000;
/// Default for `fileMaxBytes`.
pub const DEFAULT_FILE_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// Default for `maxOutputBytes`.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 10 * 1024 * 1024;
/// Default for `namespace`.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Largest exec timeout accepted (a week): beyond that a typo is likelier than intent.
const MAX_EXEC_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;
/// Caps above 1 GiB would let one call hold that much in the host process.
const MAX_BYTES_CAP: u64 = 1024 * 1024 * 1024;

/// Which GPUs a sandbox gets, as `docker run --gpus` takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
  All,
  Count(u32),
  Devices(Vec<String>),
}

/// Validated provider configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
  pub image: String,
  /// The engine address, normalised (`unix:///…`, `tcp://…`); `None` means the default.
  pub docker_host: Option<String>,
  pub namespace: String,
  pub exec_timeout_ms: u64,
  pub file_max_bytes: u64,
  pub max_output_bytes: u64,
  pub gpus: Option<Gpus>,
  pub env: BTreeMap<String, String>,
  pub labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawOptions {
  image: Option<Value>,
  docker_host: Option<Value>,
  namespace: Option<Value>,
  exec_timeout_ms: Option<Value>,
  file_max_bytes: Option<Value>,
  max_output_bytes: Option<Value>,
  gpus: Option<Value>,
  env: Option<Value>,
  labels: Option<Value>,
}

fn bad(option: &str, reason: impl Into<String>) -> SandboxError {
  SandboxError::InvalidOption {
    option: option.to_string(),
    reason: reason.into(),
  }
}

/// Label keys we set ourselves; a user label may not shadow them.
pub const LABEL_PREFIX: &str = "trueforge.sandbox.";

impl ProviderConfig {
  /// Parses the options object given to the constructor. `undefined` fields arrive as absent,
  /// `null` as `Value::Null`; both mean "use the default".
  pub fn from_json(value: Value) -> Result<Self> {
    if !value.is_object() {
      return Err(bad(
        "options",
        "expected an object such as { image: 'python:3.12' }",
      ));
    }
    let raw: RawOptions = serde_json::from_value(value).map_err(|e| {
      let msg = e.to_string();
      match msg.split('`').nth(1) {
        Some(field) if msg.starts_with("unknown field") => bad(
          field,
          "unknown option; known ones are image, dockerHost, namespace, execTimeoutMs, \
           fileMaxBytes, maxOutputBytes, gpus, env, labels, errors, logger",
        ),
        _ => bad("options", msg),
      }
    })?;
    let some = |v: Option<Value>| v.filter(|v| !v.is_null());

    let image = match some(raw.image) {
      Some(Value::String(s)) => validate_image_ref(&s)?,
      Some(_) => return Err(bad("image", "expected a string such as 'python:3.12'")),
      None => return Err(bad("image", "required: the image every sandbox runs")),
    };
    let docker_host = match some(raw.docker_host) {
      Some(Value::String(s)) => Some(normalize_docker_host(&s, "dockerHost")?),
      Some(_) => {
        return Err(bad(
          "dockerHost",
          "expected a string such as unix:///var/run/docker.sock",
        ))
      }
      None => None,
    };
    let namespace = match some(raw.namespace) {
      Some(Value::String(s)) => validate_namespace(&s)?,
      Some(_) => {
        return Err(bad(
          "namespace",
          "expected a string of [a-z0-9-], 1 to 32 long",
        ))
      }
      None => DEFAULT_NAMESPACE.to_string(),
    };
    let exec_timeout_ms = positive_int(
      "execTimeoutMs",
      some(raw.exec_timeout_ms),
      DEFAULT_EXEC_TIMEOUT_MS,
      MAX_EXEC_TIMEOUT_MS,
    )?;
    let file_max_bytes = positive_int(
      "fileMaxBytes",
      some(raw.file_max_bytes),
      DEFAULT_FILE_MAX_BYTES,
      MAX_BYTES_CAP,
    )?;
    let max_output_bytes = positive_int(
      "maxOutputBytes",
      some(raw.max_output_bytes),
      DEFAULT_MAX_OUTPUT_BYTES,
      MAX_BYTES_CAP,
    )?;
    if max_output_bytes < 1024 {
      return Err(bad(
        "maxOutputBytes",
        "must be at least 1024 so that head and tail both fit",
      ));
    }
    let gpus = some(raw.gpus).map(parse_gpus).transpose()?;
    let env = string_map("env", some(raw.env))?;
    for (k, v) in &env {
      validate_env_name(k).map_err(|r| bad("env", format!("variable {k:?}: {r}")))?;
      if v.contains('\0') {
        return Err(bad(
          "env",
          format!("variable {k:?}: value contains a NUL byte"),
        ));
      }
    }
    let labels = string_map("labels", some(raw.labels))?;
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
    Ok(Self {
      image,
      docker_host,
      namespace,
      exec_timeout_ms,
      file_max_bytes,
      max_output_bytes,
      gpus,
      env,
      labels,
    })
  }
}

fn positive_int(option: &str, v: Option<Value>, default: u64, max: u64) -> Result<u64> {
  let Some(v) = v else { return Ok(default) };
  let n = v
    .as_f64()
    .ok_or_else(|| bad(option, format!("expected a number, got {v}")))?;
  if !n.is_finite() || n <= 0.0 || n.fract() != 0.0 {
    return Err(bad(
      option,
      format!("expected a positive whole number, got {v}"),
    ));
  }
  if n > max as f64 {
    return Err(bad(option, format!("{v} is above the maximum {max}")));
  }
  Ok(n as u64)
}

fn string_map(option: &str, v: Option<Value>) -> Result<BTreeMap<String, String>> {
  match v {
    None => Ok(BTreeMap::new()),
    Some(Value::Object(m)) => m
      .into_iter()
      .map(|(k, v)| match v {
        Value::String(s) => Ok((k, s)),
        other => Err(bad(
          option,
          format!("value of {k:?} must be a string, got {other}"),
        )),
      })
      .collect(),
    Some(other) => Err(bad(
      option,
      format!("expected an object of strings, got {other}"),
    )),
  }
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
  Ok(s.to_string())
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

/// Accepts `unix:///path`, `tcp://host:port` and `http://host:port`; returns the normalised form.
pub fn normalize_docker_host(s: &str, option: &str) -> Result<String> {
  let s = s.trim();
  if let Some(path) = s.strip_prefix("unix://") {
    if !path.starts_with('/') {
      return Err(bad(
        option,
        format!("{s:?}: a unix socket needs an absolute path, as unix:///var/run/docker.sock"),
      ));
    }
    return Ok(s.to_string());
  }
  let rest = s
    .strip_prefix("tcp://")
    .or_else(|| s.strip_prefix("http://"));
  match rest {
    Some(hp) if !hp.is_empty() && !hp.contains(['/', '?', '#', ' ']) => Ok(format!("tcp://{hp}")),
    _ => Err(bad(
      option,
      format!("{s:?} is not supported; use unix:///path/to/docker.sock or tcp://host:port (TLS is not supported yet)"),
    )),
  }
}

fn parse_gpus(v: Value) -> Result<Gpus> {
  match v {
    Value::String(s) if s == "all" => Ok(Gpus::All),
    Value::Number(n) => match n.as_u64() {
      Some(c) if (1..=64).contains(&c) => Ok(Gpus::Count(c as u32)),
      _ => Err(bad(
        "gpus",
        format!("a count must be a whole number from 1 to 64, got {n}"),
      )),
    },
    Value::Array(items) => {
      if items.is_empty() {
        return Err(bad(
          "gpus",
          "the device list is empty; omit `gpus` for no GPU",
        ));
      }
      items
        .into_iter()
        .map(|i| match i {
          Value::String(s)
            if !s.is_empty()
              && s.len() <= 128
              && s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c)) =>
          {
            Ok(s)
          }
          other => Err(bad(
            "gpus",
            format!("device {other} is not an index or a GPU UUID"),
          )),
        })
        .collect::<Result<Vec<_>>>()
        .map(Gpus::Devices)
    }
    other => Err(bad(
      "gpus",
      format!("expected 'all', a count or a list of device ids, got {other}"),
    )),
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
    assert_eq!(c.file_max_bytes, 10 << 20);
    assert_eq!(c.max_output_bytes, 10 << 20);
    assert_eq!(c.gpus, None);
    assert_eq!(c.docker_host, None);
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
      err_option(json!({ "image": "x", "dockerHost": "ssh://h" })),
      "dockerHost"
    );
    assert_eq!(
      err_option(json!({ "image": "x", "dockerHost": "unix://rel" })),
      "dockerHost"
    );
    assert_eq!(err_option(json!({ "image": "x", "imgae": "y" })), "imgae");
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
      normalize_docker_host("tcp://1.2.3.4:2375", "h").unwrap(),
      "tcp://1.2.3.4:2375"
    );
    assert_eq!(
      normalize_docker_host("http://h:1", "h").unwrap(),
      "tcp://h:1"
    );
    assert_eq!(
      normalize_docker_host("unix:///run/d.sock", "h").unwrap(),
      "unix:///run/d.sock"
    );
    assert!(normalize_docker_host("h:1", "h").is_err());
  }
}
