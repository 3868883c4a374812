//! Named volumes: the typed operations the in-sandbox agent's volume needs (the removal of a
//! moved sandbox's volumes is `Engine::remove_unused_volume`).

use std::collections::HashMap;

use bollard::models::{Volume, VolumeCreateRequest};

use crate::engine::{absent_on, Engine};
use crate::util::errors::Result;

impl Engine {
  /// A volume's inspect data; `None` when there is no such volume.
  pub async fn inspect_volume(&self, name: &str) -> Result<Option<Volume>> {
    let r = self
      .control("inspect a volume", || self.docker.inspect_volume(name))
      .await;
    absent_on(r, &[404])
  }

  /// Creates a named volume carrying `labels`. The engine answers with the existing volume
  /// when one of that name is there (its labels are then that volume's), so a repeat is
  /// harmless and it is retried like a read.
  pub async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<Volume> {
    let body = VolumeCreateRequest {
      name: Some(name.to_string()),
      labels: Some(labels),
      ..Default::default()
    };
    self
      .control("create a volume", || {
        self.docker.create_volume(body.clone())
      })
      .await
  }
}
