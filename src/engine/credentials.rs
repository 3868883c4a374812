//! Registry credentials from the Docker config, for a registry the `registryAuth` option does
//! not name, found as the Docker CLI finds them: `credHelpers[registry]`, else `credsStore`
//! (both run `docker-credential-<helper> get` with the server address on stdin), else
//! `auths[registry]` (`auth` = base64 of `user:password`, or `username`/`password`, or
//! `identitytoken`). The config is `$DOCKER_CONFIG/config.json`, default `~/.docker/config.json`.
//!
//! Blocking (file reads, a helper process): call it off the async runtime. Secrets are never put
//! in an error message or a log line; a helper's output is parsed, never echoed.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bollard::auth::DockerCredentials;
use serde_json::Value;

use crate::engine::endpoint::{read_docker_config, Env};

type Result<T> = std::result::Result<T, String>;

/// How long a credential helper may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(20);

/// Docker Hub's key in the config and for helpers.
const HUB: &str = "https://index.docker.io/v1/";

fn norm(k: &str) -> &str {
  k.trim_start_matches("https://")
    .trim_start_matches("http://")
    .trim_end_matches('/')
}

/// The key `registry` (as `images::registry_of` gives it) has in `auths` and for helpers.
fn server_address(registry: &str) -> String {
  if registry == "docker.io" {
    HUB.to_string()
  } else {
    registry.to_string()
  }
}

fn matches(key: &str, registry: &str) -> bool {
  let k = norm(key);
  k == registry
    || (registry == "docker.io"
      && (k == "index.docker.io" || k.starts_with("index.docker.io/") || k == "docker.io"))
}

fn failure(registry: &str, reason: String) -> String {
  format!("no usable credentials for {registry} from the Docker config: {reason}")
}

/// Credentials for `registry` from the Docker config; `None` when it has none.
pub fn from_docker_config(registry: &str, env: &dyn Env) -> Result<Option<DockerCredentials>> {
  let Some((path, cfg)) = read_docker_config(env).map_err(|e| failure(registry, e))? else {
    return Ok(None);
  };
  let helper = cfg
    .get("credHelpers")
    .and_then(Value::as_object)
    .and_then(|h| h.iter().find(|(k, _)| matches(k, registry)))
    .and_then(|(_, v)| v.as_str())
    .or_else(|| cfg.get("credsStore").and_then(Value::as_str))
    .filter(|h| !h.is_empty());
  if let Some(helper) = helper {
    return run_helper(helper, registry, env);
  }
  let Some(entry) = cfg
    .get("auths")
    .and_then(Value::as_object)
    .and_then(|a| a.iter().find(|(k, _)| matches(k, registry)))
    .map(|(_, v)| v)
  else {
    return Ok(None);
  };
  let s = |k: &str| {
    entry
      .get(k)
      .and_then(Value::as_str)
      .filter(|v| !v.is_empty())
      .map(String::from)
  };
  let server = Some(server_address(registry));
  if let Some(token) = s("identitytoken") {
    return Ok(Some(DockerCredentials {
      identitytoken: Some(token),
      serveraddress: server,
      ..Default::default()
    }));
  }
  let (username, password) = match s("auth") {
    Some(auth) => {
      let not_basic = || {
        let what = "is not base64 of user:password";
        failure(
          registry,
          format!("its `auths` entry in {} {what}", path.display()),
        )
      };
      let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(not_basic)?;
      let (u, p) = decoded.split_once(':').ok_or_else(not_basic)?;
      (u.to_string(), p.to_string())
    }
    None => match (s("username"), s("password")) {
      (Some(u), Some(p)) => (u, p),
      _ => return Ok(None),
    },
  };
  Ok(Some(DockerCredentials {
    username: Some(username),
    password: Some(password),
    serveraddress: server,
    ..Default::default()
  }))
}

/// `docker-credential-<helper> get`, the server address on stdin.
fn run_helper(helper: &str, registry: &str, env: &dyn Env) -> Result<Option<DockerCredentials>> {
  let program = format!("docker-credential-{helper}");
  let bad = |reason: String| failure(registry, format!("credential helper `{program}` {reason}"));
  if helper.contains(['/', '\\']) || helper.starts_with('.') {
    return Err(bad("is not a plain helper name".into()));
  }
  let mut cmd = Command::new(&program);
  if let Some(p) = env.var("PATH") {
    cmd.env("PATH", p);
  }
  let mut child = cmd
    .arg("get")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .map_err(|e| {
      bad(format!(
        "cannot be run ({e}); install it on the PATH or remove it from the Docker config (credHelpers/credsStore)"
      ))
    })?;
  let address = server_address(registry);
  if let Some(mut stdin) = child.stdin.take() {
    let _ = stdin.write_all(address.as_bytes());
  }
  let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
  let reader = std::thread::spawn(move || {
    let mut o = Vec::new();
    let mut e = Vec::new();
    if let Some(s) = out.as_mut() {
      let _ = s.take(1 << 20).read_to_end(&mut o);
    }
    if let Some(s) = err.as_mut() {
      let _ = s.take(1 << 16).read_to_end(&mut e);
    }
    (o, e)
  });
  let started = Instant::now();
  let status = loop {
    match child.try_wait() {
      Ok(Some(s)) => break s,
      Ok(None) if started.elapsed() > HELPER_TIMEOUT => {
        let _ = child.kill();
        let _ = child.wait();
        return Err(bad(format!(
          "did not answer within {} s",
          HELPER_TIMEOUT.as_secs()
        )));
      }
      Ok(None) => std::thread::sleep(Duration::from_millis(10)),
      Err(e) => return Err(bad(format!("could not be waited for: {e}"))),
    }
  };
  let (stdout, stderr) = reader.join().unwrap_or_default();
  let said = String::from_utf8_lossy(if stdout.is_empty() { &stderr } else { &stdout })
    .trim()
    .to_string();
  if !status.success() {
    // The helpers' own words for "nothing stored": not an error, just no credentials.
    if said.to_ascii_lowercase().contains("credentials not found") {
      return Ok(None);
    }
    // What a helper prints on failure is an error message, not a secret; keep it short.
    let said: String = said.chars().take(200).collect();
    return Err(bad(format!("failed ({status}): {said}")));
  }
  let v: Value = serde_json::from_slice(&stdout)
    .map_err(|_| bad("answered something that is not the helper protocol's JSON".into()))?;
  let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
  let (user, secret) = (field("Username"), field("Secret"));
  if secret.is_empty() {
    return Ok(None);
  }
  Ok(Some(if user == "<token>" {
    DockerCredentials {
      identitytoken: Some(secret),
      serveraddress: Some(address),
      ..Default::default()
    }
  } else {
    DockerCredentials {
      username: Some(user),
      password: Some(secret),
      serveraddress: Some(address),
      ..Default::default()
    }
  }))
}

#[cfg(test)]
mod tests {
  use super::*;
  use std::collections::HashMap;
  use std::path::PathBuf;

  use crate::engine::endpoint::tests::FakeEnv;

  fn setup(config: &str) -> (PathBuf, FakeEnv) {
    let d = std::env::temp_dir().join(format!(
      "tf-creds-{}-{}",
      std::process::id(),
      rand::random::<u32>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), config).unwrap();
    let mut m = HashMap::new();
    m.insert("DOCKER_CONFIG", d.display().to_string());
    m.insert(
      "PATH",
      format!(
        "{}:{}",
        d.display(),
        std::env::var("PATH").unwrap_or_default()
      ),
    );
    (d.clone(), FakeEnv(m))
  }

  #[test]
  fn auths_entries() {
    // dXNlcjpwYTpzcw== is user:pa:ss (a colon in the password survives).
    let (d, env) = setup(
      r#"{"auths":{"http://127.0.0.1:5001/":{"auth":"dXNlcjpwYTpzcw=="},
        "https://index.docker.io/v1/":{"identitytoken":"tok"},
        "plain.example":{"username":"u","password":"p"},
        "broken.example":{"auth":"@@@"}}}"#,
    );
    let c = from_docker_config("127.0.0.1:5001", &env).unwrap().unwrap();
    assert_eq!(c.username.as_deref(), Some("user"));
    assert_eq!(c.password.as_deref(), Some("pa:ss"));
    let c = from_docker_config("docker.io", &env).unwrap().unwrap();
    assert_eq!(c.identitytoken.as_deref(), Some("tok"));
    assert_eq!(c.serveraddress.as_deref(), Some(HUB));
    let c = from_docker_config("plain.example", &env).unwrap().unwrap();
    assert_eq!(c.password.as_deref(), Some("p"));
    assert!(from_docker_config("other.example", &env).unwrap().is_none());
    let e = from_docker_config("broken.example", &env).unwrap_err();
    assert!(e.contains("base64"), "{e}");
    std::fs::remove_dir_all(d).unwrap();
  }

  #[test]
  fn helpers() {
    use std::os::unix::fs::PermissionsExt;
    let (d, env) = setup(
      r#"{"credsStore":"tfstore","credHelpers":{"h.example":"tfhelper","gone.example":"tfmissing","bad.example":"tfbad"},
        "auths":{"h.example":{"auth":"dTpw"}}}"#,
    );
    let script = |name: &str, body: &str| {
      let p = d.join(format!("docker-credential-{name}"));
      std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
      std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script(
      "tfhelper",
      r#"read a; [ "$1" = get ] && printf '{"ServerURL":"%s","Username":"hu","Secret":"hs"}' "$a""#,
    );
    script(
      "tfstore",
      r#"read a; [ "$a" = store.example ] && { printf '{"Username":"<token>","Secret":"idt"}'; exit 0; }; echo "credentials not found in native keychain"; exit 1"#,
    );
    script("tfbad", "echo 'keychain locked' >&2; exit 3");
    // credHelpers beats auths.
    let c = from_docker_config("h.example", &env).unwrap().unwrap();
    assert_eq!(
      (c.username.as_deref(), c.password.as_deref()),
      (Some("hu"), Some("hs"))
    );
    // credsStore for the rest; `<token>` is an identity token; "not found" is no credentials.
    let c = from_docker_config("store.example", &env).unwrap().unwrap();
    assert_eq!(c.identitytoken.as_deref(), Some("idt"));
    assert!(from_docker_config("none.example", &env).unwrap().is_none());
    // Unusable helpers are errors naming them.
    let e = from_docker_config("gone.example", &env).unwrap_err();
    assert!(e.contains("docker-credential-tfmissing"), "{e}");
    let e = from_docker_config("bad.example", &env).unwrap_err();
    assert!(
      e.contains("docker-credential-tfbad") && e.contains("keychain locked"),
      "{e}"
    );
    std::fs::remove_dir_all(d).unwrap();
  }
}
