//! Log events from the core, forwarded to the host's logger (winston-shaped) when it gave one,
//! and always to `tracing` so a Rust embedder can subscribe. Text a sandbox controls (what a
//! relay writes on stderr, a command's early output inside an error) goes through
//! `Logger::sandbox_text`, which bounds what one sandbox can put in the host's logs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

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

/// Events of sandbox text one sandbox may log per window (the line reporting drops aside).
pub const SANDBOX_LOG_EVENTS: u32 = 100;
/// Bytes of sandbox text one sandbox may log per window.
pub const SANDBOX_LOG_BYTES: usize = 1024 * 1024;
/// The window both limits count over.
pub const SANDBOX_LOG_WINDOW: Duration = Duration::from_secs(60);
/// The most text one event carries; the rest is cut, saying how much.
pub const SANDBOX_LOG_TEXT: usize = 16 * 1024;

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

  /// Logs `text`, which sandbox `sandbox_id` controls, under `key` in `meta`. Per sandbox (in
  /// this process, whichever provider logs) at most `SANDBOX_LOG_EVENTS` events and
  /// `SANDBOX_LOG_BYTES` of text reach the logger per `SANDBOX_LOG_WINDOW`, each text cut to
  /// `SANDBOX_LOG_TEXT`; past that, events are dropped and one line says how many, when the
  /// window ends (or `sandbox_text_ended` is called, whichever comes first).
  pub fn sandbox_text(
    &self,
    level: Level,
    message: &str,
    sandbox_id: &str,
    key: &str,
    text: &[u8],
    mut meta: Value,
  ) {
    let now = Instant::now();
    let (kept, summary, first_drop) = {
      let mut t = throttle().lock().expect("log throttle");
      let summary = t.roll(sandbox_id, now);
      let (kept, first_drop) = t.admit(sandbox_id, now, text.len(), self);
      (kept, summary, first_drop)
    };
    if let Some(s) = summary {
      s.emit();
    }
    if let Some(start) = first_drop {
      summarize_at_window_end(sandbox_id, start);
    }
    let Some(keep) = kept else { return };
    let mut shown = String::from_utf8_lossy(&text[..keep]).into_owned();
    if keep < text.len() {
      shown.push_str(&format!(" … [{} more bytes not logged]", text.len() - keep));
    }
    if let Value::Object(m) = &mut meta {
      m.insert(key.to_string(), Value::String(shown));
    }
    self.log(level, message, meta)
  }

  /// Says now how much of a sandbox's text was dropped, if any: its source ended (a relay's
  /// stream closed), so no later event would bring the line. The window's counts stay.
  pub fn sandbox_text_ended(sandbox_id: &str) {
    let summary = throttle()
      .lock()
      .expect("log throttle")
      .summary(sandbox_id, false);
    if let Some(s) = summary {
      s.emit();
    }
  }
}

/// One sandbox's window of logged text.
struct Window {
  start: Instant,
  events: u32,
  bytes: usize,
  dropped_events: u64,
  dropped_bytes: u64,
  /// Where the line reporting drops goes: the logger of the last event dropped.
  report_to: Option<Logger>,
}

/// The line reporting what a window dropped, made under the lock and logged outside it.
struct Summary {
  to: Logger,
  meta: Value,
}

impl Summary {
  fn emit(self) {
    self.to.warn(
      "sandbox log output over the limit; the rest was dropped",
      self.meta,
    )
  }
}

/// Every sandbox's window in this process.
#[derive(Default)]
struct Throttle {
  windows: HashMap<String, Window>,
}

fn throttle() -> &'static Mutex<Throttle> {
  static T: OnceLock<Mutex<Throttle>> = OnceLock::new();
  T.get_or_init(Default::default)
}

impl Throttle {
  /// Ends `id`'s window when it is over, with the line reporting its drops.
  fn roll(&mut self, id: &str, now: Instant) -> Option<Summary> {
    let over = self
      .windows
      .get(id)
      .is_some_and(|w| now.duration_since(w.start) >= SANDBOX_LOG_WINDOW);
    if !over {
      return None;
    }
    let summary = self.summary(id, true);
    self.windows.remove(id);
    summary
  }

  /// How much of the event's `len` bytes may be logged (`None`: drop it), and the window's start
  /// when this is its first drop.
  fn admit(
    &mut self,
    id: &str,
    now: Instant,
    len: usize,
    log: &Logger,
  ) -> (Option<usize>, Option<Instant>) {
    if self.windows.len() >= 1024 && !self.windows.contains_key(id) {
      // Windows that are over and dropped nothing need no line: forget them.
      self
        .windows
        .retain(|_, w| now.duration_since(w.start) < SANDBOX_LOG_WINDOW || w.dropped_events > 0);
    }
    let w = self.windows.entry(id.to_string()).or_insert(Window {
      start: now,
      events: 0,
      bytes: 0,
      dropped_events: 0,
      dropped_bytes: 0,
      report_to: None,
    });
    if w.events >= SANDBOX_LOG_EVENTS || w.bytes >= SANDBOX_LOG_BYTES {
      let first = w.dropped_events == 0 && w.report_to.is_none();
      w.dropped_events += 1;
      w.dropped_bytes += len as u64;
      w.report_to = Some(log.clone());
      return (None, first.then_some(w.start));
    }
    // A cut event says itself how much was cut; the line reporting drops counts dropped events.
    let keep = len.min(SANDBOX_LOG_TEXT).min(SANDBOX_LOG_BYTES - w.bytes);
    w.events += 1;
    w.bytes += keep;
    (Some(keep), None)
  }

  /// The line reporting `id`'s drops, if it dropped any; counted as reported.
  fn summary(&mut self, id: &str, window_over: bool) -> Option<Summary> {
    let w = self.windows.get_mut(id)?;
    if w.dropped_events == 0 && w.dropped_bytes == 0 {
      return None;
    }
    let to = w.report_to.take().unwrap_or_default();
    let meta = json!({
      "sandboxId": id,
      "droppedEvents": w.dropped_events,
      "droppedBytes": w.dropped_bytes,
      "limit": format!(
        "{SANDBOX_LOG_EVENTS} events and {} MiB of sandbox text per sandbox per {} s",
        SANDBOX_LOG_BYTES >> 20,
        SANDBOX_LOG_WINDOW.as_secs()
      ),
      "windowOver": window_over,
    });
    w.dropped_events = 0;
    w.dropped_bytes = 0;
    Some(Summary { to, meta })
  }
}

/// Reports the window's drops when it ends even if the sandbox says nothing more. Outside a
/// runtime the next event (or the source's end) reports them instead.
fn summarize_at_window_end(id: &str, start: Instant) {
  let Ok(rt) = tokio::runtime::Handle::try_current() else {
    return;
  };
  let id = id.to_string();
  rt.spawn(async move {
    tokio::time::sleep_until((start + SANDBOX_LOG_WINDOW).into()).await;
    let summary = {
      let mut t = throttle().lock().expect("log throttle");
      if t.windows.get(&id).is_some_and(|w| w.start == start) {
        let s = t.summary(&id, true);
        t.windows.remove(&id);
        s
      } else {
        None
      }
    };
    if let Some(s) = summary {
      s.emit();
    }
  });
}

#[cfg(test)]
mod tests {
  use super::*;

  type Seen = Arc<Mutex<Vec<(String, Value)>>>;

  fn recording() -> (Logger, Seen) {
    let got: Seen = Default::default();
    let g = got.clone();
    let sink: Sink = Arc::new(move |_, m: &str, meta: &Value| {
      g.lock().unwrap().push((m.to_string(), meta.clone()))
    });
    (Logger::new(Some(sink)), got)
  }

  #[test]
  fn a_flood_is_cut_to_the_limits_and_one_line_reports_the_rest() {
    let (log, got) = recording();
    let id = "/workspace/flood-test";
    let chunk = vec![b'x'; 32 * 1024];
    for _ in 0..3200 {
      log.sandbox_text(Level::Warn, "stderr", id, "text", &chunk, json!({}));
    }
    Logger::sandbox_text_ended(id);
    let got = got.lock().unwrap();
    let texts: usize = got
      .iter()
      .filter_map(|(_, m)| m["text"].as_str())
      .map(|t| t.chars().filter(|c| *c == 'x').count())
      .sum();
    assert!(
      got.len() <= SANDBOX_LOG_EVENTS as usize + 1,
      "{}",
      got.len()
    );
    assert!(texts <= SANDBOX_LOG_BYTES, "{texts}");
    let last = &got.last().unwrap().1;
    assert_eq!(
      got
        .iter()
        .filter(|(_, m)| m.get("droppedEvents").is_some())
        .count(),
      1
    );
    let dropped = 3200 - (got.len() as u64 - 1);
    assert_eq!(last["droppedEvents"], dropped);
    assert_eq!(last["droppedBytes"], dropped * 32 * 1024);
    // Each kept event was cut to the per-event limit, saying how much.
    assert!(got[0].1["text"]
      .as_str()
      .unwrap()
      .ends_with("[16384 more bytes not logged]"));
  }

  #[test]
  fn windows_are_per_sandbox_and_roll_over() {
    let (log, got) = recording();
    let mut t = Throttle::default();
    let t0 = Instant::now();
    for _ in 0..SANDBOX_LOG_EVENTS {
      assert_eq!(t.admit("a", t0, 10, &log), (Some(10), None));
    }
    assert_eq!(t.admit("a", t0, 10, &log), (None, Some(t0)));
    assert_eq!(t.admit("a", t0, 10, &log), (None, None));
    assert_eq!(
      t.admit("b", t0, 10, &log).0,
      Some(10),
      "another sandbox is not limited"
    );
    assert!(t.roll("a", t0 + Duration::from_secs(59)).is_none());
    let s = t.roll("a", t0 + SANDBOX_LOG_WINDOW).expect("a summary");
    assert_eq!(s.meta["droppedEvents"], 2);
    assert_eq!(s.meta["droppedBytes"], 20);
    let later = t0 + SANDBOX_LOG_WINDOW;
    assert_eq!(t.admit("a", later, 10, &log).0, Some(10), "a new window");
    s.emit();
    assert_eq!(got.lock().unwrap().len(), 1);
  }

  #[test]
  fn the_byte_budget_cuts_the_last_event_it_lets_through() {
    let (log, _) = recording();
    let mut t = Throttle::default();
    let now = Instant::now();
    let per = SANDBOX_LOG_TEXT;
    assert_eq!(t.admit("c", now, 10, &log).0, Some(10));
    for _ in 1..SANDBOX_LOG_BYTES / per {
      assert_eq!(t.admit("c", now, per, &log).0, Some(per));
    }
    assert_eq!(
      t.admit("c", now, per, &log).0,
      Some(per - 10),
      "cut to the budget"
    );
    assert_eq!(t.admit("c", now, per, &log).0, None);
    let s = t.summary("c", false).unwrap();
    assert_eq!(
      (&s.meta["droppedEvents"], &s.meta["droppedBytes"]),
      (&1.into(), &per.into())
    );
    assert!(t.summary("c", false).is_none(), "reported once");
  }
}
