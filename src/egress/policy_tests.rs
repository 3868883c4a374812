use serde_json::json;

use super::*;

fn pol(v: Value) -> Policy {
  Policy::from_json(&v).unwrap_or_else(|e| panic!("{v}: {e}"))
}

fn err(v: Value) -> String {
  Policy::from_json(&v).unwrap_err()
}

fn ip(s: &str) -> IpAddr {
  s.parse().unwrap()
}

#[test]
fn parsing_names_the_entry_and_what_it_takes() {
  assert_eq!(
    err(json!({"allow": ["a.test", "b.test", "foo bar"]})),
    "egress.allow[2]: 'foo bar' is not a host name, IP address or CIDR (with an optional :port)"
  );
  assert_eq!(
    err(json!({"allow": ["x.test"], "deny": ["10.0.0.1/8"]})),
    "egress.deny[0]: '10.0.0.1/8' is not a host name, IP address or CIDR (with an optional \
     :port): it has bits set past the prefix; the network is 10.0.0.0/8"
  );
  assert!(err(json!({"allow": ["bücher.example"]})).contains("punycode"));
  assert!(err(json!({"allow": []})).contains("egress.allow: give at least one entry"));
  assert!(err(json!({"deny": ["x.test"]})).contains("needs an allow list"));
  assert_eq!(
    err(json!({"allow": [1]})),
    "egress.allow[0]: expected a string, got 1"
  );
  assert!(err(json!({"allow": "x.test"})).contains("expected an array of strings"));
  assert_eq!(
    err(json!({"allow": ["*"], "alow": []})),
    "egress: unknown key 'alow'; a policy has allow, deny and hosts"
  );
  assert!(err(json!("open")).starts_with("egress: expected a policy"));
}

#[test]
fn hosts_entries_are_checked() {
  let p = pol(json!({
    "allow": ["mirror.test", "*.corp.test"],
    "hosts": {"Mirror.Test": "10.0.0.5", "pkg.corp.test": ["10.0.0.6", "fd00::6"]}
  }));
  assert_eq!(p.hosts_entry("mirror.test"), Some(&[ip("10.0.0.5")][..]));
  assert_eq!(p.hosts_entry("pkg.corp.test").unwrap().len(), 2);
  assert_eq!(
    err(json!({"allow": ["*"], "hosts": {"m.test": "10.0.0"}})),
    "egress.hosts['m.test']: '10.0.0' is not an IPv4 or IPv6 address"
  );
  assert!(err(json!({"allow": ["*"], "hosts": {"m.test": []}})).contains("at least one"));
  assert!(err(json!({"allow": ["*"], "hosts": {"m.test": 5}})).contains("address string"));
  assert!(err(json!({"allow": ["*"], "hosts": {"*.m.test": "1.2.3.4"}})).contains("host name"));
  assert!(err(json!({"allow": ["*"], "hosts": {"1.2.3.4": "1.2.3.4"}})).contains("host name"));
  assert!(
    err(json!({"allow": ["*"], "hosts": {"A.test": "1.2.3.4", "a.test": "1.2.3.5"}}))
      .contains("given twice")
  );
  assert_eq!(
    err(json!({"allow": ["pkgs.example"], "hosts": {"mirror.test": "10.0.0.5"}})),
    "egress.hosts['mirror.test']: no allow rule matches this name, so the entry would never \
     be used; add 'mirror.test' to egress.allow"
  );
}

#[test]
fn modes() {
  assert_eq!(Mode::from_json(&json!("open")).unwrap(), Mode::Open);
  assert_eq!(Mode::from_json(&json!("none")).unwrap(), Mode::Off);
  assert!(matches!(
    Mode::from_json(&json!({"allow": ["*"]})).unwrap(),
    Mode::Policy(_)
  ));
  assert!(Mode::from_json(&json!("closed"))
    .unwrap_err()
    .starts_with("egress: expected 'open', 'none' or a policy"));
  assert_eq!(Mode::default(), Mode::Policy(Policy::default_open_web()));
  assert_eq!(Policy::default(), Policy::default_open_web());
  assert!(Mode::Off.describe().contains("no network"));
}

#[test]
fn names_pass_by_name_rules_and_deny_wins() {
  let p = pol(json!({
    "allow": ["pkgs.example", "*.pkgs.example", "git.test:443", "10.0.0.0/8"],
    "deny": ["evil.pkgs.example", "*:25"]
  }));
  assert!(p.judge_name("pkgs.example", 443).is_ok());
  assert!(p.judge_name("files.pkgs.example", 80).is_ok());
  assert!(p.judge_name("git.test", 443).is_ok());
  assert!(p.judge_name("git.test", 22).is_err());
  assert_eq!(
    p.judge_name("evil.pkgs.example", 443).unwrap_err(),
    "denied by rule 'evil.pkgs.example'"
  );
  assert_eq!(
    p.judge_name("pkgs.example", 25).unwrap_err(),
    "denied by rule '*:25'"
  );
  assert_eq!(
    p.judge_name("other.test", 443).unwrap_err(),
    "no allow rule matches (allowed: pkgs.example, *.pkgs.example, git.test:443, 10.0.0.0/8)"
  );
}

#[test]
fn ip_literals_pass_only_by_ip_rules() {
  let p =
    pol(json!({"allow": ["*", "203.0.113.0/24:443", "[2001:db8::/32]"], "deny": ["203.0.113.66"]}));
  assert!(p.judge_literal(ip("203.0.113.5"), 443).is_ok());
  assert!(p.judge_literal(ip("::ffff:203.0.113.5"), 443).is_ok());
  assert!(p.judge_literal(ip("203.0.113.5"), 80).is_err());
  assert!(p.judge_literal(ip("2001:db8::5"), 80).is_ok());
  assert_eq!(
    p.judge_literal(ip("203.0.113.66"), 443).unwrap_err(),
    "denied by rule '203.0.113.66'"
  );
  assert!(p
    .judge_literal(ip("198.51.100.1"), 443)
    .unwrap_err()
    .starts_with("an IP address passes only by an IP or CIDR allow rule, and none matches"));
}

#[test]
fn non_public_addresses_need_a_rule_within_their_range() {
  let host = [ip("192.0.2.10")];
  let p = Policy::default_open_web();
  let barred = |p: &Policy, a: &str| p.judge_address(ip(a), 443, false, &host).err();
  for a in [
    "127.0.0.1",
    "::1",
    "169.254.169.254",
    "10.1.1.1",
    "fd00::1",
    "192.0.2.10",
  ] {
    assert!(barred(&p, a).is_some(), "{a}");
  }
  assert!(barred(&p, "8.8.8.8").is_none());
  assert_eq!(
    barred(&p, "::ffff:127.0.0.1").unwrap().why(),
    "a loopback address"
  );
  // From a hosts entry: named explicitly.
  assert!(p.judge_address(ip("127.0.0.1"), 443, true, &host).is_ok());

  let p = pol(json!({"allow": ["*", "0.0.0.0/0", "10.0.0.0/8", "127.0.0.1:8080", "192.0.2.10"]}));
  assert!(
    barred(&p, "169.254.169.254").is_some(),
    "0.0.0.0/0 is too wide"
  );
  assert!(barred(&p, "10.9.9.9").is_none());
  assert!(barred(&p, "64:ff9b::10.9.9.9").is_none());
  assert!(barred(&p, "127.0.0.1").is_some(), "wrong port");
  assert!(p.judge_address(ip("127.0.0.1"), 8080, false, &host).is_ok());
  assert!(
    barred(&p, "192.0.2.10").is_none(),
    "the host's address, named"
  );

  let p = pol(json!({"allow": ["*", "192.0.2.0/24"]}));
  assert_eq!(
    barred(&p, "192.0.2.10").unwrap().why(),
    "an address of the engine host"
  );
}

#[test]
fn deny_rules_apply_to_resolved_addresses_and_hosts_entries() {
  let p = pol(json!({"allow": ["*"], "deny": ["10.0.0.0/8", "8.8.4.4:53"]}));
  let d = |a: &str, port: u16, h: bool| p.judge_address(ip(a), port, h, &[]).err();
  assert_eq!(
    d("10.1.2.3", 443, true).unwrap(),
    Barred::Denied("10.0.0.0/8".into())
  );
  assert!(d("64:ff9b::10.1.2.3", 443, false).is_some());
  assert!(d("::ffff:10.1.2.3", 443, false).is_some());
  assert!(d("8.8.4.4", 53, false).is_some());
  assert!(d("8.8.4.4", 443, false).is_none());
}

#[test]
fn the_default_policy() {
  let p = Policy::default_open_web();
  assert!(p.judge_name("anything.example", 443).is_ok());
  assert!(
    p.judge_name("localhost", 80).is_ok(),
    "by name; its addresses are refused"
  );
  assert!(p.judge_literal(ip("127.0.0.1"), 80).is_err());
  assert!(p.judge_literal(ip("169.254.169.254"), 80).is_err());
  assert!(p.judge_literal(ip("93.184.216.34"), 80).is_err());
  let d = p.describe();
  assert!(
    d.starts_with("egress policy: allow *; deny nothing\n"),
    "{d}"
  );
  let p = pol(json!({"allow": ["*"], "hosts": {"m.test": ["10.0.0.5", "fd00::5"]}}));
  assert!(p.describe().contains("; hosts m.test → 10.0.0.5 fd00::5\n"));
}
