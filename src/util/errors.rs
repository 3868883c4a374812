//! The crate's one error type. Every variant has a stable code that the JavaScript layer maps
//! to the error classes of the SandboxProvider contract (or to the host's own injected ones).

use serde_json::{json, Map, Value};

/// Everything that can go wrong, each with a message that says what to do about it.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SandboxError {
  #[error("invalid option `{option}`: {reason}")]
  InvalidOption { option: String, reason: String },

  #[error("invalid argument `{argument}`: {reason}")]
  InvalidArgument { argument: String, reason: String },

  #[error("Sandbox '{sandbox_id}' no longer exists — it may have been auto-deleted")]
  SandboxNotAvailable { sandbox_id: String },

  #[error("File not found: {path}")]
  FileNotFound { path: String },

  #[error("Path is a directory, not a file: {path}")]
  PathIsDirectory { path: String },

  #[error("File too large: {path} ({size} bytes, max {max})")]
  FileTooLarge { path: String, size: u64, max: u64 },

  #[error("Path must not contain \"..\" segments: {path}")]
  PathTraversal { path: String },

  #[error("Invalid path {path:?}: {reason}")]
  InvalidPath { path: String, reason: String },

  #[error("Not a regular file ({kind}): {path}; only regular files can be downloaded")]
  NotRegularFile { path: String, kind: String },

  #[error("File changed while being read: {path} (it was rewritten during each of {tries} tries); download it again once nothing writes to it")]
  FileChanged { path: String, tries: u32 },

  #[error("Docker engine at {host} is unreachable ({detail}); check that dockerd runs and that `dockerHost` points at it")]
  EngineUnreachable { host: String, detail: String },

  #[error("TLS to the Docker engine at {host} failed: {detail}. Fix: {fix}")]
  EngineTls {
    host: String,
    detail: String,
    fix: String,
  },

  #[error("SSH to the Docker engine at {host} failed: {detail}. Fix: {fix}")]
  EngineSsh {
    host: String,
    detail: String,
    fix: String,
  },

  #[error("Docker engine at {host} did not answer {operation} within {seconds} s; it may be overloaded or hung")]
  EngineTimeout {
    host: String,
    operation: String,
    seconds: u64,
  },

  #[error("Docker engine at {host} sent more than {limit} bytes in reply to {operation}, so the reply was cut off; a Docker engine does not: check that `dockerHost` points at one, not at another service or a misbehaving proxy")]
  EngineReplyTooLarge {
    host: String,
    operation: String,
    limit: u64,
  },

  #[error("Docker engine refused {operation} (HTTP {status}): {detail}")]
  Engine {
    operation: String,
    status: u16,
    detail: String,
  },

  #[error("Image '{image}' is not in the Docker engine: {reason}")]
  ImageNotAvailable { image: String, reason: String },

  #[error("Creating the sandbox failed at {step}: {detail}")]
  CreateFailed { step: String, detail: String },

  #[error("Code Mode cannot run in this sandbox: {reason}")]
  CodeModeUnavailable { reason: String },

  #[error("The sandbox's agent ended while the call was in flight ({detail}); the command may or may not have run, so check its effects before running it again")]
  AgentLost { detail: String },
  #[error("Code Mode's relay did not start in this sandbox: {detail}. Check that the sandbox has free disk space (its root filesystem, /tmp, /trueforge) and memory")]
  CodeModeStartFailed { detail: String },

  #[error("No GPU is free for this sandbox: it needs {wanted} of {total} ({devices}), and {held}; retry once one of those sandboxes stops, or raise `gpuWaitMs`")]
  GpusUnavailable {
    wanted: u32,
    total: usize,
    devices: String,
    /// Who holds them, `<gpu>: <sandbox id>` each, for the message.
    held: String,
    /// The sandbox ids holding GPUs this one could have used.
    holders: Vec<String>,
  },

  #[error("The Docker engine cannot give this sandbox GPUs: {reason}")]
  GpuUnsupported { reason: String },

  #[error("{0}")]
  Internal(String),
}

impl SandboxError {
  /// The stable code the JavaScript layer switches on. Never rename one.
  pub fn code(&self) -> &'static str {
    match self {
      Self::InvalidOption { .. } => "INVALID_OPTION",
      Self::InvalidArgument { .. } => "INVALID_ARGUMENT",
      Self::SandboxNotAvailable { .. } => "SANDBOX_NOT_AVAILABLE",
      Self::FileNotFound { .. } => "FILE_NOT_FOUND",
      Self::PathIsDirectory { .. } => "PATH_IS_DIRECTORY",
      Self::FileTooLarge { .. } => "FILE_TOO_LARGE",
      Self::PathTraversal { .. } => "PATH_TRAVERSAL",
      Self::InvalidPath { .. } => "INVALID_PATH",
      Self::NotRegularFile { .. } => "NOT_REGULAR_FILE",
      Self::FileChanged { .. } => "FILE_CHANGED",
      Self::EngineUnreachable { .. } => "ENGINE_UNREACHABLE",
      Self::EngineTimeout { .. } => "ENGINE_TIMEOUT",
      Self::EngineTls { .. } => "ENGINE_TLS",
      Self::EngineSsh { .. } => "ENGINE_SSH",
      Self::Engine { .. } => "ENGINE_ERROR",
      Self::EngineReplyTooLarge { .. } => "ENGINE_REPLY_TOO_LARGE",
      Self::ImageNotAvailable { .. } => "IMAGE_NOT_AVAILABLE",
      Self::CreateFailed { .. } => "CREATE_FAILED",
      Self::CodeModeUnavailable { .. } => "CODE_MODE_UNAVAILABLE",
      Self::AgentLost { .. } => "AGENT_LOST",
      Self::CodeModeStartFailed { .. } => "CODE_MODE_START_FAILED",
      Self::GpusUnavailable { .. } => "GPUS_UNAVAILABLE",
      Self::GpuUnsupported { .. } => "GPU_UNSUPPORTED",
      Self::Internal(_) => "INTERNAL",
    }
  }

  /// The fields the contract's error constructors take, under their JavaScript names; they are
  /// set on the thrown object beside `code`, so nothing on the JavaScript side parses a message.
  pub fn fields(&self) -> Map<String, Value> {
    let mut o = Map::new();
    match self {
      Self::SandboxNotAvailable { sandbox_id } => {
        o.insert("sandboxId".into(), json!(sandbox_id));
      }
      Self::FileNotFound { path }
      | Self::PathIsDirectory { path }
      | Self::PathTraversal { path }
      | Self::InvalidPath { path, .. }
      | Self::NotRegularFile { path, .. }
      | Self::FileChanged { path, .. } => {
        o.insert("path".into(), json!(path));
      }
      Self::FileTooLarge { path, size, max } => {
        o.insert("path".into(), json!(path));
        o.insert("fileSize".into(), json!(size));
        o.insert("maxSize".into(), json!(max));
      }
      Self::InvalidOption { option, reason } => {
        o.insert("option".into(), json!(option));
        o.insert("reason".into(), json!(reason));
      }
      Self::InvalidArgument { argument, reason } => {
        o.insert("argument".into(), json!(argument));
        o.insert("reason".into(), json!(reason));
      }
      Self::GpusUnavailable { holders, .. } => {
        o.insert("holders".into(), json!(holders));
      }
      _ => {}
    }
    o
  }
}

pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn messages_match_the_contract() {
    let e = SandboxError::SandboxNotAvailable {
      sandbox_id: "/workspace/x".into(),
    };
    assert_eq!(
      e.to_string(),
      "Sandbox '/workspace/x' no longer exists — it may have been auto-deleted"
    );
    let e = SandboxError::FileTooLarge {
      path: "/a".into(),
      size: 11,
      max: 10,
    };
    assert_eq!(e.to_string(), "File too large: /a (11 bytes, max 10)");
    let p = e.fields();
    assert_eq!(e.code(), "FILE_TOO_LARGE");
    assert_eq!(p["fileSize"], 11);
    assert_eq!(p["maxSize"], 10);
    assert_eq!(
      SandboxError::PathTraversal {
        path: "a/../b".into()
      }
      .to_string(),
      "Path must not contain \"..\" segments: a/../b"
    );
    assert_eq!(
      SandboxError::FileNotFound { path: "/x".into() }.to_string(),
      "File not found: /x"
    );
    assert_eq!(
      SandboxError::PathIsDirectory { path: "/x".into() }.to_string(),
      "Path is a directory, not a file: /x"
    );
  }

  #[test]
  fn fields_carry_what_the_contract_constructors_take() {
    let e = SandboxError::SandboxNotAvailable {
      sandbox_id: "/workspace/x".into(),
    };
    assert_eq!(
      Value::Object(e.fields()),
      json!({ "sandboxId": "/workspace/x" })
    );
    // The reason alone, so the JavaScript side rebuilds the same message around `option`.
    let e = SandboxError::InvalidOption {
      option: "namespace".into(),
      reason: "too long".into(),
    };
    assert_eq!(
      Value::Object(e.fields()),
      json!({ "option": "namespace", "reason": "too long" })
    );
    assert_eq!(e.to_string(), "invalid option `namespace`: too long");
    assert!(SandboxError::Internal("x".into()).fields().is_empty());
  }
}
