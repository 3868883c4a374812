//! User specs (`name`, `uid`, `name:group`, `uid:gid` …) resolved against the container's own
//! /etc/passwd and /etc/group with the rules `docker exec -u` follows: a name must exist; a
//! number need not; an explicit group sets the primary group and no supplementary ones; without
//! one, the groups that list the user by name are its supplementary groups.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

use crate::base::sys::Creds;

/// A resolved user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
  /// The passwd name, when the spec matched an entry.
  pub name: Option<String>,
  pub uid: u32,
  pub gid: u32,
  /// Supplementary groups.
  pub groups: Vec<u32>,
  /// From passwd, else `/`.
  pub home: String,
}

impl User {
  pub fn creds(&self) -> Creds {
    Creds {
      uid: self.uid,
      gid: self.gid,
      groups: self.groups.clone(),
    }
  }

  /// How messages name the user.
  pub fn describe(&self) -> String {
    match &self.name {
      Some(n) => format!("{n} (uid {})", self.uid),
      None => format!("uid {}", self.uid),
    }
  }
}

struct PasswdEntry<'a> {
  name: &'a str,
  uid: u32,
  gid: u32,
  home: &'a str,
}

struct GroupEntry<'a> {
  name: &'a str,
  gid: u32,
  members: Vec<&'a str>,
}

fn records(text: &str) -> impl Iterator<Item = Vec<&str>> {
  text
    .lines()
    .map(str::trim)
    .filter(|l| !l.is_empty() && !l.starts_with('#'))
    .map(|l| l.split(':').collect())
}

fn passwd_entries(text: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
  records(text).filter_map(|f| {
    Some(PasswdEntry {
      name: f.first()?,
      uid: f.get(2)?.parse().ok()?,
      gid: f.get(3)?.parse().ok()?,
      home: f.get(5).copied().unwrap_or(""),
    })
  })
}

fn group_entries(text: &str) -> impl Iterator<Item = GroupEntry<'_>> {
  records(text).filter_map(|f| {
    Some(GroupEntry {
      name: f.first()?,
      gid: f.get(2)?.parse().ok()?,
      members: f
        .get(3)
        .map(|m| {
          m.split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .collect()
        })
        .unwrap_or_default(),
    })
  })
}

/// Resolves `spec` (`None` or empty: root) against the text of passwd and group.
pub fn resolve(spec: Option<&str>, passwd: &str, group: &str) -> Result<User, String> {
  let spec = spec.unwrap_or("");
  let mut parts = spec.split(':');
  let user_arg = parts.next().unwrap_or("");
  let group_arg = parts.next().unwrap_or("");
  let uid_num: Option<u32> = user_arg.parse().ok();
  let gid_num: Option<u32> = group_arg.parse().ok();

  let matched = passwd_entries(passwd).find(|e| match (user_arg, uid_num) {
    ("", _) => e.uid == 0,
    (_, Some(n)) => e.uid == n,
    (name, None) => e.name == name,
  });
  let mut user = User {
    name: None,
    uid: 0,
    gid: 0,
    groups: Vec::new(),
    home: "/".to_string(),
  };
  match (&matched, uid_num) {
    (Some(e), _) => {
      user.name = Some(e.name.to_string());
      user.uid = e.uid;
      user.gid = e.gid;
      if !e.home.is_empty() {
        user.home = e.home.to_string();
      }
    }
    (None, Some(n)) => user.uid = n,
    (None, None) if user_arg.is_empty() => {}
    (None, None) => {
      return Err(format!(
        "user {user_arg:?} is not in the sandbox's /etc/passwd"
      ))
    }
  }
  if !group_arg.is_empty() {
    let found = group_entries(group).find(|g| match gid_num {
      Some(n) => g.gid == n,
      None => g.name == group_arg,
    });
    user.gid = match (found, gid_num) {
      (Some(g), _) => g.gid,
      (None, Some(n)) => n,
      (None, None) => {
        return Err(format!(
          "group {group_arg:?} is not in the sandbox's /etc/group"
        ))
      }
    };
  } else if let Some(name) = &user.name {
    user.groups = group_entries(group)
      .filter(|g| g.members.contains(&name.as_str()))
      .map(|g| g.gid)
      .collect();
  }
  Ok(user)
}

/// Reads passwd and group for each resolution, unless neither changed since the last one.
#[derive(Default)]
pub struct Users {
  cache: RefCell<HashMap<String, User>>,
  stamp: RefCell<Option<[Stamp; 2]>>,
}

const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// Inode, mtime (s, ns) and size: a file that changed has another.
type Stamp = (u64, i64, i64, u64);

fn stamp(path: &str) -> Stamp {
  std::fs::metadata(path)
    .map(|m| (m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
    .unwrap_or_default()
}

impl Users {
  pub fn resolve(&self, spec: Option<&str>) -> Result<User, String> {
    let now = [stamp(PASSWD), stamp(GROUP)];
    if *self.stamp.borrow() != Some(now) {
      self.cache.borrow_mut().clear();
      *self.stamp.borrow_mut() = Some(now);
    }
    let key = spec.unwrap_or("").to_string();
    if let Some(u) = self.cache.borrow().get(&key) {
      return Ok(u.clone());
    }
    // A missing file means no names (a scratch image); numbers still work.
    let passwd = std::fs::read_to_string(PASSWD).unwrap_or_default();
    let group = std::fs::read_to_string(GROUP).unwrap_or_default();
    let user = resolve(spec, &passwd, &group)?;
    let mut cache = self.cache.borrow_mut();
    if cache.len() > 64 {
      cache.clear();
    }
    cache.insert(key, user.clone());
    Ok(user)
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n# comment\nagent:x:1000:1000::/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nnohome:x:1001:1001::\n";
  const GROUP: &str =
    "root:x:0:\nwheel:x:10:agent,other\nagent:x:1000:\ndocker:x:999: agent \nnogroup:x:65534:\n";

  fn r(spec: Option<&str>) -> Result<User, String> {
    resolve(spec, PASSWD, GROUP)
  }

  #[test]
  fn names_and_numbers() {
    let root = r(None).unwrap();
    assert_eq!((root.uid, root.gid, root.home.as_str()), (0, 0, "/root"));
    assert_eq!(r(Some("")).unwrap(), root);
    let a = r(Some("agent")).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1000));
    assert_eq!(a.groups, vec![10, 999]);
    assert_eq!(a.home, "/home/agent");
    // A number found in passwd is that user, with its groups.
    assert_eq!(r(Some("1000")).unwrap(), a);
    // A number not in passwd is fine: gid 0 and home / as docker exec gives.
    let n = r(Some("4242")).unwrap();
    assert_eq!(
      (n.uid, n.gid, n.groups.len(), n.home.as_str()),
      (4242, 0, 0, "/")
    );
    assert_eq!(r(Some("nohome")).unwrap().home, "/");
    assert!(r(Some("ghost")).unwrap_err().contains("ghost"));
  }

  #[test]
  fn explicit_groups_replace_the_supplementary_ones() {
    let a = r(Some("agent:wheel")).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 10));
    assert!(a.groups.is_empty());
    let b = r(Some("1000:4321")).unwrap();
    assert_eq!((b.uid, b.gid), (1000, 4321));
    let c = r(Some("4242:nogroup")).unwrap();
    assert_eq!((c.uid, c.gid), (4242, 65534));
    assert!(r(Some("agent:ghosts")).unwrap_err().contains("ghosts"));
  }

  #[test]
  fn empty_files_still_take_numbers() {
    assert_eq!(resolve(Some("12:34"), "", "").unwrap().gid, 34);
    assert!(resolve(Some("agent"), "", "").is_err());
    assert_eq!(resolve(None, "", "").unwrap().uid, 0);
  }
}
