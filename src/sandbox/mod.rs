//! One sandbox's container: finding, starting and removing it, running commands and moving
//! files in it, and its layout.

pub mod agent;
pub mod body;
pub mod container;
pub mod create;
pub mod devices;
pub mod exec;
#[cfg(test)]
mod fuzz_tests;
pub mod layout;
pub mod network;
pub mod ours;
pub mod output;
pub mod owner;
pub mod swap;
pub mod transfer;
