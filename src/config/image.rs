//! Which image sandboxes run and how the engine gets it: the `image` reference, checked against
//! Docker's grammar, the `build` option, and `registryAuth`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::check::{bad, typed};
use crate::config::maps::string_map;
use crate::config::options::{BuildOptions, Given};
use crate::util::errors::Result;

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

/// The `build` option, checked.
pub(crate) fn build_option(v: Option<Given<BuildOptions>>) -> Result<Option<BuildSpec>> {
  typed(v, "build", |v| {
    format!("expected {{ context, dockerfile?, args? }}, got {v}")
  })?
  .map(parse_build)
  .transpose()
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

pub(crate) fn parse_registry_auth(
  v: Option<Value>,
) -> Result<BTreeMap<String, RegistryCredential>> {
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

#[cfg(test)]
mod tests {
  use serde_json::json;

  use crate::config::tests::refusal;
  use crate::config::ProviderConfig;

  #[test]
  fn images_that_cannot_work_are_refused_with_the_rule() {
    let image = |i: &str| {
      let (o, r) = refusal(json!({ "image": i }));
      assert_eq!(o, "image");
      r
    };
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
  }
}
