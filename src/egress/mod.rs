//! Egress under a policy (issue 31), the host's side. A sandbox has no network interface but
//! loopback; its agent listens on 127.0.0.1:3128 and carries each connection's bytes to the
//! host, where `Egress::serve` speaks the proxy protocol (HTTP CONNECT, absolute-form HTTP or
//! SOCKS5 on the one port), decides against the sandbox's policy, opens the outbound
//! connection itself and pipes the bytes.
//!
//! Decisions are made twice: on the name the client asked for (by name rules), and on every
//! address the host would connect to, so that a public name resolving to loopback, a private
//! network, the cloud's metadata service or the host itself is refused unless the operator
//! named that address (a rule within its range, or a `hosts` entry).
//!
//! Bounds per sandbox: open connections; per connection a fixed buffer each way, an idle
//! timeout and a connect deadline. No per-connection thread; the only blocking work is the
//! system resolver, on tokio's blocking pool, at most one per open connection.
//!
//! Uses nothing of the crate: no napi types, no engine calls.

mod addr;
mod dial;
mod http;
mod intake;
mod limits;
mod name;
mod outcome;
mod pipe;
mod policy;
mod proxy;
mod rule;
mod socks;
mod target;

pub use addr::host_addresses;
pub use limits::Limits;
pub use outcome::{Carried, Refusal, Served};
pub use policy::{Mode, Policy};
pub use proxy::{Egress, EgressStats, OnRefusal};

#[cfg(test)]
mod tests;
