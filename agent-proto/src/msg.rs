//! The JSON messages carried by `Hello`, `Open`, `Head` and `Result` frames. Field names are
//! the wire names; unknown fields are ignored so either side may add optional ones.

use serde::{Deserialize, Serialize};

/// Name the agent gives in its hello.
pub const AGENT_NAME: &str = "trueforge-agent";
/// Prepended to every command's `PATH` (where `mcp-client` lives).
pub const BIN_DIR: &str = "/trueforge/codemode/bin";
/// `PATH` when neither the caller nor the container gives one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Root-owned file whose mtime the agent refreshes on host calls (see `LayoutSpec`). In the
/// sticky /tmp, so a sandbox user can neither remove it nor put a file of its own in its place.
pub const ACTIVITY_FILE: &str = "/tmp/.trueforge-agent-activity";
/// Code Mode calls the agent carries at once; more connections wait in the agent. As many as a
/// client's `asyncio.gather` of a few dozen calls needs: the host's memory is bounded by what
/// it admits (each call's size comes before its bytes), not by this count.
pub const MAX_CODE_MODE_CALLS: usize = 64;
/// Exit code of a command killed by its timeout (as coreutils `timeout`).
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// The agent's first frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
  /// Always `AGENT_NAME`.
  pub agent: String,
  /// The agent's package version; the host replaces an agent of another one.
  pub version: String,
  /// The wire protocol revision (`crate::PROTOCOL`).
  pub protocol: u32,
  /// The agent's pid inside the container.
  pub pid: u32,
  /// The agent's effective uid (0 unless started as another user).
  pub uid: u32,
  /// `x86_64` or `aarch64`.
  pub arch: String,
  /// The agent's effective capabilities (`CapEff`), so the host can tell why users cannot be
  /// switched (a container without SETUID/SETGID/KILL).
  pub cap_eff: u64,
  /// Whether `openat2` works here (else paths are resolved one component at a time).
  pub openat2: bool,
  /// Whether the agent could become a child subreaper. Without it (qemu-user does not emulate
  /// it) a timed-out command's escaped processes cannot be found, so kills are never verified.
  #[serde(default)]
  pub subreaper: bool,
  /// Without a subreaper (gVisor), whether commands are kept in their sessions instead (a
  /// seccomp filter answers `setsid` without effect), which keeps timeout kills complete.
  #[serde(default)]
  pub session_guard: bool,
  /// Whether file work switches only the filesystem ids (`setfsuid`); else (gVisor) a worker
  /// thread takes the user's effective ids for the duration.
  #[serde(default)]
  pub fs_ids: bool,
}

/// A request the host opens a stream with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
  /// Answered at once with `PingInfo`; not counted as activity.
  Ping,
  /// Runs a command. The agent sends its merged output as `Data` and then `ExecDone`.
  Exec(ExecSpec),
  /// Writes a file from the `Data` the host sends (then `End`); answers `UploadDone`.
  Upload(UploadSpec),
  /// Prepares a write whose bytes the engine's archive endpoint delivers: `Head` (`StagedHead`,
  /// where the host puts them) or a `Result` saying it declined; after the host's `End`, moves
  /// the file into place and answers `StagedDone`.
  UploadStaged(StagedUploadSpec),
  /// Reads a file: `Head` (`DownloadHead`), `Data`, then `DownloadDone`.
  Download(DownloadSpec),
  /// Answers `Option<StatInfo>` (`null` when the path does not exist).
  Stat(StatSpec),
  /// Makes directories (and links) as root with the owners and modes given; answers `null`.
  Layout(LayoutSpec),
  /// Starts a Code Mode relay socket; answers `null`. Calls arrive as agent streams.
  CodeModeListen(CodeModeListenSpec),
  /// Closes a relay socket and removes it; answers `null`.
  CodeModeClose { socket: String },
  /// Answers `ActivityInfo`; not counted as activity.
  Activity,
  /// Listens on a loopback TCP port for the sandbox's outbound connections; answers `null`.
  /// Each connection arrives as an agent stream (`AgentRequest::EgressConnect`).
  EgressListen(EgressListenSpec),
  /// Stops listening (connections in flight go on); answers `null`.
  EgressClose,
}

/// A stream the agent opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AgentRequest {
  /// One Code Mode request from a client of `socket`: the agent sends the request bytes as
  /// `Data` then `End`; the host answers with the reply bytes as `Data`, then `Result` (`null`,
  /// or an error the client receives as a transport error). `size` is the request's length: the
  /// agent has the whole request before it opens the stream, so the host can decide whether it
  /// has room for it before reading a byte.
  CodeModeCall {
    socket: String,
    #[serde(default)]
    size: Option<u64>,
  },
  /// A connection accepted on the egress port: its bytes both ways as `Data`, uninterpreted.
  /// The agent sends `End` when the client shuts its write side and `Cancel` if its socket
  /// fails; the host's `End` shuts the socket's write side, and its `Result` closes the socket
  /// (`null`: gracefully; an error: reset). The agent's data on it is limited to the listen's
  /// `window`, not `WINDOW`.
  EgressConnect {
    /// The listening port the client connected to.
    port: u16,
    /// The client's address, `127.0.0.1:54321` or `[::1]:54321`.
    peer: String,
  },
}

/// The loopback port of the sandbox's egress proxy, and how much each connection may hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressListenSpec {
  /// Bound on 127.0.0.1 (required) and [::1] (where the sandbox has it); not 0.
  pub port: u16,
  /// Bytes of a connection's data the agent sends before the host grants more (1 to
  /// `frame::WINDOW`): what the host holds per connection at most.
  pub window: u32,
  /// Connections carried at once; more are accepted and reset at once (at least 1).
  pub max_connections: u32,
}

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
  /// Run with `bash -c` when bash is on `PATH`, else `sh -c`.
  pub command: String,
  /// Absolute working directory; missing → exit 1 and a message in the output.
  pub cwd: String,
  /// Added to the container's environment (and override it), in order.
  #[serde(default)]
  pub env: Vec<(String, String)>,
  /// `name`, `uid`, `name:group`, `uid:gid` … as `docker exec -u`; `None` = root.
  #[serde(default)]
  pub user: Option<String>,
  /// 0 = no timeout.
  #[serde(default)]
  pub timeout_ms: u64,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecDone {
  /// From `waitpid`: the exit status, or 128 + signal; `TIMEOUT_EXIT_CODE` on a timeout.
  pub exit_code: i32,
  /// The timeout fired and every process the command started was verified killed. (An
  /// unverified kill is an error of kind `KillUnverified`, never a result.)
  #[serde(default)]
  pub timed_out: bool,
  /// The sandbox was out of processes: the agent killed the workload first (files kept).
  #[serde(default)]
  pub recovered: Option<String>,
}

/// A file to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadSpec {
  /// Absolute path of the file.
  pub path: String,
  /// Whose credentials the file is written with (and who owns it); `None` = root.
  #[serde(default)]
  pub user: Option<String>,
  /// Permission bits of the new file. Default 0644.
  #[serde(default = "default_file_mode")]
  pub mode: u32,
  /// Refuse (and leave nothing behind) past this many bytes.
  #[serde(default)]
  pub max_bytes: Option<u64>,
  /// Create missing parents (mode 0755, owned by the user). Default true.
  #[serde(default = "yes")]
  pub parents: bool,
}

/// What an upload wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadDone {
  pub size: u64,
}

/// A write delivered through the engine's archive endpoint into a directory only root may
/// enter, then moved into place by the agent as the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedUploadSpec {
  /// Absolute path of the file.
  pub path: String,
  #[serde(default)]
  pub user: Option<String>,
  #[serde(default = "default_file_mode")]
  pub mode: u32,
  #[serde(default = "yes")]
  pub parents: bool,
  /// The exact size the host will put.
  pub size: u64,
  /// The staging directory, absolute; `None`: `/.trueforge-staging`. Its parent must be root's
  /// and writable by no one else (the tests stage in a directory of their own).
  #[serde(default)]
  pub staging: Option<String>,
}

/// Where the host puts a staged write: the archive's directory and its one entry's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedHead {
  pub dir: String,
  pub name: String,
}

/// The end of a staged write: the size placed, or why the agent would not stage it (the host
/// then sends the bytes on the stream with `upload`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedDone {
  #[serde(default)]
  pub size: u64,
  #[serde(default)]
  pub declined: Option<String>,
}

/// A file to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadSpec {
  /// Absolute path; links are followed (with the user's permissions), magic links are not.
  pub path: String,
  #[serde(default)]
  pub user: Option<String>,
  /// Larger files are refused before any byte is sent.
  pub max_bytes: u64,
}

/// Sent before a download's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadHead {
  /// The size when opened (the data that follows has exactly this many bytes, or the download
  /// fails with `Changed`).
  pub size: u64,
  /// Permission bits.
  pub mode: u32,
  pub mtime_ms: i64,
}

/// The end of a download.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadDone {
  pub size: u64,
}

/// A path to look at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatSpec {
  pub path: String,
  #[serde(default)]
  pub user: Option<String>,
  /// Follow a final symbolic link (`stat`) or describe the link itself (`lstat`).
  #[serde(default)]
  pub follow: bool,
}

/// The kind of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
  File,
  Directory,
  Symlink,
  CharDevice,
  BlockDevice,
  Fifo,
  Socket,
  /// A file of one of the kernel's file systems (/proc, /sys …), reached through a link: shown
  /// as regular, but empty or of a made-up size, and often refusing to be read.
  KernelFile,
  Unknown,
}

impl FileKind {
  /// The kind's name in messages ("named pipe", "character device", …).
  pub fn describe(self) -> &'static str {
    match self {
      FileKind::File => "regular file",
      FileKind::Directory => "directory",
      FileKind::Symlink => "symlink",
      FileKind::CharDevice => "character device",
      FileKind::BlockDevice => "block device",
      FileKind::Fifo => "named pipe",
      FileKind::Socket => "socket",
      FileKind::KernelFile => "kernel file, as in /proc or /sys",
      FileKind::Unknown => "irregular file",
    }
  }
}

/// What `Stat` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatInfo {
  pub kind: FileKind,
  pub size: u64,
  /// Permission bits (with setuid, setgid, sticky).
  pub mode: u32,
  pub uid: u32,
  pub gid: u32,
  pub mtime_ms: i64,
  /// The link's text, for a symlink not followed.
  #[serde(default)]
  pub link_target: Option<String>,
}

/// Directories to make as root, each then given its owner and mode, without following a
/// symbolic link anywhere in their paths; plus the activity file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutSpec {
  pub dirs: Vec<LayoutDir>,
  /// Owner of the directories marked `user_owned` (`docker exec -u` syntax); `None` = root.
  #[serde(default)]
  pub user: Option<String>,
  /// Symbolic links to make or replace, after the directories.
  #[serde(default)]
  pub links: Vec<LayoutLink>,
  /// Create `ACTIVITY_FILE` (root-owned, 0644) so host calls can be recorded. Default true.
  #[serde(default = "yes")]
  pub activity_file: bool,
}

/// One layout directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutDir {
  pub path: String,
  /// Default 0755.
  #[serde(default = "default_dir_mode")]
  pub mode: u32,
  /// Owned by `LayoutSpec::user` (else root). Default true.
  #[serde(default = "yes")]
  pub user_owned: bool,
}

/// One layout link: `path` → `target`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutLink {
  pub path: String,
  pub target: String,
}

/// A Code Mode relay socket to open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeModeListenSpec {
  /// Absolute socket path (its directory is made 0700, the socket 0600, both the user's).
  pub socket: String,
  #[serde(default)]
  pub user: Option<String>,
}

/// The answer to `Ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingInfo {
  pub uptime_ms: u64,
  /// Egress connections reset unopened because `max_connections` were in flight.
  #[serde(default)]
  pub egress_turned_away: u64,
}

/// The answer to `Activity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityInfo {
  /// Wall-clock time of the last host call that counts (anything but `Ping`/`Activity`).
  pub last_call_unix_ms: Option<i64>,
  /// Milliseconds since then (monotonic).
  pub idle_ms: Option<u64>,
  /// Commands running now (they count as activity too).
  pub running: u32,
}

fn default_file_mode() -> u32 {
  0o644
}

fn default_dir_mode() -> u32 {
  0o755
}

fn yes() -> bool {
  true
}

/// A `Result` frame's payload: `{"ok": value}` or `{"err": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome<T> {
  Ok(T),
  Err(AgentError),
}

impl<T> From<Result<T, AgentError>> for Outcome<T> {
  fn from(r: Result<T, AgentError>) -> Self {
    match r {
      Ok(v) => Outcome::Ok(v),
      Err(e) => Outcome::Err(e),
    }
  }
}

impl<T> From<Outcome<T>> for Result<T, AgentError> {
  fn from(o: Outcome<T>) -> Self {
    match o {
      Outcome::Ok(v) => Ok(v),
      Outcome::Err(e) => Err(e),
    }
  }
}

/// A failure the agent reports for one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
  pub kind: ErrorKind,
  /// For the user: what failed, on which path, and why.
  pub message: String,
  /// `NotRegularFile`: the file's kind.
  #[serde(default, skip_serializing_if = "Option::is_none")]
  pub file_kind: Option<FileKind>,
  /// `TooLarge`: the size found (or read so far) and the cap.
  #[serde(default, skip_serializing_if = "Option::is_none")]
  pub size: Option<u64>,
  #[serde(default, skip_serializing_if = "Option::is_none")]
  pub max: Option<u64>,
}

impl AgentError {
  pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
    Self {
      kind,
      message: message.into(),
      file_kind: None,
      size: None,
      max: None,
    }
  }
}

/// Failure classes, stable on the wire (snake_case names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
  /// The path (or a parent) does not exist.
  NotFound,
  /// The path is a directory where a file was expected.
  IsDirectory,
  /// A FIFO, device, socket … (`file_kind` says which); never opened for reading.
  NotRegularFile,
  /// A parent of the path is not a directory.
  NotADirectory,
  /// Over the cap (`size`, `max`).
  TooLarge,
  /// The user's permissions do not allow it.
  PermissionDenied,
  /// A read-only file system.
  ReadOnly,
  /// The target is a mount point or otherwise busy (the engine bind-mounts `/etc/hosts`).
  Busy,
  /// The file changed while it was read.
  Changed,
  /// No space left (or quota).
  NoSpace,
  /// A path the agent refuses (relative, NUL, a magic link, a symbolic link loop …).
  InvalidPath,
  /// The request itself is malformed.
  InvalidRequest,
  /// The user spec names no user or group in the container's /etc/passwd or /etc/group.
  UnknownUser,
  /// The command could not start (no shell, the user could not be switched to …).
  SpawnFailed,
  /// The command's supervisor died before it reported how the command ended (the message says
  /// whether the command had started): the command may or may not have run.
  SupervisorLost,
  /// The sandbox is out of processes even after the agent killed the workload.
  OutOfProcesses,
  /// The timeout fired but not every process could be verified killed.
  KillUnverified,
  /// The egress port is taken: something in the sandbox already listens on it.
  AddressInUse,
  /// Another failure of the system (`message` has the OS error).
  Io,
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn requests_are_tagged_by_op() {
    let r: Request = serde_json::from_str(r#"{"op":"ping"}"#).unwrap();
    assert_eq!(r, Request::Ping);
    let r: Request =
      serde_json::from_str(r#"{"op":"upload","path":"/w/a","future_field":1,"max_bytes":5}"#)
        .unwrap();
    assert_eq!(
      r,
      Request::Upload(UploadSpec {
        path: "/w/a".into(),
        user: None,
        mode: 0o644,
        max_bytes: Some(5),
        parents: true,
      })
    );
    let s = serde_json::to_string(&Request::CodeModeClose {
      socket: "/s".into(),
    })
    .unwrap();
    assert_eq!(s, r#"{"op":"code_mode_close","socket":"/s"}"#);
    let r: Request = serde_json::from_str(
      r#"{"op":"egress_listen","port":3128,"window":65536,"max_connections":256}"#,
    )
    .unwrap();
    assert_eq!(
      r,
      Request::EgressListen(EgressListenSpec {
        port: 3128,
        window: 65536,
        max_connections: 256,
      })
    );
    let s = serde_json::to_string(&AgentRequest::EgressConnect {
      port: 3128,
      peer: "127.0.0.1:54321".into(),
    })
    .unwrap();
    assert_eq!(
      s,
      r#"{"op":"egress_connect","port":3128,"peer":"127.0.0.1:54321"}"#
    );
  }

  #[test]
  fn outcomes_are_ok_or_err() {
    let o: Outcome<UploadDone> = Outcome::Ok(UploadDone { size: 3 });
    assert_eq!(serde_json::to_string(&o).unwrap(), r#"{"ok":{"size":3}}"#);
    let e: Outcome<()> = Outcome::Err(AgentError::new(ErrorKind::Busy, "busy"));
    assert_eq!(
      serde_json::to_string(&e).unwrap(),
      r#"{"err":{"kind":"busy","message":"busy"}}"#
    );
    let back: Outcome<()> = serde_json::from_str(r#"{"ok":null}"#).unwrap();
    assert_eq!(back, Outcome::Ok(()));
  }
}
