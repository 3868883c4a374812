//! What the provider asks of a sandbox's agent: commands and files as the sandbox's user, the
//! layout of a new sandbox, and the agent's own state. The agent's errors become our
//! `SandboxError`s here, each saying what went wrong and what to do.

use std::time::Duration;

use bytes::Bytes;
use trueforge_agent_proto::client::{ClientError, ExecRequest as AgentExec, Staging};
use trueforge_agent_proto::msg::{
  AgentError, DownloadSpec, ErrorKind, LayoutDir, LayoutLink, LayoutSpec, StagedUploadSpec,
  StatSpec, UploadSpec,
};

use crate::engine::Engine;
use crate::sandbox::agent::conn::Conn;
use crate::sandbox::container::Target;
use crate::sandbox::exec::{ExecOutput, ExecRequest};
use crate::sandbox::layout;
use crate::util::errors::{Result, SandboxError};

/// How many times a download is read while the file keeps changing under it.
const READ_TRIES: u32 = 4;

/// Whom the agent runs a request as: the sandbox's user (an agent started as that user is that
/// user already, and then does not switch).
fn user_of(_conn: &Conn, target: &Target) -> Option<String> {
  target.user.clone()
}

/// Runs a command through the agent. The exit code is the command's own (`waitpid`), a timeout
/// is reported only when every process it started is verified gone, and a sandbox that was
/// out of processes (the agent killed the workload first) says so in the output.
pub async fn exec(conn: &Conn, target: &Target, req: &ExecRequest) -> Result<ExecOutput> {
  let r = AgentExec {
    command: req.command.clone(),
    cwd: req.cwd.clone(),
    env: req
      .env
      .iter()
      .map(|(k, v)| (k.clone(), v.clone()))
      .collect(),
    user: user_of(conn, target),
    timeout: Some(req.timeout),
    max_output: req.max_output,
  };
  let out = conn
    .client
    .exec(&r)
    .await
    .map_err(|e| exec_error(e, req.timeout))?;
  let mut output = out.output;
  if let Some(what) = out.recovered {
    if !output.is_empty() && !output.ends_with('\n') {
      output.push('\n');
    }
    // The agent's own sentence: what it killed, and that files were kept.
    output.push_str(&format!("[{what}]"));
  }
  Ok(ExecOutput {
    exit_code: out.exit_code,
    output,
    timed_out: out.timed_out,
  })
}

fn exec_error(e: ClientError, timeout: Duration) -> SandboxError {
  let secs = timeout.as_secs_f64();
  match e {
    ClientError::Agent(AgentError { kind, message, .. }) => match kind {
      ErrorKind::KillUnverified => SandboxError::Internal(format!(
        "the command ran past its {secs} s timeout and was killed, but not every process it started could be verified gone ({message}); some may still be running"
      )),
      // The agent's sentences say what holds the processes, or whether the command started
      // and that it may or may not have run, and what to do.
      ErrorKind::OutOfProcesses | ErrorKind::SupervisorLost => SandboxError::Internal(message),
      _ => SandboxError::Internal(format!("the command could not be started: {message}")),
    },
    ClientError::RequestTooLarge { bytes, max } => SandboxError::InvalidArgument {
      argument: "command".into(),
      reason: format!(
        "the command with its environment is {bytes} bytes, over the {max} one request may carry; write the script with uploadFile and run the file"
      ),
    },
    other => lost(other),
  }
}

/// The agent's stream ended (or broke) under a call.
fn lost(e: ClientError) -> SandboxError {
  SandboxError::AgentLost {
    detail: e.to_string(),
  }
}

/// Whether a failed file call may simply be made again on a new agent (it never changes
/// anything twice: a download reads, an upload replaces by rename).
pub fn is_lost(e: &SandboxError) -> bool {
  matches!(e, SandboxError::AgentLost { .. })
}

/// Writes of at least this many bytes go through the engine's archive endpoint into a directory
/// the agent stages (see `upload_staged`): the engine writes a file about twice as fast as an
/// exec stream carries one, but each archive request costs tens of milliseconds, which smaller
/// files do not win back.
pub const STAGED_MIN: usize = 32 << 20;

/// Writes a file as the sandbox's user (temporary file, then put in place; missing parents made
/// as that user). `staged`: the engine through which large files may be staged (`stagedUploads`).
pub async fn upload(
  staged: Option<&Engine>,
  conn: &Conn,
  target: &Target,
  shown: &str,
  path: &str,
  content: Bytes,
  max: Option<u64>,
) -> Result<()> {
  let within = max.is_none_or(|m| content.len() as u64 <= m);
  if let Some(engine) = staged.filter(|_| content.len() >= STAGED_MIN && within) {
    if upload_staged(engine, conn, target, shown, path, content.clone()).await? {
      return Ok(());
    }
  }
  let spec = UploadSpec {
    path: path.to_string(),
    user: user_of(conn, target),
    mode: 0o644,
    max_bytes: max,
    parents: true,
  };
  conn
    .client
    .upload_bytes(spec, content)
    .await
    .map(|_| ())
    .map_err(|e| file_error(e, shown))
}

/// A large write whose bytes the engine's archive endpoint puts into the agent's staging
/// directory (only root may enter it; the name is random), then placed by the agent as the
/// user. `false`: not written; the agent declined (a read-only root, a target on another file
/// system, the engine's write not visible in the container …) or the engine refused the
/// archive, so the caller sends the bytes on the stream.
async fn upload_staged(
  engine: &Engine,
  conn: &Conn,
  target: &Target,
  shown: &str,
  path: &str,
  content: Bytes,
) -> Result<bool> {
  let spec = StagedUploadSpec {
    path: path.to_string(),
    user: user_of(conn, target),
    mode: 0o644,
    parents: true,
    size: content.len() as u64,
    staging: None,
  };
  let staged = match conn.client.upload_staged(spec).await {
    Ok(Staging::Ready(s)) => s,
    Ok(Staging::Declined(_)) => return Ok(false),
    Err(ClientError::Agent(e)) if e.kind == ErrorKind::InvalidRequest => return Ok(false),
    Err(e) => return Err(file_error(e, shown)),
  };
  let put = crate::sandbox::transfer::put_staged(
    engine,
    &target.container_id,
    &staged.head.dir,
    &staged.head.name,
    content,
  )
  .await;
  match put {
    Ok(()) => {}
    // Dropping `staged` cancels it: the agent removes whatever arrived. A write's directory
    // the engine cannot find (404: a root workload swapped the staging directory for a link,
    // which the engine followed) is declined too: this write goes on the stream.
    Err(SandboxError::Engine { .. } | SandboxError::FileNotFound { .. }) => return Ok(false),
    Err(e) => return Err(e),
  }
  staged
    .commit()
    .await
    .map(|done| done.is_some())
    .map_err(|e| file_error(e, shown))
}

/// Reads a regular file as the sandbox's user, again when it changed while it was read.
pub async fn download(
  conn: &Conn,
  target: &Target,
  shown: &str,
  path: &str,
  max: u64,
) -> Result<Vec<u8>> {
  let mut tries = 0;
  loop {
    tries += 1;
    let spec = DownloadSpec {
      path: path.to_string(),
      user: user_of(conn, target),
      max_bytes: max,
    };
    match read_capped(conn, spec, max).await {
      Ok(bytes) => return Ok(bytes),
      Err(ClientError::Agent(e)) if e.kind == ErrorKind::Changed => {
        if tries >= READ_TRIES {
          return Err(SandboxError::FileChanged {
            path: shown.to_string(),
            tries,
          });
        }
        tokio::time::sleep(Duration::from_millis(10 << tries)).await;
      }
      Err(e) => return Err(file_error(e, shown)),
    }
  }
}

/// A download held in memory, never more than `max` bytes whatever the agent announces.
async fn read_capped(conn: &Conn, spec: DownloadSpec, max: u64) -> Result<Vec<u8>, ClientError> {
  let mut d = conn.client.download(spec).await?;
  if d.head.size > max {
    let mut e = AgentError::new(ErrorKind::TooLarge, "over the download cap");
    (e.size, e.max) = (Some(d.head.size), Some(max));
    return Err(ClientError::Agent(e));
  }
  let mut out = Vec::with_capacity(d.head.size as usize);
  while let Some(chunk) = d.chunk().await? {
    out.extend_from_slice(&chunk);
  }
  Ok(out)
}

/// An agent's file error as ours.
fn file_error(e: ClientError, shown: &str) -> SandboxError {
  let ClientError::Agent(e) = e else {
    return lost(e);
  };
  let path = shown.to_string();
  let invalid = |reason: &str| SandboxError::InvalidPath {
    path: path.clone(),
    reason: reason.to_string(),
  };
  match e.kind {
    ErrorKind::NotFound => SandboxError::FileNotFound { path },
    ErrorKind::IsDirectory => SandboxError::PathIsDirectory { path },
    ErrorKind::NotRegularFile => SandboxError::NotRegularFile {
      kind: e
        .file_kind
        .map_or("irregular file", |k| k.describe())
        .to_string(),
      path,
    },
    ErrorKind::TooLarge => SandboxError::FileTooLarge {
      path,
      size: e.size.unwrap_or(0),
      max: e.max.unwrap_or(0),
    },
    ErrorKind::Changed => SandboxError::FileChanged { path, tries: 1 },
    ErrorKind::PermissionDenied => invalid(&format!(
      "permission denied to the sandbox's user, as whom files are read and written ({})",
      e.message
    )),
    ErrorKind::ReadOnly => invalid("it is on a read-only file system"),
    ErrorKind::Busy => invalid(crate::sandbox::transfer::MOUNTED_BY_ENGINE),
    ErrorKind::NotADirectory => invalid("a parent of this path is a file, not a directory"),
    ErrorKind::InvalidPath => invalid(&e.message),
    ErrorKind::NoSpace => SandboxError::Internal(format!(
      "no space left in the sandbox for {shown}: {}",
      e.message
    )),
    _ => SandboxError::Internal(format!("{shown}: {}", e.message)),
  }
}

/// The directories every sandbox gets (made as root, then given to the sandbox's user), with
/// the Code Mode directories and the `mcp-client` link to the agent binary.
pub fn new_layout(dirs: &[String], conn: &Conn, target: &Target) -> LayoutSpec {
  let mut all: Vec<LayoutDir> = dirs
    .iter()
    .map(|d| LayoutDir {
      path: d.clone(),
      mode: 0o755,
      user_owned: true,
    })
    .collect();
  let cm = code_mode_layout(conn, target);
  all.extend(cm.dirs);
  LayoutSpec {
    dirs: all,
    user: cm.user,
    links: cm.links,
    activity_file: true,
  }
}

/// `/trueforge/codemode` and its `bin`, the sandbox user's, with `bin/mcp-client` the agent
/// (run under that name it is the static Code Mode CLI). Made again by every new agent, so
/// sandboxes made by an earlier version get it too.
pub fn code_mode_layout(conn: &Conn, target: &Target) -> LayoutSpec {
  let dir = |path: &str| LayoutDir {
    path: path.to_string(),
    mode: 0o755,
    user_owned: true,
  };
  LayoutSpec {
    dirs: vec![dir(layout::CODE_MODE_DIR), dir(layout::CODE_MODE_BIN_DIR)],
    user: user_of(conn, target),
    links: vec![LayoutLink {
      path: format!("{}/mcp-client", layout::CODE_MODE_BIN_DIR),
      target: conn.path.clone(),
    }],
    activity_file: target.agent.agent_init,
  }
}

/// Makes `spec`; a failure is the caller's to report.
pub async fn lay_out(conn: &Conn, spec: LayoutSpec) -> Result<()> {
  conn.client.layout(spec).await.map_err(|e| match e {
    ClientError::Agent(e) => SandboxError::CreateFailed {
      step: "create the sandbox layout".into(),
      detail: e.message,
    },
    other => lost(other),
  })
}

/// The uid and gid owning `path` (`None` when root owns it or it is missing).
pub async fn owner_of(conn: &Conn, path: &str) -> Result<Option<(u32, u32)>> {
  let st = conn
    .client
    .stat(StatSpec {
      path: path.to_string(),
      user: None,
      follow: false,
    })
    .await
    .map_err(lost)?;
  Ok(st.and_then(|s| (s.uid != 0 || s.gid != 0).then_some((s.uid, s.gid))))
}
