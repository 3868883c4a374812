//! Named volumes: the typed operations the in-sandbox agent's volume needs, and the removal of a
//! moved sandbox's volumes.

use std::collections::HashMap;

use bollard::models::{Volume, VolumeCreateRequest};
use bollard::query_parameters::RemoveVolumeOptions;

use crate::engine::request::absent_on;
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

impl Engine {
  /// A volume's inspect data; `None` when there is no such volume.
  pub async fn inspect_volume(&self, name: &str) -> Result<Option<Volume>> {
    let r = self
      .control("inspect a volume", || self.docker.inspect_volume(name))
      .await;
    absent_on(r, &[404])
  }

  /// Creates a named volume carrying `labels`; when one of that name is there, that volume (its
  /// labels are then its own). Docker answers a create of an existing name with it, Podman with
  /// 409, which is read as the same. A repeat is harmless, so it is retried like a read.
  pub async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<Volume> {
    let body = VolumeCreateRequest {
      name: Some(name.to_string()),
      labels: Some(labels),
      ..Default::default()
    };
    let made = self
      .control("create a volume", || {
        self.docker.create_volume(body.clone())
      })
      .await;
    match absent_on(made, &[409])? {
      Some(v) => Ok(v),
      None => self
        .inspect_volume(name)
        .await?
        .ok_or_else(|| SandboxError::Engine {
          operation: "create a volume".into(),
          status: 409,
          detail: format!("the engine says {name} exists, and then that it does not"),
        }),
    }
  }

  /// Removes a volume nothing mounts (never forced); `false` when it is gone or in use.
  pub async fn remove_unused_volume(&self, volume: &str) -> Result<bool> {
    let opts = RemoveVolumeOptions { force: false };
    let r = self
      .control("remove a sandbox volume", || {
        self.docker.remove_volume(volume, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404, 409]).map(|r| r.is_some())
  }
}
