//! How a sandbox connection ended, for the caller, the logger, and the client's reply.

use std::fmt;
use std::net::SocketAddr;

/// A connection the policy or the connection limit refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
  /// As the client named it (an IPv6 address without brackets).
  pub host: String,
  pub port: u16,
  /// What refused it: "no allow rule matches (allowed: …)", "denied by rule '…'", …
  pub reason: String,
  /// Refused for the connection limit, not by the policy.
  pub over_limit: bool,
}

impl fmt::Display for Refusal {
  /// The one line the HTTP client gets as its body, and the logger.
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let by = if self.over_limit {
      "refused"
    } else {
      "refused by the sandbox's egress policy"
    };
    if self.host.contains(':') {
      write!(
        f,
        "egress to [{}]:{} {by}: {}",
        self.host, self.port, self.reason
      )
    } else {
      write!(
        f,
        "egress to {}:{} {by}: {}",
        self.host, self.port, self.reason
      )
    }
  }
}

/// A connection the policy allowed and the host opened, once its bytes are carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
  /// As the client named it.
  pub host: String,
  pub port: u16,
  /// The address the host connected to.
  pub peer: SocketAddr,
  /// Sandbox to the outside.
  pub bytes_out: u64,
  /// The outside to the sandbox.
  pub bytes_in: u64,
  /// Why it ended other than by both sides finishing (a reset, the idle timeout): the caller
  /// should fail the sandbox's stream with it, so that its client sees an abort and does not
  /// take a cut-off reply for a whole one.
  pub broken: Option<String>,
}

/// The end of one sandbox connection. The client has had its reply (a 403, a SOCKS code, …)
/// in every case it could be sent one, so the caller finishes the sandbox's stream normally,
/// except for `Allowed` with `broken` set, where it fails the stream with that text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
  Allowed(Carried),
  Refused(Refusal),
  /// A protocol error, a name that does not resolve, a connection that failed or timed out.
  Failed(String),
}

/// Why a connection stops before its bytes are carried, with what the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stop {
  Refused(Refusal),
  Unresolved(String),
  Unreachable(String),
  ConnRefused(String),
  TimedOut(String),
  Other(String),
}

impl Stop {
  /// The HTTP status and one-line body.
  pub fn http(&self) -> (u16, String) {
    match self {
      Stop::Refused(r) if r.over_limit => (503, r.to_string()),
      Stop::Refused(r) => (403, r.to_string()),
      Stop::TimedOut(m) => (504, m.clone()),
      Stop::Unresolved(m) | Stop::Unreachable(m) | Stop::ConnRefused(m) | Stop::Other(m) => {
        (502, m.clone())
      }
    }
  }

  /// The SOCKS5 reply code.
  pub fn socks(&self) -> u8 {
    match self {
      Stop::Refused(r) if r.over_limit => 0x01,
      Stop::Refused(_) => 0x02,
      Stop::Unresolved(_) | Stop::Unreachable(_) => 0x04,
      Stop::ConnRefused(_) => 0x05,
      Stop::TimedOut(_) => 0x06,
      Stop::Other(_) => 0x01,
    }
  }

  pub fn into_served(self) -> Served {
    match self {
      Stop::Refused(r) => Served::Refused(r),
      Stop::Unresolved(m)
      | Stop::Unreachable(m)
      | Stop::ConnRefused(m)
      | Stop::TimedOut(m)
      | Stop::Other(m) => Served::Failed(m),
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn refusal_lines() {
    let r = Refusal {
      host: "evil.example".into(),
      port: 443,
      reason: "no allow rule matches (allowed: *.pkgs.example)".into(),
      over_limit: false,
    };
    assert_eq!(
      r.to_string(),
      "egress to evil.example:443 refused by the sandbox's egress policy: no allow rule \
       matches (allowed: *.pkgs.example)"
    );
    let r = Refusal {
      host: "2001:db8::1".into(),
      over_limit: true,
      reason: "busy".into(),
      ..r
    };
    assert_eq!(r.to_string(), "egress to [2001:db8::1]:443 refused: busy");
    assert_eq!(Stop::Refused(r).http().0, 503);
  }
}
