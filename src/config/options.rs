//! The provider's options as JavaScript gives them: one typed field per option, documented with
//! its default (the docs become the `NativeProviderOptions` typings in binding.d.ts).
//! `ProviderConfig::try_from` (config/mod.rs) checks them and applies the defaults.

use std::collections::BTreeMap;

use napi_derive::napi;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::{Number, Value};

use crate::util::errors::{Result, SandboxError};

/// Options that index.js takes before the rest reaches the binding; named in the refusal of
/// an unknown option so that the list there is the whole constructor's.
const JS_OPTIONS: [&str; 2] = ["errors", "logger"];

/// One option's value: of the type the option takes, or not, kept whole. serde would refuse a
/// wrong type without naming the option; kept, it is refused by the option's own check, with
/// the option's name and a message saying what it takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Given<T> {
  Typed(T),
  Mistyped(Value),
  /// An object for a struct, with a key the struct has no field for; `known` lists its fields.
  Unknown {
    key: String,
    known: &'static [&'static str],
  },
}

impl<T: DeserializeOwned> Given<T> {
  pub fn from_value(v: Value) -> Self {
    let fields = field_names::<T>();
    if !fields.is_empty() {
      // serde fills a struct from a list as well, in field order, and drops keys it has no
      // field for; an option that takes an object must refuse both.
      let Value::Object(m) = &v else {
        return Given::Mistyped(v);
      };
      if let Some(key) = m.keys().find(|k| !fields.contains(&k.as_str())) {
        return Given::Unknown {
          key: key.clone(),
          known: fields,
        };
      }
    }
    match T::deserialize(&v) {
      Ok(t) => Given::Typed(t),
      Err(_) => Given::Mistyped(v),
    }
  }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Given<T> {
  fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
    Value::deserialize(d).map(Given::from_value)
  }
}

/// The constructor's options, less `errors` and `logger` (index.js takes those). Every field is
/// optional here, `image` included, so that a missing one is refused by name; `null` means the
/// same as absent. Only JSON values cross: index.js refuses functions, symbols and non-finite
/// numbers first.
#[napi(
  object,
  object_from_js = false,
  object_to_js = false,
  js_name = "NativeProviderOptions"
)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderOptions {
  /// The image every sandbox runs, such as `'python:3.12'`. Required.
  #[napi(ts_type = "string")]
  pub image: Option<Given<String>>,
  /// `unix:///path`, `ssh://[user@]host[:port]` or `tcp://host:port`. Default: `$DOCKER_HOST`,
  /// else `$DOCKER_CONTEXT`, else the Docker config's current context, else
  /// `unix:///var/run/docker.sock`.
  #[napi(ts_type = "string")]
  pub docker_host: Option<Given<String>>,
  /// TLS for a `tcp://` engine: `{ ca, cert, key }` (each a file path or PEM text) and `verify`
  /// (default true; verification needs `ca`); `true` = the files in `$DOCKER_CERT_PATH`;
  /// `false` = never TLS. Default: as the environment or the context say.
  #[napi(ts_type = "boolean | { ca?: string; cert?: string; key?: string; verify?: boolean }")]
  pub tls: Option<Value>,
  /// Scopes container names and labels; `[a-z0-9-]{1,32}`. Default `'default'`.
  #[napi(ts_type = "string")]
  pub namespace: Option<Given<String>>,
  /// Default exec timeout in milliseconds (at most a week). Default 60000.
  #[napi(ts_type = "number")]
  pub exec_timeout_ms: Option<Given<Number>>,
  /// Cap for `downloadFile`, in bytes (at most 1 GiB). Default 20 MiB.
  #[napi(ts_type = "number")]
  pub file_max_bytes: Option<Given<Number>>,
  /// Cap for `uploadFile`, in bytes. Default: none beyond what the engine accepts.
  #[napi(ts_type = "number")]
  pub upload_max_bytes: Option<Given<Number>>,
  /// Cap on one exec's combined output, in bytes (1024 to 1 GiB). Default 10 MiB.
  #[napi(ts_type = "number")]
  pub max_output_bytes: Option<Given<Number>>,
  /// `'all'`, a count, device indexes/UUIDs, CDI device names, or `{ count, exclusive: true }`
  /// for GPUs no other running sandbox holds. Default: no GPU.
  #[napi(ts_type = "'all' | number | string[] | { count: number; exclusive?: boolean }")]
  pub gpus: Option<Value>,
  /// The GPUs exclusive allocation hands out. Default: discovered on the engine host.
  #[napi(ts_type = "string[]")]
  pub gpu_devices: Option<Value>,
  /// How long `createSandbox()` waits for exclusive GPUs, in ms (at most an hour). Default 0.
  #[napi(ts_type = "number")]
  pub gpu_wait_ms: Option<Given<Number>>,
  /// Container environment. Default none.
  #[napi(ts_type = "Record<string, string>")]
  pub env: Option<Given<BTreeMap<String, Given<String>>>>,
  /// Extra container labels (the `trueforge.sandbox.` prefix is reserved). Default none.
  #[napi(ts_type = "Record<string, string>")]
  pub labels: Option<Given<BTreeMap<String, Given<String>>>>,
  /// Minutes without activity before a sandbox stops itself; 0 = never. Default 15.
  #[napi(ts_type = "number")]
  pub auto_stop_interval_in_minutes: Option<Given<Number>>,
  /// Minutes a sandbox may stay stopped before the reaper removes it; 0 = never. Default 7200.
  #[napi(ts_type = "number")]
  pub auto_delete_interval_in_minutes: Option<Given<Number>>,
  /// Linux capabilities kept (all others dropped), from Docker's default set only. Default
  /// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, NET_BIND_SERVICE.
  #[napi(ts_type = "string[]")]
  pub capabilities: Option<Given<Vec<Given<String>>>>,
  /// Set `no-new-privileges`. Default true.
  #[napi(ts_type = "boolean")]
  pub no_new_privileges: Option<Given<bool>>,
  /// Resource limits. Defaults: memoryBytes 8 GiB (null = unlimited), nanoCpus unlimited,
  /// pidsLimit 4096.
  #[napi(
    ts_type = "{ memoryBytes?: number | null; nanoCpus?: number | null; pidsLimit?: number }"
  )]
  pub resources: Option<Value>,
  /// `'bridge'`, `'none'` or a user-defined network name (never `host`). Default `'bridge'`.
  #[napi(ts_type = "string")]
  pub network: Option<Given<String>>,
  /// Run commands as this `uid[:gid]` or user name. Default: the image's user.
  #[napi(ts_type = "string")]
  pub user: Option<Given<String>>,
  /// Make the root filesystem read-only (the workspace and /tmp stay writable). Default false.
  #[napi(ts_type = "boolean")]
  pub read_only_rootfs: Option<Given<bool>>,
  /// OCI runtime, such as `'runsc'`. Default: the engine's default.
  #[napi(ts_type = "string")]
  pub runtime: Option<Given<String>>,
  /// Recorded as a label; other tenants' sandboxes are unreachable. Default none.
  #[napi(ts_type = "string")]
  pub tenant_name: Option<Given<String>>,
  /// Build the image from a local context through the Engine build API; `dockerfile` defaults
  /// to `'Dockerfile'`. Default none.
  #[napi(ts_type = "{ context: string; dockerfile?: string; args?: Record<string, string> }")]
  pub build: Option<Given<BuildOptions>>,
  /// Credentials per registry host. Default none: a registry not named here gets the Docker
  /// config's.
  #[napi(
    ts_type = "Record<string, { username: string; password: string } | { identityToken: string }>"
  )]
  pub registry_auth: Option<Value>,
  /// Ready sandboxes kept per configuration (0 to 64). Default: no pool.
  #[napi(ts_type = "{ size: number }")]
  pub warm_pool: Option<Given<WarmPoolOptions>>,
  /// Deadline for one engine request that is not a command or a transfer, in ms (at most ten
  /// minutes). Default 30000.
  #[napi(ts_type = "number")]
  pub engine_timeout_ms: Option<Given<Number>>,
  /// Code Mode request bytes held in this process at once for one sandbox (all its transports),
  /// 64 KiB to 1 GiB: more requests wait, unread, and one larger than this is refused with an
  /// error to its caller. Default 64 MiB.
  #[napi(ts_type = "number")]
  pub code_mode_sandbox_inflight_bytes: Option<Given<Number>>,
  /// Code Mode request bytes held in this process at once for all of this provider's sandboxes,
  /// 64 KiB to 16 GiB; as `codeModeSandboxInflightBytes` otherwise. Default 256 MiB.
  #[napi(ts_type = "number")]
  pub code_mode_provider_inflight_bytes: Option<Given<Number>>,
  /// Run commands, files and Code Mode through the in-sandbox agent (a static binary started in
  /// each sandbox through the engine's exec API); `false` uses the engine's exec and archive
  /// endpoints for everything. Default true.
  #[napi(ts_type = "boolean")]
  pub agent: Option<Given<bool>>,
  /// With the agent and a local Docker engine, new sandboxes mount a directory of this machine's
  /// (read-only, their own) through which their agent links to this process, bypassing the
  /// engine's exec stream; `false` makes them without one. Default true.
  #[napi(ts_type = "boolean")]
  pub agent_link: Option<Given<bool>>,
  /// With the agent and an engine on a local Unix socket, each Code Mode socket is served on a
  /// stream of its own that the JavaScript thread reads directly (the fastest round trip);
  /// `false` carries Code Mode calls on the agent's own connection. Default true.
  #[napi(ts_type = "boolean")]
  pub code_mode_lane: Option<Given<bool>>,
  /// With the agent, uploads of 32 MiB and over have the engine write their bytes into the
  /// agent's root-only staging directory, from where the agent places them as the sandbox's user
  /// (about twice the throughput of its stream); `false` sends every byte on the agent's stream.
  /// Default true.
  #[napi(ts_type = "boolean")]
  pub staged_uploads: Option<Given<bool>>,
  /// What sandboxes may reach. A policy `{ allow, deny?, hosts? }` (host names with `*.`
  /// wildcards or `*` for every public name, IP addresses, CIDRs, each with an optional
  /// `:port`; `hosts` maps names to addresses of the operator's choosing): the sandbox has no
  /// network but loopback, and its agent carries each connection to the host's proxy, which
  /// decides it. `'open'`: the engine network, no policy; `'none'`: no network at all. Default
  /// `{ allow: ['*'] }` (every public host by name), or `'open'` when `network` is given or the
  /// agent is off.
  #[napi(
    ts_type = "'open' | 'none' | { allow: string[]; deny?: string[]; hosts?: Record<string, string | string[]> }"
  )]
  pub egress: Option<Value>,
  /// Connections a sandbox under a policy has open at once; more are refused. 1 to 65536.
  /// Default 256.
  #[napi(ts_type = "number")]
  pub egress_max_connections: Option<Value>,
  /// Bytes the host holds in flight per connection and direction. 4 KiB to 16 MiB. Default 64 KiB.
  #[napi(ts_type = "number")]
  pub egress_buffer_bytes: Option<Value>,
  /// A connection with no byte either way for this long is closed, in ms. 1 s to 24 h. Default
  /// 300000.
  #[napi(ts_type = "number")]
  pub egress_idle_timeout_ms: Option<Value>,
  /// Resolving a name and connecting, in ms. 100 ms to 5 min. Default 10000.
  #[napi(ts_type = "number")]
  pub egress_connect_timeout_ms: Option<Value>,
}

/// The `build` option. Its typings are stated on `ProviderOptions::build`, where `context` can
/// be marked required.
#[derive(Debug, Default, Deserialize)]
pub struct BuildOptions {
  /// The directory to build from. Required.
  pub context: Option<Given<String>>,
  /// The Dockerfile, relative to the context. Default `Dockerfile`.
  pub dockerfile: Option<Given<String>>,
  /// Build arguments. Default none.
  pub args: Option<Given<BTreeMap<String, Given<String>>>>,
}

/// The `warmPool` option.
#[derive(Debug, Default, Deserialize)]
pub struct WarmPoolOptions {
  /// Ready sandboxes kept, 0 to 64. Required.
  pub size: Option<Given<Number>>,
}

impl ProviderOptions {
  /// Reads the options object. A key that is no field is refused by name, with the known ones
  /// listed from the struct itself.
  pub fn from_json(value: Value) -> Result<Self> {
    match Given::<ProviderOptions>::from_value(value) {
      Given::Typed(o) => Ok(o),
      // Every field takes any JSON value, so only a non-object lands here.
      Given::Mistyped(_) => Err(invalid(
        "options",
        "expected an object such as { image: 'python:3.12' }",
      )),
      Given::Unknown { key, known } => {
        let listed = known
          .iter()
          .chain(JS_OPTIONS.iter())
          .copied()
          .collect::<Vec<_>>()
          .join(", ");
        Err(invalid(
          &key,
          format!("unknown option; known ones are {listed}"),
        ))
      }
    }
  }
}

fn invalid(option: &str, reason: impl Into<String>) -> SandboxError {
  SandboxError::InvalidOption {
    option: option.to_string(),
    reason: reason.into(),
  }
}

/// The keys a struct's derived `Deserialize` accepts, as serde spells them: the derive hands
/// them to `deserialize_struct`, where this deserializer records them and stops.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
  let mut names: &'static [&'static str] = &[];
  let _ = T::deserialize(FieldNames(&mut names));
  names
}

struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
  type Error = de::value::Error;

  fn deserialize_any<V: Visitor<'de>>(self, _: V) -> std::result::Result<V::Value, Self::Error> {
    Err(de::Error::custom("only a struct has field names"))
  }

  fn deserialize_struct<V: Visitor<'de>>(
    self,
    _name: &'static str,
    fields: &'static [&'static str],
    _visitor: V,
  ) -> std::result::Result<V::Value, Self::Error> {
    *self.0 = fields;
    Err(de::Error::custom("field names recorded"))
  }

  serde::forward_to_deserialize_any! {
    bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
    unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use serde_json::json;

  fn refusal(v: Value) -> (String, String) {
    match ProviderOptions::from_json(v) {
      Err(SandboxError::InvalidOption { option, reason }) => (option, reason),
      other => panic!("expected InvalidOption, got {other:?}"),
    }
  }

  #[test]
  fn field_names_come_from_the_struct_in_camel_case() {
    let names = field_names::<ProviderOptions>();
    assert_eq!(names.len(), 38);
    assert_eq!(names[0], "image");
    for n in [
      "dockerHost",
      "autoStopIntervalInMinutes",
      "readOnlyRootfs",
      "tenantName",
      "warmPool",
      "engineTimeoutMs",
    ] {
      assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert!(field_names::<u32>().is_empty());
  }

  #[test]
  fn an_unknown_key_is_refused_with_every_known_one_listed() {
    let (option, reason) = refusal(json!({ "image": "x", "imgae": "y" }));
    assert_eq!(option, "imgae");
    assert!(reason.starts_with("unknown option; known ones are image, dockerHost, tls,"));
    assert!(reason.ends_with(
      "agent, agentLink, codeModeLane, stagedUploads, egress, egressMaxConnections, egressBufferBytes, egressIdleTimeoutMs, egressConnectTimeoutMs, errors, logger"
    ));
    for name in field_names::<ProviderOptions>() {
      assert!(reason.contains(name), "{name} not listed");
    }
  }

  /// README.md's Options table has one row per option the constructor takes (the struct's
  /// fields as serde names them, and the options index.js takes), and no other row.
  #[test]
  fn the_readme_options_table_names_every_option_once() {
    let readme = include_str!("../../README.md");
    let section = readme
      .split("\n## ")
      .find(|s| s.starts_with("Options\n"))
      .expect("README.md has an Options section");
    let rows: Vec<&str> = section
      .lines()
      .filter_map(|l| l.strip_prefix("| `")?.split_once('`').map(|(name, _)| name))
      .collect();
    let known: Vec<&str> = field_names::<ProviderOptions>()
      .iter()
      .chain(JS_OPTIONS.iter())
      .copied()
      .collect();
    let missing: Vec<&str> = known
      .iter()
      .filter(|n| !rows.contains(n))
      .copied()
      .collect();
    let unknown: Vec<&str> = rows
      .iter()
      .filter(|n| !known.contains(n))
      .copied()
      .collect();
    let twice: Vec<&str> = known
      .iter()
      .filter(|n| rows.iter().filter(|r| r == n).count() > 1)
      .copied()
      .collect();
    assert!(
      missing.is_empty() && unknown.is_empty() && twice.is_empty(),
      "README.md's Options table: options missing from it {missing:?}; rows that are no option {unknown:?}; options listed twice {twice:?}"
    );
  }

  #[test]
  fn a_non_object_is_refused_as_options() {
    for v in [json!(null), json!("busybox"), json!(["x"]), json!(3)] {
      assert_eq!(refusal(v).0, "options");
    }
  }

  #[test]
  fn wrong_types_are_kept_for_the_field_to_refuse() {
    let o = ProviderOptions::from_json(json!({
      "image": 3, "execTimeoutMs": "10", "env": { "A": 1, "B": "b" }, "capabilities": [null],
      "namespace": null
    }))
    .unwrap();
    assert_eq!(o.image, Some(Given::Mistyped(json!(3))));
    assert_eq!(o.exec_timeout_ms, Some(Given::Mistyped(json!("10"))));
    let Some(Given::Typed(env)) = o.env else {
      panic!("env is an object")
    };
    assert_eq!(env["A"], Given::Mistyped(json!(1)));
    assert_eq!(env["B"], Given::Typed("b".to_string()));
    assert_eq!(
      o.capabilities,
      Some(Given::Typed(vec![Given::Mistyped(Value::Null)]))
    );
    assert_eq!(o.namespace, None);
  }
}
