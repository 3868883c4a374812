//! Addresses: networks (CIDRs) and which addresses are not the public internet. A sandbox's
//! connection to any of those is refused unless the operator names the address in a rule or a
//! `hosts` entry, so that a name resolving to the host, its network or the cloud's metadata
//! service does not reach it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A network: an address and a prefix length, with no bits set past the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cidr {
  net: IpAddr,
  prefix: u8,
}

fn bits(ip: IpAddr) -> (u128, u8) {
  match ip {
    IpAddr::V4(a) => (u32::from(a) as u128, 32),
    IpAddr::V6(a) => (u128::from(a), 128),
  }
}

fn mask(prefix: u8, width: u8) -> u128 {
  let all = if width == 32 {
    u32::MAX as u128
  } else {
    u128::MAX
  };
  if prefix == 0 {
    0
  } else {
    all & !((1u128 << (width - prefix)) - 1)
  }
}

impl Cidr {
  /// Refuses a prefix past the address's width, and bits set past the prefix (naming the
  /// network meant, since `10.0.0.1/8` is usually a typo for it).
  pub fn new(ip: IpAddr, prefix: u8) -> Result<Cidr, String> {
    let (v, width) = bits(ip);
    if prefix > width {
      return Err(format!("the prefix length is at most {width}"));
    }
    let m = mask(prefix, width);
    if v & !m & mask(width, width) != 0 {
      let net = Cidr::from_bits(v & m, width);
      return Err(format!(
        "it has bits set past the prefix; the network is {net}/{prefix}"
      ));
    }
    Ok(Cidr { net: ip, prefix }.canonical())
  }

  /// One address.
  pub fn host(ip: IpAddr) -> Cidr {
    let prefix = bits(ip).1;
    Cidr { net: ip, prefix }.canonical()
  }

  fn from_bits(v: u128, width: u8) -> IpAddr {
    if width == 32 {
      IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
      IpAddr::V6(Ipv6Addr::from(v))
    }
  }

  /// IPv4-mapped networks (`::ffff:0:0/96` and narrower) as the IPv4 networks they are, since
  /// addresses are compared in their IPv4 form.
  fn canonical(self) -> Cidr {
    if let IpAddr::V6(a) = self.net {
      if let Some(v4) = a.to_ipv4_mapped() {
        if self.prefix >= 96 {
          return Cidr {
            net: IpAddr::V4(v4),
            prefix: self.prefix - 96,
          };
        }
      }
    }
    self
  }

  pub fn contains(&self, ip: IpAddr) -> bool {
    let (n, w) = bits(self.net);
    let (v, vw) = bits(ip);
    w == vw && (v & mask(self.prefix, w)) == n
  }

  /// Whether every address of `self` is in `other`.
  pub fn within(&self, other: &Cidr) -> bool {
    self.prefix >= other.prefix && other.contains(self.net)
  }

  /// Whether it is one address.
  pub fn is_host(&self) -> bool {
    self.prefix == bits(self.net).1
  }
}

impl fmt::Display for Cidr {
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{}/{}", self.net, self.prefix)
  }
}

/// An address compared in its IPv4 form where it is an IPv4-mapped IPv6 address.
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
  match ip {
    IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(a)),
    v4 => v4,
  }
}

/// The IPv4 address an IPv6 address carries and is judged by: IPv4-compatible (`::a.b.c.d`,
/// other than `::` and `::1`) and NAT64 (`64:ff9b::a.b.c.d`, which a NAT64 gateway turns into
/// that IPv4 address). IPv4-mapped addresses are already IPv4 after `canonical`.
pub(super) fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
  let IpAddr::V6(a) = ip else { return None };
  let v = u128::from(a);
  let low = Ipv4Addr::from(v as u32);
  let compat = v >> 32 == 0 && v > 1;
  let nat64 = v >> 32 == 0x0064_ff9b_0000_0000_0000_0000;
  (compat || nat64).then_some(low)
}

/// An address that is not the public internet: what it is, and the range it belongs to (a rule
/// lets it through only if it lies within that range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Special {
  pub what: &'static str,
  pub range: Cidr,
}

const V4: [(u32, u8, &str); 12] = [
  (0xffff_ffff, 32, "the broadcast address"),
  (0x0000_0000, 8, "a 'this network' address"),
  (0x0a00_0000, 8, "a private address"),
  (0x6440_0000, 10, "a shared (carrier-grade NAT) address"),
  (0x7f00_0000, 8, "a loopback address"),
  (
    0xa9fe_0000,
    16,
    "a link-local address (where clouds serve instance metadata)",
  ),
  (0xac10_0000, 12, "a private address"),
  (0xc000_0000, 24, "an IETF protocol assignment address"),
  (0xc0a8_0000, 16, "a private address"),
  (0xc612_0000, 15, "a benchmarking address"),
  (0xe000_0000, 4, "a multicast address"),
  (0xf000_0000, 4, "a reserved address"),
];

const V6: [(u128, u8, &str); 6] = [
  (0, 128, "the unspecified address"),
  (1, 128, "a loopback address"),
  (0xfc00 << 112, 7, "a unique-local address"),
  (0xfe80 << 112, 10, "a link-local address"),
  (0xfec0 << 112, 10, "a site-local address"),
  (0xff00 << 112, 8, "a multicast address"),
];

fn in_table(ip: IpAddr) -> Option<Special> {
  let (v, width) = bits(ip);
  let hit = |(net, prefix, what): (u128, u8, &'static str)| {
    (v & mask(prefix, width) == net).then(|| Special {
      what,
      range: Cidr {
        net: Cidr::from_bits(net, width),
        prefix,
      },
    })
  };
  match ip {
    IpAddr::V4(_) => V4.iter().find_map(|&(n, p, w)| hit((n as u128, p, w))),
    IpAddr::V6(_) => V6.iter().find_map(|&e| hit(e)),
  }
}

/// What keeps `ip` off by default, if anything. `host` is the engine host's own addresses;
/// other than loopback, each is its own range, so that only a rule naming that very address
/// lets a sandbox reach the host (a rule for the host's private network does not).
pub(super) fn special(ip: IpAddr, host: &[IpAddr]) -> Option<Special> {
  let ip = canonical(ip);
  let forms = [Some(ip), embedded_v4(ip).map(IpAddr::V4)];
  for form in forms.into_iter().flatten() {
    if !form.is_loopback() && host.iter().any(|h| canonical(*h) == form) {
      return Some(Special {
        what: "an address of the engine host",
        range: Cidr::host(form),
      });
    }
  }
  if let Some(s) = in_table(ip) {
    return Some(s);
  }
  embedded_v4(ip).and_then(|v4| in_table(IpAddr::V4(v4)))
}

/// The engine host's own addresses, on every interface.
#[cfg(unix)]
pub fn host_addresses() -> Vec<IpAddr> {
  let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
  // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
  if unsafe { libc::getifaddrs(&mut head) } != 0 {
    return Vec::new();
  }
  let mut out = Vec::new();
  let mut at = head;
  while !at.is_null() {
    // SAFETY: `at` is a node of the list getifaddrs returned, which is alive until freed.
    let ifa = unsafe { &*at };
    // SAFETY: a non-null ifa_addr points to a sockaddr of the family it names.
    if let Some(ip) = unsafe { sockaddr_ip(ifa.ifa_addr) } {
      out.push(ip);
    }
    at = ifa.ifa_next;
  }
  // SAFETY: `head` came from getifaddrs and is freed once.
  unsafe { libc::freeifaddrs(head) };
  out.sort();
  out.dedup();
  out
}

/// # Safety
/// `sa` is null or points to a sockaddr as large as its family's.
#[cfg(unix)]
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
  if sa.is_null() {
    return None;
  }
  match (*sa).sa_family as i32 {
    libc::AF_INET => {
      let sin = &*(sa as *const libc::sockaddr_in);
      Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
        sin.sin_addr.s_addr,
      ))))
    }
    libc::AF_INET6 => {
      let sin6 = &*(sa as *const libc::sockaddr_in6);
      Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
    }
    _ => None,
  }
}

/// Without getifaddrs the host's addresses are unknown; the fixed ranges still apply.
#[cfg(not(unix))]
pub fn host_addresses() -> Vec<IpAddr> {
  Vec::new()
}

#[cfg(test)]
mod tests {
  use super::*;

  fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
  }

  fn what(s: &str) -> Option<&'static str> {
    special(ip(s), &[]).map(|s| s.what)
  }

  #[test]
  fn the_ranges_that_are_not_the_internet() {
    let table = [
      ("0.0.0.0", Some("a 'this network' address")),
      ("0.1.2.3", Some("a 'this network' address")),
      ("10.1.2.3", Some("a private address")),
      ("100.64.0.1", Some("a shared (carrier-grade NAT) address")),
      ("100.128.0.1", None),
      ("127.0.0.1", Some("a loopback address")),
      ("127.255.0.9", Some("a loopback address")),
      (
        "169.254.169.254",
        Some("a link-local address (where clouds serve instance metadata)"),
      ),
      ("172.16.0.1", Some("a private address")),
      ("172.31.255.255", Some("a private address")),
      ("172.32.0.1", None),
      ("192.0.0.8", Some("an IETF protocol assignment address")),
      ("192.168.1.1", Some("a private address")),
      ("198.18.0.1", Some("a benchmarking address")),
      ("198.19.255.1", Some("a benchmarking address")),
      ("198.20.0.1", None),
      ("224.0.0.1", Some("a multicast address")),
      ("240.0.0.1", Some("a reserved address")),
      ("255.255.255.255", Some("the broadcast address")),
      ("8.8.8.8", None),
      ("203.0.113.9", None),
      ("::", Some("the unspecified address")),
      ("::1", Some("a loopback address")),
      ("fc00::1", Some("a unique-local address")),
      ("fd12:3456::1", Some("a unique-local address")),
      ("fe80::1", Some("a link-local address")),
      ("ff02::1", Some("a multicast address")),
      ("2001:db8::1", None),
      ("::ffff:127.0.0.1", Some("a loopback address")),
      ("::ffff:10.0.0.1", Some("a private address")),
      ("::ffff:8.8.8.8", None),
      ("::127.0.0.1", Some("a loopback address")),
      (
        "::169.254.169.254",
        Some("a link-local address (where clouds serve instance metadata)"),
      ),
      ("64:ff9b::10.0.0.1", Some("a private address")),
      ("64:ff9b::8.8.8.8", None),
    ];
    for (addr, want) in table {
      assert_eq!(what(addr), want, "{addr}");
    }
  }

  #[test]
  fn the_hosts_own_addresses_are_each_their_own_range() {
    let host = [ip("10.0.0.5"), ip("203.0.113.7"), ip("127.0.0.1")];
    let s = special(ip("10.0.0.5"), &host).unwrap();
    assert_eq!(s.what, "an address of the engine host");
    assert_eq!(s.range, Cidr::host(ip("10.0.0.5")));
    assert!(special(ip("::ffff:203.0.113.7"), &host).is_some());
    assert!(special(ip("64:ff9b::203.0.113.7"), &host).is_some());
    assert_eq!(
      special(ip("10.0.0.6"), &host).unwrap().what,
      "a private address"
    );
    // Loopback keeps its whole range, so a rule for 127.0.0.0/8 reaches 127.0.0.1.
    assert_eq!(special(ip("127.0.0.1"), &host).unwrap().range.prefix, 8);
  }

  #[test]
  fn cidrs_contain_and_nest() {
    let c = Cidr::new(ip("10.0.0.0"), 8).unwrap();
    assert!(c.contains(ip("10.255.0.1")));
    assert!(!c.contains(ip("11.0.0.1")));
    assert!(
      !c.contains(ip("::ffff:10.0.0.1")),
      "compared canonical only"
    );
    let all = Cidr::new(ip("0.0.0.0"), 0).unwrap();
    assert!(all.contains(ip("1.2.3.4")));
    assert!(c.within(&all) && !all.within(&c));
    let v6 = Cidr::new(ip("2001:db8::"), 32).unwrap();
    assert!(v6.contains(ip("2001:db8:ffff::1")));
    assert!(!v6.contains(ip("2001:db9::1")));
    assert!(Cidr::new(ip("::"), 0).unwrap().contains(ip("::1")));
    assert!(Cidr::host(ip("1.2.3.4")).is_host());
    assert_eq!(
      Cidr::new(ip("::ffff:10.0.0.0"), 104).unwrap(),
      Cidr::new(ip("10.0.0.0"), 8).unwrap()
    );
  }

  #[test]
  fn bad_cidrs_say_why() {
    assert_eq!(
      Cidr::new(ip("10.0.0.1"), 8).unwrap_err(),
      "it has bits set past the prefix; the network is 10.0.0.0/8"
    );
    assert!(Cidr::new(ip("10.0.0.0"), 33).unwrap_err().contains("32"));
    assert!(Cidr::new(ip("::"), 129).unwrap_err().contains("128"));
  }

  #[test]
  fn the_host_has_a_loopback_address() {
    let a = host_addresses();
    assert!(a.contains(&ip("127.0.0.1")), "{a:?}");
  }
}
