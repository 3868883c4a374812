//! The options checked as a whole, through `ProviderConfig::from_json`: defaults, each refusal
//! named, and the messages that stay the same; the shared helpers of the modules' own tests.

use serde_json::{json, Value};

use crate::config::options::{Given, ProviderOptions};
use crate::config::{
  InflightBounds, ProviderConfig, Resources, DEFAULT_CAPABILITIES, DEFAULT_PIDS_LIMIT,
};
use crate::util::errors::SandboxError;

pub(super) fn err_option(v: Value) -> String {
  match ProviderConfig::from_json(v) {
    Err(SandboxError::InvalidOption { option, .. }) => option,
    other => panic!("expected InvalidOption, got {other:?}"),
  }
}

#[test]
fn defaults() {
  let c = ProviderConfig::from_json(json!({ "image": "busybox:1" })).unwrap();
  assert_eq!(c.namespace, "default");
  assert_eq!(c.exec_timeout_ms, 60_000);
  assert_eq!(c.file_max_bytes, 20 << 20);
  assert_eq!(c.upload_max_bytes, None);
  assert_eq!(c.max_output_bytes, 10 << 20);
  assert_eq!(c.gpus, None);
  assert_eq!(c.docker_host, None);
  assert_eq!(
    c.code_mode_inflight,
    InflightBounds {
      per_sandbox: 64 << 20,
      per_provider: 256 << 20
    }
  );
}

#[test]
fn each_bad_option_is_named() {
  assert_eq!(err_option(json!({})), "image");
  assert_eq!(err_option(json!({ "image": 3 })), "image");
  assert_eq!(err_option(json!({ "image": "a b" })), "image");
  assert_eq!(
    err_option(json!({ "image": "x", "namespace": "Bad" })),
    "namespace"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "namespace": "" })),
    "namespace"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "namespace": "a".repeat(33) })),
    "namespace"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "execTimeoutMs": 0 })),
    "execTimeoutMs"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "execTimeoutMs": -5 })),
    "execTimeoutMs"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "execTimeoutMs": 1.5 })),
    "execTimeoutMs"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "execTimeoutMs": "10" })),
    "execTimeoutMs"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "fileMaxBytes": 1e12 })),
    "fileMaxBytes"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "uploadMaxBytes": -1 })),
    "uploadMaxBytes"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "uploadMaxBytes": 1e16 })),
    "uploadMaxBytes"
  );
  let big = ProviderConfig::from_json(json!({ "image": "x", "uploadMaxBytes": 1e12 })).unwrap();
  assert_eq!(big.upload_max_bytes, Some(1_000_000_000_000));
  assert_eq!(
    ProviderConfig::from_json(json!({ "image": "x", "uploadMaxBytes": null }))
      .unwrap()
      .upload_max_bytes,
    None
  );
  assert_eq!(
    err_option(json!({ "image": "x", "maxOutputBytes": 10 })),
    "maxOutputBytes"
  );
  assert_eq!(err_option(json!({ "image": "x", "gpus": "some" })), "gpus");
  assert_eq!(err_option(json!({ "image": "x", "gpus": 0 })), "gpus");
  assert_eq!(err_option(json!({ "image": "x", "gpus": [] })), "gpus");
  assert_eq!(
    err_option(json!({ "image": "x", "gpus": ["0;rm"] })),
    "gpus"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "env": { "A=B": "1" } })),
    "env"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "env": { "A": 1 } })),
    "env"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "labels": { "trueforge.sandbox.id": "1" } })),
    "labels"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "dockerHost": "npipe:////./pipe/docker_engine" })),
    "dockerHost"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "dockerHost": "unix://rel" })),
    "dockerHost"
  );
  assert_eq!(err_option(json!({ "image": "x", "imgae": "y" })), "imgae");
}

#[test]
fn hardening_and_lifecycle_options() {
  let c = ProviderConfig::from_json(json!({ "image": "x" })).unwrap();
  assert_eq!(c.auto_stop_secs, Some(900));
  assert_eq!(c.auto_delete_secs, Some(7200 * 60));
  assert_eq!(c.capabilities.len(), DEFAULT_CAPABILITIES.len());
  assert!(c.no_new_privileges);
  assert_eq!(c.resources.pids_limit, Some(DEFAULT_PIDS_LIMIT));
  assert_eq!(c.network, None);
  assert!(!c.read_only_rootfs);
  let c = ProviderConfig::from_json(json!({
    "image": "x", "autoStopIntervalInMinutes": 0.05, "autoDeleteIntervalInMinutes": 0,
    "resources": { "memoryBytes": 67108864, "pidsLimit": 64, "nanoCpus": null },
    "network": "none", "user": "1000:1000", "readOnlyRootfs": true, "runtime": "runsc",
    "tenantName": "acme", "capabilities": ["cap_chown"], "warmPool": { "size": 2 },
    "build": { "context": "/ctx", "args": { "V": "1" } },
    "registryAuth": { "localhost:5000": { "username": "u", "password": "p" } }
  }))
  .unwrap();
  assert_eq!(c.auto_stop_secs, Some(3));
  assert_eq!(c.auto_delete_secs, None);
  assert_eq!(
    c.resources,
    Resources {
      memory_bytes: Some(64 << 20),
      nano_cpus: None,
      pids_limit: Some(64)
    }
  );
  assert_eq!(c.capabilities, vec!["CHOWN".to_string()]);
  assert_eq!(c.warm_pool_size, 2);
  assert_eq!(c.build.unwrap().dockerfile, "Dockerfile");
  assert_eq!(
    err_option(json!({ "image": "x", "network": "host" })),
    "network"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "network": "container:abc" })),
    "network"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "capabilities": ["SYS_ADMIN"] })),
    "capabilities"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "capabilities": ["ALL"] })),
    "capabilities"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "resources": { "pidsLimit": null } })),
    "resources.pidsLimit"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "resources": { "swap": 1 } })),
    "resources.swap"
  );
  assert_eq!(err_option(json!({ "image": "x", "user": "a;b" })), "user");
  assert_eq!(
    err_option(json!({ "image": "x", "autoStopIntervalInMinutes": -1 })),
    "autoStopIntervalInMinutes"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "build": {} })),
    "build.context"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "registryAuth": { "r": { "username": "u" } } })),
    "registryAuth.r"
  );
  assert_eq!(
    err_option(json!({ "image": "x", "warmPool": { "size": -1 } })),
    "warmPool.size"
  );
}

pub(super) fn refusal(v: Value) -> (String, String) {
  match ProviderConfig::from_json(v) {
    Err(SandboxError::InvalidOption { option, reason }) => (option, reason),
    other => panic!("expected InvalidOption, got {other:?}"),
  }
}

#[test]
fn try_from_refuses_field_by_field() {
  let ok = || ProviderOptions {
    image: Some(Given::Typed("busybox:1".into())),
    ..ProviderOptions::default()
  };
  let refused = |o: ProviderOptions| match ProviderConfig::try_from(o) {
    Err(SandboxError::InvalidOption { option, reason }) => (option, reason),
    other => panic!("expected InvalidOption, got {other:?}"),
  };
  assert_eq!(ProviderConfig::try_from(ok()).unwrap().image, "busybox:1");
  assert_eq!(
    refused(ProviderOptions::default()),
    (
      "image".into(),
      "required: the image every sandbox runs".into()
    )
  );
  assert_eq!(
    refused(ProviderOptions {
      image: Some(Given::Mistyped(json!(3))),
      ..ProviderOptions::default()
    }),
    (
      "image".into(),
      "expected a string such as 'python:3.12'".into()
    )
  );
  assert_eq!(
    refused(ProviderOptions {
      exec_timeout_ms: Some(Given::Mistyped(json!("10"))),
      ..ok()
    }),
    (
      "execTimeoutMs".into(),
      "expected a number, got \"10\"".into()
    )
  );
  assert_eq!(
    refused(ProviderOptions {
      no_new_privileges: Some(Given::Mistyped(json!(1))),
      ..ok()
    }),
    (
      "noNewPrivileges".into(),
      "expected true or false, got 1".into()
    )
  );
  assert_eq!(
    refused(ProviderOptions {
      runtime: Some(Given::Typed("a b".into())),
      ..ok()
    }),
    (
      "runtime".into(),
      "expected a runtime name such as 'runsc', got \"a b\"".into()
    )
  );
}

/// Options of the wrong type, with the option and reason each refusal names.
fn wrong_type_cases() -> Vec<(Value, &'static str, &'static str)> {
  vec![
    (
      json!({ "execTimeoutMs": 1.5 }),
      "execTimeoutMs",
      "expected a positive whole number, got 1.5",
    ),
    (
      json!({ "fileMaxBytes": 1e12 }),
      "fileMaxBytes",
      "1000000000000.0 is above the maximum 1073741824",
    ),
    (
      json!({ "env": { "A": 1 } }),
      "env",
      "value of \"A\" must be a string, got 1",
    ),
    (
      json!({ "env": ["A"] }),
      "env",
      "expected an object of strings, got [\"A\"]",
    ),
    (
      json!({ "capabilities": [null] }),
      "capabilities",
      "null is not a capability name",
    ),
    (
      json!({ "capabilities": "CHOWN" }),
      "capabilities",
      "expected a list such as ['CHOWN', 'SETUID'], got \"CHOWN\"",
    ),
    (
      json!({ "autoStopIntervalInMinutes": "5" }),
      "autoStopIntervalInMinutes",
      "expected a number of minutes, got \"5\"",
    ),
    (
      json!({ "network": 1 }),
      "network",
      "expected 'bridge', 'none' or a network name, got 1",
    ),
    (
      json!({ "tenantName": "" }),
      "tenantName",
      "expected a non-empty string up to 128 bytes, got \"\"",
    ),
    (
      json!({ "gpuWaitMs": -1 }),
      "gpuWaitMs",
      "expected a whole number of milliseconds from 0 to 3600000, got -1",
    ),
    (
      json!({ "build": "." }),
      "build",
      "expected { context, dockerfile?, args? }, got \".\"",
    ),
    (
      json!({ "build": { "context": "/c", "dockerfile": "../D" } }),
      "build.dockerfile",
      "invalid value \"../D\"",
    ),
    (
      json!({ "build": { "context": "/c", "args": [] } }),
      "build.args",
      "invalid value []",
    ),
    (
      json!({ "build": { "context": "/c", "args": { "V": 1 } } }),
      "build.args",
      "value of \"V\" must be a string, got 1",
    ),
    (
      json!({ "build": { "context": "" } }),
      "build.context",
      "invalid value \"\"",
    ),
    (
      json!({ "warmPool": [2] }),
      "warmPool",
      "expected { size: number }, got [2]",
    ),
    (
      json!({ "warmPool": {} }),
      "warmPool.size",
      "expected a whole number from 0 to 64, got nothing",
    ),
    (
      json!({ "warmPool": { "size": 65 } }),
      "warmPool.size",
      "expected a whole number from 0 to 64, got 65",
    ),
  ]
}

#[test]
fn wrong_types_keep_their_messages() {
  for (extra, option, reason) in wrong_type_cases() {
    let mut v = json!({ "image": "x" });
    for (k, val) in extra.as_object().unwrap() {
      v[k] = val.clone();
    }
    assert_eq!(
      refusal(v),
      (option.to_string(), reason.to_string()),
      "{extra}"
    );
  }
}

#[test]
fn unknown_keys_of_nested_options_are_listed_from_their_structs() {
  assert_eq!(
    refusal(json!({ "image": "x", "build": { "context": "/c", "target": "t" } })),
    (
      "build.target".into(),
      "unknown; known ones are context, dockerfile, args".into()
    )
  );
  assert_eq!(
    refusal(json!({ "image": "x", "warmPool": { "size": 1, "idle": 5 } })).0,
    "warmPool.idle"
  );
  let (option, reason) = refusal(json!({ "image": "x", "imgae": "y" }));
  assert_eq!(option, "imgae");
  assert!(reason.starts_with("unknown option; known ones are image, dockerHost,"));
  let c = ProviderConfig::from_json(json!({
    "image": "x", "build": { "context": "/c", "dockerfile": null, "args": null },
    "warmPool": { "size": 0 }
  }))
  .unwrap();
  assert_eq!(c.build.unwrap().dockerfile, "Dockerfile");
  assert_eq!(c.warm_pool_size, 0);
}
