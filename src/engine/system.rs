//! What the engine says of itself: the API version negotiated, its version and its info.

use bollard::models::{SystemInfo, SystemVersion};

use crate::engine::Engine;
use crate::util::errors::Result;

impl Engine {
  /// The API version negotiated with the engine.
  pub fn api_version(&self) -> String {
    self.docker.client_version().to_string()
  }

  pub async fn version(&self) -> Result<SystemVersion> {
    self
      .control("read the engine version", || self.docker.version())
      .await
  }

  pub async fn info(&self) -> Result<SystemInfo> {
    self
      .control("read the engine info", || self.docker.info())
      .await
  }
}
