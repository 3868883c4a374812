//! Log events from the core, forwarded to the host's logger (winston-shaped) when it gave one,
//! and always to `tracing` so a Rust embedder can subscribe.

use std::sync::Arc;

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
  Debug,
  Info,
  Warn,
  Error,
}

impl Level {
  pub fn as_str(self) -> &'static str {
    match self {
      Level::Debug => "debug",
      Level::Info => "info",
      Level::Warn => "warn",
      Level::Error => "error",
    }
  }
}

/// Where log events go. Cheap to clone.
pub type Sink = Arc<dyn Fn(Level, &str, &Value) + Send + Sync>;

#[derive(Clone, Default)]
pub struct Logger {
  sink: Option<Sink>,
}

impl Logger {
  pub fn new(sink: Option<Sink>) -> Self {
    Self { sink }
  }

  pub fn log(&self, level: Level, message: &str, meta: Value) {
    match level {
      Level::Debug => tracing::debug!(%meta, "{message}"),
      Level::Info => tracing::info!(%meta, "{message}"),
      Level::Warn => tracing::warn!(%meta, "{message}"),
      Level::Error => tracing::error!(%meta, "{message}"),
    }
    if let Some(sink) = &self.sink {
      sink(level, message, &meta);
    }
  }

  pub fn debug(&self, message: &str, meta: Value) {
    self.log(Level::Debug, message, meta)
  }
  pub fn info(&self, message: &str, meta: Value) {
    self.log(Level::Info, message, meta)
  }
  pub fn warn(&self, message: &str, meta: Value) {
    self.log(Level::Warn, message, meta)
  }
}
