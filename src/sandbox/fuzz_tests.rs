//! Property tests over the parsers at the boundary: whatever a caller sends, they return a
//! value or a typed error, never panic, and what they accept obeys the rules.

use proptest::prelude::*;
use serde_json::Value;

use crate::config::ProviderConfig;
use crate::sandbox::layout;
use crate::sandbox::output::{CappedOutput, Marker, MarkerScanner};
use crate::util::errors::SandboxError;
use crate::util::ids;

fn json_value() -> impl Strategy<Value = Value> {
  let leaf = prop_oneof![
    Just(Value::Null),
    any::<bool>().prop_map(Value::from),
    any::<i64>().prop_map(Value::from),
    any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
      .map(Value::Number)
      .unwrap_or(Value::Null)),
    ".{0,40}".prop_map(Value::from),
  ];
  leaf.prop_recursive(3, 24, 6, |inner| {
    prop_oneof![
      prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
      prop::collection::btree_map(
        prop_oneof![
          Just("image".to_string()),
          Just("namespace".to_string()),
          Just("gpus".to_string()),
          Just("env".to_string()),
          Just("resources".to_string()),
          Just("capabilities".to_string()),
          Just("network".to_string()),
          Just("user".to_string()),
          Just("build".to_string()),
          Just("registryAuth".to_string()),
          Just("warmPool".to_string()),
          Just("execTimeoutMs".to_string()),
          Just("autoStopIntervalInMinutes".to_string()),
          ".{0,12}",
        ],
        inner,
        0..6
      )
      .prop_map(|m| Value::Object(m.into_iter().collect())),
    ]
  })
}

proptest! {
  #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

  #[test]
  fn options_never_panic(v in json_value()) {
    match ProviderConfig::from_json(v) {
      Ok(c) => {
        prop_assert!(!c.image.is_empty());
        prop_assert!(c.exec_timeout_ms > 0);
        prop_assert!(c.resources.pids_limit.is_some());
        prop_assert!(c.network.as_deref() != Some("host"));
        prop_assert!(c
          .capabilities
          .iter()
          .all(|c| crate::config::capabilities::ALLOWED_CAPABILITIES.contains(&c.as_str())));
      }
      Err(e) => {
        let typed = matches!(e, SandboxError::InvalidOption { .. });
        prop_assert!(typed, "untyped error {:?}", e);
      }
    }
  }

  #[test]
  fn ids_only_accept_the_grammar(s in ".{0,64}") {
    if let Some(ulid) = ids::parse_sandbox_id(&s) {
      let expected = format!("/workspace/{ulid}");
      prop_assert_eq!(s.as_str(), expected.as_str());
      prop_assert_eq!(ulid.len(), 26);
      prop_assert!(ulid.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()));
      let name = ids::container_name("ns", ulid);
      prop_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    }
  }

  #[test]
  fn near_miss_ids_are_refused(ulid in "[0-7][0-9A-HJKMNP-TV-Z]{25}", junk in "[^0-9A-HJKMNP-TV-Z]", at in 0usize..26) {
    let good = format!("/workspace/{ulid}");
    prop_assert!(ids::parse_sandbox_id(&good).is_some());
    let mut bad = ulid.clone();
    bad.replace_range(at..at + 1, &junk);
    let bad_id = format!("/workspace/{bad}");
    prop_assert!(ids::parse_sandbox_id(&bad_id).is_none());
  }

  #[test]
  fn resolved_paths_are_clean(p in prop_oneof![".{0,80}", "(/|\\.\\./|\\./|[a-z]{1,3}/|\\.\\.){0,12}[a-z]{0,4}"]) {
    match layout::resolve_path("/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV", &p) {
      Ok(r) => {
        prop_assert!(r.starts_with('/'));
        prop_assert!(!r.split('/').any(|s| s == ".." || s == "."));
        prop_assert!(!r.contains("//"));
        prop_assert!(r.len() <= layout::MAX_PATH_BYTES);
        prop_assert!(!p.split('/').any(|s| s == ".."));
      }
      Err(SandboxError::PathTraversal { .. }) => prop_assert!(p.split('/').any(|s| s == "..")),
      Err(SandboxError::InvalidPath { .. }) => {}
      Err(other) => prop_assert!(false, "unexpected error {other:?}"),
    }
  }

  #[test]
  fn capped_output_keeps_exact_head_and_tail(data in prop::collection::vec(any::<u8>(), 0..3000), cap in 2usize..600, cuts in prop::collection::vec(1usize..200, 1..40)) {
    let mut c = CappedOutput::new(cap);
    let mut rest = &data[..];
    let mut i = 0;
    while !rest.is_empty() {
      let n = cuts[i % cuts.len()].min(rest.len());
      c.push(&rest[..n]);
      rest = &rest[n..];
      i += 1;
    }
    let omitted = c.omitted();
    prop_assert_eq!(omitted as usize, data.len().saturating_sub(cap));
    let text = c.into_text();
    if omitted == 0 {
      prop_assert_eq!(text, String::from_utf8_lossy(&data).into_owned());
    } else {
      let notice = format!("[... {omitted} bytes of output omitted ...]");
      prop_assert!(text.contains(&notice));
    }
  }

  #[test]
  fn markers_survive_any_chunking(payload in prop::collection::vec(any::<u8>(), 0..400), code in -300i32..300, pid in 1u32..100000, cuts in prop::collection::vec(1usize..50, 1..20)) {
    let token = "00ff00ff00ff00ff";
    let mut stream = format!("\x1eTFX{token}:p:{pid}\x1e").into_bytes();
    stream.extend_from_slice(&payload);
    stream.extend_from_slice(format!("\x1eTFX{token}:x:{code}\x1e").as_bytes());
    let mut s = MarkerScanner::new(token);
    let mut out = Vec::new();
    let mut marks = Vec::new();
    let mut rest = &stream[..];
    let mut i = 0;
    while !rest.is_empty() {
      let n = cuts[i % cuts.len()].min(rest.len());
      s.feed(&rest[..n], &mut |b| out.extend_from_slice(b), &mut marks);
      rest = &rest[n..];
      i += 1;
    }
    s.finish(&mut |b| out.extend_from_slice(b));
    prop_assert_eq!(marks, vec![Marker::Pid(pid), Marker::Exit(code)]);
    prop_assert_eq!(out, payload);
  }
}
