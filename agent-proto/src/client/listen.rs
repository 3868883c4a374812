//! What the agent serves for the host: Code Mode relay sockets, whose calls come in as
//! `CodeModeCall`s, and the egress port, whose connections come in as `EgressConn`s. Both arrive
//! on streams the agent opens, handed to the handler set here.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::call::{CallHandler, CodeModeCall};
use super::conn::AgentClient;
use super::egress::EgressHandler;
use super::error::ClientError;
use crate::frame::WINDOW;
use crate::msg::{CodeModeListenSpec, EgressListenSpec, Request};

impl AgentClient {
  /// Opens a Code Mode relay socket in the sandbox. Its calls arrive on `code_mode_calls`.
  pub async fn code_mode_listen(&self, spec: CodeModeListenSpec) -> Result<(), ClientError> {
    self.call(&Request::CodeModeListen(spec)).await
  }

  /// Closes a relay socket (and removes it).
  pub async fn code_mode_close(&self, socket: &str) -> Result<(), ClientError> {
    self
      .call(&Request::CodeModeClose {
        socket: socket.to_string(),
      })
      .await
  }

  /// The Code Mode calls of every relay socket of this agent. Until this is called, and
  /// after the receiver is dropped, calls fail at once with a transport error.
  pub fn code_mode_calls(&self) -> mpsc::UnboundedReceiver<CodeModeCall> {
    let (tx, rx) = mpsc::unbounded_channel();
    // A dropped receiver drops the call, which fails it.
    self.on_code_mode_call(Arc::new(move |call| {
      let _ = tx.send(call);
    }));
    rx
  }

  /// Hands every Code Mode call to `handler` as it arrives, on the reader task, with no task
  /// switch in between (a round trip's cost is mostly such switches). Replaces any earlier one.
  pub fn on_code_mode_call(&self, handler: CallHandler) {
    self.inner.shared.state.lock().expect("state").calls = Some(handler);
  }

  /// Has the agent listen on `127.0.0.1:port` (and `[::1]:port` where the sandbox has IPv6)
  /// for the sandbox's outbound connections; each arrives at the `on_egress` handler. Again with
  /// the same spec: nothing changes; with another: it replaces the first (connections in
  /// flight go on). `AddressInUse`: something in the sandbox listens on that port.
  pub async fn egress_listen(&self, spec: EgressListenSpec) -> Result<(), ClientError> {
    {
      // Before the request leaves: a connection may be opened as soon as the agent listens.
      let mut st = self.inner.shared.state.lock().expect("state");
      st.egress_window = st.egress_window.max(spec.window.min(WINDOW));
      st.egress_max = st.egress_max.max(spec.max_connections);
    }
    self.call(&Request::EgressListen(spec)).await
  }

  /// Stops listening for egress; connections in flight go on.
  pub async fn egress_close(&self) -> Result<(), ClientError> {
    self.call(&Request::EgressClose).await
  }

  /// Hands every egress connection to `handler` as it arrives, on the reader task: it must not
  /// block (spawn a task for the connection). Until this is called, connections are refused
  /// (the agent resets them). Replaces any earlier one.
  pub fn on_egress(&self, handler: EgressHandler) {
    self.inner.shared.state.lock().expect("state").egress = Some(handler);
  }
}
