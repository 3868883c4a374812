//! What every other folder stands on and nothing here knows of them: system calls and per-thread
//! credentials (`sys`), the container's users (`users`), the threads for blocking file work
//! (`pool`) and the protocol stream with its credit (`conn`).

pub mod conn;
pub mod pool;
pub mod sys;
pub mod users;
