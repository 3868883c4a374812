//! Image readiness. `buildImage()` pulls the configured image or builds it from a context, in
//! the background, one pull or build per image per process however many callers;
//! `getImageBuildStatus()` only reads: the engine's images, the work this process has in flight,
//! and its outcome. A ready image is probed once for what TrueForge's skill init needs.

pub mod context;
pub mod ensure;
pub mod probe;
pub mod source;
pub mod work;

pub use ensure::{build, ensure, status};
pub use probe::{probe, Probe};
pub use source::{source, ImageSource};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use bollard::models::ImageInspect;

use crate::engine::Engine;
use crate::images::ensure::Work;
use crate::util::errors::Result;

/// The three states TrueForge's settings page knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
  Pending,
  Ready,
  Failed,
}

impl BuildStatus {
  pub fn as_str(self) -> &'static str {
    match self {
      BuildStatus::Pending => "pending",
      BuildStatus::Ready => "ready",
      BuildStatus::Failed => "failed",
    }
  }
}

/// What `buildImage()` and `getImageBuildStatus()` return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
  pub status: BuildStatus,
  pub reason: Option<String>,
  pub metadata: Option<BTreeMap<String, String>>,
}

/// Per-engine state (kept per engine: `EngineShared::state`).
#[derive(Default)]
pub struct State {
  /// Pulls and builds this process runs or ran, by image reference.
  pub(crate) works: Mutex<HashMap<String, Work>>,
  /// Probe results by image id (an image id never changes content).
  pub(crate) probes: Mutex<HashMap<String, Probe>>,
  /// One probe at a time per image id; entries go when the probe is done.
  pub probe_locks: crate::engine::runtime::KeyedLocks<String>,
  /// (reference, image id) pairs whose shortcomings were logged already.
  pub(crate) warned: Mutex<HashSet<(String, String)>>,
}

impl State {
  /// Pulls and builds remembered (running or failed).
  pub fn works(&self) -> usize {
    self.works.lock().expect("works").len()
  }

  /// Images probed.
  pub fn probes(&self) -> usize {
    self.probes.lock().expect("probes").len()
  }
}

/// The image's inspect data when present; `None` when the engine does not have it.
pub async fn present(engine: &Engine, image: &str) -> Result<Option<ImageInspect>> {
  engine.inspect_image(image).await
}
