//! Image readiness: whether the configured image is in the engine, and a background pull (one
//! per image per process, however many callers) whose progress the status reports.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};

use bollard::query_parameters::CreateImageOptions;
use futures_util::StreamExt;
use serde_json::json;

use crate::client::{status_of, Engine};
use crate::errors::Result;
use crate::logging::Logger;

/// The three states TrueForge's settings page knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
  Pending,
  Ready,
  Failed,
}

impl BuildStatus {
  pub fn as_str(self) -> &'static str {
    match self {
      BuildStatus::Pending => "pending",
      BuildStatus::Ready => "ready",
      BuildStatus::Failed => "failed",
    }
  }
}

/// What `buildImage()` and `getImageBuildStatus()` return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
  pub status: BuildStatus,
  pub reason: Option<String>,
  pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default)]
struct Progress {
  /// Per layer: (bytes done, bytes total, finished).
  layers: BTreeMap<String, (u64, u64, bool)>,
}

impl Progress {
  fn describe(&self, image: &str) -> String {
    if self.layers.is_empty() {
      return format!("pulling {image}: resolving the manifest");
    }
    let done = self.layers.values().filter(|l| l.2).count();
    let (cur, total) = self
      .layers
      .values()
      .fold((0, 0), |(c, t), l| (c + l.0, t + l.1));
    format!(
      "pulling {image}: {done}/{} layers done, {} of {} downloaded",
      self.layers.len(),
      human(cur),
      human(total)
    )
  }
}

fn human(b: u64) -> String {
  if b >= 1 << 30 {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
  } else {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
  }
}

#[derive(Debug, Clone)]
enum Work {
  Pulling(Progress),
  Failed(String),
}

fn works() -> &'static Mutex<HashMap<String, Work>> {
  static W: OnceLock<Mutex<HashMap<String, Work>>> = OnceLock::new();
  W.get_or_init(Default::default)
}

fn key(engine: &Engine, image: &str) -> String {
  format!("{}\n{image}", engine.host)
}

/// Splits a reference into what the pull endpoint wants; a missing tag means `latest` (an
/// empty tag would pull every tag of the repository).
pub fn split_reference(image: &str) -> (String, String) {
  if let Some((repo, digest)) = image.split_once('@') {
    return (repo.to_string(), digest.to_string());
  }
  let slash = image.rfind('/').map(|i| i + 1).unwrap_or(0);
  match image[slash..].rfind(':') {
    Some(i) => (
      image[..slash + i].to_string(),
      image[slash + i + 1..].to_string(),
    ),
    None => (image.to_string(), "latest".to_string()),
  }
}

/// The image's id when present; `None` when the engine does not have it.
pub async fn present(engine: &Engine, image: &str) -> Result<Option<String>> {
  match engine
    .control("inspect the image", engine.docker.inspect_image(image))
    .await
  {
    Ok(i) => Ok(Some(i.id.unwrap_or_default())),
    Err(e) if status_of(&e) == Some(404) => Ok(None),
    Err(e) => Err(e),
  }
}

fn ready(image: &str, id: String) -> Build {
  let mut m = BTreeMap::new();
  m.insert("image".to_string(), image.to_string());
  if !id.is_empty() {
    m.insert("imageId".to_string(), id);
  }
  Build {
    status: BuildStatus::Ready,
    reason: None,
    metadata: Some(m),
  }
}

fn meta(image: &str) -> Option<BTreeMap<String, String>> {
  Some(BTreeMap::from([("image".to_string(), image.to_string())]))
}

/// Read-only status: never starts work, never reports work that is not happening.
pub async fn status(engine: &Engine, image: &str) -> Result<Build> {
  if let Some(id) = present(engine, image).await? {
    return Ok(ready(image, id));
  }
  let work = works()
    .lock()
    .expect("works")
    .get(&key(engine, image))
    .cloned();
  Ok(match work {
    Some(Work::Pulling(p)) => Build { status: BuildStatus::Pending, reason: Some(p.describe(image)), metadata: meta(image) },
    Some(Work::Failed(reason)) => Build { status: BuildStatus::Failed, reason: Some(reason), metadata: meta(image) },
    None => Build {
      status: BuildStatus::Failed,
      reason: Some(format!(
        "image {image} is not in the Docker engine and no pull is running; save the sandbox settings again to pull it"
      )),
      metadata: meta(image),
    },
  })
}

/// Idempotent: `ready` when present, else starts (or joins) the background pull.
pub async fn build(engine: &Engine, image: &str, log: &Logger) -> Result<Build> {
  if let Some(id) = present(engine, image).await? {
    return Ok(ready(image, id));
  }
  let k = key(engine, image);
  let start = {
    let mut w = works().lock().expect("works");
    match w.get(&k) {
      Some(Work::Pulling(_)) => false,
      _ => {
        w.insert(k.clone(), Work::Pulling(Progress::default()));
        true
      }
    }
  };
  if start {
    log.info("pulling image", json!({ "image": image }));
    let engine = engine.clone();
    let image_owned = image.to_string();
    let log = log.clone();
    tokio::spawn(async move {
      let outcome = pull(&engine, &image_owned, &k).await;
      let mut w = works().lock().expect("works");
      match outcome {
        Ok(()) => {
          w.remove(&k);
          log.info("image pulled", json!({ "image": image_owned }));
        }
        Err(reason) => {
          log.warn(
            "image pull failed",
            json!({ "image": image_owned, "reason": reason }),
          );
          w.insert(k, Work::Failed(reason));
        }
      }
    });
  }
  status(engine, image).await
}

async fn pull(engine: &Engine, image: &str, k: &str) -> std::result::Result<(), String> {
  let (repo, tag) = split_reference(image);
  let opts = CreateImageOptions {
    from_image: Some(repo),
    tag: Some(tag),
    ..Default::default()
  };
  let mut stream = engine.docker.create_image(Some(opts), None, None);
  while let Some(item) = stream.next().await {
    let info = item.map_err(|e| engine.map_error("pull the image", e).to_string())?;
    if let Some(err) = info.error_detail.and_then(|d| d.message) {
      return Err(format!("pulling {image} failed: {err}"));
    }
    if let (Some(id), Some(status)) = (info.id, info.status) {
      let mut w = works().lock().expect("works");
      if let Some(Work::Pulling(p)) = w.get_mut(k) {
        let entry = p.layers.entry(id).or_insert((0, 0, false));
        if let Some(d) = info.progress_detail {
          if let (Some(c), Some(t)) = (d.current, d.total) {
            if status.starts_with("Downloading") {
              entry.0 = c.max(0) as u64;
              entry.1 = t.max(0) as u64;
            }
          }
        }
        if status == "Pull complete" || status == "Already exists" {
          entry.2 = true;
          entry.0 = entry.1;
        }
      }
    }
  }
  match present(engine, image).await {
    Ok(Some(_)) => Ok(()),
    Ok(None) => Err(format!(
      "pulling {image} ended but the engine does not have the image"
    )),
    Err(e) => Err(e.to_string()),
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn references() {
    assert_eq!(
      split_reference("busybox"),
      ("busybox".into(), "latest".into())
    );
    assert_eq!(
      split_reference("busybox:1.36"),
      ("busybox".into(), "1.36".into())
    );
    assert_eq!(
      split_reference("localhost:5000/a/b"),
      ("localhost:5000/a/b".into(), "latest".into())
    );
    assert_eq!(
      split_reference("localhost:5000/a/b:t"),
      ("localhost:5000/a/b".into(), "t".into())
    );
    assert_eq!(
      split_reference("a@sha256:abc"),
      ("a".into(), "sha256:abc".into())
    );
  }

  #[test]
  fn progress_text() {
    let mut p = Progress::default();
    assert!(p.describe("x").contains("resolving"));
    p.layers.insert("a".into(), (1 << 20, 2 << 20, false));
    p.layers.insert("b".into(), (3 << 20, 3 << 20, true));
    assert_eq!(
      p.describe("x"),
      "pulling x: 1/2 layers done, 4.0 MiB of 5.0 MiB downloaded"
    );
  }
}
