//! A sandbox out of processes (a fork bomb that outlived its command fills the pids cgroup):
//! the agent, already running, kills the workload without forking anything, so the next
//! command can start. Files are untouched.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::sys;
use crate::users::User;

/// Kills the workload's processes and reaps what was reparented to the agent. Returns what it
/// did, for the command's result.
pub async fn kill_workload(user: &User, attempt: usize) -> String {
  if user.uid != 0 {
    // Every process of the user, in one atomic sweep.
    let _ = sys::kill_all_of_user(user.uid, libc::SIGKILL);
  } else {
    stop_then_kill_all();
  }
  // Killed processes free their pids once reaped; orphans are the agent's to reap.
  for _ in 0..20 {
    sys::reap_all();
    tokio::time::sleep(Duration::from_millis(5 << attempt.min(4))).await;
  }
  sys::reap_all();
  if user.uid != 0 {
    format!(
      "the sandbox had run out of processes: the agent killed every process of {} before running this command (files are kept)",
      user.describe()
    )
  } else {
    "the sandbox had run out of processes: the agent killed every process but the container's init and its own before running this command (files are kept)".to_string()
  }
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

/// The sandbox user is root, so "its processes" are all of them: every process in the agent's
/// pids cgroup (the container) but PID 1, this agent and its own helpers (processes of the
/// agent's binary: other agents, shepherds). They are stopped first, round after round until
/// none is left running (a stopped process cannot fork), then killed.
fn stop_then_kill_all() {
  let me = std::process::id();
  let own = std::fs::metadata("/proc/self/exe")
    .map(|m| (m.dev(), m.ino()))
    .ok();
  let Some(own_cgroup) = pids_cgroup("self") else {
    return;
  };
  let targets = |running_only: bool| -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
      return Vec::new();
    };
    dir
      .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
      .filter(|&pid| pid != 1 && pid != me)
      .filter(|&pid| pids_cgroup(&pid.to_string()).as_ref() == Some(&own_cgroup))
      .filter(|&pid| {
        let exe = std::fs::metadata(format!("/proc/{pid}/exe"))
          .map(|m| (m.dev(), m.ino()))
          .ok();
        exe.is_none() || exe != own
      })
      .filter(|&pid| {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
          .ok()
          .and_then(|s| {
            let close = s.rfind(')')?;
            s[close + 1..].trim_start().chars().next()
          });
        match state {
          Some('Z') | Some('X') | None => false,
          Some('T') | Some('t') => !running_only,
          Some(_) => true,
        }
      })
      .map(|pid| pid as i32)
      .collect()
  };
  for _ in 0..50 {
    let running = targets(true);
    if running.is_empty() {
      break;
    }
    for pid in running {
      unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
  }
  for pid in targets(false) {
    unsafe { libc::kill(pid, libc::SIGKILL) };
  }
}
