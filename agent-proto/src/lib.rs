//! The protocol between the TrueForge Docker sandbox provider (the host) and its in-sandbox
//! agent, spoken over the agent's stdin and stdout (an attached engine exec): id-tagged,
//! length-prefixed frames (`frame`), JSON control messages (`msg`), per-stream credit so one slow
//! reader cannot stall the others, and a version handshake. `PROTOCOL.md` describes the wire
//! format. With the `client` feature, `client::AgentClient` is the host's side.

pub mod codemode;
pub mod frame;
pub mod msg;
pub mod output;

#[cfg(feature = "client")]
pub mod client;

/// The package version both sides carry; a host replaces an agent that reports another one.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The wire protocol revision, bumped on any incompatible change.
pub const PROTOCOL: u32 = 1;

#[cfg(test)]
mod tests {
  /// The agent is replaced when its version differs from the host's, so the protocol crate
  /// (whose version the agent reports) must carry the addon's version.
  #[test]
  fn the_version_is_the_addons() {
    let root = include_str!("../../Cargo.toml");
    let package = root.split("[package]").nth(1).expect("[package]");
    let version = package
      .lines()
      .find_map(|l| l.strip_prefix("version = "))
      .expect("version")
      .trim_matches('"');
    assert_eq!(version, super::VERSION);
  }
}
