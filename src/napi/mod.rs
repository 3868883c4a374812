//! The napi layer: converts JavaScript values to the core's types and the core's errors to
//! JavaScript errors carrying a stable code. No behaviour lives here.

pub mod admin;
pub mod diag;
pub mod js;
pub mod provider;
pub mod start;
