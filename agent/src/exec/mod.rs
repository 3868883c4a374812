//! Commands: the request handler (`command`), the per-command supervisor (`shepherd`), forked
//! or kept ready ahead of its command (`spare`), how a command's processes stay findable for
//! its timeout (`contain`), and the recovery of a sandbox out of processes (`recover`).

pub mod command;
pub mod contain;
pub mod recover;
pub mod shepherd;
pub mod spare;
