//! The relay stream's reader: requests out of the sandbox to the session's sink, each held under
//! the budget from before its payload is read until the JavaScript side hands its reply back
//! (`Holds`). What the relay writes on stderr goes to the logger, throttled per sandbox.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::codemode::budget::{self, Admission, Budget, Claim};
use crate::codemode::frame::{encode, Decoder, Event, Frame, KIND_REPLY, KIND_REQUEST};
use crate::codemode::intake::{Intake, Request};
use crate::engine::Engine;
use crate::util::logging::{Level, Logger};

pub(crate) type Output = std::pin::Pin<
  Box<dyn futures_util::Stream<Item = std::result::Result<LogOutput, BollardError>> + Send>,
>;

/// The requests of one relay handed on and not yet answered, by the number the session was
/// given for each (the relay's own ids come from the sandbox and are not trusted to be unique).
#[derive(Default)]
pub(crate) struct Inflight(Mutex<Pending>);

#[derive(Default)]
struct Pending {
  held: HashMap<u32, Held>,
  deadlines: BTreeSet<(Instant, u32)>,
  next: u32,
}

/// One request handed on: the relay's id for it, and when it times out. (Its room is held by
/// the session until the JavaScript side is done with it.)
struct Held {
  relay_id: u32,
  deadline: Instant,
}

impl Inflight {
  /// Request `seq` is answered: the relay's id for it. `None` when it is no longer awaited (it
  /// timed out, or the relay ended).
  pub(crate) fn finish(&self, seq: u32) -> Option<u32> {
    let mut p = self.0.lock().expect("inflight");
    let held = p.held.remove(&seq)?;
    p.deadlines.remove(&(held.deadline, seq));
    Some(held.relay_id)
  }

  pub(crate) fn hold(&self, relay_id: u32, deadline: Instant) -> u32 {
    let mut p = self.0.lock().expect("inflight");
    let mut seq = p.next;
    while p.held.contains_key(&seq) {
      seq = seq.wrapping_add(1);
    }
    p.next = seq.wrapping_add(1);
    p.held.insert(seq, Held { relay_id, deadline });
    p.deadlines.insert((deadline, seq));
    seq
  }

  pub(crate) fn next_deadline(&self) -> Option<Instant> {
    let p = self.0.lock().expect("inflight");
    p.deadlines.first().map(|(d, _)| *d)
  }

  /// The relay's ids of the requests whose time is up.
  pub(crate) fn expire(&self, now: Instant) -> Vec<u32> {
    let mut p = self.0.lock().expect("inflight");
    let mut out = Vec::new();
    while let Some(&(d, seq)) = p.deadlines.first() {
      if d > now {
        break;
      }
      p.deadlines.pop_first();
      if let Some(h) = p.held.remove(&seq) {
        out.push(h.relay_id);
      }
    }
    out
  }

  /// The relay ended: nothing is awaited any more.
  pub(crate) fn clear(&self) {
    let mut p = self.0.lock().expect("inflight");
    p.held.clear();
    p.deadlines.clear();
  }
}

/// A reply in the relay's own error shape (`_error_reply` in relay.py), for the caller.
pub(crate) fn error_reply(relay_id: u32, message: &str, source: &str) -> Bytes {
  let body = json!({ "ok": false, "error": message, "source": source }).to_string();
  encode(KIND_REPLY, relay_id, body.as_bytes())
}

/// What the reader task owns.
pub(crate) struct Reader {
  pub output: Output,
  pub decoder: Decoder,
  pub intake: Intake,
  pub budget: Budget,
  pub inflight: Arc<Inflight>,
  /// Where replies the reader makes itself go; weak, so the relay's stream still closes when
  /// the relay drops its own sender.
  pub replies: mpsc::WeakUnboundedSender<Bytes>,
  pub generation: u32,
  pub alive: Arc<AtomicBool>,
  pub ended: watch::Sender<bool>,
  /// Cancelled when the relay is stopped or dropped: a wait for room then ends at once.
  pub closing: CancellationToken,
  pub sandbox_id: String,
  pub log: Logger,
}

/// Reads requests out of the relay's stdout, handing them to the sink in arrival order, until
/// the stream ends or the engine's background work is stopped (which also ends the relay, so
/// its session sees it gone).
pub(crate) fn spawn(engine: &Engine, mut r: Reader) {
  engine.shared.background.spawn(|stop| async move {
    let outcome = r.run(&stop).await;
    r.inflight.clear();
    r.alive.store(false, Ordering::SeqCst);
    let _ = r.ended.send(true);
    Logger::sandbox_text_ended(&r.sandbox_id);
    let why = outcome
      .err()
      .unwrap_or_else(|| "the stream closed".to_string());
    r.log.debug(
      "Code Mode relay ended",
      json!({ "sandboxId": r.sandbox_id, "reason": why }),
    );
  });
}

/// What a wait needs besides the reader (which the awaited future borrows).
struct Waits {
  inflight: Arc<Inflight>,
  replies: mpsc::WeakUnboundedSender<Bytes>,
  closing: CancellationToken,
  timeout: Duration,
}

impl Waits {
  /// Awaits `fut`, answering requests whose time is up meanwhile. `None` when the relay is
  /// closing and `until_closing` says to stop waiting then; `Err` when the engine is stopped.
  async fn wait<T>(
    &self,
    stop: &CancellationToken,
    until_closing: bool,
    fut: impl Future<Output = T>,
  ) -> Result<Option<T>, String> {
    tokio::pin!(fut);
    loop {
      let next = self.inflight.next_deadline();
      let due = async move {
        match next {
          Some(d) => tokio::time::sleep_until(d).await,
          None => std::future::pending().await,
        }
      };
      tokio::select! {
        v = &mut fut => return Ok(Some(v)),
        _ = due => self.expire(),
        _ = self.closing.cancelled(), if until_closing => return Ok(None),
        _ = stop.cancelled() => return Err("the engine's last provider was disposed".into()),
      }
    }
  }

  /// Answers the requests whose time is up, so the caller hears why.
  fn expire(&self) {
    let late = self.inflight.expire(Instant::now());
    let Some(tx) = self.replies.upgrade() else {
      return;
    };
    let message = format!(
      "Code Mode request got no reply from the host within {} s",
      self.timeout.as_secs_f64()
    );
    for relay_id in late {
      let _ = tx.send(error_reply(relay_id, &message, "transport"));
    }
  }
}

impl Reader {
  async fn run(&mut self, stop: &CancellationToken) -> Result<(), String> {
    let mut claim: Option<Claim> = None;
    loop {
      let waits = Waits {
        inflight: self.inflight.clone(),
        replies: self.replies.clone(),
        closing: self.closing.clone(),
        timeout: self.intake.timeout(),
      };
      match self.decoder.next_event()? {
        Some(Event::Head(h)) if h.kind == KIND_REQUEST => {
          if let Some(why) = self.budget.refusal(h.len) {
            self.decoder.skip();
            if let Some(tx) = self.replies.upgrade() {
              let _ = tx.send(error_reply(h.id, &why, "caller"));
            }
            continue;
          }
          // Nothing more is read from the stream until the room is there.
          let room = budget::reading(h.len);
          match waits.wait(stop, true, self.budget.claim(room)).await? {
            Some(c) => claim = Some(c),
            None => return Ok(()),
          }
          self.decoder.accept_measured();
        }
        Some(Event::Head(_)) => self.decoder.skip(),
        Some(Event::Frame(f)) => {
          if let Some(c) = claim.take() {
            if !self.admit(f, c, &waits, stop).await? {
              return Ok(());
            }
          }
        }
        None => match waits.wait(stop, false, self.output.next()).await? {
          None | Some(None) => return Ok(()),
          Some(Some(Ok(LogOutput::StdOut { message }))) => self.decoder.push(&message),
          Some(Some(Ok(LogOutput::StdErr { message }))) => self.log.sandbox_text(
            Level::Warn,
            "Code Mode relay stderr",
            &self.sandbox_id,
            "text",
            &message,
            json!({ "sandboxId": self.sandbox_id }),
          ),
          Some(Some(Ok(_))) => {}
          Some(Some(Err(e))) => return Err(e.to_string()),
        },
      }
    }
  }

  /// Hands a measured request on once its room is held, or answers why it cannot be; false
  /// when the relay closed meanwhile.
  async fn admit(
    &mut self,
    f: Frame,
    claim: Claim,
    waits: &Waits,
    stop: &CancellationToken,
  ) -> Result<bool, String> {
    let measured = f
      .measured
      .clone()
      .unwrap_or(Err(crate::codemode::meter::Unfit::Malformed));
    let claim = match self.budget.admit(f.payload.len(), &measured, claim) {
      Admission::Ready(c) => c,
      Admission::Refused(why) => {
        self.answer(f.id, &why, "caller");
        return Ok(true);
      }
      Admission::Wait(mut c, room) => {
        let fit = tokio::time::timeout(waits.timeout, self.budget.fit(&mut c, room));
        match waits.wait(stop, true, fit).await? {
          None => return Ok(false),
          Some(Err(_)) => {
            self.answer(f.id, &budget::no_room(waits.timeout), "transport");
            return Ok(true);
          }
          Some(Ok(())) => c,
        }
      }
    };
    let Ok(measured) = measured else {
      unreachable!("admitted")
    };
    let seq = self.inflight.hold(f.id, Instant::now() + waits.timeout);
    let request = Request {
      payload: f.payload,
      measured,
    };
    self.intake.deliver(self.generation, seq, request, claim);
    Ok(true)
  }

  fn answer(&self, relay_id: u32, message: &str, source: &str) {
    if let Some(tx) = self.replies.upgrade() {
      let _ = tx.send(error_reply(relay_id, message, source));
    }
  }
}
