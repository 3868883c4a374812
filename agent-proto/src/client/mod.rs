//! The host's side of the agent protocol: one `AgentClient` per agent stream, cheap to clone,
//! carrying any number of concurrent requests. A reader task splits incoming frames by stream
//! and never waits on a caller (each stream's backlog is bounded by its credit window); a
//! writer task batches outgoing frames. When the stream ends, every request in flight fails
//! with `ClientError::StreamEnded` (an agent's commands cannot be re-attached), and so does
//! every later one: the caller starts a new agent.
//!
//! The modules, each using only those before it: `error`, `outbox` (the writer), `stream` (one
//! stream's ends, and what it needs of its connection), `egress` and `call` (the streams the
//! agent opens), `shared` (the connection's state), `demux` (the reader task), `handshake`,
//! `conn` (the handle), and the requests by concern: `exec`, `files`, `listen`.

mod call;
mod conn;
mod demux;
mod egress;
mod error;
mod exec;
mod files;
mod handshake;
mod listen;
pub mod outbox;
mod shared;
mod stream;

pub use call::{CallHandler, CodeModeCall};
pub use conn::AgentClient;
pub use egress::{EgressConn, EgressHandler};
pub use error::ClientError;
pub use exec::{ExecOutput, ExecRequest};
pub use files::{Download, StagedUpload, Staging};
pub use handshake::ClientOptions;

#[cfg(test)]
mod tests;
