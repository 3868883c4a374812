//! The options that are maps of strings: `env` and `labels` (and `build.args`, read the same
//! way).

use std::collections::BTreeMap;

use crate::config::check::{bad, must, typed};
use crate::config::options::Given;
use crate::util::errors::Result;
use crate::util::labels::LABEL_PREFIX;

type StringMap = Option<Given<BTreeMap<String, Given<String>>>>;

pub(crate) fn parse_env(v: StringMap) -> Result<BTreeMap<String, String>> {
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

pub(crate) fn parse_labels(v: StringMap) -> Result<BTreeMap<String, String>> {
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

pub(crate) fn string_map(option: &str, v: StringMap) -> Result<BTreeMap<String, String>> {
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
