//! How many Code Mode request bytes the host holds at once: per sandbox (every relay in it, from
//! any provider of this process) and per provider. A request's bytes are claimed before its
//! payload is read, so a sandbox that sends more waits (its relay stream is not read meanwhile,
//! which holds the caller in the sandbox), and given back when its reply is sent, it times out,
//! or its relay ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::engine::Engine;

/// What holding a request costs besides its payload (the JavaScript values made from it, the
/// bookkeeping), so that many tiny requests are bounded too.
pub const REQUEST_OVERHEAD: usize = 16 * 1024;

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

  /// What a request of `len` payload bytes holds: never more than the whole pool, so a request
  /// that fits its limit is never stuck.
  fn cost(&self, len: usize) -> u32 {
    (len + REQUEST_OVERHEAD).min(self.limit) as u32
  }

  fn try_take(&self, len: usize) -> Option<OwnedSemaphorePermit> {
    self.sem.clone().try_acquire_many_owned(self.cost(len)).ok()
  }

  async fn take(&self, len: usize) -> OwnedSemaphorePermit {
    let n = self.cost(len);
    self
      .sem
      .clone()
      .acquire_many_owned(n)
      .await
      .expect("the semaphore is never closed")
  }
}

/// The two bounds one relay's requests are held under.
#[derive(Clone)]
pub struct Budget {
  sandbox: Arc<Pool>,
  provider: Arc<Pool>,
}

/// Bytes held for one request; given back when dropped.
pub struct Claim {
  _sandbox: OwnedSemaphorePermit,
  _provider: OwnedSemaphorePermit,
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
    [&self.sandbox, &self.provider]
      .into_iter()
      .find(|p| len > p.limit)
      .map(|p| {
        format!(
          "Code Mode request of {len} bytes exceeds the host's in-flight limit of {} bytes (option `{}`); send smaller requests, or ask the operator to raise the limit",
          p.limit, p.option
        )
      })
  }

  /// Room for `len` payload bytes now, if both bounds have it (a request waiting for room
  /// keeps what is given back, so this never overtakes it).
  pub fn try_claim(&self, len: usize) -> Option<Claim> {
    let sandbox = self.sandbox.try_take(len)?;
    let provider = self.provider.try_take(len)?;
    Some(Claim {
      _sandbox: sandbox,
      _provider: provider,
    })
  }

  /// Waits until `len` payload bytes fit under both bounds. Cancel-safe: a wait dropped early
  /// holds nothing.
  pub async fn claim(&self, len: usize) -> Claim {
    // Always the sandbox first, then the provider: one order, so waits never form a cycle.
    let sandbox = self.sandbox.take(len).await;
    let provider = self.provider.take(len).await;
    Claim {
      _sandbox: sandbox,
      _provider: provider,
    }
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
    assert_eq!(
      b.provider.available(),
      (4 << 20) - 700 * 1024 - REQUEST_OVERHEAD
    );
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
    assert_eq!(
      b.provider.available(),
      (4 << 20) - 901 * 1024 - 2 * REQUEST_OVERHEAD
    );
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
}
