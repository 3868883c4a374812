//! A sandbox out of processes (a fork bomb that outlived its command fills the pids cgroup):
//! the agent, already running, kills the workload without forking anything, so the next
//! command can start. Files are untouched.
//!
//! "The workload" is every process of the sandbox user in the agent's pids cgroup (the
//! container), or every process there when that user is root, except PID 1, the container's
//! main process (PID 1's first child: it keeps the container running), this agent and the
//! processes of its binary running as the agent's user (shepherds, other agents). They are stopped round after round
//! until none is left running (a stopped process cannot fork), then killed.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::sys;
use crate::users::User;

/// Kills the workload's processes and reaps what was reparented to the agent. Returns what it
/// did, for the command's result.
pub async fn kill_workload(user: &User, attempt: usize) -> String {
  let killed = stop_then_kill((user.uid != 0).then_some(user.uid));
  // Killed processes free their pids once reaped; orphans are the agent's to reap.
  for _ in 0..20 {
    sys::reap_all();
    tokio::time::sleep(Duration::from_millis(5 << attempt.min(4))).await;
  }
  sys::reap_all();
  if user.uid != 0 {
    format!(
      "the sandbox had run out of processes: the agent killed the {killed} processes of {} before running this command (files are kept)",
      user.describe()
    )
  } else {
    format!("the sandbox had run out of processes: the agent killed {killed} processes (all but the container's init, its main process and the agent) before running this command (files are kept)")
  }
}

/// What /proc says about one process.
struct Proc {
  pid: u32,
  ppid: u32,
  state: char,
  start: u64,
}

fn read_proc(pid: u32) -> Option<Proc> {
  let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
  let close = stat.rfind(')')?;
  let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
  Some(Proc {
    pid,
    state: fields.first()?.chars().next()?,
    ppid: fields.get(1)?.parse().ok()?,
    // Field 22 of the line, the 20th after the command name.
    start: fields.get(19)?.parse().ok()?,
  })
}

fn real_uid(pid: u32) -> Option<u32> {
  let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
  status
    .lines()
    .find_map(|l| l.strip_prefix("Uid:"))?
    .split_whitespace()
    .next()?
    .parse()
    .ok()
}

/// The line of /proc/<pid>/cgroup that places a process for the pids limit (the v1 pids
/// controller, else the unified hierarchy).
fn pids_cgroup(pid: &str) -> Option<String> {
  let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
  let line = text
    .lines()
    .find(|l| {
      l.split(':')
        .nth(1)
        .is_some_and(|c| c.split(',').any(|c| c == "pids"))
    })
    .or_else(|| text.lines().find(|l| l.starts_with("0::")))?;
  Some(line.to_string())
}

fn all_pids() -> Vec<u32> {
  std::fs::read_dir("/proc")
    .map(|d| {
      d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
    })
    .unwrap_or_default()
}

/// Stops, then kills, the workload (`uid`: only that user's processes). Returns how many.
fn stop_then_kill(uid: Option<u32>) -> usize {
  let me = std::process::id();
  let own_uid = unsafe { libc::geteuid() };
  let own_exe = std::fs::metadata("/proc/self/exe")
    .map(|m| (m.dev(), m.ino()))
    .ok();
  let Some(own_cgroup) = pids_cgroup("self") else {
    return 0;
  };
  let main = all_pids()
    .into_iter()
    .filter_map(read_proc)
    .filter(|p| p.ppid == 1)
    .min_by_key(|p| (p.start, p.pid))
    .map(|p| p.pid);
  let spared = |pid: u32| {
    if pid == 1 || pid == me || Some(pid) == main {
      return true;
    }
    if pids_cgroup(&pid.to_string()).as_ref() != Some(&own_cgroup) {
      return true;
    }
    let owner = real_uid(pid);
    if uid.is_some() && owner != uid {
      return true;
    }
    // The agent's own helpers run as the agent's user from its binary.
    owner == Some(own_uid)
      && own_exe.is_some()
      && std::fs::metadata(format!("/proc/{pid}/exe"))
        .map(|m| (m.dev(), m.ino()))
        .ok()
        == own_exe
  };
  let targets = |running_only: bool| -> Vec<u32> {
    all_pids()
      .into_iter()
      .filter_map(read_proc)
      .filter(|p| match p.state {
        'Z' | 'X' => false,
        'T' | 't' => !running_only,
        _ => true,
      })
      .map(|p| p.pid)
      .filter(|&pid| !spared(pid))
      .collect()
  };
  for _ in 0..50 {
    let running = targets(true);
    if running.is_empty() {
      break;
    }
    for pid in running {
      unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    }
  }
  let all = targets(false);
  for &pid in &all {
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
  }
  all.len()
}
