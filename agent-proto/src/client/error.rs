//! How a request fails (`ClientError`), and the decoding of the agent's answers into it: the
//! vocabulary every other part of the client shares.

use crate::msg::{AgentError, Outcome};

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
  /// The agent's stream ended (the agent died, was killed, or its exec was closed). A request
  /// in flight is lost: a command may have run, and its result cannot be recovered.
  #[error("the sandbox agent's stream ended ({reason}); a request in flight is lost and the agent must be started again")]
  StreamEnded { reason: String },
  /// The agent is another version (or protocol revision): replace it.
  #[error("the sandbox agent is version {agent} (protocol {protocol}), expected {expected}")]
  VersionMismatch {
    agent: String,
    protocol: u32,
    expected: String,
  },
  /// The agent never said hello: it could not start, or something else answered.
  #[error("the sandbox agent did not start: {0}")]
  Handshake(String),
  /// The agent broke the protocol; the connection is closed.
  #[error("the sandbox agent broke the protocol: {0}")]
  Protocol(String),
  /// The agent refused or failed this request.
  #[error(transparent)]
  Agent(#[from] AgentError),
  /// A request that does not fit in one frame (a huge command or environment).
  #[error("the request is {bytes} bytes, over the protocol's limit of {max}")]
  RequestTooLarge { bytes: usize, max: usize },
  /// Reading the caller's upload source failed.
  #[error("reading the upload's data failed: {0}")]
  Source(String),
}

/// Decodes a `Result` payload.
pub(super) fn outcome<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ClientError> {
  let o: Outcome<T> = serde_json::from_slice(body)
    .map_err(|e| ClientError::Protocol(format!("an unreadable result: {e}")))?;
  Ok(Result::from(o)?)
}
