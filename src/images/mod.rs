//! Image readiness. `buildImage()` pulls the configured image or builds it from a context, in
//! the background, one pull or build per image per process however many callers;
//! `getImageBuildStatus()` only reads: the engine's images, the work this process has in flight,
//! and its outcome. A ready image is probed once for what TrueForge's skill init needs.

pub mod context;
pub mod ensure;
pub mod probe;
pub mod source;
pub mod work;

pub use ensure::{build, ensure, present, status, Build, BuildStatus, Works};
pub use probe::{probe, Probe, Probes};
pub use source::{source, ImageSource};
