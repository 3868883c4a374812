//! Running commands: `exec` streams a command's output back, keeping its head and tail.

use std::time::Duration;

use super::conn::AgentClient;
use super::error::{outcome, ClientError};
use super::stream::Inbound;
use crate::msg::{ExecDone, ExecSpec, Request, TIMEOUT_EXIT_CODE};
use crate::output::{timed_out_text, CappedOutput};

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
  pub command: String,
  /// Absolute working directory.
  pub cwd: String,
  /// Added to the container's environment, in order (later wins).
  pub env: Vec<(String, String)>,
  /// `docker exec -u` syntax; `None` runs as root.
  pub user: Option<String>,
  /// `None`: no timeout.
  pub timeout: Option<Duration>,
  /// Output bytes kept (head and tail).
  pub max_output: usize,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
  pub exit_code: i32,
  /// Merged stdout and stderr, capped (see `CappedOutput`), with the timeout line if any.
  pub output: String,
  /// Killed by its timeout, every process verified gone (`exit_code` is 124).
  pub timed_out: bool,
  /// Output bytes left out of `output`.
  pub omitted: u64,
  /// The sandbox was out of processes and the agent killed the workload first: what it did.
  pub recovered: Option<String>,
}

impl AgentClient {
  /// Runs a command; its output is kept under `req.max_output` (head and tail).
  pub async fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ClientError> {
    self.exec_with(req, |_| {}).await
  }

  /// `exec`, also handing each output chunk to `on_output` as it arrives.
  pub async fn exec_with<F>(
    &self,
    req: &ExecRequest,
    mut on_output: F,
  ) -> Result<ExecOutput, ClientError>
  where
    F: FnMut(&[u8]) + Send,
  {
    let spec = ExecSpec {
      command: req.command.clone(),
      cwd: req.cwd.clone(),
      env: req.env.clone(),
      user: req.user.clone(),
      timeout_ms: req
        .timeout
        .map(|t| (t.as_millis() as u64).max(1))
        .unwrap_or(0),
    };
    let mut s = self.open(&Request::Exec(spec))?;
    let mut kept = CappedOutput::new(req.max_output);
    let done: ExecDone = loop {
      match s.next().await? {
        Inbound::Data(b) => {
          on_output(&b);
          kept.push(&b);
          s.consumed(b.len());
        }
        Inbound::Result(body) => break outcome(&body)?,
        Inbound::Head(_) | Inbound::End => {}
      }
    };
    let omitted = kept.omitted();
    let output = if done.timed_out {
      timed_out_text(kept, req.timeout.unwrap_or_default())
    } else {
      kept.into_text()
    };
    Ok(ExecOutput {
      exit_code: if done.timed_out {
        TIMEOUT_EXIT_CODE
      } else {
        done.exit_code
      },
      output,
      timed_out: done.timed_out,
      omitted,
      recovered: done.recovered,
    })
  }
}
