//! What one engine connection keeps for the life of the process: each module's own state
//! (kept by type, so this module names none of them), the background tasks working on the
//! engine, and how many providers use it. One `EngineShared` exists per connection identity
//! (`engine::engine_for`), so state of two engines is never mixed and needs no engine in its keys.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Per-engine state: each module's private `State`, by type, plus the background tasks.
#[derive(Default)]
pub struct EngineShared {
  states: States,
  pub background: Background,
  providers: AtomicUsize,
}

/// Counts of what the engine itself holds, for tests and diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
  pub providers: usize,
  pub background_tasks: usize,
}

impl EngineShared {
  pub fn stats(&self) -> Stats {
    Stats {
      providers: self.providers.load(Ordering::SeqCst),
      background_tasks: self.background.running(),
    }
  }

  /// The engine's `T`, made on first use. Each module keeps its state in a type of its own.
  pub fn state<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
    self.states.get()
  }

  /// The engine's `T` if some call made it (a diagnostic read makes nothing).
  pub fn peek<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
    self.states.peek()
  }
}

/// Values by type, one of each.
#[derive(Default)]
struct States(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl States {
  fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
    let mut map = self.0.lock().expect("states");
    let any = map
      .entry(TypeId::of::<T>())
      .or_insert_with(|| Arc::new(T::default()))
      .clone();
    any.downcast::<T>().expect("kept under its own type id")
  }

  fn peek<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
    let map = self.0.lock().expect("states");
    map
      .get(&TypeId::of::<T>())
      .cloned()
      .and_then(|a| a.downcast::<T>().ok())
  }
}

/// A provider's claim on an engine. Releasing the last claim with `release` stops the engine's
/// background work; dropping a claim without it (a provider garbage-collected undisposed) only
/// uncounts it, so work another provider started is not cut short by a collection.
pub struct Hold(Option<Arc<EngineShared>>);

impl Hold {
  pub fn new(shared: &Arc<EngineShared>) -> Self {
    shared.providers.fetch_add(1, Ordering::SeqCst);
    Self(Some(shared.clone()))
  }

  /// Gives the claim back; the last one cancels and awaits the engine's background tasks.
  pub async fn release(mut self) {
    let Some(shared) = self.0.take() else { return };
    if shared.providers.fetch_sub(1, Ordering::SeqCst) == 1 {
      shared.background.stop().await;
    }
  }
}

impl Drop for Hold {
  fn drop(&mut self) {
    if let Some(shared) = self.0.take() {
      shared.providers.fetch_sub(1, Ordering::SeqCst);
    }
  }
}

/// The engine's background tasks. Every task gets a token that is cancelled by `stop`; a task
/// started after a stop belongs to a fresh generation, so the engine stays usable.
#[derive(Default)]
pub struct Background(Mutex<Generation>);

#[derive(Default)]
struct Generation {
  token: CancellationToken,
  tracker: TaskTracker,
}

impl Background {
  /// Runs `task(token)` in the background. The task must end soon after `token` is cancelled;
  /// a task that must finish something first (a clean-up) does so within its own deadline.
  pub fn spawn<F, Fut>(&self, task: F)
  where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
  {
    let g = self.0.lock().expect("background");
    g.tracker.spawn(task(g.token.clone()));
  }

  /// Runs `fut` in the background, dropped at its next await when the engine is stopped.
  pub fn spawn_cancellable(&self, fut: impl Future<Output = ()> + Send + 'static) {
    self.spawn(|token| async move {
      tokio::select! {
        _ = token.cancelled() => {}
        _ = fut => {}
      }
    });
  }

  /// Tasks running now.
  pub fn running(&self) -> usize {
    self.0.lock().expect("background").tracker.len()
  }

  /// Cancels every task and waits for them to end.
  pub async fn stop(&self) {
    let old = std::mem::take(&mut *self.0.lock().expect("background"));
    old.token.cancel();
    old.tracker.close();
    old.tracker.wait().await;
  }
}

/// Async locks by key whose entries live only while someone holds or waits for them, so a map
/// keyed by container or image does not grow with every container the process ever saw.
pub struct KeyedLocks<K>(Mutex<HashMap<K, LockEntry>>);

/// A key's lock and how many hold or wait for it.
type LockEntry = (Arc<tokio::sync::Mutex<()>>, usize);

impl<K> Default for KeyedLocks<K> {
  fn default() -> Self {
    Self(Mutex::new(HashMap::new()))
  }
}

impl<K: Eq + Hash + Clone> KeyedLocks<K> {
  /// Waits for the lock of `key`. Cancel-safe: a waiter dropped early leaves no entry behind.
  pub async fn lock(&self, key: K) -> KeyedGuard<'_, K> {
    let mutex = {
      let mut map = self.0.lock().expect("keyed locks");
      let entry = map.entry(key.clone()).or_default();
      entry.1 += 1;
      entry.0.clone()
    };
    // Counted before the wait, so the entry is uncounted by `Drop` however the wait ends.
    let mut guard = KeyedGuard {
      locks: self,
      key,
      held: None,
    };
    guard.held = Some(mutex.lock_owned().await);
    guard
  }

  /// Keys held or waited for now.
  pub fn len(&self) -> usize {
    self.0.lock().expect("keyed locks").len()
  }

  pub fn is_empty(&self) -> bool {
    self.len() == 0
  }
}

/// Holds one key's lock; the entry goes when its last holder or waiter is done.
pub struct KeyedGuard<'a, K: Eq + Hash> {
  locks: &'a KeyedLocks<K>,
  key: K,
  held: Option<OwnedMutexGuard<()>>,
}

impl<K: Eq + Hash> Drop for KeyedGuard<'_, K> {
  fn drop(&mut self) {
    self.held.take();
    let mut map = self.locks.0.lock().expect("keyed locks");
    if let Some(entry) = map.get_mut(&self.key) {
      entry.1 -= 1;
      if entry.1 == 0 {
        map.remove(&self.key);
      }
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use std::time::Duration;

  #[tokio::test]
  async fn keyed_locks_drop_their_entries() {
    let locks = Arc::new(KeyedLocks::<String>::default());
    let first = locks.lock("a".into()).await;
    assert_eq!(locks.len(), 1);
    let waiter = {
      let locks = locks.clone();
      tokio::spawn(async move {
        let _g = locks.lock("a".into()).await;
      })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
      !waiter.is_finished(),
      "the second holder waits for the first"
    );
    drop(first);
    waiter.await.unwrap();
    assert_eq!(locks.len(), 0);
    for i in 0..100 {
      let _g = locks.lock(format!("c{i}")).await;
    }
    assert_eq!(locks.len(), 0);
  }

  #[tokio::test]
  async fn a_cancelled_waiter_leaves_no_entry() {
    let locks = KeyedLocks::<u32>::default();
    let held = locks.lock(1).await;
    let gave_up = tokio::time::timeout(Duration::from_millis(10), locks.lock(1)).await;
    assert!(gave_up.is_err());
    assert_eq!(locks.len(), 1);
    drop(held);
    assert_eq!(locks.len(), 0);
  }

  #[tokio::test]
  async fn stopping_cancels_and_awaits_tasks() {
    let shared = Arc::new(EngineShared::default());
    let (a, b) = (Hold::new(&shared), Hold::new(&shared));
    let finished = Arc::new(AtomicUsize::new(0));
    let f = finished.clone();
    shared.background.spawn(|token| async move {
      token.cancelled().await;
      // A clean-up that runs after cancellation is awaited too.
      tokio::time::sleep(Duration::from_millis(20)).await;
      f.fetch_add(1, Ordering::SeqCst);
    });
    shared
      .background
      .spawn_cancellable(tokio::time::sleep(Duration::from_secs(3600)));
    assert_eq!(shared.stats().background_tasks, 2);
    a.release().await;
    assert_eq!(shared.stats().background_tasks, 2, "one provider is left");
    b.release().await;
    assert_eq!(shared.stats().background_tasks, 0);
    assert_eq!(shared.stats().providers, 0);
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    // The engine stays usable after a stop.
    shared
      .background
      .spawn_cancellable(tokio::time::sleep(Duration::from_secs(3600)));
    assert_eq!(shared.stats().background_tasks, 1);
    shared.background.stop().await;
  }

  #[test]
  fn states_are_kept_by_type() {
    #[derive(Default)]
    struct A(Mutex<u32>);
    #[derive(Default)]
    struct B;
    let shared = EngineShared::default();
    assert!(shared.peek::<A>().is_none());
    *shared.state::<A>().0.lock().unwrap() = 7;
    assert_eq!(*shared.state::<A>().0.lock().unwrap(), 7);
    assert!(shared.peek::<B>().is_none());
    assert!(shared.peek::<A>().is_some());
  }

  #[test]
  fn dropping_a_hold_only_uncounts() {
    let shared = Arc::new(EngineShared::default());
    drop(Hold::new(&shared));
    assert_eq!(shared.stats().providers, 0);
  }
}
