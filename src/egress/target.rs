//! Where a client asks to go: a host name or an IP address, and a port. Also the `host:port`
//! syntax that rules share with requests.

use std::fmt;
use std::net::IpAddr;

use super::name;

/// A host as the client named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Host {
  /// In normal form (see `name::normalize`).
  Name(String),
  Ip(IpAddr),
}

impl fmt::Display for Host {
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match self {
      Host::Name(n) => f.write_str(n),
      Host::Ip(ip) => write!(f, "{ip}"),
    }
  }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
  pub host: Host,
  pub port: u16,
}

impl fmt::Display for Target {
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match self.host {
      Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]:{}", self.port),
      _ => write!(f, "{}:{}", self.host, self.port),
    }
  }
}

/// A decimal port from 1 to 65535.
pub(super) fn port(s: &str) -> Result<u16, String> {
  let bad = || format!("'{s}' is not a port: give a number from 1 to 65535");
  if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
    return Err(bad());
  }
  match s.parse::<u16>() {
    Ok(p) if p > 0 => Ok(p),
    _ => Err(bad()),
  }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` as (host, bracketed, port). A host with more
/// than one colon and no brackets is an IPv6 address, or network, without a port.
pub(super) fn split_port(s: &str) -> Result<(&str, bool, Option<u16>), String> {
  if let Some(rest) = s.strip_prefix('[') {
    let Some(close) = rest.find(']') else {
      return Err("it opens '[' without closing it".to_string());
    };
    let after = &rest[close + 1..];
    let p = match after {
      "" => None,
      _ => match after.strip_prefix(':') {
        Some(p) => Some(port(p)?),
        None => return Err(format!("'{after}' follows ']'; expected ':port'")),
      },
    };
    return Ok((&rest[..close], true, p));
  }
  if s.matches(':').count() > 1 {
    return Ok((s, false, None));
  }
  match s.split_once(':') {
    Some((h, p)) => Ok((h, false, Some(port(p)?))),
    None => Ok((s, false, None)),
  }
}

impl Target {
  /// A host as a client gives it outside any `host:port` syntax (a SOCKS5 domain).
  pub fn from_host(s: &str, port: u16) -> Result<Target, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
      return Ok(Target {
        host: Host::Ip(ip),
        port,
      });
    }
    match name::normalize(s) {
      Ok(n) => Ok(Target {
        host: Host::Name(n),
        port,
      }),
      Err(e) => {
        let mut m = format!("'{s}' is not a host name or IP address");
        if let Some(d) = e.detail {
          m = format!("{m}: {d}");
        }
        Err(m)
      }
    }
  }

  /// An authority (`host:port`, `[v6]:port`), with `default_port` where it has none; without
  /// a default the port is required.
  pub fn from_authority(s: &str, default_port: Option<u16>) -> Result<Target, String> {
    let (host, bracketed, p) = split_port(s).map_err(|e| format!("'{s}': {e}"))?;
    let Some(port) = p.or(default_port) else {
      return Err(format!("'{s}' has no port; expected host:port"));
    };
    if host.contains(':') && !bracketed {
      return Err(format!(
        "'{s}': an IPv6 address goes in brackets, as [2001:db8::1]:443"
      ));
    }
    if bracketed && host.parse::<std::net::Ipv6Addr>().is_err() {
      return Err(format!("'{s}': only an IPv6 address goes in brackets"));
    }
    Target::from_host(host, port)
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn t(s: &str) -> Result<String, String> {
    Target::from_authority(s, Some(80)).map(|t| t.to_string())
  }

  #[test]
  fn authorities() {
    assert_eq!(t("Example.TEST").unwrap(), "example.test:80");
    assert_eq!(t("example.test:8080").unwrap(), "example.test:8080");
    assert_eq!(t("1.2.3.4:443").unwrap(), "1.2.3.4:443");
    assert_eq!(t("[::1]:443").unwrap(), "[::1]:443");
    assert_eq!(t("[2001:db8::1]").unwrap(), "[2001:db8::1]:80");
    assert!(t("2001:db8::1").unwrap_err().contains("brackets"));
    assert!(t("[1.2.3.4]:80").unwrap_err().contains("only an IPv6"));
    assert!(t("example.test:0").unwrap_err().contains("1 to 65535"));
    assert!(t("example.test:99999").unwrap_err().contains("1 to 65535"));
    assert!(t("example.test:+80").is_err());
    assert!(t("ex ample.test").is_err());
    assert!(t("2130706433").unwrap_err().contains("IPv4"));
    assert!(t("[::1").is_err());
    assert!(Target::from_authority("example.test", None)
      .unwrap_err()
      .contains("no port"));
  }

  #[test]
  fn socks_domains_may_be_addresses() {
    assert_eq!(
      Target::from_host("127.0.0.1", 9).unwrap().host,
      Host::Ip("127.0.0.1".parse().unwrap())
    );
    assert_eq!(
      Target::from_host("Mirror.Test.", 9).unwrap().host,
      Host::Name("mirror.test".into())
    );
    assert!(Target::from_host("bücher.example", 9)
      .unwrap_err()
      .contains("punycode"));
  }
}
