//! How much of the host's memory Code Mode requests hold at once: per sandbox (every relay in it,
//! from any provider of this process) and per provider. A request holds its bytes or what its
//! values take in V8's heap (`meter`), whichever is more. Room for its bytes is claimed before
//! they are read, so a sandbox that sends more waits (its stream is not read meanwhile, which
//! holds the caller in the sandbox); once the request is measured, the claim grows to what its
//! values take (waiting within the request's timeout when that room is not free), or the request
//! is refused. The claim is given back when the dispatcher is done with the request, not when
//! the caller stops waiting: a slow tool cannot make the host hold more than the bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::codemode::meter::{Measured, Unfit};
use crate::engine::Engine;

/// What holding a request costs besides its payload and values (the bookkeeping, the dispatcher's
/// promise), so that many tiny requests are bounded too.
pub const REQUEST_OVERHEAD: usize = 16 * 1024;

/// The room a request of `len` bytes takes while it is read.
pub fn reading(len: usize) -> usize {
  len.saturating_add(REQUEST_OVERHEAD)
}

/// The room a measured request holds: its bytes (while they are alive) or its values, whichever
/// is more. Both live at once only while the JavaScript side builds the values, which is why the
/// host's memory stays within twice the bound.
pub fn holding(len: usize, heap: u64) -> usize {
  let values = usize::try_from(heap).unwrap_or(usize::MAX);
  len.max(values).saturating_add(REQUEST_OVERHEAD)
}

/// One bound: its bytes, and the option that sets it (for messages).
pub struct Pool {
  sem: Arc<Semaphore>,
  limit: usize,
  option: &'static str,
}

impl Pool {
  pub fn new(limit: usize, option: &'static str) -> Arc<Self> {
    Arc::new(Self {
      sem: Arc::new(Semaphore::new(limit)),
      limit,
      option,
    })
  }

  /// Bytes free now.
  pub fn available(&self) -> usize {
    self.sem.available_permits()
  }

  /// What `room` takes of this pool: never more than the whole pool, so a request that fits
  /// its limit is never stuck.
  fn cost(&self, room: usize) -> u32 {
    room.min(self.limit) as u32
  }

  fn try_take(&self, room: usize) -> Option<OwnedSemaphorePermit> {
    self
      .sem
      .clone()
      .try_acquire_many_owned(self.cost(room))
      .ok()
  }

  async fn take(&self, room: usize) -> OwnedSemaphorePermit {
    self.take_permits(self.cost(room) as usize).await
  }

  /// Gives back what `held` has beyond what `room` takes of this pool, or takes the shortfall
  /// if it is free now; false when it is not (`held` is then as it was).
  fn fit_now(&self, held: &mut OwnedSemaphorePermit, room: usize) -> bool {
    let (want, have) = (self.cost(room) as usize, held.num_permits());
    if want <= have {
      drop(held.split(have - want));
      return true;
    }
    match self
      .sem
      .clone()
      .try_acquire_many_owned((want - have) as u32)
    {
      Ok(more) => {
        held.merge(more);
        true
      }
      Err(_) => false,
    }
  }

  /// As `fit_now`, waiting for a shortfall.
  async fn fit_wait(&self, held: &mut OwnedSemaphorePermit, room: usize) {
    let (want, have) = (self.cost(room) as usize, held.num_permits());
    if want <= have {
      drop(held.split(have - want));
      return;
    }
    held.merge(self.take_permits(want - have).await);
  }

  async fn take_permits(&self, n: usize) -> OwnedSemaphorePermit {
    self
      .sem
      .clone()
      .acquire_many_owned(n as u32)
      .await
      .expect("the semaphore is never closed")
  }
}

/// What becomes of a request once it is measured.
pub enum Admission {
  /// Its claim holds what it needs: hand it on.
  Ready(Claim),
  /// It needs this much room, more than is free now: wait for it (or give up).
  Wait(Claim, usize),
  /// It can never be held; the message is for the caller.
  Refused(String),
}

/// The caller's message when a request found no room within its timeout.
pub fn no_room(timeout: std::time::Duration) -> String {
  format!(
    "Code Mode request found no room in the host's in-flight limit within {} s (other requests hold it); try again",
    timeout.as_secs_f64()
  )
}

/// The two bounds one relay's requests are held under.
#[derive(Clone)]
pub struct Budget {
  sandbox: Arc<Pool>,
  provider: Arc<Pool>,
}

/// Room held for one request; given back when dropped.
pub struct Claim {
  sandbox: OwnedSemaphorePermit,
  provider: OwnedSemaphorePermit,
}

impl Claim {
  /// Bytes held of the sandbox's bound.
  pub fn held(&self) -> usize {
    self.sandbox.num_permits()
  }
}

/// Each sandbox's pool on one engine, while some relay uses it.
#[derive(Default)]
struct State(Mutex<HashMap<String, Weak<Pool>>>);

/// The option setting the per-sandbox bound.
pub const SANDBOX_OPTION: &str = "codeModeSandboxInflightBytes";
/// The option setting the per-provider bound.
pub const PROVIDER_OPTION: &str = "codeModeProviderInflightBytes";

impl Budget {
  /// The bounds of a relay in `sandbox_id`. Every relay in one sandbox shares its pool; the
  /// first one's `sandbox_limit` sizes it, while any relay there uses it.
  pub fn new(engine: &Engine, sandbox_id: &str, sandbox_limit: usize, provider: Arc<Pool>) -> Self {
    let state = engine.shared.state::<State>();
    let mut map = state.0.lock().expect("code mode budgets");
    map.retain(|_, pool| pool.strong_count() > 0);
    let sandbox = match map.get(sandbox_id).and_then(Weak::upgrade) {
      Some(pool) => pool,
      None => {
        let pool = Pool::new(sandbox_limit, SANDBOX_OPTION);
        map.insert(sandbox_id.to_string(), Arc::downgrade(&pool));
        pool
      }
    };
    Self { sandbox, provider }
  }

  /// Why a request of `len` payload bytes can never be held, if it cannot: it alone is over a
  /// bound. The message is for the caller in the sandbox.
  pub fn refusal(&self, len: usize) -> Option<String> {
    self.over(len).map(|p| {
      format!(
        "Code Mode request of {len} bytes exceeds the host's in-flight limit of {} bytes (option `{}`); send smaller requests, or ask the operator to raise the limit",
        p.limit, p.option
      )
    })
  }

  /// Why a measured request can never be held: what its values take is over a bound.
  pub fn refusal_measured(&self, len: usize, measured: &Measured) -> Option<String> {
    let room = holding(len, measured.heap) - REQUEST_OVERHEAD;
    self.over(room).map(|p| {
      format!(
        "Code Mode request of {len} bytes would take about {} bytes of the host's memory as {} JavaScript values, over the host's in-flight limit of {} bytes (option `{}`); send fewer values (long strings cost what they hold, many small objects and arrays cost tens of bytes each), or ask the operator to raise the limit",
        measured.heap, measured.values, p.limit, p.option
      )
    })
  }

  fn over(&self, room: usize) -> Option<&Pool> {
    [&self.sandbox, &self.provider]
      .into_iter()
      .find(|p| room > p.limit)
      .map(|p| &**p)
  }

  /// `room` now, if both bounds have it (a request waiting for room keeps what is given back,
  /// so this never overtakes it).
  pub fn try_claim(&self, room: usize) -> Option<Claim> {
    let sandbox = self.sandbox.try_take(room)?;
    let provider = self.provider.try_take(room)?;
    Some(Claim { sandbox, provider })
  }

  /// Waits until `room` fits under both bounds. Cancel-safe: a wait dropped early holds
  /// nothing.
  pub async fn claim(&self, room: usize) -> Claim {
    // Always the sandbox first, then the provider: one order, so waits never form a cycle.
    let sandbox = self.sandbox.take(room).await;
    let provider = self.provider.take(room).await;
    Claim { sandbox, provider }
  }

  /// Decides a measured request of `len` bytes, read under `claim` (`reading(len)`).
  pub fn admit(
    &self,
    len: usize,
    measured: &Result<Measured, Unfit>,
    mut claim: Claim,
  ) -> Admission {
    let m = match measured {
      Ok(m) => m,
      Err(why) => return Admission::Refused(why.message()),
    };
    if let Some(why) = self.refusal_measured(len, m) {
      return Admission::Refused(why);
    }
    let room = holding(len, m.heap);
    match self.try_fit(&mut claim, room) {
      true => Admission::Ready(claim),
      false => Admission::Wait(claim, room),
    }
  }

  /// Makes `claim` hold exactly `room` if that needs no wait: surplus is given back, a
  /// shortfall taken when free now. False, with `claim` as it was, otherwise.
  pub fn try_fit(&self, claim: &mut Claim, room: usize) -> bool {
    let before = claim.sandbox.num_permits();
    if !self.sandbox.fit_now(&mut claim.sandbox, room) {
      return false;
    }
    if self.provider.fit_now(&mut claim.provider, room) {
      return true;
    }
    // Only a claim that grows can fail: the sandbox's share goes back to what it was.
    let grown = claim.sandbox.num_permits() - before;
    drop(claim.sandbox.split(grown));
    false
  }

  /// Makes `claim` hold exactly `room`, waiting for a shortfall (the sandbox's first, then the
  /// provider's, as `claim` does). Dropped early, the claim may hold part of it, still given
  /// back when the claim is dropped.
  pub async fn fit(&self, claim: &mut Claim, room: usize) {
    self.sandbox.fit_wait(&mut claim.sandbox, room).await;
    self.provider.fit_wait(&mut claim.provider, room).await;
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn budget(sandbox: usize, provider: usize) -> Budget {
    Budget {
      sandbox: Pool::new(sandbox, SANDBOX_OPTION),
      provider: Pool::new(provider, PROVIDER_OPTION),
    }
  }

  #[tokio::test]
  async fn claims_wait_for_room_and_give_it_back_when_dropped() {
    let b = budget(1 << 20, 4 << 20);
    let first = b.claim(700 * 1024).await;
    let waiting = tokio::spawn({
      let b = b.clone();
      async move { b.claim(700 * 1024).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "over the sandbox's bound: it waits");
    drop(first);
    let second = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
      .await
      .expect("room was given back")
      .unwrap();
    assert_eq!(b.provider.available(), (4 << 20) - 700 * 1024);
    drop(second);
    assert_eq!(b.sandbox.available(), 1 << 20);
    assert_eq!(b.provider.available(), 4 << 20);
  }

  #[tokio::test]
  async fn a_request_that_fits_a_bound_exactly_is_held_alone() {
    let b = budget(1 << 20, 4 << 20);
    assert!(b.refusal(1 << 20).is_none());
    let whole = b.claim(1 << 20).await;
    assert_eq!(b.sandbox.available(), 0);
    drop(whole);
  }

  #[test]
  fn a_request_over_either_bound_is_refused_naming_the_option() {
    let b = budget(1 << 20, 512 * 1024);
    let why = b.refusal(600 * 1024).expect("over the provider's bound");
    assert!(why.contains("codeModeProviderInflightBytes"), "{why}");
    let why = b.refusal(2 << 20).expect("over both");
    assert!(why.contains("codeModeSandboxInflightBytes"), "{why}");
    assert!(b.refusal(100).is_none());
  }

  #[tokio::test]
  async fn a_claim_now_takes_free_room_and_never_overtakes_a_waiting_claim() {
    let b = budget(1 << 20, 4 << 20);
    let small = b.try_claim(1024).expect("room is free");
    let big = b.claim(900 * 1024).await;
    // Both bounds or nothing: the provider has room, the sandbox does not.
    assert!(b.try_claim(200 * 1024).is_none());
    assert_eq!(b.provider.available(), (4 << 20) - 901 * 1024);
    let waiting = tokio::spawn({
      let b = b.clone();
      async move { b.claim(500 * 1024).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    // Room given back goes to the claim that waits, not to a later one that asks now.
    drop(small);
    assert!(b.try_claim(1024).is_none());
    drop(big);
    let held = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
      .await
      .expect("the waiting claim gets the room")
      .unwrap();
    drop(held);
    assert_eq!(b.sandbox.available(), 1 << 20);
  }

  #[tokio::test]
  async fn a_measured_claim_is_cut_or_grown_to_what_it_holds() {
    let b = budget(1 << 20, 4 << 20);
    let mut claim = b.claim(reading(100 * 1024)).await;
    assert_eq!(claim.held(), 100 * 1024 + REQUEST_OVERHEAD);
    // Text: its bytes, as read.
    assert!(b.try_fit(&mut claim, holding(100 * 1024, 90 * 1024)));
    assert_eq!(claim.held(), 100 * 1024 + REQUEST_OVERHEAD);
    assert_eq!(b.sandbox.available(), (1 << 20) - claim.held());
    assert_eq!(b.provider.available(), (4 << 20) - claim.held());
    // Less than held: the surplus goes back at once.
    let mut big = b.claim(300 * 1024).await;
    assert!(b.try_fit(&mut big, 200 * 1024));
    assert_eq!(b.sandbox.available(), (1 << 20) - claim.held() - 200 * 1024);
    drop(big);
    // Dense values: more than their bytes, taken when free.
    let other = b.claim(700 * 1024).await;
    assert!(!b.try_fit(&mut claim, 400 * 1024), "not free now");
    assert_eq!(claim.held(), 100 * 1024 + REQUEST_OVERHEAD, "as it was");
    assert_eq!(
      b.provider.available(),
      (4 << 20) - 800 * 1024 - REQUEST_OVERHEAD
    );
    let grown = tokio::spawn({
      let b = b.clone();
      async move {
        b.fit(&mut claim, 400 * 1024).await;
        claim
      }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!grown.is_finished(), "waits for room");
    drop(other);
    let claim = tokio::time::timeout(std::time::Duration::from_secs(5), grown)
      .await
      .expect("room was given back")
      .unwrap();
    assert_eq!(claim.held(), 400 * 1024);
    drop(claim);
    assert_eq!(b.sandbox.available(), 1 << 20);
    assert_eq!(b.provider.available(), 4 << 20);
  }

  #[test]
  fn values_over_a_bound_are_refused_naming_what_they_take() {
    let b = budget(1 << 20, 4 << 20);
    let dense = Measured {
      heap: 2 << 20,
      values: 40_000,
      plan: None,
    };
    let why = b
      .refusal_measured(100_000, &dense)
      .expect("over the sandbox's bound");
    assert!(
      why.contains("2097152 bytes of the host's memory as 40000 JavaScript values"),
      "{why}"
    );
    assert!(why.contains("codeModeSandboxInflightBytes"), "{why}");
    let light = Measured {
      heap: 1000,
      values: 3,
      plan: None,
    };
    assert!(b.refusal_measured(1000, &light).is_none());
  }
}
