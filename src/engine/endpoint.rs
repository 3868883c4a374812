//! Which engine to talk to and how, decided as the Docker CLI decides it: the `dockerHost`
//! option (with `tls`), else `DOCKER_HOST` (with `DOCKER_TLS_VERIFY`, `DOCKER_TLS`,
//! `DOCKER_CERT_PATH`), else the context named by `DOCKER_CONTEXT`, else the `currentContext` of
//! the Docker config (`$DOCKER_CONFIG/config.json`, default `~/.docker`), read from the context
//! store (`contexts/meta/<sha256 of the name>/meta.json`, TLS material in
//! `contexts/tls/<sha256>/docker/`). No context, or the context `default`, is the local socket.
//!
//! Everything is read once, when the endpoint is resolved; the TLS material is kept in memory
//! (PEM), so a provider never reads a key file again and two endpoints with the same address
//! but different TLS identities are different engines (`Endpoint::key`).

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::util::errors::{Result, SandboxError};

/// The socket used when nothing says otherwise.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// TLS material for one engine, in memory.
#[derive(Clone, PartialEq, Eq)]
pub struct Tls {
  /// PEM of the CA(s) the engine's certificate must chain to; required when `verify`.
  pub ca: Option<Vec<u8>>,
  /// PEM of the client certificate (chain) and its key; both or neither.
  pub cert: Option<Vec<u8>>,
  pub key: Option<Vec<u8>>,
  /// Verify the engine's certificate and name (`DOCKER_TLS_VERIFY`); `false` is `DOCKER_TLS`
  /// alone: encrypted, not authenticated.
  pub verify: bool,
  /// Where the material came from, for messages (`DOCKER_CERT_PATH=/x`, `context remote`, …).
  pub origin: String,
}

impl std::fmt::Debug for Tls {
  // Never prints key material.
  fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    f.debug_struct("Tls")
      .field("verify", &self.verify)
      .field("ca", &self.ca.is_some())
      .field("client_cert", &self.cert.is_some())
      .field("origin", &self.origin)
      .finish()
  }
}

/// How a provider reaches its engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
  /// `unix:///…` or `tcp://host:port`, as in messages.
  pub host: String,
  pub tls: Option<Tls>,
  /// How it was chosen: `option`, `DOCKER_HOST`, `context NAME`, `default`.
  pub source: String,
}

impl Endpoint {
  pub fn plain(host: &str, source: &str) -> Self {
    Self {
      host: host.to_string(),
      tls: None,
      source: source.to_string(),
    }
  }

  /// The identity of the connection: the address plus, with TLS, a digest of the CA, the client
  /// certificate, the key and `verify`. Caches keyed by it never confuse two engines (or two
  /// identities on one engine).
  pub fn key(&self) -> String {
    match &self.tls {
      None => self.host.clone(),
      Some(t) => {
        let mut h = Sha256::new();
        for part in [&t.ca, &t.cert, &t.key] {
          let bytes = part.as_deref().unwrap_or_default();
          h.update((bytes.len() as u64).to_le_bytes());
          h.update(bytes);
        }
        h.update([t.verify as u8]);
        let d = h.finalize();
        let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}#tls-{hex}", self.host)
      }
    }
  }

  /// One line for people: `tcp://h:2376 (TLS, verified; DOCKER_CERT_PATH=/c; from DOCKER_HOST)`.
  pub fn describe(&self) -> String {
    let how = match &self.tls {
      None if self.host.starts_with("unix://") => "unix socket".to_string(),
      None if self.host.starts_with("ssh://") => {
        "system ssh running `docker system dial-stdio`".to_string()
      }
      None => "plain TCP, no TLS".to_string(),
      Some(t) => format!(
        "TLS, {}{}; {}",
        if t.verify {
          "engine verified"
        } else {
          "engine NOT verified"
        },
        if t.cert.is_some() {
          ", client certificate"
        } else {
          ""
        },
        t.origin
      ),
    };
    format!("{} ({how}; from {})", self.host, self.source)
  }
}

/// The explicit `tls` option: each of `ca`, `cert`, `key` a path or PEM text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsOption {
  pub ca: Option<String>,
  pub cert: Option<String>,
  pub key: Option<String>,
  pub verify: Option<bool>,
}

/// Parses the `tls` option: `false` (never TLS, whatever the environment says), `true` (TLS
/// with `DOCKER_CERT_PATH`'s files) or `{ ca, cert, key, verify }`.
pub fn parse_tls_option(v: &Value) -> Result<Option<TlsChoice>> {
  let bad = |reason: &str| SandboxError::InvalidOption {
    option: "tls".into(),
    reason: reason.into(),
  };
  match v {
    Value::Null => Ok(None),
    Value::Bool(false) => Ok(Some(TlsChoice::Off)),
    Value::Bool(true) => Ok(Some(TlsChoice::FromEnv)),
    Value::Object(o) => {
      let mut t = TlsOption::default();
      for (k, v) in o {
        let s = || match v {
          Value::String(s) if !s.trim().is_empty() => Ok(Some(s.clone())),
          Value::Null => Ok(None),
          _ => Err(SandboxError::InvalidOption {
            option: format!("tls.{k}"),
            reason: "expected a file path or PEM text".into(),
          }),
        };
        match k.as_str() {
          "ca" => t.ca = s()?,
          "cert" => t.cert = s()?,
          "key" => t.key = s()?,
          "verify" => match v {
            Value::Bool(b) => t.verify = Some(*b),
            Value::Null => {}
            _ => {
              return Err(SandboxError::InvalidOption {
                option: "tls.verify".into(),
                reason: "expected true or false".into(),
              })
            }
          },
          other => {
            return Err(SandboxError::InvalidOption {
              option: format!("tls.{other}"),
              reason: "unknown; known ones are ca, cert, key, verify".into(),
            })
          }
        }
      }
      if t.cert.is_some() != t.key.is_some() {
        return Err(bad(
          "give both `cert` and `key` (a client certificate needs its key)",
        ));
      }
      if t.verify.unwrap_or(true) && t.ca.is_none() {
        return Err(bad(
          "`ca` is needed to verify the engine (or set `verify: false`, which trusts any certificate)",
        ));
      }
      Ok(Some(TlsChoice::Explicit(t)))
    }
    _ => Err(bad(
      "expected { ca, cert, key, verify } (paths or PEM text), true or false",
    )),
  }
}

/// What the `tls` option asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsChoice {
  Off,
  FromEnv,
  Explicit(TlsOption),
}

/// Where the process's environment and files come from; a trait so tests give their own.
pub trait Env {
  fn var(&self, name: &str) -> Option<String>;
  fn home(&self) -> Option<PathBuf> {
    self.var("HOME").map(PathBuf::from)
  }
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
  fn var(&self, name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
  }
}

/// The Docker config directory: `$DOCKER_CONFIG`, else `~/.docker`.
pub fn config_dir(env: &dyn Env) -> Option<PathBuf> {
  env
    .var("DOCKER_CONFIG")
    .map(PathBuf::from)
    .or_else(|| env.home().map(|h| h.join(".docker")))
}

/// The Docker config (`config.json` in `config_dir`): its path and its JSON; `None` when there
/// is none. `Err` says what is wrong with the file, for the caller to put in its own words.
pub fn read_docker_config(env: &dyn Env) -> std::result::Result<Option<(PathBuf, Value)>, String> {
  let Some(dir) = config_dir(env) else {
    return Ok(None);
  };
  let path = dir.join("config.json");
  let text = match std::fs::read_to_string(&path) {
    Ok(t) => t,
    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
    Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
  };
  serde_json::from_str(&text)
    .map(|v| Some((path.clone(), v)))
    .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))
}

fn invalid(option: &str, reason: impl Into<String>) -> SandboxError {
  SandboxError::InvalidOption {
    option: option.to_string(),
    reason: reason.into(),
  }
}

/// A path or PEM text → PEM bytes.
fn pem_or_file(option: &str, v: &str) -> Result<Vec<u8>> {
  if v.trim_start().starts_with("-----BEGIN") {
    return Ok(v.as_bytes().to_vec());
  }
  std::fs::read(v).map_err(|e| invalid(option, format!("cannot read {v}: {e}")))
}

/// Resolves the endpoint from the options and the environment.
pub fn resolve(
  docker_host: Option<&str>,
  tls: Option<&TlsChoice>,
  env: &dyn Env,
) -> Result<Endpoint> {
  if let Some(h) = docker_host {
    let host = normalize_docker_host(h, "dockerHost")?;
    let tls = match tls {
      Some(TlsChoice::Off) => None,
      Some(TlsChoice::Explicit(t)) => Some(explicit_tls(t)?),
      Some(TlsChoice::FromEnv) => Some(env_tls(env, true)?.expect("forced")),
      None => env_tls(env, false)?,
    };
    return finish(host, tls, "option");
  }
  if let Some(h) = env.var("DOCKER_HOST") {
    let host = normalize_docker_host(&h, "DOCKER_HOST")?;
    let tls = match tls {
      Some(TlsChoice::Off) => None,
      Some(TlsChoice::Explicit(t)) => Some(explicit_tls(t)?),
      Some(TlsChoice::FromEnv) => Some(env_tls(env, true)?.expect("forced")),
      None => env_tls(env, false)?,
    };
    return finish(host, tls, "DOCKER_HOST");
  }
  let (name, via) = match env.var("DOCKER_CONTEXT") {
    Some(n) => (Some(n), "DOCKER_CONTEXT"),
    None => (current_context(env)?, "currentContext"),
  };
  match name {
    Some(n) if n != "default" => context_endpoint(&n, via, env),
    _ => {
      let tls = match tls {
        Some(TlsChoice::Explicit(t)) => Some(explicit_tls(t)?),
        _ => None,
      };
      finish(DEFAULT_DOCKER_HOST.to_string(), tls, "default")
    }
  }
}

fn finish(host: String, tls: Option<Tls>, source: &str) -> Result<Endpoint> {
  if tls.is_some() && !host.starts_with("tcp://") {
    // The CLI ignores TLS settings for a socket; so do we.
    return Ok(Endpoint::plain(&host, source));
  }
  Ok(Endpoint {
    host,
    tls,
    source: source.to_string(),
  })
}

fn explicit_tls(t: &TlsOption) -> Result<Tls> {
  let read = |opt: &str, v: &Option<String>| v.as_deref().map(|v| pem_or_file(opt, v)).transpose();
  let describe = |v: &Option<String>| match v.as_deref() {
    Some(v) if !v.trim_start().starts_with("-----BEGIN") => v.to_string(),
    Some(_) => "PEM text".to_string(),
    None => "none".to_string(),
  };
  Ok(Tls {
    ca: read("tls.ca", &t.ca)?,
    cert: read("tls.cert", &t.cert)?,
    key: read("tls.key", &t.key)?,
    verify: t.verify.unwrap_or(true),
    origin: format!("tls option, CA {}", describe(&t.ca)),
  })
}

/// `DOCKER_TLS_VERIFY` / `DOCKER_TLS` with `DOCKER_CERT_PATH` (default the config dir), as the
/// CLI reads them: TLS is on when either is set (or `force`); with verification the CA file must
/// exist; a missing `cert.pem` or `key.pem` means no client certificate.
fn env_tls(env: &dyn Env, force: bool) -> Result<Option<Tls>> {
  let verify = env.var("DOCKER_TLS_VERIFY").is_some();
  let tls = verify || env.var("DOCKER_TLS").is_some() || force;
  if !tls {
    return Ok(None);
  }
  let (dir, origin) = match env.var("DOCKER_CERT_PATH") {
    Some(p) => (PathBuf::from(&p), format!("DOCKER_CERT_PATH={p}")),
    None => {
      let d = config_dir(env).ok_or_else(|| {
        invalid(
          "DOCKER_CERT_PATH",
          "TLS is on but neither DOCKER_CERT_PATH nor HOME is set",
        )
      })?;
      let o = format!("certificates in {}", d.display());
      (d, o)
    }
  };
  let verify = verify || force;
  read_cert_dir(&dir, verify, "DOCKER_CERT_PATH", origin).map(Some)
}

fn read_cert_dir(dir: &Path, verify: bool, option: &str, origin: String) -> Result<Tls> {
  let opt = |name: &str| -> Result<Option<Vec<u8>>> {
    match std::fs::read(dir.join(name)) {
      Ok(b) => Ok(Some(b)),
      Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
      Err(e) => Err(invalid(
        option,
        format!("cannot read {}: {e}", dir.join(name).display()),
      )),
    }
  };
  let ca = opt("ca.pem")?;
  if verify && ca.is_none() {
    return Err(invalid(
      option,
      format!(
        "TLS verification is on but {} does not exist; put the engine's CA there (ca.pem, with cert.pem and key.pem) or point DOCKER_CERT_PATH at the folder holding them",
        dir.join("ca.pem").display()
      ),
    ));
  }
  let (cert, key) = (opt("cert.pem")?, opt("key.pem")?);
  let (cert, key) = match (cert, key) {
    (Some(c), Some(k)) => (Some(c), Some(k)),
    _ => (None, None),
  };
  Ok(Tls {
    ca,
    cert,
    key,
    verify,
    origin,
  })
}

/// The `currentContext` of the Docker config, if any.
fn current_context(env: &dyn Env) -> Result<Option<String>> {
  let Some((_, v)) = read_docker_config(env).map_err(|e| invalid("currentContext", e))? else {
    return Ok(None);
  };
  Ok(
    v.get("currentContext")
      .and_then(Value::as_str)
      .filter(|s| !s.is_empty())
      .map(String::from),
  )
}

fn context_dir_name(name: &str) -> String {
  Sha256::digest(name.as_bytes())
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect()
}

/// The docker endpoint of a named context from the context store.
fn context_endpoint(name: &str, via: &str, env: &dyn Env) -> Result<Endpoint> {
  let dir = config_dir(env).ok_or_else(|| {
    invalid(
      via,
      format!("context {name:?} is selected but neither DOCKER_CONFIG nor HOME is set"),
    )
  })?;
  let id = context_dir_name(name);
  let meta = dir
    .join("contexts")
    .join("meta")
    .join(&id)
    .join("meta.json");
  let text = std::fs::read_to_string(&meta).map_err(|e| {
    invalid(
      via,
      format!(
        "Docker context {name:?} not found ({}: {e}); list them with `docker context ls`",
        meta.display()
      ),
    )
  })?;
  let v: Value = serde_json::from_str(&text)
    .map_err(|e| invalid(via, format!("{} is not valid JSON: {e}", meta.display())))?;
  let ep = v.pointer("/Endpoints/docker").ok_or_else(|| {
    invalid(
      via,
      format!("Docker context {name:?} has no docker endpoint"),
    )
  })?;
  let host = ep
    .get("Host")
    .and_then(Value::as_str)
    .filter(|h| !h.is_empty())
    .unwrap_or(DEFAULT_DOCKER_HOST);
  let host = normalize_docker_host(host, &format!("context {name}"))?;
  let skip_verify = ep
    .get("SkipTLSVerify")
    .and_then(Value::as_bool)
    .unwrap_or(false);
  let tls_dir = dir.join("contexts").join("tls").join(&id).join("docker");
  let has_tls = ["ca.pem", "cert.pem", "key.pem"]
    .iter()
    .any(|f| tls_dir.join(f).exists());
  let tls = if has_tls {
    Some(read_cert_dir(
      &tls_dir,
      !skip_verify,
      via,
      format!("context {name} TLS material"),
    )?)
  } else if skip_verify && host.starts_with("tcp://") {
    Some(Tls {
      ca: None,
      cert: None,
      key: None,
      verify: false,
      origin: format!("context {name}"),
    })
  } else {
    None
  };
  finish(host, tls, &format!("context {name}"))
}

/// Accepts `unix:///path`, `tcp://host:port` and `http://host:port`; returns the normalised form.
pub fn normalize_docker_host(s: &str, option: &str) -> Result<String> {
  let s = s.trim();
  if s.contains(|c: char| c.is_control()) {
    return Err(invalid_option(
      option,
      format!("{s:?} contains a NUL byte or another control character; an engine address is plain text such as unix:///var/run/docker.sock"),
    ));
  }
  if let Some(path) = s.strip_prefix("unix://") {
    if !path.starts_with('/') {
      return Err(invalid_option(
        option,
        format!("{s:?}: a unix socket needs an absolute path, as unix:///var/run/docker.sock"),
      ));
    }
    return Ok(s.to_string());
  }
  if s.starts_with("ssh://") {
    return match crate::engine::ssh::parse(s) {
      Some(_) => Ok(s.trim_end_matches('/').to_string()),
      None => Err(invalid_option(
        option,
        format!("{s:?}: expected ssh://[user@]host[:port]"),
      )),
    };
  }
  let rest = s
    .strip_prefix("tcp://")
    .or_else(|| s.strip_prefix("http://"));
  match rest {
    Some(hp) if !hp.is_empty() && !hp.contains(['/', '?', '#', ' ']) => tcp_host_port(hp)
      .map(|()| format!("tcp://{hp}"))
      .map_err(|rule| invalid_option(option, format!("{s:?}: {rule}"))),
    _ => Err(invalid_option(
      option,
      format!("{s:?} is not supported; use unix:///path/to/docker.sock, ssh://user@host or tcp://host:port (with TLS from DOCKER_TLS_VERIFY, a context or the `tls` option)"),
    )),
  }
}

/// Checks the `host:port` of a TCP address: a host name, an IPv4 address or an IPv6 one in
/// brackets, and a port from 1 to 65535 (the engine has no default one; 2375, or 2376 with TLS,
/// is the convention). `Err` says which rule it breaks.
fn tcp_host_port(hp: &str) -> std::result::Result<(), String> {
  const EXAMPLE: &str = "as tcp://host:2375 or tcp://[::1]:2375";
  let port = if let Some(inner) = hp.strip_prefix('[') {
    let (addr, after) = inner.split_once(']').ok_or(format!(
      "the IPv6 address has no closing bracket; write it {EXAMPLE}"
    ))?;
    // A zone (`%eth0`) may follow a link-local address.
    let (ip, zone) = addr.split_once('%').unwrap_or((addr, "x"));
    let ip_ok = ip.contains(':')
      && ip
        .bytes()
        .all(|b| b.is_ascii_hexdigit() || b".:".contains(&b));
    let zone_ok = !zone.is_empty()
      && zone
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ip_ok || !zone_ok {
      return Err(format!("{addr:?} in brackets is not an IPv6 address"));
    }
    after
      .strip_prefix(':')
      .ok_or(format!("no port after the address; give one, {EXAMPLE}"))?
  } else {
    if hp.contains(['[', ']']) {
      return Err(format!(
        "unbalanced bracket; an IPv6 address is written {EXAMPLE}"
      ));
    }
    let (host, port) = hp
      .rsplit_once(':')
      .ok_or(format!("no port; give one, {EXAMPLE} (2376 with TLS)"))?;
    if host.contains(':') {
      return Err(format!("an IPv6 address must be in brackets, {EXAMPLE}"));
    }
    let name_ok = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
    if host.is_empty() || !host.bytes().all(name_ok) {
      return Err(format!("{host:?} is not a host name or IP address"));
    }
    port
  };
  match port.parse::<u32>() {
    Ok(p) if (1..=65535).contains(&p) && port.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
    _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
  }
}

fn invalid_option(option: &str, reason: String) -> SandboxError {
  SandboxError::InvalidOption {
    option: option.to_string(),
    reason,
  }
}

#[cfg(test)]
pub(crate) mod tests {
  use super::*;
  use std::collections::HashMap;

  /// An environment made of the given variables only (also used by `credentials`' tests).
  pub(crate) struct FakeEnv(pub(crate) HashMap<&'static str, String>);
  impl Env for FakeEnv {
    fn var(&self, name: &str) -> Option<String> {
      self.0.get(name).cloned()
    }
  }

  fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
      "tf-endpoint-{tag}-{}-{}",
      std::process::id(),
      rand::random::<u32>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
  }

  #[test]
  fn option_then_docker_host_then_context_then_default() {
    let cfg = tmp("order");
    let env = |pairs: &[(&'static str, &str)]| {
      let mut m: HashMap<&'static str, String> =
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect();
      m.insert("DOCKER_CONFIG", cfg.display().to_string());
      FakeEnv(m)
    };
    // A context store with one context, `remote`.
    let id = context_dir_name("remote");
    let meta = cfg.join("contexts/meta").join(&id);
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::write(
      meta.join("meta.json"),
      r#"{"Name":"remote","Metadata":{},"Endpoints":{"docker":{"Host":"tcp://10.0.0.9:2376","SkipTLSVerify":false}}}"#,
    )
    .unwrap();
    let tlsd = cfg.join("contexts/tls").join(&id).join("docker");
    std::fs::create_dir_all(&tlsd).unwrap();
    std::fs::write(tlsd.join("ca.pem"), "CA").unwrap();
    std::fs::write(tlsd.join("cert.pem"), "CERT").unwrap();
    std::fs::write(tlsd.join("key.pem"), "KEY").unwrap();

    let e = resolve(Some("tcp://1.2.3.4:2375"), None, &env(&[])).unwrap();
    assert_eq!(
      (e.host.as_str(), e.source.as_str()),
      ("tcp://1.2.3.4:2375", "option")
    );
    assert!(e.tls.is_none());

    let e = resolve(
      None,
      None,
      &env(&[
        ("DOCKER_HOST", "unix:///x.sock"),
        ("DOCKER_CONTEXT", "remote"),
      ]),
    )
    .unwrap();
    assert_eq!(
      (e.host.as_str(), e.source.as_str()),
      ("unix:///x.sock", "DOCKER_HOST")
    );

    let e = resolve(None, None, &env(&[("DOCKER_CONTEXT", "remote")])).unwrap();
    assert_eq!(e.host, "tcp://10.0.0.9:2376");
    assert_eq!(e.source, "context remote");
    let t = e.tls.clone().unwrap();
    assert!(t.verify);
    assert_eq!(t.ca.as_deref(), Some(&b"CA"[..]));
    assert_eq!(t.key.as_deref(), Some(&b"KEY"[..]));
    assert!(
      !format!("{e:?}").contains("KEY"),
      "Debug never prints key material"
    );

    // No DOCKER_CONTEXT: the config's currentContext.
    let e = resolve(None, None, &env(&[])).unwrap();
    assert_eq!(e.host, DEFAULT_DOCKER_HOST);
    std::fs::write(cfg.join("config.json"), r#"{"currentContext":"remote"}"#).unwrap();
    let e = resolve(None, None, &env(&[])).unwrap();
    assert_eq!(e.source, "context remote");
    // `default` is the local socket.
    let e = resolve(None, None, &env(&[("DOCKER_CONTEXT", "default")])).unwrap();
    assert_eq!(e.host, DEFAULT_DOCKER_HOST);

    let err = resolve(None, None, &env(&[("DOCKER_CONTEXT", "nope")])).unwrap_err();
    assert!(err.to_string().contains("\"nope\" not found"), "{err}");
    std::fs::remove_dir_all(&cfg).unwrap();
  }

  #[test]
  fn docker_tls_variables() {
    let certs = tmp("certs");
    std::fs::write(certs.join("ca.pem"), "CA").unwrap();
    let mut m = HashMap::new();
    m.insert("DOCKER_HOST", "tcp://127.0.0.1:2376".to_string());
    m.insert("DOCKER_TLS_VERIFY", "1".to_string());
    m.insert("DOCKER_CERT_PATH", certs.display().to_string());
    let e = resolve(None, None, &FakeEnv(m.clone())).unwrap();
    let t = e.tls.clone().unwrap();
    assert!(t.verify && t.ca.is_some() && t.cert.is_none(), "{t:?}");
    // The key differs from the plain address and from another identity.
    assert_ne!(e.key(), e.host);
    std::fs::write(certs.join("cert.pem"), "C").unwrap();
    std::fs::write(certs.join("key.pem"), "K").unwrap();
    let e2 = resolve(None, None, &FakeEnv(m.clone())).unwrap();
    assert!(e2.tls.as_ref().unwrap().cert.is_some());
    assert_ne!(e.key(), e2.key());
    // `tls: false` wins over the environment.
    let e3 = resolve(None, Some(&TlsChoice::Off), &FakeEnv(m.clone())).unwrap();
    assert!(e3.tls.is_none());
    // A unix socket never uses TLS.
    m.insert("DOCKER_HOST", "unix:///run/d.sock".into());
    assert!(resolve(None, None, &FakeEnv(m.clone()))
      .unwrap()
      .tls
      .is_none());
    // Verification without a CA file is an error naming the file.
    std::fs::remove_file(certs.join("ca.pem")).unwrap();
    m.insert("DOCKER_HOST", "tcp://127.0.0.1:2376".into());
    let err = resolve(None, None, &FakeEnv(m)).unwrap_err();
    assert!(err.to_string().contains("ca.pem"), "{err}");
    std::fs::remove_dir_all(&certs).unwrap();
  }

  #[test]
  fn tls_option_parsing() {
    use serde_json::json;
    assert_eq!(
      parse_tls_option(&json!(false)).unwrap(),
      Some(TlsChoice::Off)
    );
    assert!(parse_tls_option(&json!({ "cert": "/c" })).is_err());
    assert!(parse_tls_option(&json!({ "cert": "/c", "key": "/k" })).is_err()); // no ca, verify
    assert!(parse_tls_option(&json!({ "verify": false })).is_ok());
    assert!(parse_tls_option(&json!({ "ca": "/c", "bogus": 1 })).is_err());
    assert!(parse_tls_option(&json!(3)).is_err());
    let Some(TlsChoice::Explicit(t)) =
      parse_tls_option(&json!({ "ca": "-----BEGIN CERTIFICATE-----\nx" })).unwrap()
    else {
      panic!()
    };
    let tls = explicit_tls(&t).unwrap();
    assert!(tls.verify);
    assert!(tls.origin.contains("PEM text"));
    let err = explicit_tls(&TlsOption {
      ca: Some("/nonexistent/ca.pem".into()),
      ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("tls.ca"), "{err}");
  }

  #[test]
  fn engine_addresses_that_cannot_work_are_refused_with_the_rule() {
    let reason = |h: &str| match normalize_docker_host(h, "dockerHost") {
      Err(SandboxError::InvalidOption { option, reason }) => {
        assert_eq!(option, "dockerHost");
        reason
      }
      other => panic!("{h:?} was not refused: {other:?}"),
    };
    assert!(reason("tcp://h:99999").contains("port \"99999\" is not a number from 1 to 65535"));
    assert!(reason("tcp://h:0").contains("from 1 to 65535"));
    assert!(reason("tcp://h:+80").contains("from 1 to 65535"));
    assert!(reason("tcp://host").contains("no port; give one"));
    assert!(reason("tcp://[::1").contains("no closing bracket"));
    assert!(reason("tcp://::1]:2375").contains("unbalanced bracket"));
    assert!(reason("tcp://[::1]").contains("no port after the address"));
    assert!(reason("tcp://[nope]:1").contains("is not an IPv6 address"));
    assert!(reason("tcp://::1:2375").contains("must be in brackets"));
    assert!(reason("tcp://a@b:1").contains("is not a host name"));
    assert!(reason("tcp://:2375").contains("is not a host name"));
    assert!(reason("tcp://h\0:2375").contains("NUL byte"));
    assert!(reason("unix:///var/run/docker.sock\0x").contains("NUL byte"));
    assert!(reason("ssh://h\0").contains("NUL byte"));
    for ok in [
      "tcp://h:1",
      "tcp://h:65535",
      "tcp://10.0.0.9:2376",
      "tcp://[::1]:2375",
      "tcp://[fe80::1%eth0]:2375",
      "tcp://my-host.example_1:2375",
    ] {
      assert_eq!(normalize_docker_host(ok, "dockerHost").unwrap(), ok);
    }
  }

  #[test]
  fn docker_hosts() {
    assert_eq!(
      normalize_docker_host("tcp://1.2.3.4:2375", "h").unwrap(),
      "tcp://1.2.3.4:2375"
    );
    assert_eq!(
      normalize_docker_host("http://h:1", "h").unwrap(),
      "tcp://h:1"
    );
    assert_eq!(
      normalize_docker_host("unix:///run/d.sock", "h").unwrap(),
      "unix:///run/d.sock"
    );
    assert!(normalize_docker_host("h:1", "h").is_err());
    assert_eq!(
      normalize_docker_host("ssh://me@h:22/", "h").unwrap(),
      "ssh://me@h:22"
    );
    assert!(normalize_docker_host("ssh://-oProxyCommand=x", "h").is_err());
  }
}
