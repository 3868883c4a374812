//! `ssh://[user@]host[:port]` engines, as the Docker CLI reaches them: the system `ssh` (so the
//! user's ssh config, agent and known hosts apply) running `docker system dial-stdio` on the
//! remote host, one ssh process per pooled HTTP connection. `BatchMode=yes`: ssh never prompts,
//! so an untrusted host key or a missing key is an error at once, never a hang. Like git's
//! `GIT_SSH_COMMAND`, `TRUEFORGE_SSH_COMMAND` replaces `ssh` (e.g. `ssh -F /path/config`).
//!
//! What ssh printed on stderr when it failed becomes an `EngineSsh` error with the fix.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::{BollardRequest, ClientVersion, Docker};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::util::errors::{Result, SandboxError};

/// `user`, `host`, `port` of an `ssh://` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
  pub user: Option<String>,
  pub host: String,
  pub port: Option<u16>,
}

pub fn parse(addr: &str) -> Option<Target> {
  let rest = addr.strip_prefix("ssh://")?.trim_end_matches('/');
  if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
    return None;
  }
  let (user, hp) = match rest.rsplit_once('@') {
    Some((u, hp)) if !u.is_empty() => (Some(u.to_string()), hp),
    Some(_) => return None,
    None => (None, rest),
  };
  let (host, port) = match hp.rsplit_once(':') {
    Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p.parse().ok()?)),
    _ => (hp.to_string(), None),
  };
  if host.is_empty() || host.starts_with('-') || user.as_deref().is_some_and(|u| u.starts_with('-'))
  {
    return None;
  }
  Some(Target { user, host, port })
}

/// The ssh command line, without the remote command.
fn ssh_argv(t: &Target) -> Vec<String> {
  let mut argv: Vec<String> = match std::env::var("TRUEFORGE_SSH_COMMAND") {
    Ok(c) if !c.trim().is_empty() => c.split_whitespace().map(String::from).collect(),
    _ => vec!["ssh".into()],
  };
  argv.extend(["-o".into(), "BatchMode=yes".into()]);
  argv.extend(["-o".into(), "ConnectTimeout=10".into()]);
  if let Some(u) = &t.user {
    argv.extend(["-l".into(), u.clone()]);
  }
  if let Some(p) = t.port {
    argv.extend(["-p".into(), p.to_string()]);
  }
  argv.push("--".into());
  argv.push(t.host.clone());
  argv
}

/// One ssh process's stdio as a byte stream; the process dies with it.
pub struct SshStream {
  _child: Child,
  out: ChildStdout,
  inp: ChildStdin,
}

impl AsyncRead for SshStream {
  fn poll_read(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
  ) -> Poll<std::io::Result<()>> {
    Pin::new(&mut self.out).poll_read(cx, buf)
  }
}

impl AsyncWrite for SshStream {
  fn poll_write(
    mut self: Pin<&mut Self>,
    cx: &mut Context<'_>,
    buf: &[u8],
  ) -> Poll<std::io::Result<usize>> {
    Pin::new(&mut self.inp).poll_write(cx, buf)
  }
  fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Pin::new(&mut self.inp).poll_flush(cx)
  }
  fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Pin::new(&mut self.inp).poll_shutdown(cx)
  }
}

impl Connection for SshStream {
  fn connected(&self) -> Connected {
    Connected::new()
  }
}

/// What the last failed ssh said on stderr.
type Said = Arc<Mutex<Option<String>>>;

#[derive(Clone)]
struct Connector {
  target: Target,
  said: Said,
}

impl tower_service::Service<hyper::Uri> for Connector {
  type Response = TokioIo<SshStream>;
  type Error = std::io::Error;
  type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

  fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    Poll::Ready(Ok(()))
  }

  fn call(&mut self, _: hyper::Uri) -> Self::Future {
    let argv = ssh_argv(&self.target);
    let said = self.said.clone();
    Box::pin(async move {
      let mut cmd = Command::new(&argv[0]);
      cmd
        .args(&argv[1..])
        .args(["docker", "system", "dial-stdio"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
      let mut child = cmd
        .spawn()
        .map_err(|e| std::io::Error::other(SshFailure(format!("cannot run {}: {e}", argv[0]))))?;
      let (Some(out), Some(inp), Some(mut err)) =
        (child.stdout.take(), child.stdin.take(), child.stderr.take())
      else {
        return Err(std::io::Error::other("ssh without stdio"));
      };
      // Not one of the engine's background tasks: it ends with this connection's ssh process.
      tokio::spawn(async move {
        let mut text = String::new();
        let _ = (&mut err).take(16 << 10).read_to_string(&mut text).await;
        let text = text.trim().to_string();
        if !text.is_empty() {
          *said.lock().expect("said") = Some(text);
        }
      });
      Ok(TokioIo::new(SshStream {
        _child: child,
        out,
        inp,
      }))
    })
  }
}

/// An error carrying what ssh said, found again by `classify`.
#[derive(Debug)]
pub struct SshFailure(pub String);

impl std::fmt::Display for SshFailure {
  fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    f.write_str(&self.0)
  }
}

impl std::error::Error for SshFailure {}

/// A bollard client for `ssh://…`.
pub fn connect(host: &str, timeout: u64, version: &ClientVersion) -> Result<Docker> {
  let target = parse(host).ok_or_else(|| SandboxError::InvalidOption {
    option: "dockerHost".into(),
    reason: format!("{host:?} is not ssh://[user@]host[:port]"),
  })?;
  let said: Said = Default::default();
  let connector = Connector {
    target,
    said: said.clone(),
  };
  let client = crate::engine::connector::http_client(connector, true);
  Docker::connect_with_custom_transport(
    move |req: BollardRequest| {
      let client = client.clone();
      let said = said.clone();
      async move {
        match client.request(req).await {
          Ok(r) => Ok(r),
          Err(e) => {
            // ssh exits with its reason on stderr; give the reader a moment to collect it.
            for _ in 0..50 {
              if let Some(text) = said.lock().expect("said").take() {
                return Err(BollardError::IOError {
                  err: std::io::Error::other(SshFailure(text)),
                });
              }
              tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(BollardError::from(e))
          }
        }
      }
    },
    Some("http://docker.ssh"),
    timeout,
    version,
  )
  .map_err(|e| SandboxError::Internal(format!("SSH client: {e}")))
}

/// An `EngineSsh` error when `e` carries what ssh said.
pub fn classify(host: &str, e: &BollardError) -> Option<SandboxError> {
  let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
  let mut text = match e {
    BollardError::IOError { err } => err
      .get_ref()
      .and_then(|i| i.downcast_ref::<SshFailure>())
      .map(|f| f.0.clone()),
    _ => None,
  };
  while let (None, Some(err)) = (&text, cur) {
    if let Some(io) = err.downcast_ref::<std::io::Error>() {
      if let Some(f) = io.get_ref().and_then(|i| i.downcast_ref::<SshFailure>()) {
        text = Some(f.0.clone());
        break;
      }
    }
    cur = err.source();
  }
  let text = text?;
  let fix = if text.contains("Host key verification failed")
    || text.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
  {
    "the host key is not trusted: connect once with `ssh` and check the fingerprint (it is added to known_hosts), or add the key with ssh-keyscan after verifying it"
  } else if text.contains("Permission denied") {
    "the remote user does not accept this key: load it into the ssh agent (ssh-add) or name it in ~/.ssh/config (IdentityFile), and add it to the remote authorized_keys"
  } else if text.contains("docker: command not found")
    || text.contains("not found") && text.contains("docker")
  {
    "install the docker CLI on the remote host: `docker system dial-stdio` runs there"
  } else if text.contains("Connection refused")
    || text.contains("timed out")
    || text.contains("Could not resolve")
  {
    "check that sshd runs on the remote host and the address and port are right"
  } else {
    "check that `ssh HOST docker version` works from this machine as this user"
  };
  Some(SandboxError::EngineSsh {
    host: host.to_string(),
    detail: text
      .lines()
      .last()
      .unwrap_or("")
      .chars()
      .take(300)
      .collect(),
    fix: fix.into(),
  })
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn addresses() {
    assert_eq!(
      parse("ssh://me@box.example:2222"),
      Some(Target {
        user: Some("me".into()),
        host: "box.example".into(),
        port: Some(2222)
      })
    );
    assert_eq!(parse("ssh://box").unwrap().user, None);
    assert!(
      parse("ssh://-oProxyCommand=x").is_none(),
      "never an ssh option"
    );
    assert!(parse("ssh://a@b/c").is_none());
    assert!(parse("ssh://").is_none());
    let argv = ssh_argv(&parse("ssh://me@h:22").unwrap());
    assert!(argv.windows(2).any(|w| w == ["-o", "BatchMode=yes"]));
    assert_eq!(argv[argv.len() - 2..], ["--".to_string(), "h".to_string()]);
  }
}
