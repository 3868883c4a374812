//! Networks: inspect, find by name, create, remove.

use std::collections::HashMap;

use bollard::models::{Network, NetworkCreateRequest, NetworkInspect};
use bollard::query_parameters::ListNetworksOptions;

use crate::engine::request::absent_on;
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

impl Engine {
  /// A network's inspect data; `None` when there is no such network.
  pub async fn inspect_network(&self, name: &str) -> Result<Option<NetworkInspect>> {
    let r = self
      .control("inspect the sandboxes' network", || {
        self.docker.inspect_network(name, None)
      })
      .await;
    absent_on(r, &[404])
  }

  /// The networks named exactly `name` (Docker allows several of one name).
  pub async fn networks_named(&self, name: &str) -> Result<Vec<Network>> {
    let opts = ListNetworksOptions {
      filters: Some(HashMap::from([(
        "name".to_string(),
        vec![name.to_string()],
      )])),
    };
    let all = self
      .control("list the sandboxes' networks", || {
        self.docker.list_networks(Some(opts.clone()))
      })
      .await?;
    Ok(
      all
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .collect(),
    )
  }

  /// Creates a network; its id, or `None` when one of that name exists (another process made it
  /// first). Not retried: a repeat could find our own first one.
  pub async fn create_network(&self, body: NetworkCreateRequest) -> Result<Option<String>> {
    let r = self
      .within(
        self.control_timeout,
        "create the sandboxes' network",
        self.docker.create_network(body),
      )
      .await
      .map(|n| n.id);
    // Podman says so with a 500 rather than Docker's 409.
    let r = match r {
      Err(SandboxError::Engine {
        status: 500,
        detail,
        ..
      }) if detail.to_ascii_lowercase().contains("already exists") => {
        return Ok(None);
      }
      other => other,
    };
    absent_on(r, &[409])
  }

  /// Removes a network; `false` when it was gone or still has containers.
  pub async fn remove_network(&self, name: &str) -> Result<bool> {
    let r = self
      .control("remove the sandboxes' network", || {
        self.docker.remove_network(name)
      })
      .await;
    absent_on(r, &[403, 404, 409]).map(|r| r.is_some())
  }
}
