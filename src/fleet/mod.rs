//! Many sandboxes at once: the warm pool, the reaper, and the `ls`/`rm` commands.

pub mod admin;
pub mod pool;
pub mod reaper;
