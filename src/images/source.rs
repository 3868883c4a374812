//! Where an image comes from: the configured reference, or a tag derived from a build context;
//! and the registry credentials a pull of it uses.

use bollard::auth::DockerCredentials;

use crate::config::{BuildSpec, ProviderConfig, RegistryCredential};
use crate::images::context;
use crate::util::errors::{Result, SandboxError};

/// Where a provider's image comes from.
#[derive(Debug, Clone)]
pub struct ImageSource {
  /// The reference sandboxes are created from (for a build: the content-derived tag).
  pub reference: String,
  pub build: Option<BuildSpec>,
  pub credentials: Option<DockerCredentials>,
  /// The provider's namespace: the image's probe container is made in it.
  pub namespace: String,
}

/// Splits a reference into what the pull endpoint wants; a missing tag means `latest` (an
/// empty tag would pull every tag of the repository).
pub fn split_reference(image: &str) -> (String, String) {
  if let Some((repo, digest)) = image.split_once('@') {
    return (repo.to_string(), digest.to_string());
  }
  let slash = image.rfind('/').map(|i| i + 1).unwrap_or(0);
  match image[slash..].rfind(':') {
    Some(i) => (
      image[..slash + i].to_string(),
      image[slash + i + 1..].to_string(),
    ),
    None => (image.to_string(), "latest".to_string()),
  }
}

/// The registry host of a reference, as `docker login` names it.
pub fn registry_of(image: &str) -> String {
  match image.split_once('/') {
    Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first.to_string(),
    _ => "docker.io".to_string(),
  }
}

fn credentials_for(cfg: &ProviderConfig, image: &str) -> Option<DockerCredentials> {
  let registry = registry_of(image);
  let norm = |k: &str| {
    k.trim_start_matches("https://")
      .trim_start_matches("http://")
      .trim_end_matches('/')
      .to_string()
  };
  let cred = cfg.registry_auth.iter().find(|(k, _)| {
    let k = norm(k);
    k == registry
      || (registry == "docker.io" && (k == "index.docker.io" || k.starts_with("index.docker.io/")))
  })?;
  Some(match cred.1 {
    RegistryCredential::Basic { username, password } => DockerCredentials {
      username: Some(username.clone()),
      password: Some(password.clone()),
      serveraddress: Some(registry),
      ..Default::default()
    },
    RegistryCredential::IdentityToken(t) => DockerCredentials {
      identitytoken: Some(t.clone()),
      serveraddress: Some(registry),
      ..Default::default()
    },
  })
}

/// Works out where the image comes from. For a build this hashes the context (blocking I/O off
/// the runtime), so the tag always reflects the files as they are now.
pub async fn source(cfg: &ProviderConfig) -> Result<ImageSource> {
  match &cfg.build {
    None => Ok(ImageSource {
      reference: cfg.image.clone(),
      build: None,
      credentials: credentials_for(cfg, &cfg.image),
      namespace: cfg.namespace.clone(),
    }),
    Some(spec) => {
      let spec2 = spec.clone();
      let prepared = tokio::task::spawn_blocking(move || context::prepare(&spec2, false))
        .await
        .map_err(|e| {
          SandboxError::Internal(format!("hashing the build context panicked: {e}"))
        })??;
      Ok(ImageSource {
        reference: prepared.tag,
        build: Some(spec.clone()),
        credentials: None,
        namespace: cfg.namespace.clone(),
      })
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn references() {
    assert_eq!(
      split_reference("busybox"),
      ("busybox".into(), "latest".into())
    );
    assert_eq!(
      split_reference("busybox:1.36"),
      ("busybox".into(), "1.36".into())
    );
    assert_eq!(
      split_reference("localhost:5000/a/b"),
      ("localhost:5000/a/b".into(), "latest".into())
    );
    assert_eq!(
      split_reference("localhost:5000/a/b:t"),
      ("localhost:5000/a/b".into(), "t".into())
    );
    assert_eq!(
      split_reference("a@sha256:abc"),
      ("a".into(), "sha256:abc".into())
    );
    assert_eq!(registry_of("localhost:5000/a/b:t"), "localhost:5000");
    assert_eq!(registry_of("ghcr.io/x/y"), "ghcr.io");
    assert_eq!(registry_of("python:3.12"), "docker.io");
    assert_eq!(registry_of("library/python"), "docker.io");
  }

  #[test]
  fn credentials_are_matched_by_registry() {
    let cfg = ProviderConfig::from_json(serde_json::json!({
      "image": "localhost:5000/team/img:1",
      "registryAuth": { "localhost:5000": { "username": "u", "password": "p" }, "ghcr.io": { "identityToken": "t" } }
    }))
    .unwrap();
    let c = credentials_for(&cfg, "localhost:5000/team/img:1").unwrap();
    assert_eq!(c.username.as_deref(), Some("u"));
    assert_eq!(c.serveraddress.as_deref(), Some("localhost:5000"));
    assert_eq!(
      credentials_for(&cfg, "ghcr.io/a/b")
        .unwrap()
        .identitytoken
        .as_deref(),
      Some("t")
    );
    assert!(credentials_for(&cfg, "python:3").is_none());
  }
}
