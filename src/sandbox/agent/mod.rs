//! The in-sandbox agent, host side: what a container's inspect data says of it (`facts`), the
//! binaries the package ships (`binaries`), the engine's read-only volume holding them and their
//! placement in sandboxes made without it (`volume`, `place`), one connection per container per
//! process (`conn`), started or found again by `connect`, what is asked of it (`ops`, `egress`),
//! sandboxes it cannot serve (`down`), and the activity the idle stop must see when the agent
//! cannot record it (`activity`). The agent itself and its protocol are `agent/` and
//! `agent-proto/` in this workspace.

pub mod activity;
pub mod binaries;
pub mod conn;
pub mod connect;
pub mod down;
pub mod egress;
pub mod facts;
pub mod link;
pub mod ops;
pub mod place;
pub mod volume;

pub use binaries::{Arch, Binaries, Setup};
pub use conn::{Conn, Failure};
pub use connect::{connect, restarted};
pub use facts::{is_agent_volume, sandbox_user, Facts};
