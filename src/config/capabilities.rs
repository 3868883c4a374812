//! The `capabilities` option: which Linux capabilities a sandbox may keep. Only Docker's default
//! set is allowed; every other capability is refused by name with the reason the Capabilities
//! table of docs/security.md gives (a test holds the two equal).

use crate::config::check::{bad, typed};
use crate::config::options::Given;
use crate::util::errors::Result;

/// The capabilities kept by default: what package managers (apt, pip, npm) need to install,
/// chown and switch users, plus signalling and low ports. The rest of Docker's default set is
/// dropped unless asked for.
pub const DEFAULT_CAPABILITIES: [&str; 8] = [
  "CHOWN",
  "DAC_OVERRIDE",
  "FOWNER",
  "FSETID",
  "KILL",
  "SETGID",
  "SETUID",
  "NET_BIND_SERVICE",
];

/// What a sandbox may keep: Docker's default set, none of which reaches past the container.
pub const ALLOWED_CAPABILITIES: [&str; 14] = [
  "AUDIT_WRITE",
  "CHOWN",
  "DAC_OVERRIDE",
  "FOWNER",
  "FSETID",
  "KILL",
  "MKNOD",
  "NET_BIND_SERVICE",
  "NET_RAW",
  "SETFCAP",
  "SETGID",
  "SETPCAP",
  "SETUID",
  "SYS_CHROOT",
];

/// Every other Linux capability (linux/capability.h, 0 to 40), with why a sandbox may not keep
/// it. The Capabilities table of docs/security.md lists the same, word for word.
pub const REFUSED_CAPABILITIES: [(&str, &str); 27] = [
  ("AUDIT_CONTROL", "changes or switches off the host's audit rules"),
  ("AUDIT_READ", "reads the host's audit events, other tenants' included"),
  ("BLOCK_SUSPEND", "keeps the host from suspending"),
  ("BPF", "loads BPF programs into the host kernel: kernel attack surface and kernel memory reads"),
  ("CHECKPOINT_RESTORE", "picks process ids and reads other processes' memory maps; only checkpoint tools need it"),
  ("DAC_READ_SEARCH", "bypasses read permissions and opens files by handle, which reaches host files outside the container"),
  ("IPC_LOCK", "locks memory the host can then neither swap nor reclaim"),
  ("IPC_OWNER", "bypasses the permission checks on System V IPC objects"),
  ("LEASE", "takes leases on files it does not own, stalling whoever else opens them"),
  ("LINUX_IMMUTABLE", "makes files immutable or append-only, so they can no longer be cleaned up"),
  ("MAC_ADMIN", "changes the mandatory access control policy (AppArmor, SELinux) that confines the sandbox"),
  ("MAC_OVERRIDE", "overrides mandatory access control"),
  ("NET_ADMIN", "reconfigures interfaces, routes and firewall rules: spoofing, and a way around network policy"),
  ("NET_BROADCAST", "is unused by the kernel; refused so it cannot gain a meaning later"),
  ("PERFMON", "observes the kernel and other processes through performance events: side channels"),
  ("SYSLOG", "reads the host's kernel log (other containers' events) and real kernel addresses"),
  ("SYS_ADMIN", "grants mounts, namespaces and most of the kernel's administration: the classic container escape"),
  ("SYS_BOOT", "loads a new kernel into the host (kexec)"),
  ("SYS_MODULE", "loads kernel modules: code in the host kernel"),
  ("SYS_NICE", "raises priorities and real-time scheduling, starving other tenants of CPU"),
  ("SYS_PACCT", "switches the host's process accounting on or off"),
  ("SYS_PTRACE", "traces and injects into processes, a way past seccomp and into secrets"),
  ("SYS_RAWIO", "gets raw access to I/O ports and devices: host hardware and memory"),
  ("SYS_RESOURCE", "overrides resource limits and disk quotas that protect the host"),
  ("SYS_TIME", "sets the host's clock, which is not namespaced"),
  ("SYS_TTY_CONFIG", "configures and hangs up the host's terminals"),
  ("WAKE_ALARM", "sets alarms that wake the host"),
];

/// The `capabilities` option, upper-cased without `CAP_`, deduplicated; the default set when
/// absent. Anything outside `ALLOWED_CAPABILITIES` is refused, naming the capability.
pub fn parse(v: Option<Given<Vec<Given<String>>>>) -> Result<Vec<String>> {
  let items = typed(v, "capabilities", |v| {
    format!("expected a list such as ['CHOWN', 'SETUID'], got {v}")
  })?;
  let Some(items) = items else {
    return Ok(DEFAULT_CAPABILITIES.iter().map(|c| c.to_string()).collect());
  };
  let mut out = Vec::new();
  for i in items {
    let c = typed(Some(i), "capabilities", |i| {
      format!("{i} is not a capability name")
    })?
    .unwrap_or_default();
    let c = c.to_ascii_uppercase();
    let c = c.strip_prefix("CAP_").unwrap_or(&c).to_string();
    check(&c)?;
    if !out.contains(&c) {
      out.push(c);
    }
  }
  Ok(out)
}

/// Refuses a capability (already upper-cased, without `CAP_`) a sandbox may not keep.
fn check(c: &str) -> Result<()> {
  if ALLOWED_CAPABILITIES.contains(&c) {
    return Ok(());
  }
  let allowed = ALLOWED_CAPABILITIES.join(", ");
  let reason = if c.is_empty() || !c.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
    format!("{c:?} is not a capability name; a sandbox may keep only {allowed}")
  } else if c == "ALL" {
    format!("ALL would keep every capability; list the ones needed, from {allowed}")
  } else if let Some((_, why)) = REFUSED_CAPABILITIES.iter().find(|(n, _)| *n == c) {
    format!("{c} cannot be kept: it {why}. A sandbox may keep only {allowed}")
  } else {
    format!("{c} is not a Linux capability; a sandbox may keep only {allowed}")
  };
  Err(bad("capabilities", reason))
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::util::errors::SandboxError;

  fn refused(names: &[&str]) -> (String, String) {
    let v = Some(Given::Typed(
      names.iter().map(|n| Given::Typed(n.to_string())).collect(),
    ));
    match parse(v) {
      Err(SandboxError::InvalidOption { option, reason }) => (option, reason),
      other => panic!("expected a refusal of {names:?}, got {other:?}"),
    }
  }

  #[test]
  fn docker_defaults_are_kept_and_everything_else_refused_by_name() {
    let all: Vec<Given<String>> = ALLOWED_CAPABILITIES
      .iter()
      .map(|c| Given::Typed(format!("cap_{}", c.to_lowercase())))
      .collect();
    assert_eq!(
      parse(Some(Given::Typed(all))).unwrap(),
      ALLOWED_CAPABILITIES
    );
    assert_eq!(parse(None).unwrap(), DEFAULT_CAPABILITIES);
    assert!(DEFAULT_CAPABILITIES
      .iter()
      .all(|c| ALLOWED_CAPABILITIES.contains(c)));
    for (name, why) in REFUSED_CAPABILITIES {
      let (option, reason) = refused(&["CHOWN", &format!("CAP_{name}")]);
      assert_eq!(option, "capabilities");
      assert!(
        reason.starts_with(&format!("{name} cannot be kept: it {why}.")),
        "{reason}"
      );
    }
    assert!(refused(&["BOGUS"])
      .1
      .starts_with("BOGUS is not a Linux capability"));
    assert!(refused(&["all"])
      .1
      .starts_with("ALL would keep every capability"));
    assert!(refused(&["a b"])
      .1
      .starts_with("\"A B\" is not a capability name"));
    assert!(refused(&[""])
      .1
      .starts_with("\"\" is not a capability name"));
  }

  #[test]
  fn the_lists_cover_every_linux_capability_once() {
    let mut names: Vec<&str> = ALLOWED_CAPABILITIES.to_vec();
    names.extend(REFUSED_CAPABILITIES.iter().map(|(n, _)| *n));
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    // CAP_CHOWN (0) to CAP_CHECKPOINT_RESTORE (40).
    assert_eq!((count, names.len()), (41, 41));
  }

  /// The Capabilities table of docs/security.md names every refused capability with the same
  /// reason.
  #[test]
  fn the_security_doc_table_matches_the_code() {
    let doc = include_str!("../../docs/security.md");
    let table = doc
      .split("\n## ")
      .find(|s| s.starts_with("Capabilities\n"))
      .expect("a Capabilities section in docs/security.md");
    let rows: Vec<(String, String)> = table
      .lines()
      .filter_map(|l| {
        let rest = l.strip_prefix("| `")?;
        let (name, why) = rest.split_once("` | ")?;
        Some((name.to_string(), why.trim_end_matches(" |").to_string()))
      })
      .collect();
    let code: Vec<(String, String)> = REFUSED_CAPABILITIES
      .iter()
      .map(|(n, w)| (n.to_string(), w.to_string()))
      .collect();
    assert_eq!(rows, code);
  }
}
