//! Execs: create, start with the streams attached, inspect.

use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ExecInspectResponse;

use crate::engine::Engine;
use crate::util::errors::Result;

impl Engine {
  /// Creates an exec within `limit`; returns its id.
  pub async fn create_exec(
    &self,
    operation: &str,
    container: &str,
    opts: CreateExecOptions<String>,
    limit: Duration,
  ) -> Result<String> {
    self
      .control_within(limit, operation, || {
        self.docker.create_exec(container, opts.clone())
      })
      .await
      .map(|c| c.id)
  }

  /// Starts an exec with its streams attached (`capacity`: the output buffer), within `limit`.
  pub async fn start_exec(
    &self,
    operation: &str,
    exec_id: &str,
    capacity: Option<usize>,
    limit: Duration,
  ) -> Result<StartExecResults> {
    let opts = StartExecOptions {
      detach: false,
      tty: false,
      output_capacity: capacity,
    };
    self
      .within(
        limit,
        operation,
        self.docker.start_exec(exec_id, Some(opts)),
      )
      .await
  }

  pub async fn inspect_exec(
    &self,
    operation: &str,
    exec_id: &str,
    limit: Duration,
  ) -> Result<ExecInspectResponse> {
    self
      .control_within(limit, operation, || self.docker.inspect_exec(exec_id))
      .await
  }
}

/// Options of an exec started with stdin, stdout and stderr attached and no TTY (a stream the
/// caller speaks a protocol on), in `/`, as `user` (the container's own when `None`).
pub fn attached_exec(cmd: Vec<String>, user: Option<String>) -> CreateExecOptions<String> {
  CreateExecOptions {
    cmd: Some(cmd),
    user,
    attach_stdin: Some(true),
    attach_stdout: Some(true),
    attach_stderr: Some(true),
    tty: Some(false),
    working_dir: Some("/".to_string()),
    ..Default::default()
  }
}
