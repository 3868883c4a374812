//! From a target to an open outbound connection: the decision on the name (or address) the
//! client gave, resolution, the decision on every address, and the connect, all within the
//! connect deadline.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use super::outcome::{Refusal, Stop};
use super::policy::{Barred, Policy};
use super::target::{Host, Target};

/// An open outbound connection.
pub(super) struct Opened {
  pub stream: TcpStream,
  pub peer: SocketAddr,
  /// The host's end, which SOCKS5 reports to the client.
  pub local: SocketAddr,
}

fn refusal(t: &Target, reason: String) -> Stop {
  Stop::Refused(Refusal {
    host: t.host.to_string(),
    port: t.port,
    reason,
    over_limit: false,
  })
}

/// The addresses a target may reach, in the resolver's order, or why none.
async fn addresses(
  policy: &Policy,
  host_addrs: &[IpAddr],
  t: &Target,
  deadline: Instant,
  timeout: Duration,
) -> Result<Vec<IpAddr>, Stop> {
  let (candidates, from_hosts) = match &t.host {
    Host::Ip(ip) => {
      policy
        .judge_literal(*ip, t.port)
        .map_err(|r| refusal(t, r))?;
      (vec![*ip], false)
    }
    Host::Name(n) => {
      policy.judge_name(n, t.port).map_err(|r| refusal(t, r))?;
      match policy.hosts_entry(n) {
        Some(a) => (a.to_vec(), true),
        None => (resolve(n, t.port, deadline, timeout).await?, false),
      }
    }
  };
  let mut allowed = Vec::with_capacity(candidates.len());
  let mut barred = Vec::new();
  for ip in candidates {
    match policy.judge_address(ip, t.port, from_hosts, host_addrs) {
      Ok(()) => allowed.push(ip),
      Err(b) => barred.push((ip, b)),
    }
  }
  if allowed.is_empty() {
    return Err(refusal(t, none_allowed(t, &barred)));
  }
  Ok(allowed)
}

async fn resolve(
  n: &str,
  port: u16,
  deadline: Instant,
  timeout: Duration,
) -> Result<Vec<IpAddr>, Stop> {
  match timeout_at(deadline, tokio::net::lookup_host((n, port))).await {
    Err(_) => Err(Stop::TimedOut(format!(
      "resolving {n} took longer than the connect timeout ({} ms)",
      timeout.as_millis()
    ))),
    Ok(Err(e)) => Err(Stop::Unresolved(format!("cannot resolve {n}: {e}"))),
    Ok(Ok(addrs)) => {
      let mut out: Vec<IpAddr> = Vec::new();
      for a in addrs {
        if !out.contains(&a.ip()) {
          out.push(a.ip());
        }
      }
      Ok(out)
    }
  }
}

/// The refusal when every address is barred.
fn none_allowed(t: &Target, barred: &[(IpAddr, Barred)]) -> String {
  let special = barred.iter().any(|(_, b)| matches!(b, Barred::Special(_)));
  let hint = if special {
    "; allow it explicitly with an IP rule if you mean it"
  } else {
    ""
  };
  match (&t.host, barred) {
    (Host::Ip(ip), [(_, Barred::Special(s))]) => format!(
      "{ip} is {}; allow it explicitly with an IP rule within {} if you mean it",
      s.what, s.range
    ),
    (Host::Ip(_), [(_, b)]) => b.why(),
    (_, [(ip, b)]) => format!("{} resolves only to {ip}, {}{hint}", t.host, b.why()),
    _ => {
      let each: Vec<String> = barred
        .iter()
        .take(4)
        .map(|(ip, b)| format!("{ip} ({})", b.why()))
        .collect();
      format!(
        "{} resolves only to refused addresses: {}{hint}",
        t.host,
        each.join(", ")
      )
    }
  }
}

fn connect_failed(t: &Target, ip: IpAddr, e: io::Error) -> Stop {
  let at = format!("{t} ({ip})");
  match e.kind() {
    io::ErrorKind::ConnectionRefused => Stop::ConnRefused(format!("{at} refused the connection")),
    io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
      Stop::Unreachable(format!("{at} is unreachable: {e}"))
    }
    _ => Stop::Other(format!("connecting to {at} failed: {e}")),
  }
}

/// Decides, resolves and connects, trying the allowed addresses in order; the first that
/// connects wins.
pub(super) async fn open(
  policy: &Policy,
  host_addrs: &[IpAddr],
  t: &Target,
  timeout: Duration,
) -> Result<Opened, Stop> {
  let deadline = Instant::now() + timeout;
  let allowed = addresses(policy, host_addrs, t, deadline, timeout).await?;
  let mut last = None;
  for ip in allowed {
    let to = SocketAddr::new(ip, t.port);
    match timeout_at(deadline, TcpStream::connect(to)).await {
      Ok(Ok(stream)) => {
        // Small writes (TLS handshakes, interactive protocols) go out at once.
        let _ = stream.set_nodelay(true);
        let local = stream
          .local_addr()
          .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        return Ok(Opened {
          stream,
          peer: to,
          local,
        });
      }
      Ok(Err(e)) => last = Some(connect_failed(t, ip, e)),
      Err(_) => {
        return Err(Stop::TimedOut(format!(
          "no connection to {t} within the connect timeout ({} ms)",
          timeout.as_millis()
        )))
      }
    }
  }
  Err(last.unwrap_or_else(|| Stop::Other(format!("no address to connect to for {t}"))))
}
