//! Running a command in a sandbox. A small POSIX-sh wrapper (passed the cwd, the command and a
//! per-call token as positional arguments, never spliced into a script) reports its pid, runs
//! the command with stderr merged into stdout (so output keeps its true order), and reports the
//! exit status under the token. The call returns when that exit marker arrives, even if a
//! background process still holds the output open, and on timeout it kills the command's
//! process group plus every process that inherited the token.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::{Stream, StreamExt};
use rand::Rng;
use tokio::io::AsyncWrite;

use trueforge_agent_proto::output::{format_secs, timed_out_text};

use crate::engine::Engine;
use crate::sandbox::output::{CappedOutput, MarkerReader, ReadEnd, ReadResult, Until};
use crate::util::errors::{Result, SandboxError};

/// Exit code reported for a command killed by its timeout (as coreutils `timeout`).
pub const TIMEOUT_EXIT_CODE: i32 = 124;
/// The variable every process a command starts inherits; the timeout killer looks for it.
pub const EXEC_ID_VAR: &str = "TRUEFORGE_EXEC_ID";

/// Extra time the engine gets beyond a call's own timeout: to start the command, and once the
/// timeout has passed, to kill it. A call returns by its timeout plus this (and `PID_GRACE`).
pub const ENGINE_GRACE: Duration = Duration::from_secs(5);

/// $1 = working directory, $2 = command, $3 = token.
pub(crate) const WRAPPER: &str = r#"exec 2>&1 </dev/null
printf '\036TFX%s:p:%s\036' "$3" "$$"
: > /trueforge/.activity 2>/dev/null
TRUEFORGE_EXEC_ID=$3; export TRUEFORGE_EXEC_ID
PATH="/trueforge/codemode/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"; export PATH
if ! cd "$1" 2>/dev/null; then
  if [ ! -e "$1" ]; then why='no such directory'
  elif [ ! -d "$1" ]; then why='not a directory (it, or a parent, is a file)'
  else why='permission denied (the user may not enter it)'; fi
  printf 'cannot change directory to %s: %s\n' "$1" "$why"
  printf '\036TFX%s:x:1\036' "$3"; exit 1
fi
if command -v bash >/dev/null 2>&1; then bash -c "$2"; else sh -c "$2"; fi
s=$?
printf '\036TFX%s:x:%s\036' "$3" "$s"
exit "$s"
"#;

/// $1 = the wrapper's pid (its process group), $2 = token. Kills the group, then anything that
/// escaped it (setsid, double fork) but still carries the token, a few rounds for fork races.
const KILLER: &str = r#"[ -n "$1" ] && kill -9 -"$1" 2>/dev/null
n=0
while [ "$n" -lt 5 ]; do
  n=$((n+1)); hit=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    if tr '\0' '\n' 2>/dev/null < "$d/environ" | grep -qx "TRUEFORGE_EXEC_ID=$2"; then
      kill -9 "$p" 2>/dev/null && hit=1
    fi
  done
  [ -z "$hit" ] && break
done
left=0
for d in /proc/[0-9]*; do
  [ "${d#/proc/}" = "$$" ] && continue
  tr '\0' '\n' 2>/dev/null < "$d/environ" | grep -qx "TRUEFORGE_EXEC_ID=$2" && left=$((left+1))
done
echo "left=$left"
"#;

/// One command to run.
#[derive(Debug, Clone)]
pub struct ExecRequest {
  pub command: String,
  /// Absolute working directory.
  pub cwd: String,
  pub env: BTreeMap<String, String>,
  pub timeout: Duration,
  pub max_output: usize,
  /// Whom it runs as (`docker exec -u`); `None`: the container's user.
  pub user: Option<String>,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
  pub exit_code: i32,
  pub output: String,
  pub timed_out: bool,
}

/// Why an exec could not start, so the caller can recover (start the container, re-resolve).
#[derive(Debug)]
pub enum StartError {
  NotRunning,
  Gone,
  /// The engine ran the exec but the wrapper never started (no pid marker): the text says why.
  NeverStarted(String),
  Other(SandboxError),
}

/// Whether a failed start looks like the container ran out of processes (a fork bomb).
pub fn is_pid_exhaustion(text: &str) -> bool {
  let t = text.to_ascii_lowercase();
  t.contains("init-p")
    || t.contains("resource temporarily unavailable")
    || t.contains("cannot fork")
}

fn new_token() -> String {
  format!("{:016x}", rand::rng().random::<u64>())
}

/// How long a timed-out call still waits for the wrapper's pid, so the group kill cannot miss a
/// command that a loaded engine starts just after the deadline.
const PID_GRACE: Duration = Duration::from_secs(2);

type OutputStream =
  Pin<Box<dyn Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>>;

/// An exec the engine started, its output read up to the wrapper's pid or the call's deadline.
struct Started {
  exec_id: String,
  output: OutputStream,
  /// Held only so the attach connection stays open while the output is read.
  input: Pin<Box<dyn AsyncWrite + Send>>,
  reader: MarkerReader,
  deadline: Instant,
  /// The deadline passed before the wrapper reported its pid.
  timed_out: bool,
}

/// Runs `req` in `container`. The outer error means the command never started, so the caller
/// may recover (start the container, re-resolve it, restart one out of processes) and try
/// again; the inner one means it started and the call failed after (output lost, a kill not
/// verified), which a retry must not hide.
pub async fn run(
  engine: &Engine,
  container: &str,
  req: &ExecRequest,
) -> std::result::Result<Result<ExecOutput>, StartError> {
  let token = new_token();
  let started = start(engine, container, req, &token).await?;
  Ok(complete(engine, container, req, &token, started).await)
}

/// Creates the exec, starts it attached and reads its output until the wrapper reports its pid.
/// The only source of `StartError`s: past it the command runs, or may.
async fn start(
  engine: &Engine,
  container: &str,
  req: &ExecRequest,
  token: &str,
) -> std::result::Result<Started, StartError> {
  // The token is in the exec's own environment too, so the killer finds even a wrapper whose
  // pid it never learnt (a timeout that fired before the wrapper printed it).
  let mut env: Vec<String> = req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
  env.push(format!("{EXEC_ID_VAR}={token}"));
  let cmd = vec![
    "/bin/sh".to_string(),
    "-c".to_string(),
    WRAPPER.to_string(),
    "trueforge-exec".to_string(),
    req.cwd.clone(),
    req.command.clone(),
    token.to_string(),
  ];
  let opts = CreateExecOptions {
    cmd: Some(cmd),
    env: Some(env),
    attach_stdout: Some(true),
    attach_stderr: Some(true),
    attach_stdin: Some(false),
    tty: Some(false),
    working_dir: Some("/".to_string()),
    user: req.user.clone(),
    ..Default::default()
  };
  // Creating and starting the exec share one engine budget (the caller's timeout plus a grace
  // period, at most the engine timeout), so a slow engine cannot stretch the call step by step.
  let setup_end = Instant::now() + (req.timeout + ENGINE_GRACE).min(engine.control_timeout);
  let left = || setup_end.saturating_duration_since(Instant::now());
  let created = engine
    .create_exec("create an exec", container, opts, left())
    .await
    .map_err(StartError::from_engine)?;
  let started = match engine
    .start_exec("start an exec", &created, Some(64 * 1024), left())
    .await
  {
    Ok(s) => s,
    Err(e) => {
      // No answer is not "not started": a hung engine may run the buffered start when it wakes.
      // Kill whatever carries this call's token once the engine answers again.
      if matches!(
        e,
        SandboxError::EngineTimeout { .. } | SandboxError::EngineUnreachable { .. }
      ) {
        kill_when_answered(engine, container, None, token);
      }
      return Err(StartError::from_engine(e));
    }
  };
  let StartExecResults::Attached { mut output, input } = started else {
    return Err(StartError::Other(SandboxError::Internal(
      "the engine detached an attached exec".into(),
    )));
  };
  let deadline = Instant::now() + req.timeout;
  let mut reader = MarkerReader::new(token, req.max_output);
  let timed_out = match reader.read_until(&mut output, Until::Pid, deadline).await {
    ReadEnd::Marker => false,
    ReadEnd::Deadline => true,
    // Not from this wrapper, which prints its pid first; an exit status still ends the call.
    ReadEnd::Ended if reader.exit().is_some() => false,
    ReadEnd::Ended => {
      return Err(StartError::never_started(
        reader.finish().output.into_text().trim().to_string(),
      ));
    }
    ReadEnd::Failed(e) => {
      let e = engine.map_error("read exec output", e);
      drop(output);
      drop(input);
      let _ = kill_tree(engine, container, None, token, engine.control_timeout).await;
      return Err(StartError::Other(e));
    }
  };
  Ok(Started {
    exec_id: created,
    output,
    input,
    reader,
    deadline,
    timed_out,
  })
}

/// Kills, in the background, the group of `pid` and whatever carries `token` once the engine
/// answers again. On dispose one last kill is tried within ENGINE_GRACE (dispose awaits it); a
/// command that starts even later is left to the sandbox's own limits and idle stop.
fn kill_when_answered(engine: &Engine, container: &str, pid: Option<u32>, token: &str) {
  let (task_engine, container, token) = (engine.clone(), container.to_string(), token.to_string());
  engine.shared.background.spawn(move |stop| async move {
    let engine = task_engine;
    let killing = async {
      for _ in 0..2 {
        let _ = kill_tree(&engine, &container, pid, &token, Duration::from_secs(600)).await;
        tokio::time::sleep(ENGINE_GRACE).await;
      }
    };
    tokio::select! {
      _ = killing => {}
      _ = stop.cancelled() => {
        let _ = kill_tree(&engine, &container, pid, &token, ENGINE_GRACE).await;
      }
    }
  });
}

/// Everything after the start. Its errors are never `StartError`s: the command may have run,
/// and a retry would run it twice.
async fn complete(
  engine: &Engine,
  container: &str,
  req: &ExecRequest,
  token: &str,
  started: Started,
) -> Result<ExecOutput> {
  let Started {
    exec_id,
    mut output,
    input,
    mut reader,
    deadline,
    timed_out,
  } = started;
  let end = if timed_out {
    // A deadline passed during the start stands: later frames cannot make the call succeed.
    ReadEnd::Deadline
  } else {
    reader.read_until(&mut output, Until::Exit, deadline).await
  };
  if matches!(end, ReadEnd::Deadline) && reader.pid().is_none() {
    let _ = reader
      .read_until(&mut output, Until::Pid, Instant::now() + PID_GRACE)
      .await;
  }
  // Dropping the attach connection leaves background processes running, as in a terminal.
  drop(output);
  drop(input);
  let read = reader.finish();
  match end {
    ReadEnd::Deadline => {
      let kill_by = deadline + ENGINE_GRACE;
      kill_after_timeout(engine, container, read.pid, token, req.timeout, kill_by).await?;
      Ok(timed_out_output(read.output, req.timeout))
    }
    ReadEnd::Failed(e) => {
      let e = engine.map_error("read exec output", e);
      let _ = kill_tree(engine, container, read.pid, token, engine.control_timeout).await;
      Err(e)
    }
    ReadEnd::Marker | ReadEnd::Ended => finish(engine, &exec_id, read).await,
  }
}

/// Kills a command whose timeout ran out: its group and every process carrying its token, then
/// a restart of the container if even the killer cannot start. Errs unless a kill is verified;
/// then the kill is tried again in the background once the engine answers.
async fn kill_after_timeout(
  engine: &Engine,
  container: &str,
  pid: Option<u32>,
  token: &str,
  timeout: Duration,
  kill_by: Instant,
) -> Result<()> {
  // All kill attempts share one budget, which ends a few seconds after the timeout (and never
  // after the engine timeout), so a hung engine cannot stretch the call.
  let budget_end = kill_by.min(Instant::now() + engine.control_timeout);
  let left = || budget_end.saturating_duration_since(Instant::now());
  let budget = left();
  for attempt in 0..3 {
    if attempt > 0 {
      tokio::time::sleep(Duration::from_millis(300).min(left())).await;
    }
    if left().is_zero() {
      break;
    }
    if kill_tree(engine, container, pid, token, left()).await {
      return Ok(());
    }
  }
  // Out of processes (a fork bomb), the killer itself cannot start: restarting the container
  // is then the only way to kill everything. Files are kept.
  if !left().is_zero() && engine.restart_container(container, 1, left()).await.is_ok() {
    return Ok(());
  }
  // Never claim a kill that did not happen.
  kill_when_answered(engine, container, pid, token);
  Err(kill_unverified(&engine.host, timeout, budget))
}

/// The kill after a command's timeout found no engine to run it.
fn kill_unverified(host: &str, timeout: Duration, waited: Duration) -> SandboxError {
  SandboxError::EngineTimeout {
    host: host.to_string(),
    operation: format!(
      "a kill of the command after its {t} s timeout (that kill is not verified: the command may still be running, and is killed once the engine answers again)",
      t = format_secs(timeout)
    ),
    seconds: waited.as_secs().max(1),
  }
}

/// The result of a command killed by its timeout: its output so far and a line saying so.
fn timed_out_output(output: CappedOutput, timeout: Duration) -> ExecOutput {
  ExecOutput {
    exit_code: TIMEOUT_EXIT_CODE,
    output: timed_out_text(output, timeout),
    timed_out: true,
  }
}

/// The result of a command that ended: the status its wrapper reported or, when the wrapper
/// itself died (killed with its group, say), the one the engine saw.
async fn finish(engine: &Engine, exec_id: &str, read: ReadResult) -> Result<ExecOutput> {
  let exit_code = match read.exit {
    Some(c) => c,
    None => exit_from_inspect(engine, exec_id).await?,
  };
  Ok(ExecOutput {
    exit_code,
    output: read.output.into_text(),
    timed_out: false,
  })
}

/// Whether the engine's or the runtime's words say the container is not running (any more):
/// an exec racing the container's end (its init killed, a stop, a removal) gets these.
pub fn says_stopped(text: &str) -> bool {
  let t = text.to_ascii_lowercase();
  t.contains("cannot exec in a stopped")
    || t.contains("is not running")
    || t.contains("container state improper")
    || (t.contains("task ") && t.contains("not found"))
    // The runtime could not join the namespaces of an init that is gone.
    || t.contains("error executing setns process")
}

impl StartError {
  /// What an engine error on creating or starting an exec means for the caller.
  pub fn from_engine(e: SandboxError) -> Self {
    match &e {
      SandboxError::Engine { status: 409, .. } => Self::NotRunning,
      // Podman says "container state improper" with a 500; Docker says a container that just
      // exited "is not running" with a 500 too.
      SandboxError::Engine {
        status: 500,
        detail,
        ..
      } if says_stopped(detail) => Self::NotRunning,
      SandboxError::Engine { status: 404, .. } => Self::Gone,
      _ => Self::Other(e),
    }
  }

  /// An exec the engine started whose command never ran, told by what it printed: the
  /// runtime's words when the container stopped under it, else whatever else went wrong.
  pub fn never_started(text: String) -> Self {
    if says_stopped(&text) {
      Self::NotRunning
    } else {
      Self::NeverStarted(text)
    }
  }
}

async fn exit_from_inspect(engine: &Engine, exec_id: &str) -> Result<i32> {
  for _ in 0..50 {
    let info = engine
      .inspect_exec("inspect an exec", exec_id, ENGINE_GRACE)
      .await?;
    if info.running != Some(true) {
      return Ok(info.exit_code.unwrap_or(-1) as i32);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
  }
  Err(SandboxError::Internal(
    "the command's output ended but the engine still reports it running".into(),
  ))
}

/// Kills the command's process group and every process carrying its token. Returns whether the
/// killer ran to the end within the engine timeout and found none left, so a caller never
/// claims a kill that did not happen.
pub async fn kill_tree(
  engine: &Engine,
  container: &str,
  pid: Option<u32>,
  token: &str,
  limit: Duration,
) -> bool {
  let opts = CreateExecOptions {
    cmd: Some(vec![
      "/bin/sh".to_string(),
      "-c".to_string(),
      KILLER.to_string(),
      "trueforge-kill".to_string(),
      pid.map(|p| p.to_string()).unwrap_or_default(),
      token.to_string(),
    ]),
    attach_stdout: Some(true),
    attach_stderr: Some(true),
    working_dir: Some("/".to_string()),
    ..Default::default()
  };
  let run = async {
    let created = engine
      .create_exec("create the killer exec", container, opts, limit)
      .await?;
    let mut text = Vec::new();
    if let StartExecResults::Attached { mut output, .. } = engine
      .start_exec("start the killer exec", &created, None, limit)
      .await?
    {
      while let Some(Ok(item)) = output.next().await {
        text.extend_from_slice(&item.into_bytes());
      }
    }
    Ok::<_, SandboxError>(String::from_utf8_lossy(&text).contains("left=0"))
  };
  matches!(tokio::time::timeout(limit, run).await, Ok(Ok(true)))
}

/// Longest command accepted: Linux's limit for one argument (MAX_ARG_STRLEN).
pub const MAX_COMMAND_BYTES: usize = 128 * 1024;

/// A command must fit in one argument and hold no NUL byte; otherwise it could never start.
pub fn validate_command(command: &str) -> Result<()> {
  if command.contains('\0') {
    return Err(SandboxError::InvalidArgument {
      argument: "command".into(),
      reason: "contains a NUL byte".into(),
    });
  }
  if command.len() >= MAX_COMMAND_BYTES {
    return Err(SandboxError::InvalidArgument {
      argument: "command".into(),
      reason: format!(
        "{} bytes is over the kernel's limit for one argument ({MAX_COMMAND_BYTES}); write the script with uploadFile and run the file",
        command.len()
      ),
    });
  }
  Ok(())
}

/// Validates per-call environment variables: names a shell can export, values without NUL.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<()> {
  for (k, v) in env {
    crate::config::validate_env_name(k).map_err(|r| SandboxError::InvalidArgument {
      argument: format!("env.{k}"),
      reason: r,
    })?;
    if k == EXEC_ID_VAR {
      return Err(SandboxError::InvalidArgument {
        argument: format!("env.{k}"),
        reason: "this name is reserved: the provider uses it to find a command's processes".into(),
      });
    }
    if v.contains('\0') {
      return Err(SandboxError::InvalidArgument {
        argument: format!("env.{k}"),
        reason: "value contains a NUL byte".into(),
      });
    }
  }
  Ok(())
}

/// The absolute working directory for a call: the sandbox root, or `cwd` taken from it.
pub fn working_dir(sandbox_root: &str, cwd: Option<&str>) -> Result<String> {
  match cwd {
    None | Some("") => Ok(sandbox_root.to_string()),
    Some(c) if c.contains('\0') => Err(SandboxError::InvalidArgument {
      argument: "cwd".into(),
      reason: "contains a NUL byte".into(),
    }),
    Some(c) if c.len() > crate::sandbox::layout::MAX_PATH_BYTES => {
      Err(SandboxError::InvalidArgument {
        argument: "cwd".into(),
        reason: format!(
          "longer than {} bytes",
          crate::sandbox::layout::MAX_PATH_BYTES
        ),
      })
    }
    Some(c) if c.starts_with('/') => Ok(c.to_string()),
    Some(c) => Ok(format!("{sandbox_root}/{c}")),
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn code_mode_bin_dir_leads_path() {
    assert!(WRAPPER.contains(&format!(
      "PATH=\"{}:",
      crate::sandbox::layout::CODE_MODE_BIN_DIR
    )));
  }

  #[test]
  fn working_dirs() {
    assert_eq!(working_dir("/w/x", None).unwrap(), "/w/x");
    assert_eq!(working_dir("/w/x", Some("")).unwrap(), "/w/x");
    assert_eq!(
      working_dir("/w/x", Some("sub/dir")).unwrap(),
      "/w/x/sub/dir"
    );
    assert_eq!(working_dir("/w/x", Some("/tmp")).unwrap(), "/tmp");
    assert!(working_dir("/w/x", Some("a\0")).is_err());
  }

  #[test]
  fn env_validation() {
    let mut env = BTreeMap::new();
    env.insert("GOOD_1".to_string(), "it's \"$(x)\"\nline".to_string());
    assert!(validate_env(&env).is_ok());
    env.insert("1BAD".to_string(), "v".to_string());
    assert!(matches!(
      validate_env(&env),
      Err(SandboxError::InvalidArgument { .. })
    ));
  }

  #[test]
  fn an_exec_racing_the_containers_end_is_not_running() {
    let engine = |status: u16, detail: &str| SandboxError::Engine {
      operation: "start an exec".into(),
      status,
      detail: detail.into(),
    };
    // What Docker 20.10 and Podman 4.3 answered an exec just after the init was killed.
    for (status, detail) in [
      (409, "Container abc is not running"),
      (
        500,
        "Container abc is not running: Exited (137) Less than a second ago",
      ),
      (500, "Container abc is not running: Removal In Progress"),
      (500, "container state improper"),
    ] {
      assert!(matches!(
        StartError::from_engine(engine(status, detail)),
        StartError::NotRunning
      ));
    }
    assert!(matches!(
      StartError::from_engine(engine(500, "no space left on device")),
      StartError::Other(_)
    ));
    for text in [
      "cannot exec in a stopped state: unknown",
      "OCI runtime exec failed: exec failed: cannot exec in a stopped container: unknown",
      "OCI runtime exec failed: task 3f2a not found: not found",
      "OCI runtime exec failed: exec failed: unable to start container process: error executing setns process: exit status 1: unknown",
    ] {
      assert!(matches!(
        StartError::never_started(text.into()),
        StartError::NotRunning
      ));
    }
    assert!(matches!(
      StartError::never_started("fork: Resource temporarily unavailable".into()),
      StartError::NeverStarted(_)
    ));
  }

  #[test]
  fn a_kill_the_engine_never_answered_is_not_claimed() {
    let e = kill_unverified(
      "unix:///e.sock",
      Duration::from_secs(3),
      Duration::from_millis(4900),
    );
    let e = e.to_string();
    assert!(
      e.starts_with("Docker engine at unix:///e.sock did not answer a kill"),
      "{e}"
    );
    assert!(e.contains("after its 3 s timeout"), "{e}");
    assert!(
      e.contains("not verified: the command may still be running"),
      "{e}"
    );
    assert!(e.contains("within 4 s"), "{e}");
  }

  #[test]
  fn tokens_are_hex() {
    let t = new_token();
    assert_eq!(t.len(), 16);
    assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
  }

  #[test]
  fn timeouts_print_plainly() {
    assert_eq!(format_secs(Duration::from_secs(5)), "5");
    assert_eq!(format_secs(Duration::from_millis(1500)), "1.5");
  }

  #[test]
  fn a_timed_out_result_says_so_on_its_own_line() {
    let mut kept = CappedOutput::new(100);
    kept.push(b"partial");
    let out = timed_out_output(kept, Duration::from_millis(1500));
    assert_eq!(out.exit_code, TIMEOUT_EXIT_CODE);
    assert!(out.timed_out);
    assert_eq!(
      out.output,
      "partial\n[timed out after 1.5 s: the command and every process it started were killed]"
    );
    let out = timed_out_output(CappedOutput::new(100), Duration::from_secs(2));
    assert!(out.output.starts_with("[timed out after 2 s"));
  }
}
