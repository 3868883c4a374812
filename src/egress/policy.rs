//! The `egress` option and the decisions a policy makes: on the name a client asks for, and on
//! every address the host would connect to.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::Value;

use super::addr::{canonical, embedded_v4, special, Special};
use super::name;
use super::rule::{Pattern, Rule};

/// The `egress` option: `'open'` (the sandbox's own network, as without the option), `'none'`
/// (no network at all) or a policy enforced by the host's proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
  /// `'open'`.
  Open,
  /// `'none'`.
  Off,
  /// A policy object, or the default.
  Policy(Policy),
}

impl Default for Mode {
  /// Every public host by name: package managers keep working.
  fn default() -> Mode {
    Mode::Policy(Policy::default_open_web())
  }
}

impl Mode {
  /// `'open'`, `'none'` or a policy object (`Policy::from_json`).
  pub fn from_json(v: &Value) -> Result<Mode, String> {
    match v {
      Value::String(s) if s == "open" => Ok(Mode::Open),
      Value::String(s) if s == "none" => Ok(Mode::Off),
      Value::Object(_) => Policy::from_json(v).map(Mode::Policy),
      _ => Err(format!(
        "egress: expected 'open', 'none' or a policy {{ allow: [...], deny?: [...], hosts?: \
         {{...}} }}, got {v}"
      )),
    }
  }

  /// A few lines for `doctor`.
  pub fn describe(&self) -> String {
    match self {
      Mode::Open => "egress: open (the sandbox's own network, no policy)".to_string(),
      Mode::Off => "egress: none (no network but loopback)".to_string(),
      Mode::Policy(p) => p.describe(),
    }
  }
}

/// Which hosts a sandbox may reach. `deny` wins over `allow`; names pass only by name rules
/// and IP addresses only by IP or CIDR rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
  allow: Vec<Rule>,
  deny: Vec<Rule>,
  /// Names the operator maps to addresses of their choosing, resolved without DNS.
  hosts: BTreeMap<String, Vec<IpAddr>>,
}

impl Default for Policy {
  fn default() -> Policy {
    Policy::default_open_web()
  }
}

/// Why an address is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Barred {
  /// By the deny rule written so.
  Denied(String),
  /// Not the public internet, and no rule or `hosts` entry names it.
  Special(Special),
}

impl Barred {
  pub fn why(&self) -> String {
    match self {
      Barred::Denied(r) => format!("denied by rule '{r}'"),
      Barred::Special(s) => s.what.to_string(),
    }
  }
}

const ENTRY: &str = "is not a host name, IP address or CIDR (with an optional :port)";

fn rules(v: Option<&Value>, key: &str, required: bool) -> Result<Vec<Rule>, String> {
  let list = match v {
    None if required => {
      return Err(format!(
        "egress.{key}: a policy needs an {key} list; for no network at all use egress: 'none'"
      ))
    }
    None => return Ok(Vec::new()),
    Some(Value::Array(a)) => a,
    Some(other) => {
      return Err(format!(
        "egress.{key}: expected an array of strings, got {other}"
      ))
    }
  };
  if required && list.is_empty() {
    return Err(format!(
      "egress.{key}: give at least one entry; for no network at all use egress: 'none'"
    ));
  }
  let mut out = Vec::with_capacity(list.len());
  for (i, e) in list.iter().enumerate() {
    let Value::String(s) = e else {
      return Err(format!("egress.{key}[{i}]: expected a string, got {e}"));
    };
    match Rule::parse(s) {
      Ok(r) => out.push(r),
      Err(None) => return Err(format!("egress.{key}[{i}]: '{s}' {ENTRY}")),
      Err(Some(d)) => return Err(format!("egress.{key}[{i}]: '{s}' {ENTRY}: {d}")),
    }
  }
  Ok(out)
}

fn address_list(key: &str, v: &Value) -> Result<Vec<IpAddr>, String> {
  let one = |e: &Value| match e {
    Value::String(s) => s
      .parse::<IpAddr>()
      .map_err(|_| format!("egress.hosts['{key}']: '{s}' is not an IPv4 or IPv6 address")),
    other => Err(format!(
      "egress.hosts['{key}']: expected an address string, got {other}"
    )),
  };
  match v {
    Value::Array(a) if a.is_empty() => {
      Err(format!("egress.hosts['{key}']: give at least one address"))
    }
    Value::Array(a) => a.iter().map(one).collect(),
    other => Ok(vec![one(other)?]),
  }
}

fn hosts(v: Option<&Value>) -> Result<BTreeMap<String, Vec<IpAddr>>, String> {
  let map = match v {
    None => return Ok(BTreeMap::new()),
    Some(Value::Object(m)) => m,
    Some(other) => {
      return Err(format!(
        "egress.hosts: expected an object mapping names to addresses, got {other}"
      ))
    }
  };
  let mut out = BTreeMap::new();
  for (key, v) in map {
    let n = name::normalize(key).map_err(|e| {
      let d = e.detail.map(|d| format!(": {d}")).unwrap_or_default();
      format!("egress.hosts: '{key}' is not a host name{d}")
    })?;
    if n.parse::<IpAddr>().is_ok() {
      return Err(format!("egress.hosts: '{key}' is not a host name"));
    }
    let addrs = address_list(key, v)?;
    if out.insert(n.clone(), addrs).is_some() {
      return Err(format!("egress.hosts: '{n}' is given twice"));
    }
  }
  Ok(out)
}

impl Policy {
  /// The policy object `{ allow: [...], deny?: [...], hosts?: {...} }`. Messages name the entry
  /// at fault and what is expected there.
  pub fn from_json(v: &Value) -> Result<Policy, String> {
    let Value::Object(m) = v else {
      return Err(format!(
        "egress: expected a policy {{ allow: [...], deny?: [...], hosts?: {{...}} }}, got {v}"
      ));
    };
    if let Some(k) = m
      .keys()
      .find(|k| !["allow", "deny", "hosts"].contains(&k.as_str()))
    {
      return Err(format!(
        "egress: unknown key '{k}'; a policy has allow, deny and hosts"
      ));
    }
    let p = Policy {
      allow: rules(m.get("allow"), "allow", true)?,
      deny: rules(m.get("deny"), "deny", false)?,
      hosts: hosts(m.get("hosts"))?,
    };
    // A hosts entry only resolves; the name must still pass. One that cannot is a mistake
    // better told now than as refusals later.
    if let Some(n) = p.hosts.keys().find(|n| !p.allows_name_on_some_port(n)) {
      return Err(format!(
        "egress.hosts['{n}']: no allow rule matches this name, so the entry would never be \
         used; add '{n}' to egress.allow"
      ));
    }
    Ok(p)
  }

  /// The default: every public host by name, on any port (`allow: ['*']`). IP literals,
  /// and names resolving to non-public addresses, are refused.
  pub fn default_open_web() -> Policy {
    Policy {
      allow: vec![Rule::parse("*").expect("'*' is a rule")],
      deny: Vec::new(),
      hosts: BTreeMap::new(),
    }
  }

  fn allows_name_on_some_port(&self, n: &str) -> bool {
    self.allow.iter().any(|r| match &r.pattern {
      Pattern::Any => true,
      Pattern::Name(m) => m == n,
      Pattern::Suffix(s) => n.len() > s.len() && n.ends_with(s.as_str()),
      Pattern::Net(_) => false,
    })
  }

  /// The allow rules in a phrase, for the agent's instructions.
  pub fn summary(&self) -> String {
    if self.allow.iter().any(|r| matches!(r.pattern, Pattern::Any)) && self.deny.is_empty() {
      return "every public host by name".to_string();
    }
    let s: Vec<&str> = self
      .allow
      .iter()
      .take(20)
      .map(|r| r.text.as_str())
      .collect();
    let more = self.allow.len().saturating_sub(20);
    let mut out = format!("allowed: {}", s.join(", "));
    if more > 0 {
      out.push_str(&format!(" and {more} more"));
    }
    if !self.deny.is_empty() {
      let d: Vec<&str> = self.deny.iter().take(10).map(|r| r.text.as_str()).collect();
      out.push_str(&format!("; denied: {}", d.join(", ")));
    }
    out
  }

  /// A few lines for `doctor`.
  pub fn describe(&self) -> String {
    let list = |rules: &[Rule]| -> String {
      if rules.is_empty() {
        return "nothing".to_string();
      }
      let mut s = rules
        .iter()
        .take(20)
        .map(|r| r.text.as_str())
        .collect::<Vec<_>>()
        .join(", ");
      if rules.len() > 20 {
        s.push_str(&format!(" and {} more", rules.len() - 20));
      }
      s
    };
    let mut out = format!(
      "egress policy: allow {}; deny {}",
      list(&self.allow),
      list(&self.deny)
    );
    if !self.hosts.is_empty() {
      let h: Vec<String> = self
        .hosts
        .iter()
        .map(|(n, a)| {
          let a: Vec<String> = a.iter().map(IpAddr::to_string).collect();
          format!("{n} → {}", a.join(" "))
        })
        .collect();
      out.push_str(&format!("; hosts {}", h.join(", ")));
    }
    out.push_str(
      "\nnames pass by name rules ('*' is every name), IP addresses only by IP or CIDR rules; \
       loopback, private, link-local (metadata) and the engine host's own addresses are \
       refused unless an IP rule within their range or a hosts entry names them",
    );
    out
  }

  pub(super) fn hosts_entry(&self, n: &str) -> Option<&[IpAddr]> {
    self.hosts.get(n).map(Vec::as_slice)
  }

  fn allowed_list(&self) -> String {
    let mut s: Vec<&str> = self.allow.iter().take(6).map(|r| r.text.as_str()).collect();
    if self.allow.len() > 6 {
      s.push("…");
    }
    format!("allowed: {}", s.join(", "))
  }

  /// The decision on a name the client asked for (in normal form).
  pub(super) fn judge_name(&self, n: &str, port: u16) -> Result<(), String> {
    if let Some(r) = self.deny.iter().find(|r| r.matches_name(n, port)) {
      return Err(format!("denied by rule '{}'", r.text));
    }
    if self.allow.iter().any(|r| r.matches_name(n, port)) {
      return Ok(());
    }
    Err(format!("no allow rule matches ({})", self.allowed_list()))
  }

  /// The decision on an IP address the client gave as such: only IP and CIDR rules pass it.
  pub(super) fn judge_literal(&self, ip: IpAddr, port: u16) -> Result<(), String> {
    if let Some(r) = self.deny_net(ip, port) {
      return Err(format!("denied by rule '{}'", r.text));
    }
    if forms(ip).any(|f| self.allow.iter().any(|r| r.net_for(f, port).is_some())) {
      return Ok(());
    }
    Err(format!(
      "an IP address passes only by an IP or CIDR allow rule, and none matches ({})",
      self.allowed_list()
    ))
  }

  fn deny_net(&self, ip: IpAddr, port: u16) -> Option<&Rule> {
    self
      .deny
      .iter()
      .find(|r| forms(ip).any(|f| r.net_for(f, port).is_some()))
  }

  /// The decision on an address the host would connect to. `from_hosts`: it came from a
  /// `hosts` entry, which names it explicitly. `host` is the engine host's own addresses.
  pub(super) fn judge_address(
    &self,
    ip: IpAddr,
    port: u16,
    from_hosts: bool,
    host: &[IpAddr],
  ) -> Result<(), Barred> {
    if let Some(r) = self.deny_net(ip, port) {
      return Err(Barred::Denied(r.text.clone()));
    }
    if from_hosts {
      return Ok(());
    }
    let Some(s) = special(ip, host) else {
      return Ok(());
    };
    // A wide rule such as 0.0.0.0/0 does not name these; one within their range, or the
    // very address, does.
    let named = forms(ip).any(|f| {
      self.allow.iter().any(|r| {
        r.net_for(f, port)
          .is_some_and(|net| net.within(&s.range) || net.is_host())
      })
    });
    if named {
      Ok(())
    } else {
      Err(Barred::Special(s))
    }
  }
}

/// An address and the IPv4 address it carries, if any: rules and ranges apply to both.
fn forms(ip: IpAddr) -> impl Iterator<Item = IpAddr> {
  let c = canonical(ip);
  std::iter::once(c).chain(embedded_v4(c).map(IpAddr::V4))
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
