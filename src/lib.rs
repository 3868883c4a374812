//! A TrueForge sandbox provider: one Docker container per agent session, driven through the
//! Docker Engine API. Folders by concern, in one direction (each uses only those before it):
//! util → {engine, egress} → config → sandbox → {images, gpu} → {fleet, codemode} → provider →
//! napi.

pub mod codemode;
pub mod config;
pub mod egress;
pub mod engine;
pub mod fleet;
pub mod gpu;
pub mod images;
pub mod napi;
pub mod provider;
pub mod sandbox;
pub mod util;
