//! A TrueForge sandbox provider: one Docker container per agent session, driven through the
//! Docker Engine API. The engine-facing core holds no napi types; `binding` converts at the edge.

pub mod admin;
pub mod admin_binding;
pub mod binding;
pub mod client;
pub mod codemode;
pub mod config;
pub mod context;
pub mod credentials;
pub mod endpoint;
pub mod errors;
pub mod exec;
#[cfg(test)]
mod fuzz_tests;
pub mod gpu;
pub mod gpumove;
pub mod ids;
pub mod image;
pub mod imagework;
pub mod labels;
pub mod layout;
pub mod lifecycle;
pub mod logging;
pub mod options;
pub mod output;
pub mod pool;
pub mod provider;
pub mod reaper;
pub mod shared;
pub mod ssh;
pub mod timestamps;
pub mod tls;
pub mod transfer;
