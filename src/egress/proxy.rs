//! One sandbox's egress: its policy, bounds and counters, and the serving of each connection
//! its agent carries to the host.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::{timeout, timeout_at, Instant};

use super::addr::host_addresses;
use super::dial::{self, Opened};
use super::http::{self, Ask};
use super::intake::{Intake, Short};
use super::limits::Limits;
use super::outcome::{Carried, Refusal, Served, Stop};
use super::pipe::{self, Totals};
use super::policy::Policy;
use super::socks;
use super::target::Target;

/// The head an over-limit connection may send before it gets its refusal: enough for the
/// target of a usual request, and small, so that a flood of them holds little.
const OVER_LIMIT_CAP: usize = 4 * 1024;

/// A sandbox's egress counters, since its `Egress` was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressStats {
  /// Connections the policy allowed and the host opened.
  pub allowed: u64,
  /// Connections refused by the policy or the connection limit.
  pub refused: u64,
  /// Connections that ended otherwise: protocol errors, names that do not resolve, failed or
  /// timed-out connects.
  pub failed: u64,
  /// Connections open now.
  pub open: u32,
  /// Bytes from the sandbox to the outside.
  pub bytes_out: u64,
  /// Bytes from the outside to the sandbox.
  pub bytes_in: u64,
}

#[derive(Default)]
struct Counters {
  allowed: AtomicU64,
  refused: AtomicU64,
  failed: AtomicU64,
  open: AtomicU32,
  bytes_out: AtomicU64,
  bytes_in: AtomicU64,
}

/// A place among the connections a sandbox may hold open, given back on drop (so also when
/// `serve` is cancelled).
struct Slot<'a>(&'a AtomicU32);

impl Drop for Slot<'_> {
  fn drop(&mut self) {
    self.0.fetch_sub(1, Ordering::AcqRel);
  }
}

/// Called with each refusal, for the sandbox's logger.
pub type OnRefusal = Arc<dyn Fn(&Refusal) + Send + Sync>;

/// One sandbox's egress proxy on the host.
pub struct Egress {
  policy: Arc<Policy>,
  limits: Limits,
  on_refusal: OnRefusal,
  host_addrs: RwLock<Arc<[IpAddr]>>,
  counters: Counters,
}

impl Egress {
  /// Reads the engine host's own addresses once (see `refresh_host_addresses`).
  pub fn new(policy: Arc<Policy>, limits: Limits, on_refusal: OnRefusal) -> Egress {
    Egress {
      policy,
      limits,
      on_refusal,
      host_addrs: RwLock::new(host_addresses().into()),
      counters: Counters::default(),
    }
  }

  /// Reads the host's addresses again, after its interfaces changed.
  pub fn refresh_host_addresses(&self) {
    let fresh: Arc<[IpAddr]> = host_addresses().into();
    *self.host_addrs.write().unwrap_or_else(|e| e.into_inner()) = fresh;
  }

  /// The policy it enforces.
  pub fn policy(&self) -> &Policy {
    &self.policy
  }

  /// The bounds it keeps.
  pub fn limits(&self) -> &Limits {
    &self.limits
  }

  /// The counters now (each read on its own: a snapshot, not a transaction).
  pub fn stats(&self) -> EgressStats {
    let c = &self.counters;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    EgressStats {
      allowed: get(&c.allowed),
      refused: get(&c.refused),
      failed: get(&c.failed),
      open: c.open.load(Ordering::Relaxed),
      bytes_out: get(&c.bytes_out),
      bytes_in: get(&c.bytes_in),
    }
  }

  /// Serves one connection from the sandbox end to end: the handshake (HTTP or SOCKS5, told
  /// apart by the first byte), the decision, the outbound connect and the piping. Dropping the
  /// future closes the outbound side and drops `client` (pass `&mut conn` to keep it). When it
  /// returns, the client has had every byte meant for it; see `Served` for how to end it.
  pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send>(&self, mut client: S) -> Served {
    let open = &self.counters.open;
    let max = self.limits.max_connections;
    let slot = open
      .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < max).then_some(n + 1)
      })
      .ok()
      .map(|_| Slot(open));
    let served = self.handshake(&mut client, slot.is_none()).await;
    let c = &self.counters;
    match &served {
      Served::Allowed(_) => {}
      Served::Refused(r) => {
        c.refused.fetch_add(1, Ordering::Relaxed);
        (self.on_refusal)(r);
      }
      Served::Failed(_) => {
        c.failed.fetch_add(1, Ordering::Relaxed);
      }
    }
    drop(slot);
    served
  }

  async fn handshake<S: AsyncRead + AsyncWrite + Unpin + Send>(
    &self,
    client: &mut S,
    over: bool,
  ) -> Served {
    let mut intake = Intake::default();
    let wait = if over {
      self.limits.connect_timeout
    } else {
      self.limits.idle_timeout
    };
    let deadline = Instant::now() + wait;
    let cap = if over { OVER_LIMIT_CAP } else { http::HEAD_CAP };
    match timeout_at(deadline, intake.more(client, cap)).await {
      Ok(Ok(())) => {}
      Ok(Err(Short::Io(e))) => return Served::Failed(format!("reading from the client: {e}")),
      Ok(Err(_)) => return Served::Failed("the client sent nothing".into()),
      Err(_) => return Served::Failed(format!("the client sent nothing within {wait:?}")),
    }
    match intake.unread()[0] {
      5 => self.socks(client, intake, over, deadline).await,
      4 => {
        self.reply(client, &socks::SOCKS4_REJECTED).await;
        Served::Failed("SOCKS4 is not supported; use SOCKS5 (socks5h://)".into())
      }
      _ => self.http(client, intake, over, deadline, cap).await,
    }
  }

  /// Sends a last reply and shuts the client's side, within the connect timeout (a client
  /// that does not read must not hold the connection).
  async fn reply<S: AsyncWrite + Unpin>(&self, client: &mut S, bytes: &[u8]) {
    let _ = timeout(self.limits.connect_timeout, async {
      client.write_all(bytes).await?;
      client.shutdown().await
    })
    .await;
  }

  fn over_limit(&self, host: String, port: u16) -> Stop {
    Stop::Refused(Refusal {
      host,
      port,
      reason: format!(
        "the sandbox already has {} egress connections open, its limit",
        self.limits.max_connections
      ),
      over_limit: true,
    })
  }

  async fn socks<S: AsyncRead + AsyncWrite + Unpin + Send>(
    &self,
    client: &mut S,
    mut intake: Intake,
    over: bool,
    deadline: Instant,
  ) -> Served {
    let target = match timeout_at(deadline, socks::handshake(client, &mut intake)).await {
      Ok(Ok(t)) => t,
      Ok(Err(r)) => {
        if let Some(code) = r.reply {
          self.reply(client, &socks::reply(code, None)).await;
        }
        return Served::Failed(r.why);
      }
      Err(_) => return Served::Failed("the SOCKS5 handshake timed out".into()),
    };
    let opened = match over {
      true => Err(self.over_limit(target.host.to_string(), target.port)),
      false => self.open(&target).await,
    };
    match opened {
      Err(stop) => {
        self.reply(client, &socks::reply(stop.socks(), None)).await;
        stop.into_served()
      }
      Ok(o) => {
        let ok = socks::reply(socks::SUCCEEDED, Some(o.local));
        if timeout(self.limits.idle_timeout, client.write_all(&ok))
          .await
          .is_err()
        {
          return Served::Failed("the client did not take the SOCKS5 reply".into());
        }
        self.carry(client, o, &target, intake.into_rest()).await
      }
    }
  }

  /// Reads the request head, or answers the client itself.
  async fn read_head<S: AsyncRead + AsyncWrite + Unpin + Send>(
    &self,
    client: &mut S,
    intake: &mut Intake,
    deadline: Instant,
    cap: usize,
  ) -> Result<Ask, (u16, String)> {
    let mut searched = 0;
    loop {
      if let Some(end) = http::head_end(intake.unread(), searched) {
        let ask = http::parse(&intake.unread()[..end]).map_err(|b| (b.status, b.message));
        intake.consume(end);
        return ask;
      }
      searched = intake.unread().len();
      match timeout_at(deadline, intake.more(client, cap)).await {
        Ok(Ok(())) => {}
        Ok(Err(Short::Full)) => {
          return Err((431, format!("the request head is over {cap} bytes")));
        }
        Ok(Err(_)) => {
          return Err((
            400,
            "the client closed before its request head ended".into(),
          ))
        }
        Err(_) => {
          return Err((
            408,
            "the request head took longer than the idle timeout".into(),
          ))
        }
      }
    }
  }

  async fn http<S: AsyncRead + AsyncWrite + Unpin + Send>(
    &self,
    client: &mut S,
    mut intake: Intake,
    over: bool,
    deadline: Instant,
    cap: usize,
  ) -> Served {
    let ask = self.read_head(client, &mut intake, deadline, cap).await;
    let (target, head) = match ask {
      Ok(Ask::Connect(t)) => (t, None),
      Ok(Ask::Forward(t, head)) => (t, Some(head)),
      Err(_) if over => (Target::from_host("unknown", 0).expect("a name"), None),
      Err((status, message)) => {
        self.reply(client, &http::response(status, &message)).await;
        return Served::Failed(message);
      }
    };
    let opened = match over {
      true => Err(self.over_limit(target.host.to_string(), target.port)),
      false => self.open(&target).await,
    };
    let o = match opened {
      Ok(o) => o,
      Err(stop) => {
        let (status, body) = stop.http();
        self.reply(client, &http::response(status, &body)).await;
        return stop.into_served();
      }
    };
    let mut prelude = intake.into_rest();
    match head {
      Some(mut h) => {
        h.append(&mut prelude);
        prelude = h;
      }
      None => {
        let sent = timeout(
          self.limits.idle_timeout,
          client.write_all(http::ESTABLISHED),
        );
        if sent.await.is_err() {
          return Served::Failed("the client did not take the CONNECT reply".into());
        }
      }
    }
    self.carry(client, o, &target, prelude).await
  }

  async fn open(&self, t: &Target) -> Result<Opened, Stop> {
    let host_addrs = self
      .host_addrs
      .read()
      .unwrap_or_else(|e| e.into_inner())
      .clone();
    dial::open(&self.policy, &host_addrs, t, self.limits.connect_timeout).await
  }

  /// Sends what the client sent past its handshake, then pipes.
  async fn carry<S: AsyncRead + AsyncWrite + Unpin + Send>(
    &self,
    client: &mut S,
    mut o: Opened,
    t: &Target,
    prelude: Vec<u8>,
  ) -> Served {
    let c = &self.counters;
    c.allowed.fetch_add(1, Ordering::Relaxed);
    let first = prelude.len() as u64;
    let mut broken = None;
    if first > 0 {
      match timeout(self.limits.idle_timeout, o.stream.write_all(&prelude)).await {
        Ok(Ok(())) => c.bytes_out.fetch_add(first, Ordering::Relaxed),
        Ok(Err(e)) => {
          broken = Some(format!("sending what the client sent first: {e}"));
          0
        }
        Err(_) => {
          broken = Some("the origin took nothing within the idle timeout".into());
          0
        }
      };
    }
    drop(prelude);
    let r = match broken {
      Some(b) => pipe::Relayed {
        out: 0,
        inn: 0,
        broken: Some(b),
      },
      None => {
        let totals = Totals {
          out: &c.bytes_out,
          inn: &c.bytes_in,
        };
        let (buf, idle) = (self.limits.buffer_bytes, self.limits.idle_timeout);
        pipe::relay(client, &mut o.stream, buf, idle, totals).await
      }
    };
    Served::Allowed(Carried {
      host: t.host.to_string(),
      port: t.port,
      peer: o.peer,
      bytes_out: first + r.out,
      bytes_in: r.inn,
      broken: r.broken,
    })
  }
}
