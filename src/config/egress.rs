//! The `egress` option and its bounds (`crate::egress` decides each connection): what a sandbox
//! may reach. Kept on each sandbox as a label (`record`), so that whoever starts its agent later
//! (another provider, another process, after an idle stop) enforces the policy it was made with.

use serde_json::{json, Value};

use crate::config::check::bad;
use crate::config::options::ProviderOptions;
use crate::egress::{Limits, Mode};
use crate::util::errors::Result;

/// What a provider's sandboxes may reach, and the bounds on their connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
  pub mode: Mode,
  /// The option as given (or the default), for the label.
  spec: Value,
  pub limits: Limits,
}

impl Egress {
  /// A policy: the sandbox has no network but loopback, and its agent carries its connections.
  pub fn is_policy(&self) -> bool {
    matches!(self.mode, Mode::Policy(_))
  }

  /// No engine network at all: `'none'` or a policy.
  pub fn no_network(&self) -> bool {
    !matches!(self.mode, Mode::Open)
  }

  /// The label value that records it on a sandbox.
  pub fn record(&self) -> String {
    let l = &self.limits;
    json!({
      "mode": self.spec,
      "limits": {
        "maxConnections": l.max_connections,
        "bufferBytes": l.buffer_bytes,
        "idleTimeoutMs": l.idle_timeout.as_millis() as u64,
        "connectTimeoutMs": l.connect_timeout.as_millis() as u64,
      },
    })
    .to_string()
  }

  /// What a sandbox's label recorded; `None` when it is not ours to read (a sandbox made before
  /// the label existed: its network is its own, as `'open'`).
  pub fn of_record(label: &str) -> Option<Egress> {
    let v: Value = serde_json::from_str(label).ok()?;
    let spec = v.get("mode")?.clone();
    Some(Egress {
      mode: Mode::from_json(&spec).ok()?,
      limits: Limits::from_json("label", v.get("limits")?).ok()?,
      spec,
    })
  }

  /// `'open'`: the engine network, no proxy.
  pub fn open() -> Egress {
    Egress {
      mode: Mode::Open,
      spec: json!("open"),
      limits: Limits::default(),
    }
  }
}

/// The option a policy needs (`agent`), and why, for the messages.
const NEEDS_AGENT: &str = "a policy needs the in-sandbox agent, which carries the sandbox's connections to the host's proxy; set agent: true, or egress: 'open' or 'none'";

/// The options read here, taken out of the rest.
pub(super) struct Options {
  egress: Option<Value>,
  limits: [(&'static str, Option<Value>); 4],
}

impl Options {
  pub(super) fn take(o: &mut ProviderOptions) -> Options {
    Options {
      egress: o.egress.take(),
      limits: [
        ("egressMaxConnections", o.egress_max_connections.take()),
        ("egressBufferBytes", o.egress_buffer_bytes.take()),
        ("egressIdleTimeoutMs", o.egress_idle_timeout_ms.take()),
        ("egressConnectTimeoutMs", o.egress_connect_timeout_ms.take()),
      ],
    }
  }
}

/// Reads `egress` and its bounds. Unset, it is the default policy (every public host by name),
/// unless `network` is given or the agent is off: then `'open'`, as before the option existed.
pub(super) fn parse(o: Options, agent: bool, network: Option<&str>) -> Result<Egress> {
  let limits = parse_limits(o.limits)?;
  let given = o.egress.filter(|v| !v.is_null());
  let Some(spec) = given else {
    if network.is_some() || !agent {
      return Ok(Egress {
        limits,
        ..Egress::open()
      });
    }
    let spec = json!({ "allow": ["*"] });
    let mode = Mode::from_json(&spec).map_err(|e| bad("egress", e))?;
    return Ok(Egress { mode, spec, limits });
  };
  let mode = Mode::from_json(&spec).map_err(|e| bad("egress", e))?;
  if matches!(mode, Mode::Policy(_)) && !agent {
    return Err(bad("egress", NEEDS_AGENT));
  }
  if let Some(n) = network.filter(|n| *n != "none" && !matches!(mode, Mode::Open)) {
    return Err(bad(
      "egress",
      format!(
        "contradicts network {n:?}: under a policy or 'none' a sandbox has no network but loopback; leave network unset, or set egress: 'open'"
      ),
    ));
  }
  Ok(Egress { mode, spec, limits })
}

/// `egressMaxConnections`, `egressBufferBytes`, `egressIdleTimeoutMs`, `egressConnectTimeoutMs`.
fn parse_limits(fields: [(&'static str, Option<Value>); 4]) -> Result<Limits> {
  let mut l = Limits::default();
  for (i, (name, v)) in fields.into_iter().enumerate() {
    let Some(v) = v.filter(|v| !v.is_null()) else {
      continue;
    };
    let e = |m: String| bad(name, m.trim_start_matches(&format!("{name}: ")).to_string());
    match i {
      0 => l.max_connections = Limits::max_connections(name, &v).map_err(e)?,
      1 => l.buffer_bytes = Limits::buffer_bytes(name, &v).map_err(e)?,
      2 => l.idle_timeout = Limits::idle_timeout(name, &v).map_err(e)?,
      _ => l.connect_timeout = Limits::connect_timeout(name, &v).map_err(e)?,
    }
  }
  Ok(l)
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::config::ProviderConfig;
  use crate::util::errors::SandboxError;

  fn refused(options: Value) -> (String, String) {
    match ProviderConfig::with_image(options) {
      Err(SandboxError::InvalidOption { option, reason }) => (option, reason),
      other => panic!("expected InvalidOption, got {other:?}"),
    }
  }

  #[test]
  fn unset_it_is_the_default_policy_unless_a_network_is_named_or_the_agent_is_off() {
    let c = ProviderConfig::with_image(json!({})).unwrap();
    assert!(c.egress.is_policy());
    assert_eq!(c.egress.mode, Mode::default());
    for options in [json!({ "network": "bridge" }), json!({ "agent": false })] {
      let c = ProviderConfig::with_image(options).unwrap();
      assert_eq!(c.egress.mode, Mode::Open);
    }
  }

  #[test]
  fn a_policy_needs_the_agent_and_no_network_of_its_own() {
    let (option, reason) = refused(json!({ "egress": { "allow": ["*"] }, "agent": false }));
    assert_eq!(option, "egress");
    assert!(reason.contains("agent"), "{reason}");
    let (option, reason) = refused(json!({ "egress": "none", "network": "bridge" }));
    assert_eq!(option, "egress");
    assert!(
      reason.contains("contradicts network \"bridge\""),
      "{reason}"
    );
    // Consistent combinations.
    for options in [
      json!({ "egress": "none", "network": "none" }),
      json!({ "egress": { "allow": ["pkg.example"] }, "network": "none" }),
      json!({ "egress": "open", "network": "bridge" }),
      json!({ "egress": "none", "agent": false }),
    ] {
      ProviderConfig::with_image(options.clone()).unwrap_or_else(|e| panic!("{options}: {e}"));
    }
  }

  #[test]
  fn bad_values_name_the_option_and_what_is_expected() {
    let (option, reason) = refused(json!({ "egress": "closed" }));
    assert_eq!(option, "egress");
    assert!(
      reason.contains("expected 'open', 'none' or a policy"),
      "{reason}"
    );
    let (option, reason) = refused(json!({ "egress": { "allow": ["foo bar"] } }));
    assert_eq!(option, "egress");
    assert!(reason.starts_with("egress.allow[0]"), "{reason}");
    let (option, reason) = refused(json!({ "egressMaxConnections": 0 }));
    assert_eq!(option, "egressMaxConnections");
    assert_eq!(
      reason,
      "expected an integer from 1 to 65536 (default 256), got 0"
    );
    let (option, _) = refused(json!({ "egressIdleTimeoutMs": "5" }));
    assert_eq!(option, "egressIdleTimeoutMs");
  }

  #[test]
  fn the_record_reads_back_as_it_was() {
    let c = ProviderConfig::with_image(json!({
      "egress": { "allow": ["*.pkg.example:443"], "hosts": { "mirror.pkg.example": "10.1.2.3" } },
      "egressMaxConnections": 12, "egressBufferBytes": 8192,
    }))
    .unwrap();
    let back = Egress::of_record(&c.egress.record()).expect("readable");
    assert_eq!(back, c.egress);
    assert_eq!(back.limits.max_connections, 12);
    assert_eq!(Egress::of_record("not json"), None);
    assert_eq!(
      Egress::of_record(&Egress::open().record()),
      Some(Egress::open())
    );
  }
}
