//! What the server keeps across requests, and the context (`ctx`) that hands it to each
//! request's handler: activity for the idle timer, the relay sockets and egress listener held
//! open, the one inotify watcher, and what commands share about processes (`procs`). Each piece
//! sits here, below the handlers that fill it, so that the context can name it without the
//! handlers' folders and the context depending on each other.

pub mod activity;
pub mod ctx;
pub mod held;
pub mod procs;
pub mod watch;
