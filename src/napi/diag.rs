//! Diagnostics: what one engine connection holds in this process. The one place that reads
//! every module's per-engine state.

use napi::Env;
use napi_derive::napi;

use crate::engine::Engine;
use crate::fleet::{pool, reaper};
use crate::images;
use crate::napi::js::to_js;
use crate::sandbox::{agent, container};

/// Counts of what one engine connection holds in this process, for tests and diagnostics.
#[napi(object)]
pub struct NativeEngineStats {
  /// Providers that made a call on the engine and are not disposed.
  pub providers: u32,
  /// Background tasks running (pool refills, image work, reapers, clean-ups …).
  pub background_tasks: u32,
  /// Containers with a start in progress or waited for.
  pub start_locks: u32,
  /// Images with a probe in progress or waited for.
  pub probe_locks: u32,
  /// Containers cached as ours.
  pub cached_targets: u32,
  /// Images probed.
  pub probes: u32,
  /// Pulls and builds remembered (running or failed).
  pub image_works: u32,
  /// Warm-pool refills in flight.
  pub pool_refills: u32,
  /// Namespaces with a live background reaper.
  pub reaper_leases: u32,
  /// Containers with a live in-sandbox agent connection (or one starting).
  pub agent_connections: u32,
  /// Of those, the agents linked to this process through a socket (their traffic bypasses the
  /// engine).
  pub linked_agents: u32,
}

impl NativeEngineStats {
  /// Reads every module's state of `engine` (making none that no call made).
  fn of(engine: &Engine) -> Self {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    let shared = &engine.shared;
    let own = shared.stats();
    let containers = shared.peek::<container::State>();
    let works = shared.peek::<images::Works>();
    let probes = shared.peek::<images::Probes>();
    Self {
      providers: n(own.providers),
      background_tasks: n(own.background_tasks),
      start_locks: n(containers.as_ref().map_or(0, |c| c.start_locks.len())),
      probe_locks: n(probes.as_ref().map_or(0, |i| i.probe_locks.len())),
      cached_targets: n(containers.as_ref().map_or(0, |c| c.cached())),
      probes: n(probes.as_ref().map_or(0, |i| i.probes())),
      image_works: n(works.as_ref().map_or(0, |i| i.works())),
      pool_refills: n(shared.peek::<pool::State>().map_or(0, |p| p.refills())),
      reaper_leases: n(shared.peek::<reaper::State>().map_or(0, |r| r.leases())),
      agent_connections: n(shared
        .peek::<agent::conn::Conns>()
        .map_or(0, |a| a.connections())),
      linked_agents: n(shared
        .peek::<agent::conn::Conns>()
        .map_or(0, |a| a.linked())),
    }
  }
}

/// What the engine at `dockerHost` (default: as a provider without one picks it; reached
/// without TLS options) holds in this process; null when this process has not connected to it.
#[napi]
pub fn engine_stats(
  env: &Env,
  docker_host: Option<String>,
) -> napi::Result<Option<NativeEngineStats>> {
  let endpoint =
    crate::engine::effective_endpoint(docker_host.as_deref(), None).map_err(|e| to_js(env, e))?;
  Ok(crate::engine::connected(&endpoint).map(|e| NativeEngineStats::of(&e)))
}
