//! Exclusive GPUs (`gpus: { count, exclusive: true }`): each sandbox gets GPUs that no other
//! running sandbox on the engine holds, whichever process or provider made it. `inventory` finds
//! the GPUs to hand out, `lock` serialises choosing them across processes, `alloc` creates a
//! sandbox on free ones, `relocate` starts a stopped one again (on its own GPUs when free, else
//! on others: a move). `GpuPlacement` is how the sandbox layer reaches all of it.

pub mod alloc;
pub mod inventory;
pub mod lock;
pub mod relocate;

use bollard::models::ContainerInspectResponse;
use futures_util::future::BoxFuture;

use crate::engine::Engine;
use crate::sandbox::container::{Placement, Plain, Target};
use crate::sandbox::devices::gpus_of;
use crate::util::errors::Result;
use crate::util::logging::Logger;

pub use relocate::{ImageFn, StartSettings};

/// Starts and removes exclusive-GPU sandboxes under the engine's GPU lock, and every other
/// container plainly; which one a container is comes from its label, since any provider of a
/// namespace can meet a sandbox another one made.
pub struct GpuPlacement {
  start: Option<StartSettings>,
}

impl GpuPlacement {
  /// A provider's placement.
  pub fn new(start: StartSettings) -> Self {
    Self { start: Some(start) }
  }

  /// For callers that only remove (`rm`, the reaper): a start through it is the plain one.
  pub fn removal_only() -> Self {
    Self { start: None }
  }
}

impl Placement for GpuPlacement {
  fn start<'a>(
    &'a self,
    engine: &'a Engine,
    target: &'a Target,
    info: &'a ContainerInspectResponse,
    log: &'a Logger,
  ) -> BoxFuture<'a, Result<()>> {
    match (&self.start, gpus_of(info)) {
      (Some(settings), Some(_)) => {
        Box::pin(relocate::start_exclusive(engine, settings, target, log))
      }
      _ => Plain.start(engine, target, info, log),
    }
  }

  fn remove<'a>(
    &'a self,
    engine: &'a Engine,
    target: &'a Target,
    force: bool,
    log: &'a Logger,
  ) -> BoxFuture<'a, Result<bool>> {
    if target.exclusive_gpus {
      Box::pin(relocate::remove_exclusive(engine, target, force, log))
    } else {
      Plain.remove(engine, target, force, log)
    }
  }
}
