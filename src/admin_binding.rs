//! The napi functions behind the `ls`, `rm` and `doctor` commands. Conversion only: the work is
//! in `admin`, `endpoint` and `client`.

use std::time::Duration;

use napi_derive::napi;
use serde_json::{json, Value};

use crate::binding::to_js;
use crate::client::{self, Engine};
use crate::config;
use crate::errors::SandboxError;
use crate::logging::Logger;

/// Which engine and which sandboxes a command is about.
#[napi(object)]
pub struct NativeAdminOptions {
  /// Default: as a provider without `dockerHost` (DOCKER_HOST, DOCKER_CONTEXT, the current context).
  pub docker_host: Option<String>,
  /// Default `'default'`; ignored with `allNamespaces`.
  pub namespace: Option<String>,
  pub all_namespaces: Option<bool>,
  /// Deadline of one engine request, ms. Default 30000.
  pub timeout_ms: Option<u32>,
}

async fn engine(o: &NativeAdminOptions) -> Result<Engine, SandboxError> {
  let endpoint = client::effective_endpoint(o.docker_host.as_deref(), None)?;
  let limit = Duration::from_millis(o.timeout_ms.unwrap_or(30_000).max(100) as u64);
  let mut e = client::engine_for(&endpoint, limit).await?;
  e.control_timeout = limit;
  Ok(e)
}

fn namespace(o: &NativeAdminOptions) -> Result<Option<String>, SandboxError> {
  if o.all_namespaces.unwrap_or(false) {
    return Ok(None);
  }
  config::validate_namespace(o.namespace.as_deref().unwrap_or(config::DEFAULT_NAMESPACE)).map(Some)
}

/// This package's sandboxes (`admin::SandboxInfo` objects).
#[napi]
pub async fn list_sandboxes(options: NativeAdminOptions) -> napi::Result<Value> {
  let ns = namespace(&options).map_err(to_js)?;
  let e = engine(&options).await.map_err(to_js)?;
  let list = crate::admin::list(&e, ns.as_deref()).await.map_err(to_js)?;
  Ok(json!(list))
}

/// Removes the sandboxes with these ids; `[{ sandboxId, outcome: 'removed' | 'not-found' }]`.
#[napi]
pub async fn remove_sandboxes(
  options: NativeAdminOptions,
  ids: Vec<String>,
) -> napi::Result<Value> {
  let ns = namespace(&options).map_err(to_js)?;
  let e = engine(&options).await.map_err(to_js)?;
  let out = crate::admin::remove(&e, ns.as_deref(), &ids)
    .await
    .map_err(to_js)?;
  Ok(json!(out))
}

/// Removes the sandboxes stopped for at least `olderThanMinutes` (default 0); their ids.
#[napi]
pub async fn remove_stopped_sandboxes(
  options: NativeAdminOptions,
  older_than_minutes: Option<f64>,
) -> napi::Result<Vec<String>> {
  let ns = namespace(&options).map_err(to_js)?;
  let secs = config::minutes("olderThanMinutes", older_than_minutes.map(Value::from), 0.0)
    .map_err(to_js)?
    .unwrap_or(0);
  let e = engine(&options).await.map_err(to_js)?;
  let namespaces = match ns {
    Some(n) => vec![n],
    None => {
      let mut all: Vec<String> = crate::admin::list(&e, None)
        .await
        .map_err(to_js)?
        .into_iter()
        .map(|s| s.namespace)
        .collect();
      all.sort();
      all.dedup();
      all
    }
  };
  let mut removed = Vec::new();
  for n in namespaces {
    removed.extend(
      crate::reaper::reap(&e, &n, Duration::from_secs(secs), false, &Logger::default())
        .await
        .map_err(to_js)?,
    );
  }
  Ok(removed)
}

/// How the engine would be reached, without reaching it (DOCKER_HOST, contexts, TLS material).
#[napi]
pub fn describe_endpoint(docker_host: Option<String>) -> napi::Result<Value> {
  let endpoint = client::effective_endpoint(docker_host.as_deref(), None).map_err(to_js)?;
  Ok(json!({
    "host": endpoint.host,
    "source": endpoint.source,
    "tls": endpoint.tls.is_some(),
    "verify": endpoint.tls.as_ref().map(|t| t.verify),
    "clientCert": endpoint.tls.as_ref().map(|t| t.cert.is_some()),
    "describe": endpoint.describe(),
  }))
}

/// How the engine is reached and what it says about itself (`/version` and `/info`), for
/// `doctor`: `{ endpoint: { host, source, tls, verify, clientCert, describe }, version, info }`.
#[napi]
pub async fn engine_report(options: NativeAdminOptions) -> napi::Result<Value> {
  let ep = describe_endpoint(options.docker_host.clone())?;
  let e = engine(&options).await.map_err(to_js)?;
  let version = e.version().await.map_err(to_js)?;
  let info = e.info().await.map_err(to_js)?;
  Ok(json!({
    "endpoint": ep,
    "apiVersion": e.api_version(),
    "version": version,
    "info": info,
  }))
}
