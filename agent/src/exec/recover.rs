//! A sandbox out of processes: the agent, already running, kills what no running command owns
//! (a fork bomb that outlived its command fills the pids cgroup) without forking anything, so
//! the next command can start. Files are untouched.
//!
//! The candidates are the processes in the agent's pids cgroup (the container) of the sandbox
//! user, or every one there when that user is root. Spared are:
//! - PID 1, and the container's main process (PID 1's first child: it keeps the container
//!   running) with its subtree (the init's `sleep`, killed, would have it fork again at once,
//!   into a sandbox still full, and a failed fork ends the init and so the container);
//! - the processes the engine started from outside the container (parent pid 0: this agent,
//!   other agents, Code Mode lanes, engine execs), and the subtree of each that is no agent (an
//!   engine exec's command is in flight);
//! - every process a running command owns: the subtrees of this agent's live shepherds and of
//!   other agents' shepherds (their children that run the agent's binary), and whatever stays
//!   in a running command's session;
//! - this agent's shepherds that run no command: spares waiting, starting or ending, which
//!   `spare::Spares::release` ends first and which free their pids by themselves (counted as
//!   owned, so a command waits for them rather than fail).
//!
//! What is left was left behind. It is stopped round after round until none of it runs (a
//! stopped process cannot fork), then killed; a process stopped on stale data that turns out
//! owned is continued.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::base::sys;
use crate::base::users::User;
use crate::state::procs::{Pressure, Recovery};

/// Kills what no running command owns (see the module's doc); what the last recovery found
/// instead when it found nothing to kill a moment ago (`Pressure::lately_fruitless`).
pub async fn recover(procs: &Pressure, user: &User) -> Recovery {
  if let Some(r) = procs.lately_fruitless() {
    return r;
  }
  let r = kill_leftovers(user, &procs.shepherds()).await;
  procs.recovered(r);
  r
}

/// Kills the leftovers (see the module's doc) and reaps what was reparented to the agent.
/// `shepherds`: this agent's shepherds of commands still running.
async fn kill_leftovers(user: &User, shepherds: &HashSet<u32>) -> Recovery {
  let r = stop_then_kill((user.uid != 0).then_some(user.uid), shepherds);
  if r.killed > 0 {
    // Killed processes free their pids once reaped; orphans are the agent's to reap.
    for _ in 0..20 {
      sys::reap_all();
      tokio::time::sleep(Duration::from_millis(5)).await;
    }
  }
  sys::reap_all();
  r
}

/// The note a command's result carries after a recovery that killed `killed` processes.
pub fn note(user: &User, killed: usize) -> String {
  let whose = if user.uid != 0 {
    format!(" of {}", user.describe())
  } else {
    String::new()
  };
  format!(
    "the sandbox had run out of processes: the agent killed {killed} processes{whose} that no running command owned (left behind by earlier commands) before running this command (files are kept)"
  )
}

/// What /proc says about one process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Proc {
  pid: u32,
  ppid: u32,
  sid: u32,
  state: char,
  start: u64,
  comm: String,
}

/// Parses a /proc/<pid>/stat line: "pid (comm) S ppid pgrp session … starttime …", where comm
/// may hold anything, so the fields are read after the last ')'.
fn parse_stat(pid: u32, stat: &str) -> Option<Proc> {
  let open = stat.find('(')?;
  let close = stat.rfind(')')?;
  let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
  Some(Proc {
    pid,
    comm: stat.get(open + 1..close)?.to_string(),
    state: fields.first()?.chars().next()?,
    ppid: fields.get(1)?.parse().ok()?,
    sid: fields.get(3)?.parse().ok()?,
    // Field 22 of the line, the 20th after the command name.
    start: fields.get(19)?.parse().ok()?,
  })
}

fn read_proc(pid: u32) -> Option<Proc> {
  parse_stat(
    pid,
    &std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?,
  )
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

/// Every process now, by pid. One whose parent is gone from the snapshot (it died while /proc
/// was read, and the child was reparented since) is read again.
fn snapshot() -> HashMap<u32, Proc> {
  let mut procs: HashMap<u32, Proc> = std::fs::read_dir("/proc")
    .map(|d| {
      d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter_map(read_proc)
        .map(|p| (p.pid, p))
        .collect()
    })
    .unwrap_or_default();
  let stale: Vec<u32> = procs
    .values()
    .filter(|p| p.ppid != 0 && !procs.contains_key(&p.ppid))
    .map(|p| p.pid)
    .collect();
  for pid in stale {
    match read_proc(pid) {
      Some(p) => procs.insert(pid, p),
      None => procs.remove(&pid),
    };
  }
  procs
}

/// Who the agent is, for telling its kin apart.
struct Me {
  pid: u32,
  comm: String,
  uid: u32,
  exe: Option<(u64, u64)>,
}

impl Me {
  fn now() -> Me {
    Me {
      pid: std::process::id(),
      comm: std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default(),
      uid: unsafe { libc::geteuid() },
      exe: std::fs::metadata("/proc/self/exe")
        .map(|m| (m.dev(), m.ino()))
        .ok(),
    }
  }

  /// Runs the agent's binary as the agent's user. Where /proc hides the link of a process
  /// that is not dumpable (as the agent and its shepherds are), the command name stands in.
  fn kin(&self, p: &Proc, uid: Option<u32>) -> bool {
    if uid != Some(self.uid) {
      return false;
    }
    match std::fs::metadata(format!("/proc/{}/exe", p.pid)) {
      Ok(m) => Some((m.dev(), m.ino())) == self.exe,
      Err(_) => p.comm == self.comm,
    }
  }
}

/// The processes no recovery may touch (see the module's doc): (spared, how many of them
/// running commands own). `kin`: whether a process runs the agent's binary as its user.
fn owned(
  procs: &HashMap<u32, Proc>,
  me: u32,
  shepherds: &HashSet<u32>,
  kin: impl Fn(&Proc) -> bool,
) -> (HashSet<u32>, usize) {
  let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
  for p in procs.values() {
    children.entry(p.ppid).or_default().push(p.pid);
  }
  let kids = |pid: u32| children.get(&pid).into_iter().flatten().copied();
  let main = procs
    .values()
    .filter(|p| p.ppid == 1)
    .min_by_key(|p| (p.start, p.pid))
    .map(|p| p.pid);
  let mut spared: HashSet<u32> = [1, me].into_iter().collect();
  let mut stack: Vec<u32> = main.into_iter().collect();
  while let Some(pid) = stack.pop() {
    if spared.insert(pid) {
      stack.extend(kids(pid));
    }
  }
  // Roots whose whole subtree a call in flight owns.
  let mut roots: Vec<u32> = shepherds.iter().copied().collect();
  for p in procs.values().filter(|p| p.ppid == 0 && p.pid != 1) {
    spared.insert(p.pid);
    if p.pid == me {
      roots.extend(kids(me).filter(|c| !shepherds.contains(c) && kin(&procs[c])));
      continue;
    }
    if kin(p) {
      // Another agent: its shepherds are its children that run its binary; its other
      // children were left behind by commands that ended.
      roots.extend(kids(p.pid).filter(|c| kin(&procs[c])));
    } else {
      roots.extend(kids(p.pid));
    }
  }
  // The command under each shepherd leads a session of its own: a process of it that /proc
  // showed outside the subtree (reparented while it was read) is still in that session.
  let sessions: HashSet<u32> = roots.iter().flat_map(|&r| kids(r)).collect();
  let mut owned = HashSet::new();
  let mut stack = roots;
  while let Some(pid) = stack.pop() {
    if owned.insert(pid) {
      stack.extend(kids(pid));
    }
  }
  owned.extend(
    procs
      .values()
      .filter(|p| sessions.contains(&p.sid))
      .map(|p| p.pid),
  );
  let count = owned.iter().filter(|p| procs.contains_key(p)).count();
  spared.extend(owned);
  (spared, count)
}

/// Stops, then kills, what no running command owns (`uid`: only that user's processes).
fn stop_then_kill(uid: Option<u32>, shepherds: &HashSet<u32>) -> Recovery {
  let me = Me::now();
  let Some(own_cgroup) = pids_cgroup("self") else {
    return Recovery::default();
  };
  let alive = |p: &Proc| !matches!(p.state, 'Z' | 'X');
  let kin = |p: &Proc| me.kin(p, real_uid(p.pid));
  let targets = |running_only: bool| -> (Vec<u32>, usize) {
    let procs = snapshot();
    let (spared, owned) = owned(&procs, me.pid, shepherds, kin);
    let hit = procs
      .values()
      .filter(|p| alive(p) && !(running_only && matches!(p.state, 'T' | 't')))
      .filter(|p| !spared.contains(&p.pid))
      .filter(|p| pids_cgroup(&p.pid.to_string()).as_ref() == Some(&own_cgroup))
      .filter(|p| uid.is_none_or(|u| real_uid(p.pid) == Some(u)))
      .map(|p| p.pid)
      .collect();
    (hit, owned)
  };
  let mut stopped = HashSet::new();
  for _ in 0..50 {
    let (running, _) = targets(true);
    if running.is_empty() {
      break;
    }
    for pid in running {
      unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
      stopped.insert(pid);
    }
  }
  let (all, owned) = targets(false);
  for &pid in &all {
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
  }
  for pid in stopped.difference(&all.iter().copied().collect()) {
    unsafe { libc::kill(*pid as i32, libc::SIGCONT) };
  }
  Recovery {
    killed: all.len(),
    owned,
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn p(pid: u32, ppid: u32, sid: u32, comm: &str) -> Proc {
    Proc {
      pid,
      ppid,
      sid,
      state: 'S',
      start: pid as u64,
      comm: comm.into(),
    }
  }

  #[test]
  fn stat_lines_with_odd_names_parse() {
    let got = parse_stat(
      7,
      "7 (a) b (c) S 1 7 7 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 99 0",
    )
    .unwrap();
    assert_eq!(got, p(7, 1, 7, "a) b (c").clone_with_start(99));
    assert!(parse_stat(7, "7 (x) S").is_none());
  }

  impl Proc {
    fn clone_with_start(mut self, start: u64) -> Proc {
      self.start = start;
      self
    }
  }

  #[test]
  fn running_commands_and_the_engines_processes_are_owned_leftovers_are_not() {
    let mut procs: HashMap<u32, Proc> = [
      p(1, 0, 1, "docker-init"),
      p(2, 1, 2, "sh"), // the main process
      p(3, 2, 2, "sleep"),
      p(20, 0, 20, "trueforge-agent"),  // this agent
      p(21, 20, 20, "trueforge-agent"), // a shepherd of a running command
      p(22, 21, 22, "bash"),            // its command
      p(23, 22, 22, "sleep"),
      p(24, 20, 24, "sh"), // setsid'd by that command, reparented past its shepherd
      p(25, 20, 20, "trueforge-agent"), // a spare, or a shepherd whose call has ended
      p(30, 20, 30, "sh"), // left behind by a command that ended
      p(31, 30, 30, "sh"),
      p(40, 0, 40, "sh"),               // an engine exec
      p(41, 40, 40, "cat"),             // its command
      p(50, 0, 50, "trueforge-agent"),  // another agent
      p(51, 50, 50, "trueforge-agent"), // its shepherd
      p(52, 51, 52, "make"),
      p(53, 50, 53, "sleep"), // left behind under it
    ]
    .into_iter()
    .map(|p| (p.pid, p))
    .collect();
    let kin = |p: &Proc| p.comm == "trueforge-agent";
    let left = |procs: &HashMap<u32, Proc>| {
      let (spared, owned) = owned(procs, 20, &HashSet::from([21]), kin);
      let mut left: Vec<u32> = procs
        .keys()
        .filter(|p| !spared.contains(p))
        .copied()
        .collect();
      left.sort();
      (left, owned)
    };
    assert_eq!(left(&procs), (vec![24, 30, 31, 53], 7));
    // 24 in the running command's session: owned, wherever /proc shows it.
    procs.get_mut(&24).unwrap().sid = 22;
    assert_eq!(left(&procs), (vec![30, 31, 53], 8));
  }
}
