//! Containers: inspect, create, start, restart, rename, remove, list, logs and the wait for an
//! exit.

use std::collections::HashMap;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, ContainerInspectResponse, ContainerSummary};
use bollard::query_parameters::{
  CreateContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions,
  RenameContainerOptions, RestartContainerOptions,
};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::engine::request::{absent_on, status_of};
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

impl Engine {
  /// A container's inspect data; `None` when there is no such container.
  pub async fn inspect_container(
    &self,
    operation: &str,
    container: &str,
  ) -> Result<Option<ContainerInspectResponse>> {
    let r = self
      .control(operation, || self.docker.inspect_container(container, None))
      .await;
    match absent_on(r, &[404]) {
      // Podman answers for a container it is removing with a 500 "no such container".
      Err(SandboxError::Engine {
        status: 500,
        ref detail,
        ..
      }) if detail.contains("no such container") => Ok(None),
      other => other,
    }
  }

  /// Creates a container (named when `name` is given); returns its id.
  pub async fn create_container(
    &self,
    operation: &str,
    name: Option<&str>,
    body: ContainerCreateBody,
  ) -> Result<String> {
    let opts = name.map(|n| CreateContainerOptions {
      name: Some(n.to_string()),
      ..Default::default()
    });
    self
      .within(
        self.control_timeout,
        operation,
        self.docker.create_container(opts, body),
      )
      .await
      .map(|c| c.id)
  }

  /// Creates a container under `name`; `None` when that name is taken.
  pub async fn create_named(
    &self,
    operation: &str,
    name: &str,
    body: ContainerCreateBody,
  ) -> Result<Option<String>> {
    match self.create_container(operation, Some(name), body).await {
      // Podman 4 says so with a 500 ("that name is already in use") rather than Docker's 409.
      Err(SandboxError::Engine {
        status: 500,
        detail,
        ..
      }) if detail
        .to_ascii_lowercase()
        .contains("name is already in use") =>
      {
        Ok(None)
      }
      r => absent_on(r, &[409]),
    }
  }

  /// Starts a container; `false` when there is no such container. Another 404 (a network the
  /// container names is gone) is an error.
  pub async fn start_container(&self, operation: &str, container: &str) -> Result<bool> {
    let r = self
      .control(operation, || self.docker.start_container(container, None))
      .await;
    match r {
      Err(SandboxError::Engine {
        status: 404,
        ref detail,
        ..
      }) if !detail.to_ascii_lowercase().contains("no such container") => r.map(|_| true),
      r => absent_on(r, &[404]).map(|r| r.is_some()),
    }
  }

  pub async fn unpause_container(&self, operation: &str, container: &str) -> Result<()> {
    self
      .control(operation, || self.docker.unpause_container(container))
      .await
  }

  /// Restarts a container with `grace_secs` before the kill, within `limit`.
  pub async fn restart_container(
    &self,
    container: &str,
    grace_secs: i32,
    limit: Duration,
  ) -> Result<()> {
    let opts = RestartContainerOptions {
      t: Some(grace_secs),
      ..Default::default()
    };
    self
      .within(
        limit,
        "restart the sandbox",
        self.docker.restart_container(container, Some(opts)),
      )
      .await
  }

  pub async fn rename_container(&self, operation: &str, container: &str, name: &str) -> Result<()> {
    let opts = RenameContainerOptions {
      name: name.to_string(),
    };
    self
      .within(
        self.control_timeout,
        operation,
        self.docker.rename_container(container, opts),
      )
      .await
  }

  /// Removes a container (and its anonymous volumes) whatever its state. `false` when it was
  /// already gone or another removal of it is under way.
  pub async fn force_remove(&self, container: &str) -> Result<bool> {
    let opts = RemoveContainerOptions {
      force: true,
      v: true,
      ..Default::default()
    };
    match self
      .control("remove the sandbox container", || {
        self.docker.remove_container(container, Some(opts.clone()))
      })
      .await
    {
      Ok(()) => Ok(true),
      Err(e) if status_of(&e) == Some(404) => Ok(false),
      Err(e) if status_of(&e) == Some(409) && e.to_string().contains("already in progress") => {
        Ok(false)
      }
      Err(e) => Err(e),
    }
  }

  /// Removes a container whatever its state but keeps its volumes: another container of the
  /// same sandbox mounts them now. `false` when it was already gone.
  pub async fn remove_keeping_volumes(&self, operation: &str, container: &str) -> Result<bool> {
    let opts = RemoveContainerOptions {
      force: true,
      v: false,
      ..Default::default()
    };
    let r = self
      .control(operation, || {
        self.docker.remove_container(container, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404]).map(|r| r.is_some())
  }

  /// Removes a stopped container (and its anonymous volumes). `false` when it is gone, or
  /// running again: the engine refuses to remove a running container unforced.
  pub async fn remove_stopped(&self, operation: &str, container: &str) -> Result<bool> {
    self.remove_unforced(operation, container, true).await
  }

  /// As `remove_stopped`, but keeping its volumes: another container mounts them now.
  pub async fn remove_stopped_keeping_volumes(
    &self,
    operation: &str,
    container: &str,
  ) -> Result<bool> {
    self.remove_unforced(operation, container, false).await
  }

  async fn remove_unforced(&self, operation: &str, container: &str, volumes: bool) -> Result<bool> {
    let opts = RemoveContainerOptions {
      force: false,
      v: volumes,
      ..Default::default()
    };
    let r = self
      .control(operation, || {
        self.docker.remove_container(container, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404, 409]).map(|r| r.is_some())
  }

  /// Containers (stopped ones too with `all`) matching the engine's list `filters`.
  pub async fn list_containers(
    &self,
    operation: &str,
    all: bool,
    size: bool,
    filters: HashMap<String, Vec<String>>,
  ) -> Result<Vec<ContainerSummary>> {
    let opts = ListContainersOptions {
      all,
      size,
      filters: Some(filters),
      ..Default::default()
    };
    self
      .control(operation, || {
        self.docker.list_containers(Some(opts.clone()))
      })
      .await
  }

  /// Containers carrying every label in `labels` (`key=value` or just `key`), in any state.
  pub async fn list_labelled(
    &self,
    operation: &str,
    labels: Vec<String>,
  ) -> Result<Vec<ContainerSummary>> {
    let filters = HashMap::from([("label".to_string(), labels)]);
    self.list_containers(operation, true, false, filters).await
  }

  /// A container's output so far (or, with `follow`, until it exits), as raw bytes.
  pub fn logs(&self, container: &str, follow: bool) -> impl Stream<Item = Result<Bytes>> + '_ {
    let opts = LogsOptions {
      follow,
      stdout: true,
      stderr: true,
      tail: "all".into(),
      ..Default::default()
    };
    self.docker.logs(container, Some(opts)).map(|r| {
      r.map(LogOutput::into_bytes)
        .map_err(|e| self.map_error("read container logs", e))
    })
  }

  /// Waits up to `limit` for a container to exit; whether it did.
  pub async fn wait_exit(&self, container: &str, limit: Duration) -> bool {
    let mut wait = self.docker.wait_container(container, None);
    matches!(tokio::time::timeout(limit, wait.next()).await, Ok(Some(_)))
  }
}
