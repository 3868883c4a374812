//! What a ready image holds for TrueForge's skill init (a shell, Python with pydantic 2, git …),
//! learnt once per image id by running a short script in a throwaway container.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;

use crate::engine::{claim, Engine};
use crate::sandbox::transfer;
use crate::util::errors::{Result, SandboxError};

/// What the probe found in an image: for each tool its version (`""` when it is there but its
/// version could not be read), `None` when it is missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
  pub sh: bool,
  pub bash: Option<String>,
  /// `python3`'s version, e.g. `3.13.5`.
  pub python: Option<String>,
  /// The installed pydantic's version, whatever its major version.
  pub pydantic: Option<String>,
  /// `from pydantic import field_validator, ConfigDict` works: the pydantic v2 API TrueForge's
  /// git skill downloader imports.
  pub pydantic_v2: bool,
  pub git: Option<String>,
  pub genson: Option<String>,
  pub curl: Option<String>,
  pub jq: Option<String>,
  pub rg: Option<String>,
}

/// Prints `tool=<first line of its version output>` for each tool present (POSIX sh builtins
/// only, so it runs on busybox as well); a missing tool prints nothing.
const PROBE_SCRIPT: &str = r#"first() { IFS= read -r l; printf '%s\n' "$l"; cat >/dev/null; }
has() { command -v "$1" >/dev/null 2>&1; }
if has bash; then printf 'bash=%s\n' "$(bash -c 'echo "$BASH_VERSION"' 2>&1 | first)"; fi
if has python3; then
  printf 'python=%s\n' "$(python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>&1 | first)"
  if python3 -c 'import pydantic' >/dev/null 2>&1; then
    printf 'pydantic=%s\n' "$(python3 -c 'import pydantic; print(pydantic.VERSION)' 2>&1 | first)"
  fi
  if python3 -c 'from pydantic import field_validator, ConfigDict' >/dev/null 2>&1; then echo pydantic_v2=1; fi
fi
for c in git genson curl jq rg; do
  if has "$c"; then printf '%s=%s\n' "$c" "$("$c" --version 2>&1 | first)"; fi
done
"#;

/// The version number in a tool's version line (`git version 2.47.3` → `2.47.3`,
/// `jq-1.7.1` → `1.7.1`, `5.2.37(1)-release` → `5.2.37`); `""` when there is none.
fn version_in(line: &str) -> String {
  let bytes = line.as_bytes();
  let mut i = 0;
  while i < bytes.len() {
    if bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
      let end = line[i..]
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or(line.len(), |e| i + e);
      let v = line[i..end].trim_end_matches('.');
      if v.contains('.') {
        return v.to_string();
      }
      i = end;
    } else {
      i += 1;
    }
  }
  String::new()
}

/// Reads the probe script's output.
fn parse_probe(text: &str) -> Probe {
  let get = |k: &str| {
    text.lines().find_map(|l| {
      l.trim_end()
        .strip_prefix(k)
        .and_then(|r| r.strip_prefix('='))
        .map(version_in)
    })
  };
  Probe {
    sh: true,
    bash: get("bash"),
    python: get("python"),
    pydantic: get("pydantic"),
    pydantic_v2: text.lines().any(|l| l.trim() == "pydantic_v2=1"),
    git: get("git"),
    genson: get("genson"),
    curl: get("curl"),
    jq: get("jq"),
    rg: get("rg"),
  }
}

/// Whether a `major.minor[.patch]` version is at least 3.9.
fn python_ok(version: &str) -> bool {
  let mut it = version.split('.').map(|p| p.parse::<u32>().ok());
  match (it.next().flatten(), it.next().flatten()) {
    (Some(major), Some(minor)) => (major, minor) >= (3, 9),
    _ => false,
  }
}

/// What an image lacks: first what TrueForge's skill init needs (sessions with skills fail at
/// init without it), then the tools TrueForge's exec tool description tells the agent about.
fn lacks(p: &Probe) -> (Vec<String>, Vec<&'static str>) {
  let mut init = Vec::new();
  match p.python.as_deref() {
    None => init.push("python3".to_string()),
    Some(v) if !python_ok(v) => init.push(format!(
      "Python 3.9 or later (python3 is {})",
      if v.is_empty() { "unreadable" } else { v }
    )),
    Some(_) => {}
  }
  if p.python.is_some() && !p.pydantic_v2 {
    init.push(match p.pydantic.as_deref() {
      Some(v) if !v.is_empty() => format!(
        "the pydantic v2 API (from pydantic import field_validator, ConfigDict; pydantic {v} is installed)"
      ),
      _ => "the pydantic v2 API (the python3 module pydantic 2.x; none is installed)".to_string(),
    });
  }
  if p.git.is_none() {
    init.push("git".to_string());
  }
  let tools = [
    ("bash", &p.bash),
    ("genson", &p.genson),
    ("curl", &p.curl),
    ("jq", &p.jq),
    ("rg (ripgrep)", &p.rg),
  ]
  .into_iter()
  .filter(|(_, v)| v.is_none())
  .map(|(n, _)| n)
  .collect();
  (init, tools)
}

/// The warning about a ready image, `None` when it has everything.
pub(crate) fn warning(image: &str, p: &Probe) -> Option<String> {
  let (init, tools) = lacks(p);
  let mut parts = Vec::new();
  if !init.is_empty() {
    parts.push(format!(
      "image {image} lacks {}, which TrueForge's skill init needs: sessions with skills will fail at init",
      init.join(", ")
    ));
  }
  if !tools.is_empty() {
    parts.push(format!(
      "{}{} that TrueForge's exec tool tells the agent about",
      if parts.is_empty() {
        format!("image {image} lacks ")
      } else {
        "it also lacks ".to_string()
      },
      tools.join(", ")
    ));
  }
  (!parts.is_empty()).then(|| parts.join("; "))
}

/// The probes of images, per engine (`EngineShared::state`).
#[derive(Default)]
pub struct Probes {
  /// By image id (an image id never changes content).
  pub(crate) probes: Mutex<HashMap<String, Probe>>,
  /// One probe at a time per image id; entries go when the probe is done.
  pub probe_locks: crate::engine::runtime::KeyedLocks<String>,
}

impl Probes {
  /// Images probed.
  pub fn probes(&self) -> usize {
    self.probes.lock().expect("probes").len()
  }
}

/// Probes an image once per image id per process: a throwaway container of `namespace` (no
/// network) runs a short script; `/bin/sh` is checked first through the archive stat, since
/// without it nothing can run at all.
pub async fn probe(engine: &Engine, image: &str, image_id: &str, namespace: &str) -> Result<Probe> {
  // One probe per image at a time: racing first reads wait for it instead of probing again.
  let state = &engine.shared.state::<Probes>();
  let _guard = state.probe_locks.lock(image_id.to_string()).await;
  if let Some(p) = state.probes.lock().expect("probes").get(image_id) {
    return Ok(p.clone());
  }
  // Named and labelled for its namespace, so the reaper finds it if this process dies first.
  let (name, mut body) = claim::probe_body(image, namespace);
  body.entrypoint = Some(vec!["/bin/sh".into(), "-c".into(), PROBE_SCRIPT.into()]);
  let id = engine
    .create_container("create a probe container", Some(&name), body)
    .await?;
  let run = async {
    let sh = transfer::stat(engine, &id, "/bin/sh").await?.is_some();
    if !sh {
      return Ok(Probe::default());
    }
    engine.start_container("start the probe", &id).await?;
    engine.wait_exit(&id, Duration::from_secs(60)).await;
    let logs = engine.logs(&id, false);
    futures_util::pin_mut!(logs);
    let mut text = String::new();
    while let Some(Ok(chunk)) = logs.next().await {
      text.push_str(&String::from_utf8_lossy(&chunk));
    }
    Ok::<_, SandboxError>(parse_probe(&text))
  };
  let outcome = tokio::time::timeout(Duration::from_secs(90), run).await;
  let _ = engine.force_remove(&id).await;
  let p = outcome.map_err(|_| engine.timeout("probe the image", Duration::from_secs(90)))??;
  state
    .probes
    .lock()
    .expect("probes")
    .insert(image_id.to_string(), p.clone());
  Ok(p)
}

#[cfg(test)]
mod tests {
  use super::*;

  const READY: &str = "bash=5.2.37(1)-release\npython=3.13.5\npydantic=2.12.5\npydantic_v2=1\ngit=git version 2.47.3\ngenson=genson 1.4.0\ncurl=curl 8.14.1 (x86_64-pc-linux-gnu)\njq=jq-1.7\nrg=ripgrep 14.1.1\n";

  #[test]
  fn versions_are_read_from_version_lines() {
    assert_eq!(version_in("git version 2.47.3"), "2.47.3");
    assert_eq!(version_in("jq-1.7.1"), "1.7.1");
    assert_eq!(version_in("5.2.37(1)-release"), "5.2.37");
    assert_eq!(version_in("ripgrep 14.1.1"), "14.1.1");
    assert_eq!(
      version_in("curl 8.14.1 (x86_64-pc-linux-gnu) libcurl/8.14.1"),
      "8.14.1"
    );
    assert_eq!(version_in("genson 1.4.0"), "1.4.0");
    assert_eq!(version_in("x86_64 2.0"), "2.0");
    assert_eq!(version_in("no version here 7"), "");
    assert_eq!(version_in(""), "");
  }

  #[test]
  fn python_versions() {
    assert!(python_ok("3.13.5"));
    assert!(python_ok("3.9"));
    assert!(python_ok("4.0.0"));
    assert!(!python_ok("3.8.18"));
    assert!(!python_ok("2.7.18"));
    assert!(!python_ok(""));
  }

  #[test]
  fn a_trueforge_ready_image_has_no_warning() {
    let p = parse_probe(READY);
    assert_eq!(p.python.as_deref(), Some("3.13.5"));
    assert_eq!(p.pydantic.as_deref(), Some("2.12.5"));
    assert!(p.pydantic_v2);
    assert_eq!(p.git.as_deref(), Some("2.47.3"));
    assert_eq!(p.jq.as_deref(), Some("1.7"));
    assert_eq!(warning("img", &p), None);
  }

  #[test]
  fn pydantic_v1_old_python_and_missing_tools_are_warned_about() {
    // Debian 12: pydantic 1.10, no genson, curl, jq or ripgrep.
    let p = parse_probe(
      "bash=5.2.15(1)-release\npython=3.11.2\npydantic=1.10.4\ngit=git version 2.39.5\n",
    );
    assert!(!p.pydantic_v2);
    let w = warning("deb:12", &p).unwrap();
    assert!(
      w.starts_with("image deb:12 lacks the pydantic v2 API"),
      "{w}"
    );
    assert!(w.contains("pydantic 1.10.4 is installed"), "{w}");
    assert!(w.contains("skill init"), "{w}");
    assert!(
      w.contains("it also lacks genson, curl, jq, rg (ripgrep)"),
      "{w}"
    );
    assert!(!w.contains("git,") && !w.contains("python3,"), "{w}");

    let old = parse_probe(&READY.replace("python=3.13.5", "python=3.8.18"));
    let w = warning("i", &old).unwrap();
    assert!(w.contains("Python 3.9 or later (python3 is 3.8.18)"), "{w}");
    assert!(!w.contains("also lacks"), "{w}");

    // busybox: a shell and nothing else; an unknown version still counts as present.
    let bb = parse_probe("");
    let w = warning("bb", &bb).unwrap();
    assert!(w.contains("lacks python3, git, which"), "{w}");
    assert!(
      w.contains("also lacks bash, genson, curl, jq, rg (ripgrep)"),
      "{w}"
    );
    let odd = parse_probe("git=\n");
    assert_eq!(odd.git.as_deref(), Some(""));
  }
}
