//! Calls that start on the JavaScript thread. A call's future is polled there first, inside the
//! runtime's context, until it first waits: a command's request then leaves for the agent from
//! this thread, with no runtime thread woken to send it. The first wake-up moves the future onto
//! the runtime, from the thread that woke it: the runtime's reader, which runs it next on the
//! same thread. On a virtual machine, waking a sleeping thread costs more than the host's whole
//! share of a short command, and napi's own bridge wakes two runtime threads per call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use napi::bindgen_prelude::{spawn, within_runtime_if_available};

use crate::provider::agent::WATCH_EVERY;

/// A call's future, settling its promise itself when it ends.
pub type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

enum State {
  /// Being polled on the JavaScript thread; `woken`: it was woken meanwhile.
  Polling { woken: bool },
  /// Waiting for its first wake-up.
  Waiting(Job),
  /// On the runtime now.
  Moved,
}

struct Start(Mutex<State>);

impl Wake for Start {
  fn wake(self: Arc<Self>) {
    self.wake_by_ref();
  }

  fn wake_by_ref(self: &Arc<Self>) {
    let mut st = self.0.lock().expect("start");
    match std::mem::replace(&mut *st, State::Moved) {
      State::Polling { .. } => *st = State::Polling { woken: true },
      State::Waiting(job) => {
        drop(st);
        spawn(job);
      }
      State::Moved => {}
    }
  }
}

/// Polls `job` here until it first waits, then leaves it to the runtime.
pub fn run_here(mut job: Job) {
  beat();
  let start = Arc::new(Start(Mutex::new(State::Polling { woken: false })));
  let waker = Waker::from(start.clone());
  let ready = within_runtime_if_available(|| {
    job
      .as_mut()
      .poll(&mut Context::from_waker(&waker))
      .is_ready()
  });
  if ready {
    return;
  }
  let mut st = start.0.lock().expect("start");
  if matches!(*st, State::Polling { woken: true }) {
    *st = State::Moved;
    drop(st);
    spawn(job);
  } else {
    *st = State::Waiting(job);
  }
}

/// How often the beat's timer fires: as often as a call's watch, so that the watch's timer is
/// never the earliest.
const BEAT: Duration = WATCH_EVERY;
/// The beat stops after this long without a call started here.
const BEAT_IDLE: Duration = Duration::from_secs(30);

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
static LAST_CALL_MS: AtomicU64 = AtomicU64::new(0);
static BEATING: AtomicBool = AtomicBool::new(false);

fn now_ms() -> u64 {
  EPOCH.elapsed().as_millis() as u64
}

/// Keeps a timer at most `BEAT` away pending on the runtime while calls start here. A call's
/// watch registers a timer `WATCH_EVERY` away from this thread; when that is earlier than every
/// timer the runtime's sleeping thread waits for, the runtime wakes that thread just to re-arm
/// its wait, which costs as much as the call's send.
fn beat() {
  LAST_CALL_MS.store(now_ms(), Ordering::Relaxed);
  if BEATING.swap(true, Ordering::AcqRel) {
    return;
  }
  spawn(async {
    loop {
      tokio::time::sleep(BEAT).await;
      let idle = now_ms().saturating_sub(LAST_CALL_MS.load(Ordering::Relaxed));
      if idle > BEAT_IDLE.as_millis() as u64 {
        BEATING.store(false, Ordering::Release);
        return;
      }
    }
  });
}
