//! The napi functions behind the `ls`, `rm` and `doctor` commands. Conversion only: the work is
//! in `fleet::admin` and `engine`.

use std::time::Duration;

use napi_derive::napi;
use serde_json::{json, Value};

use napi::bindgen_prelude::PromiseRaw;
use napi::Env;

use crate::config;
use crate::engine::{self, Engine};
use crate::napi::js::{promise, to_js};
use crate::util::errors::SandboxError;

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
  let endpoint = engine::effective_endpoint(o.docker_host.as_deref(), None)?;
  let limit = Duration::from_millis(o.timeout_ms.unwrap_or(30_000).max(100) as u64);
  let mut e = engine::engine_for(&endpoint, limit).await?;
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
pub fn list_sandboxes(
  env: &Env,
  options: NativeAdminOptions,
) -> napi::Result<PromiseRaw<'_, Value>> {
  promise(env, async move {
    let ns = namespace(&options)?;
    let e = engine(&options).await?;
    Ok(json!(crate::fleet::admin::list(&e, ns.as_deref()).await?))
  })
}

/// Removes the sandboxes with these ids; `[{ sandboxId, outcome: 'removed' | 'not-found' }]`.
#[napi]
pub fn remove_sandboxes(
  env: &Env,
  options: NativeAdminOptions,
  ids: Vec<String>,
) -> napi::Result<PromiseRaw<'_, Value>> {
  promise(env, async move {
    let ns = namespace(&options)?;
    let e = engine(&options).await?;
    Ok(json!(
      crate::fleet::admin::remove(&e, ns.as_deref(), &ids).await?
    ))
  })
}

/// Removes the sandboxes stopped for at least `olderThanMinutes` (default 0); their ids.
#[napi]
pub fn remove_stopped_sandboxes(
  env: &Env,
  options: NativeAdminOptions,
  older_than_minutes: Option<f64>,
) -> napi::Result<PromiseRaw<'_, Vec<String>>> {
  promise(env, async move {
    let ns = namespace(&options)?;
    let secs =
      config::minutes("olderThanMinutes", older_than_minutes.map(Value::from), 0.0)?.unwrap_or(0);
    let e = engine(&options).await?;
    crate::fleet::admin::remove_stopped(&e, ns.as_deref(), Duration::from_secs(secs)).await
  })
}

/// The image-work leases on the engine (`admin::LeaseInfo` objects); engine-wide, whatever the
/// namespace options say.
#[napi]
pub fn list_image_work_leases(
  env: &Env,
  options: NativeAdminOptions,
) -> napi::Result<PromiseRaw<'_, Value>> {
  promise(env, async move {
    let e = engine(&options).await?;
    Ok(json!(crate::fleet::admin::leases(&e).await?))
  })
}

/// Removes image-work leases: those named (`trueforge-imagework-<hash>`), or, with `names`
/// absent, every one whose work failed or whose holder died, last written at least
/// `olderThanMinutes` ago (default 0). A lease whose holder is at work is never removed.
/// `[{ kind, container, image, outcome: 'removed' | 'not-found' | 'in-use' }]`.
#[napi]
pub fn remove_image_work_leases(
  env: &Env,
  options: NativeAdminOptions,
  names: Option<Vec<String>>,
  older_than_minutes: Option<f64>,
) -> napi::Result<PromiseRaw<'_, Value>> {
  promise(env, async move {
    let secs =
      config::minutes("olderThanMinutes", older_than_minutes.map(Value::from), 0.0)?.unwrap_or(0);
    let e = engine(&options).await?;
    Ok(match names {
      Some(names) => json!(crate::fleet::admin::remove_leases(&e, &names).await?),
      None => json!(crate::fleet::admin::remove_stale_leases(&e, Duration::from_secs(secs)).await?),
    })
  })
}

/// How the engine would be reached, without reaching it (DOCKER_HOST, contexts, TLS material).
#[napi]
pub fn describe_endpoint(env: &Env, docker_host: Option<String>) -> napi::Result<Value> {
  endpoint_json(docker_host.as_deref()).map_err(|e| to_js(env, e))
}

fn endpoint_json(docker_host: Option<&str>) -> Result<Value, SandboxError> {
  let endpoint = engine::effective_endpoint(docker_host, None)?;
  Ok(json!({
    "host": endpoint.host,
    "source": endpoint.source,
    "tls": endpoint.tls.is_some(),
    "verify": endpoint.tls.as_ref().map(|t| t.verify),
    "clientCert": endpoint.tls.as_ref().map(|t| t.cert.is_some()),
    "describe": endpoint.describe(),
  }))
}

/// How the engine is reached and what it says about itself (`/version` and `/info`), and the
/// image-work leases on it, for `doctor`: `{ endpoint: { host, source, tls, verify, clientCert,
/// describe }, apiVersion, version, info, imageWork, imageWorkError }` (`imageWork` is `null`
/// and `imageWorkError` says why when they could not be listed).
#[napi]
pub fn engine_report(
  env: &Env,
  options: NativeAdminOptions,
) -> napi::Result<PromiseRaw<'_, Value>> {
  promise(env, async move {
    let ep = endpoint_json(options.docker_host.as_deref())?;
    let e = engine(&options).await?;
    let version = e.version().await?;
    let info = e.info().await?;
    let leases = crate::fleet::admin::leases(&e).await;
    Ok(json!({
      "endpoint": ep,
      "apiVersion": e.api_version(),
      "version": version,
      "info": info,
      "imageWork": leases.as_ref().ok(),
      "imageWorkError": leases.as_ref().err().map(|e| e.to_string()),
    }))
  })
}
