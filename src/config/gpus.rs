//! The `gpus`, `gpuDevices` and `gpuWaitMs` options: which GPUs a sandbox gets, in the forms
//! `docker run --gpus` takes, as CDI device names, or as a count of exclusive GPUs.

use serde_json::{Number, Value};

use crate::config::check::{bad, typed};
use crate::config::options::Given;
use crate::util::errors::{Result, SandboxError};

/// Which GPUs a sandbox gets: as `docker run --gpus` takes them, CDI device names, or a count
/// of GPUs that no other running sandbox on the engine holds (see src/gpu/).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
  All,
  Count(u32),
  Devices(Vec<String>),
  /// CDI device names (`vendor/class=name`), such as `nvidia.com/gpu=all`.
  Cdi(Vec<String>),
  /// `{ count, exclusive: true }`.
  Exclusive(u32),
}

pub(crate) fn parse_gpu_wait(v: Option<Given<Number>>) -> Result<u64> {
  let expected = |got: &dyn std::fmt::Display| {
    format!(
      "expected a whole number of milliseconds from 0 to {}, got {got}",
      MAX_WAIT_MS
    )
  };
  let Some(n) = typed(v, "gpuWaitMs", |v| expected(v))? else {
    return Ok(0);
  };
  n.as_u64()
    .filter(|ms| *ms <= MAX_WAIT_MS)
    .ok_or_else(|| bad("gpuWaitMs", expected(&n)))
}

pub(crate) fn parse_gpus(v: Value) -> Result<Gpus> {
  let count = |n: &serde_json::Number| match n.as_u64() {
    Some(c) if (1..=64).contains(&c) => Ok(c as u32),
    _ => Err(bad(
      "gpus",
      format!("a count must be a whole number from 1 to 64, got {n}"),
    )),
  };
  match v {
    Value::String(s) if s == "all" => Ok(Gpus::All),
    Value::String(s) if is_cdi_name(&s) => Ok(Gpus::Cdi(vec![s])),
    Value::Number(n) => count(&n).map(Gpus::Count),
    Value::Array(items) => {
      if items.is_empty() {
        return Err(bad(
          "gpus",
          "the device list is empty; omit `gpus` for no GPU",
        ));
      }
      let items = items
        .into_iter()
        .map(|i| match i {
          Value::String(s) if is_cdi_name(&s) || is_device_id(&s) => Ok(s),
          other => Err(bad(
            "gpus",
            format!("device {other} is not an index, a GPU UUID or a CDI name (vendor/class=name)"),
          )),
        })
        .collect::<Result<Vec<_>>>()?;
      let cdi = items.iter().filter(|s| is_cdi_name(s)).count();
      if cdi == items.len() {
        Ok(Gpus::Cdi(items))
      } else if cdi == 0 {
        Ok(Gpus::Devices(items))
      } else {
        Err(bad(
          "gpus",
          "mixes CDI names and device ids; use one kind (CDI names such as nvidia.com/gpu=0, or ids such as 0)",
        ))
      }
    }
    Value::Object(m) => {
      let mut n = None;
      let mut exclusive = false;
      for (k, v) in m {
        match (k.as_str(), v) {
          ("count", Value::Number(c)) => n = Some(count(&c)?),
          ("exclusive", Value::Bool(b)) => exclusive = b,
          ("exclusive", Value::Null) => {}
          (k, v) => {
            return Err(bad(
              "gpus",
              format!(
                "{k}: {v} is not understood; expected {{ count: number, exclusive?: boolean }}"
              ),
            ))
          }
        }
      }
      let n = n.ok_or_else(|| {
        bad(
          "gpus",
          "an object needs `count`, as in { count: 1, exclusive: true }",
        )
      })?;
      Ok(if exclusive {
        Gpus::Exclusive(n)
      } else {
        Gpus::Count(n)
      })
    }
    other => Err(bad(
      "gpus",
      format!("expected 'all', a count, a list of device ids, CDI names, or {{ count, exclusive }}, got {other}"),
    )),
  }
}

/// The largest `gpuWaitMs` accepted: an hour.
pub const MAX_WAIT_MS: u64 = 3_600_000;

/// Whether `s` is a fully qualified CDI device name, `vendor.com/class=name`.
pub fn is_cdi_name(s: &str) -> bool {
  let Some((kind, name)) = s.split_once('=') else {
    return false;
  };
  let Some((vendor, class)) = kind.split_once('/') else {
    return false;
  };
  let vendor_ok = !vendor.is_empty()
    && vendor
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    && vendor.starts_with(|c: char| c.is_ascii_alphanumeric());
  let class_ok = !class.is_empty()
    && class
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
  let name_ok = !name.is_empty()
    && name.len() <= 128
    && name
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
  s.len() <= 255 && vendor_ok && class_ok && name_ok
}

/// Whether `s` is a GPU index or UUID as `docker run --gpus device=…` takes them.
pub fn is_device_id(s: &str) -> bool {
  !s.is_empty()
    && s.len() <= 128
    && s
      .chars()
      .all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c))
}

/// Parses `gpuDevices`: the GPUs exclusive allocation hands out, as ids or CDI names.
pub fn parse_devices(v: Option<Value>, gpus: Option<&Gpus>) -> Result<Vec<String>> {
  let bad = |reason: String| SandboxError::InvalidOption {
    option: "gpuDevices".into(),
    reason,
  };
  let Some(v) = v else { return Ok(Vec::new()) };
  let Value::Array(items) = v else {
    return Err(bad(format!(
      "expected a list of GPU ids or CDI names such as ['0', '1'], got {v}"
    )));
  };
  if !matches!(gpus, Some(Gpus::Exclusive(_))) {
    return Err(bad(
      "only exclusive allocation uses it; set gpus: { count: n, exclusive: true }".into(),
    ));
  }
  if items.is_empty() || items.len() > 256 {
    return Err(bad("expected 1 to 256 devices".into()));
  }
  let mut out: Vec<String> = Vec::new();
  for i in items {
    match i {
      Value::String(s) if (is_cdi_name(&s) || is_device_id(&s)) && !out.contains(&s) => out.push(s),
      Value::String(s) if out.contains(&s) => return Err(bad(format!("{s:?} is listed twice"))),
      other => {
        return Err(bad(format!(
          "{other} is not a GPU index, a GPU UUID or a CDI name (vendor/class=name)"
        )))
      }
    }
  }
  if let Some(Gpus::Exclusive(n)) = gpus {
    if out.len() < *n as usize {
      return Err(bad(format!(
        "lists {} device(s), fewer than the {n} each sandbox needs",
        out.len()
      )));
    }
  }
  Ok(out)
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::config::ProviderConfig;
  use serde_json::json;

  fn cfg(v: Value) -> Result<ProviderConfig> {
    ProviderConfig::with_image(v)
  }

  fn option_of(r: Result<ProviderConfig>) -> String {
    match r {
      Err(SandboxError::InvalidOption { option, .. }) => option,
      other => panic!("expected InvalidOption, got {other:?}"),
    }
  }

  #[test]
  fn cdi_names() {
    for ok in [
      "nvidia.com/gpu=all",
      "nvidia.com/gpu=0",
      "nvidia.com/gpu=GPU-8d8e8f2c-1a2b-3c4d-5e6f-0123456789ab",
      "vendor.example/class_x=a:b",
    ] {
      assert!(is_cdi_name(ok), "{ok}");
    }
    for bad in [
      "all",
      "0",
      "nvidia.com/gpu",
      "nvidia.com=gpu",
      "/gpu=0",
      "nvidia.com/gpu=",
      "a/b=c;rm",
      "a/b=c d",
    ] {
      assert!(!is_cdi_name(bad), "{bad}");
    }
  }

  #[test]
  fn gpus_forms() {
    let g = |v: Value| {
      ProviderConfig::from_json(json!({ "image": "x", "gpus": v }))
        .unwrap()
        .gpus
    };
    assert_eq!(g(json!("all")), Some(Gpus::All));
    assert_eq!(g(json!(2)), Some(Gpus::Count(2)));
    assert_eq!(
      g(json!(["0", "GPU-abc-1"])),
      Some(Gpus::Devices(vec!["0".into(), "GPU-abc-1".into()]))
    );
    assert_eq!(g(Value::Null), None);
  }

  #[test]
  fn gpus_option_forms() {
    let g = |v: Value| cfg(json!({ "gpus": v })).expect("valid").gpus;
    assert_eq!(
      g(json!("nvidia.com/gpu=all")),
      Some(Gpus::Cdi(vec!["nvidia.com/gpu=all".into()]))
    );
    assert_eq!(
      g(json!(["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-abc"])),
      Some(Gpus::Cdi(vec![
        "nvidia.com/gpu=0".into(),
        "nvidia.com/gpu=GPU-abc".into()
      ]))
    );
    assert_eq!(
      g(json!({ "count": 2, "exclusive": true })),
      Some(Gpus::Exclusive(2))
    );
    assert_eq!(g(json!({ "count": 2 })), Some(Gpus::Count(2)));
    assert_eq!(
      g(json!({ "count": 2, "exclusive": false })),
      Some(Gpus::Count(2))
    );
    for bad in [
      json!(["nvidia.com/gpu=0", "1"]),
      json!({ "exclusive": true }),
      json!({ "count": 0, "exclusive": true }),
      json!({ "count": 1, "exclusive": "yes" }),
      json!({ "count": 1, "other": 1 }),
      json!("nvidia.com/gpu"),
    ] {
      assert_eq!(
        option_of(cfg(json!({ "gpus": bad.clone() }))),
        "gpus",
        "{bad}"
      );
    }
  }

  #[test]
  fn gpu_devices_and_wait_options() {
    let c = cfg(json!({ "gpus": { "count": 1, "exclusive": true }, "gpuDevices": ["0", "GPU-a"], "gpuWaitMs": 1500 }))
      .expect("valid");
    assert_eq!(c.gpu_devices, vec!["0".to_string(), "GPU-a".to_string()]);
    assert_eq!(c.gpu_wait_ms, 1500);
    assert_eq!(cfg(json!({})).expect("valid").gpu_wait_ms, 0);
    // Only with exclusive; enough of them; no duplicates; well-formed.
    assert_eq!(
      option_of(cfg(json!({ "gpus": 1, "gpuDevices": ["0"] }))),
      "gpuDevices"
    );
    let ex2 = json!({ "count": 2, "exclusive": true });
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex2, "gpuDevices": ["0"] }))),
      "gpuDevices"
    );
    let ex1 = json!({ "count": 1, "exclusive": true });
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "gpuDevices": ["0", "0"] }))),
      "gpuDevices"
    );
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "gpuDevices": ["0;rm"] }))),
      "gpuDevices"
    );
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "gpuDevices": "0" }))),
      "gpuDevices"
    );
    assert_eq!(option_of(cfg(json!({ "gpuWaitMs": -1 }))), "gpuWaitMs");
    assert_eq!(
      option_of(cfg(json!({ "gpuWaitMs": 3_600_001 }))),
      "gpuWaitMs"
    );
    // Idle pool members would hold exclusive GPUs.
    assert_eq!(
      option_of(cfg(json!({ "gpus": ex1, "warmPool": { "size": 1 } }))),
      "warmPool"
    );
  }
}
