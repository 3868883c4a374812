//! Code Mode: MCP tools callable from inside a sandbox. A small relay (`codemode/relay.py`)
//! runs in the container, started through the engine's exec API with stdin and stdout
//! attached; it listens on an owner-only Unix socket under `/trueforge/codemode/run` and
//! carries each connection's request to us over the attached stream, and our reply back, in
//! frames of a 9-byte header (kind u8, request id u32, payload length u32, big endian) and a
//! payload. No host path is mounted and no port is opened, so it works on remote engines, with
//! `network: 'none'`, a read-only root and any user. The relay is not a command: it is not run
//! through the exec wrapper, is not killed by command timeouts and does not count as activity.
//! It ends when its stream closes; a dead relay is relaunched by the next `Session::start`.
//! No napi types here.

pub mod budget;
pub mod by_agent;
pub mod frame;
pub mod intake;
#[cfg(unix)]
pub mod lane;
pub mod meter;
mod reader;
pub mod relay;
pub mod session;

pub use budget::{Budget, Pool};
pub use by_agent::Served;
pub use intake::{Intake, Request, RequestSink};
pub use relay::{launch, Relay};
pub use session::{Launcher, Liveness, Session};

/// Where everything Code Mode puts in a sandbox lives.
pub const DIR: &str = "/trueforge/codemode";
/// The client module TrueForge installs (its name is fixed: `from mcp_client import call_tool`).
pub const CLIENT_PATH: &str = "/trueforge/codemode/mcp_client.py";
/// `<dir>/bin`, where TrueForge links `mcp-client`; every exec has it first on `PATH`.
pub const BIN_DIR: &str = crate::sandbox::layout::CODE_MODE_BIN_DIR;
/// The relay, uploaded before each launch.
pub const RELAY_PATH: &str = "/trueforge/codemode/relay.py";
/// The relays' sockets (mode 0700, each socket 0600).
pub const SOCKET_DIR: &str = "/trueforge/codemode/run";

pub const RELAY_SOURCE: &str = include_str!("../../codemode/relay.py");
pub const CLIENT_SOURCE: &str = include_str!("../../codemode/mcp_client.py");

/// Largest request or reply, as TrueForge's own transports allow.
pub use trueforge_agent_proto::codemode::MAX_MESSAGE_BYTES;

/// $1 = the socket path. Fails fast (exit 127, a message on stderr) without python3.
pub(crate) const LAUNCHER: &str = r#"if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 is not on PATH in this sandbox image; Code Mode needs Python 3.9 or later" >&2
  exit 127
fi
exec python3 -I -S /trueforge/codemode/relay.py "$1""#;

#[cfg(test)]
mod tests {
  use super::*;
  use crate::codemode::frame::{KIND_READY, KIND_REPLY, KIND_REQUEST};

  /// The value of `NAME = a * b * …` in a Python source.
  fn py_product(source: &str, name: &str) -> usize {
    let line = source
      .lines()
      .find_map(|l| l.strip_prefix(&format!("{name} = ")))
      .unwrap_or_else(|| panic!("{name} is not assigned"));
    line
      .split('*')
      .map(|f| f.trim().parse::<usize>().expect("a product of integers"))
      .product()
  }

  /// The Python relay and client speak the frames and limits the agent's protocol defines.
  #[test]
  fn the_python_sides_carry_the_protocols_values() {
    use trueforge_agent_proto::codemode::{HEADER_LEN, REPLY_ENVELOPE_BYTES};
    for source in [RELAY_SOURCE, CLIENT_SOURCE] {
      assert_eq!(py_product(source, "MAX_MESSAGE_BYTES"), MAX_MESSAGE_BYTES);
    }
    assert!(RELAY_SOURCE.contains("HEADER = struct.Struct(\">BII\")"));
    assert_eq!(1 + 4 + 4, HEADER_LEN);
    let kinds = format!("READY, REQUEST, REPLY = {KIND_READY}, {KIND_REQUEST}, {KIND_REPLY}");
    assert!(RELAY_SOURCE.contains(&kinds), "{kinds}");
    let envelope = format!("MAX_MESSAGE_BYTES + {REPLY_ENVELOPE_BYTES}");
    assert!(RELAY_SOURCE.contains(&envelope), "{envelope}");
  }

  #[test]
  fn relay_script_matches_the_paths() {
    assert!(LAUNCHER.contains(RELAY_PATH));
    assert!(CLIENT_PATH.ends_with("/mcp_client.py"));
    assert_eq!(format!("{DIR}/bin"), BIN_DIR);
  }
}
