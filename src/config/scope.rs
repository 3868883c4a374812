//! Whose sandboxes these are: the `namespace` that scopes container names, and the
//! `tenantName`.

use serde_json::Value;

use crate::config::check::{bad, typed};
use crate::config::options::Given;
use crate::util::errors::Result;

/// Default for `namespace`.
pub const DEFAULT_NAMESPACE: &str = "default";

pub(crate) fn parse_tenant(v: Option<Given<String>>) -> Result<Option<String>> {
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
