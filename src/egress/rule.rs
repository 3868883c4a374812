//! One `allow` or `deny` entry: a name, a `*.suffix` wildcard, `*`, an IP address or a CIDR,
//! each with an optional `:port`.

use std::net::IpAddr;

use super::addr::{canonical, Cidr};
use super::name;
use super::target::split_port;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pattern {
  /// `*`: every name, but no IP address.
  Any,
  Name(String),
  /// `*.example.com`, kept as `.example.com`: names under it, not the name itself.
  Suffix(String),
  Net(Cidr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rule {
  pub pattern: Pattern,
  pub port: Option<u16>,
  /// The entry as written, for messages.
  pub text: String,
}

/// Why an entry is not one; `None` where the generic message says it all.
pub(super) type Detail = Option<String>;

fn pattern(host: &str, bracketed: bool) -> Result<Pattern, Detail> {
  if bracketed {
    return v6_pattern(host);
  }
  if host == "*" {
    return Ok(Pattern::Any);
  }
  if let Some((ip, prefix)) = host.split_once('/') {
    return cidr(ip, prefix);
  }
  if let Ok(ip) = host.parse::<IpAddr>() {
    return Ok(Pattern::Net(Cidr::host(ip)));
  }
  if let Some(rest) = host.strip_prefix("*.") {
    return match name::normalize(rest) {
      Ok(n) => Ok(Pattern::Suffix(format!(".{n}"))),
      Err(e) => Err(e.detail),
    };
  }
  if host.contains('*') {
    return Err(Some(
      "a wildcard stands only as the whole first label, as in *.example.com".into(),
    ));
  }
  name::normalize(host)
    .map(Pattern::Name)
    .map_err(|e| e.detail)
}

fn v6_pattern(host: &str) -> Result<Pattern, Detail> {
  let p = match host.split_once('/') {
    Some((ip, prefix)) => cidr(ip, prefix)?,
    None => match host.parse::<IpAddr>() {
      Ok(a) => Pattern::Net(Cidr::host(a)),
      Err(_) => return Err(None),
    },
  };
  match p {
    Pattern::Net(_) if host.contains(':') => Ok(p),
    _ => Err(Some(
      "only an IPv6 address or network goes in brackets".into(),
    )),
  }
}

fn cidr(ip: &str, prefix: &str) -> Result<Pattern, Detail> {
  let ip: IpAddr = ip.parse().map_err(|_| None)?;
  if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
    return Err(Some(format!("'{prefix}' is not a prefix length")));
  }
  let prefix: u8 = prefix.parse().map_err(|_| None)?;
  Cidr::new(ip, prefix).map(Pattern::Net).map_err(Some)
}

impl Rule {
  pub fn parse(s: &str) -> Result<Rule, Detail> {
    if s.is_empty() {
      return Err(Some("it is empty".into()));
    }
    let (host, bracketed, port) = split_port(s).map_err(Some)?;
    Ok(Rule {
      pattern: pattern(host, bracketed)?,
      port,
      text: s.to_string(),
    })
  }

  fn port_ok(&self, port: u16) -> bool {
    self.port.is_none_or(|p| p == port)
  }

  /// Whether the rule covers a name (in normal form) at `port`; IP rules never do.
  pub fn matches_name(&self, n: &str, port: u16) -> bool {
    self.port_ok(port)
      && match &self.pattern {
        Pattern::Any => true,
        Pattern::Name(m) => m == n,
        Pattern::Suffix(s) => n.len() > s.len() && n.ends_with(s.as_str()),
        Pattern::Net(_) => false,
      }
  }

  /// The network of an IP rule that covers `ip` at `port`.
  pub fn net_for(&self, ip: IpAddr, port: u16) -> Option<&Cidr> {
    match &self.pattern {
      Pattern::Net(c) if self.port_ok(port) && c.contains(canonical(ip)) => Some(c),
      _ => None,
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn p(s: &str) -> Rule {
    Rule::parse(s).unwrap_or_else(|e| panic!("{s}: {e:?}"))
  }

  fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
  }

  #[test]
  fn the_grammar() {
    let net = |s: &str, pre: u8| Pattern::Net(Cidr::new(ip(s), pre).unwrap());
    let cases = [
      ("pkgs.example", Pattern::Name("pkgs.example".into()), None),
      (
        "Pkgs.Example.:443",
        Pattern::Name("pkgs.example".into()),
        Some(443),
      ),
      (
        "*.example.com",
        Pattern::Suffix(".example.com".into()),
        None,
      ),
      ("*", Pattern::Any, None),
      ("*:443", Pattern::Any, Some(443)),
      ("1.2.3.4", net("1.2.3.4", 32), None),
      ("1.2.3.4:80", net("1.2.3.4", 32), Some(80)),
      ("10.0.0.0/8", net("10.0.0.0", 8), None),
      ("10.0.0.0/8:5432", net("10.0.0.0", 8), Some(5432)),
      ("2001:db8::1", net("2001:db8::1", 128), None),
      ("[2001:db8::1]", net("2001:db8::1", 128), None),
      ("[2001:db8::1]:443", net("2001:db8::1", 128), Some(443)),
      ("2001:db8::/32", net("2001:db8::", 32), None),
      ("[2001:db8::/32]:443", net("2001:db8::", 32), Some(443)),
      ("::ffff:10.0.0.1", net("10.0.0.1", 32), None),
      ("0.0.0.0/0", net("0.0.0.0", 0), None),
    ];
    for (s, pat, port) in cases {
      let r = p(s);
      assert_eq!((r.pattern, r.port), (pat, port), "{s}");
    }
  }

  #[test]
  fn bad_entries() {
    let cases = [
      ("", Some("it is empty")),
      ("foo bar", None),
      ("foo.*.com", Some("a wildcard stands only")),
      ("*foo.com", Some("a wildcard stands only")),
      ("example.test:0", Some("1 to 65535")),
      ("example.test:http", Some("1 to 65535")),
      ("10.0.0.1/8", Some("the network is 10.0.0.0/8")),
      ("10.0.0.0/33", Some("at most 32")),
      ("10.0.0.0/x", Some("not a prefix length")),
      ("[1.2.3.4]", Some("only an IPv6")),
      ("[example.test]", None),
      ("[2001:db8::1]x", Some("follows ']'")),
      ("2001:db8::1:443", None),
      ("bücher.example", Some("punycode")),
      ("1.2.3.256", Some("IPv4")),
    ];
    for (s, want) in cases {
      let got = Rule::parse(s);
      match (got, want) {
        (Err(None), None) => {}
        (Err(Some(d)), Some(w)) => assert!(d.contains(w), "{s}: {d}"),
        (other, _) => {
          // An unbracketed IPv6 address with a port reads as an address; it parses.
          assert!(s == "2001:db8::1:443" && other.is_ok(), "{s}: {other:?}");
        }
      }
    }
  }

  #[test]
  fn wildcards_ports_and_networks() {
    let sub = p("*.example.com");
    assert!(sub.matches_name("a.example.com", 1));
    assert!(sub.matches_name("a.b.example.com", 1));
    assert!(!sub.matches_name("example.com", 1), "not the apex");
    assert!(!sub.matches_name("badexample.com", 1));
    let any443 = p("*:443");
    assert!(any443.matches_name("x.test", 443) && !any443.matches_name("x.test", 80));
    assert!(p("x.test").matches_name("x.test", 22));
    assert!(!p("10.0.0.0/8").matches_name("x.test", 1));
    let net = p("10.0.0.0/8:5432");
    assert!(net.net_for(ip("10.1.2.3"), 5432).is_some());
    assert!(net.net_for(ip("::ffff:10.1.2.3"), 5432).is_some());
    assert!(net.net_for(ip("10.1.2.3"), 5433).is_none());
    assert!(net.net_for(ip("11.1.2.3"), 5432).is_none());
    let v6 = p("[2001:db8::/32]:443");
    assert!(v6.net_for(ip("2001:db8::7"), 443).is_some());
    assert!(v6.net_for(ip("2001:db9::7"), 443).is_none());
    assert!(p("*").net_for(ip("1.2.3.4"), 1).is_none());
  }
}
