//! A sandbox's egress under a policy, host side: the agent listens on the sandbox's loopback
//! (`PORT`) and hands each connection here, where the sandbox's `Egress` decides it and carries
//! it. One `Egress` per sandbox for this process, so its counters outlive agent restarts; its
//! policy is the one recorded on the sandbox (`config::egress::Egress::of_record`), whoever
//! starts the agent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use trueforge_agent_proto::client::{ClientError, EgressConn, EgressHandler};
use trueforge_agent_proto::msg::{EgressListenSpec, ErrorKind};

use crate::config::egress::Egress as Recorded;
use crate::egress::{Egress, EgressStats, Mode, Refusal, Served};
use crate::engine::Engine;
use crate::sandbox::agent::conn::Conn;
use crate::sandbox::container::Target;
use crate::util::bounded::bounded_insert;
use crate::util::logging::{Level, Logger};

/// The port the agent listens on, in the sandbox's own network namespace: the same in every
/// sandbox (`body::EGRESS_PROXY`).
pub const PORT: u16 = 3128;
/// Connections the agent takes beyond the policy's limit, so that those few are told why (the
/// proxy's 503 naming the limit) before the agent resets the rest outright.
const OVERFLOW: u32 = 32;
/// The most the protocol lets one stream hold unacknowledged.
const MAX_WINDOW: usize = 2 << 20;
/// How often a port held by someone else is tried again.
const RETRY_EVERY: Duration = Duration::from_secs(2);

/// Each sandbox's `Egress` in this process (kept per engine).
#[derive(Default)]
pub struct State(Mutex<HashMap<String, Arc<Egress>>>);

/// What `target` may reach (`mode`: `policy`, `open` or `none`) and, under a policy, the counters
/// of the connections this process carried for it (zeros before the first).
pub fn report(engine: &Engine, target: &Target) -> serde_json::Value {
  let mode = match target.agent.egress.as_ref().map(|r| &r.mode) {
    Some(Mode::Policy(_)) => "policy",
    Some(Mode::Off) => "none",
    Some(Mode::Open) | None => "open",
  };
  let state = engine.shared.state::<State>();
  let stats = match state.0.lock().expect("egress").get(&target.sandbox_id) {
    Some(e) => e.stats(),
    None => EgressStats::default(),
  };
  let mut v = serde_json::to_value(stats).unwrap_or_else(|_| json!({}));
  v["mode"] = json!(mode);
  v
}

/// The sandbox's `Egress`, made on first use.
fn egress_of(
  engine: &Engine,
  target: &Target,
  rec: &Recorded,
  log: &Logger,
) -> Option<Arc<Egress>> {
  let Mode::Policy(policy) = &rec.mode else {
    return None;
  };
  let state = engine.shared.state::<State>();
  let mut by_sandbox = state.0.lock().expect("egress");
  if let Some(e) = by_sandbox.get(&target.sandbox_id) {
    return Some(e.clone());
  }
  let (log, id) = (log.clone(), target.sandbox_id.clone());
  let on_refusal = Arc::new(move |r: &Refusal| refused(&log, &id, r));
  let e = Arc::new(Egress::new(
    Arc::new(policy.clone()),
    rec.limits,
    on_refusal,
  ));
  bounded_insert(&mut by_sandbox, target.sandbox_id.clone(), e.clone());
  Some(e)
}

/// One line per refusal, through the sandbox's log throttle (the sandbox chooses the names).
fn refused(log: &Logger, sandbox_id: &str, r: &Refusal) {
  let meta = json!({ "sandboxId": sandbox_id, "host": r.host, "port": r.port });
  log.sandbox_text(
    Level::Warn,
    "egress refused",
    sandbox_id,
    "reason",
    r.to_string().as_bytes(),
    meta,
  );
}

/// Opens the sandbox's egress port on `conn`, when the sandbox is under a policy. A port held by
/// someone else (another process's agent serving it, or the workload) is tried again while the
/// connection lives; anything else is an error for the caller to log.
pub async fn attach(
  engine: &Engine,
  conn: &Arc<Conn>,
  target: &Target,
  log: &Logger,
) -> Result<(), String> {
  let Some(rec) = target.agent.egress.as_ref() else {
    return Ok(());
  };
  let Some(egress) = egress_of(engine, target, rec, log) else {
    return Ok(());
  };
  conn.client.on_egress(handler(egress));
  let spec = EgressListenSpec {
    port: PORT,
    window: rec.limits.buffer_bytes.min(MAX_WINDOW) as u32,
    max_connections: rec.limits.max_connections.saturating_add(OVERFLOW),
  };
  match conn.client.egress_listen(spec.clone()).await {
    Ok(()) => Ok(()),
    Err(ClientError::Agent(e)) if e.kind == ErrorKind::AddressInUse => {
      log.info(
        "the sandbox's egress port is taken (by another process's agent serving it, or by the workload); trying again while this agent runs",
        json!({ "sandboxId": target.sandbox_id, "port": PORT }),
      );
      retry(conn.clone(), spec);
      Ok(())
    }
    Err(e) => Err(format!(
      "the agent could not open the egress port {PORT}: {e}"
    )),
  }
}

/// Serves each connection the agent hands over on a task of its own.
fn handler(egress: Arc<Egress>) -> EgressHandler {
  Arc::new(move |mut c: EgressConn| {
    let egress = egress.clone();
    tokio::spawn(async move {
      match egress.serve(&mut c).await {
        // Cut short (reset, idle): the client must not take what it got for the whole.
        Served::Allowed(carried) if carried.broken.is_some() => {
          let why = carried.broken.unwrap_or_default();
          c.fail(&why)
        }
        // Everything else has had its answer (the reply, a 403, a SOCKS code).
        _ => c.finish(),
      }
    });
  })
}

/// Tries the port again every `RETRY_EVERY` until it is ours or the connection ends.
fn retry(conn: Arc<Conn>, spec: EgressListenSpec) {
  tokio::spawn(async move {
    loop {
      tokio::select! {
        _ = conn.client.closed() => return,
        _ = tokio::time::sleep(RETRY_EVERY) => {}
      }
      match conn.client.egress_listen(spec.clone()).await {
        Err(ClientError::Agent(e)) if e.kind == ErrorKind::AddressInUse => {}
        _ => return,
      }
    }
  });
}
