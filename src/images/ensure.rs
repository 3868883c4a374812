//! Pulling or building an image, in the background, once per image per process, with the
//! engine's lease (`images::work`) telling every process on the engine who does it; and the
//! status the settings page reads.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bollard::models::ImageInspect;
use bollard::query_parameters::{BuildImageOptions, CreateImageOptions};
use futures_util::StreamExt;
use serde_json::json;

use crate::config::BuildSpec;
use crate::engine::Engine;
use crate::images::context;
use crate::images::probe::{probe, warning};
use crate::images::source::ImageSource;
use crate::images::source::{registry_of, split_reference};
use crate::images::work::{self, Acquired, Liveness, Record};
use crate::util::errors::{Result, SandboxError};
use crate::util::labels;
use crate::util::logging::Logger;

#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
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

/// The pulls and builds this process runs or ran, per engine (`EngineShared::state`).
#[derive(Default)]
pub struct Works {
  /// By image reference.
  pub(crate) works: Mutex<HashMap<String, Work>>,
  /// (reference, image id) pairs whose shortcomings were logged already.
  pub(crate) warned: Mutex<HashSet<(String, String)>>,
}

impl Works {
  /// Pulls and builds remembered (running or failed).
  pub fn works(&self) -> usize {
    self.works.lock().expect("works").len()
  }
}

/// The image's inspect data when present; `None` when the engine does not have it.
pub async fn present(engine: &Engine, image: &str) -> Result<Option<ImageInspect>> {
  engine.inspect_image(image).await
}

#[derive(Debug, Clone)]
pub(crate) enum Work {
  Pulling(Progress),
  Building(String),
  Failed(String),
}

/// Runs `f` on the engine's pulls and builds, under their lock.
fn with_works<R>(engine: &Engine, f: impl FnOnce(&mut HashMap<String, Work>) -> R) -> R {
  f(&mut engine.shared.state::<Works>().works.lock().expect("works"))
}

fn key(image: &str) -> String {
  image.to_string()
}

/// `ready` with metadata, from the inspect data `present` already fetched (no second inspect).
async fn ready(
  engine: &Engine,
  src: &ImageSource,
  info: ImageInspect,
  log: &Logger,
) -> Result<Build> {
  let id = info.id.unwrap_or_default();
  let mut m = BTreeMap::new();
  m.insert("image".to_string(), src.reference.clone());
  if !id.is_empty() {
    m.insert("imageId".to_string(), id.clone());
  }
  // The same content pulled under several names has a digest per repository: report ours.
  let (repo, _) = split_reference(&src.reference);
  let ours = info
    .repo_digests
    .unwrap_or_default()
    .into_iter()
    .find(|d| d.split_once('@').map(|(r, _)| r) == Some(repo.as_str()));
  if let Some(d) = ours {
    m.insert("digest".to_string(), d);
  }
  if let Some(b) = &src.build {
    m.insert("buildContext".to_string(), b.context.clone());
  }
  let p = probe(engine, &src.reference, &id, &src.namespace).await?;
  let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
  // A tool's version; `yes` when it is there but said no version; `no` when it is missing.
  let ver = |v: &Option<String>| match v.as_deref() {
    None => "no".to_string(),
    Some("") => "yes".to_string(),
    Some(v) => v.to_string(),
  };
  m.insert("sh".into(), yes(p.sh));
  m.insert("bash".into(), ver(&p.bash));
  m.insert("python3".into(), yes(p.python.is_some()));
  m.insert("python".into(), ver(&p.python));
  m.insert("pydantic".into(), ver(&p.pydantic));
  m.insert("pydanticV2".into(), yes(p.pydantic_v2));
  m.insert("git".into(), ver(&p.git));
  m.insert("genson".into(), ver(&p.genson));
  m.insert("curl".into(), ver(&p.curl));
  m.insert("jq".into(), ver(&p.jq));
  m.insert("rg".into(), ver(&p.rg));
  if !p.sh {
    return Ok(Build {
      status: BuildStatus::Failed,
      reason: Some(format!(
        "image {} has no /bin/sh: the sandbox cannot run commands in it",
        src.reference
      )),
      metadata: Some(m),
    });
  }
  // Ready means ready (`reason: null`): what the image lacks is a warning, in the metadata and
  // in the log (once per image per process, not on every poll of the settings page).
  if let Some(w) = warning(&src.reference, &p) {
    let first = engine
      .shared
      .state::<Works>()
      .warned
      .lock()
      .expect("warned")
      .insert((src.reference.clone(), id.clone()));
    if first {
      log.warn(
        &w,
        json!({ "image": src.reference, "imageId": id, "probe": m }),
      );
    }
    m.insert("warning".into(), w);
  }
  Ok(Build {
    status: BuildStatus::Ready,
    reason: None,
    metadata: Some(m),
  })
}

fn meta(src: &ImageSource) -> Option<BTreeMap<String, String>> {
  let mut m = BTreeMap::from([("image".to_string(), src.reference.clone())]);
  if let Some(b) = &src.build {
    m.insert("buildContext".to_string(), b.context.clone());
  }
  Some(m)
}

/// Read-only status: never starts a pull or build, never reports work that is not happening.
/// Work in flight is what this process does, else what the engine's lease says another process
/// on the same engine does (see `imagework`), so every replica of a server reports the same.
pub async fn status(engine: &Engine, src: &ImageSource, log: &Logger) -> Result<Build> {
  if let Some(info) = present(engine, &src.reference).await? {
    return ready(engine, src, info, log).await;
  }
  let work = with_works(engine, |w| w.get(&key(&src.reference)).cloned());
  let what = if src.build.is_some() { "build" } else { "pull" };
  let build = |status, reason: String| Build {
    status,
    reason: Some(reason),
    metadata: meta(src),
  };
  match work {
    Some(w @ (Work::Pulling(_) | Work::Building(_))) => {
      return Ok(build(BuildStatus::Pending, describe(&w, &src.reference)))
    }
    Some(Work::Failed(_)) | None => {}
  }
  if let Some(seen) = work::observe(engine, &src.reference).await? {
    let holder = &seen.record.holder;
    return Ok(match seen.liveness() {
      Liveness::Alive => build(
        BuildStatus::Pending,
        format!("{} (in server process {holder})", seen.record.progress),
      ),
      Liveness::Failed => build(
        BuildStatus::Failed,
        seen.record.reason.clone().unwrap_or_else(|| format!("the {what} failed")),
      ),
      Liveness::Silent(secs) => build(
        BuildStatus::Failed,
        format!(
          "the {what} of {} stopped: the server process doing it ({holder}) has not been heard from for {secs} s (it crashed or was restarted); save the sandbox settings again to start it",
          src.reference
        ),
      ),
    });
  }
  Ok(match work {
    Some(Work::Failed(reason)) => build(BuildStatus::Failed, reason),
    _ => build(
      BuildStatus::Failed,
      format!(
        "image {} is not in the Docker engine and no {what} is running (the server may have restarted mid-way); save the sandbox settings again to start it",
        src.reference
      ),
    ),
  })
}

fn describe(work: &Work, image: &str) -> String {
  match work {
    Work::Pulling(p) => p.describe(image),
    Work::Building(step) => step.clone(),
    Work::Failed(reason) => reason.clone(),
  }
}

/// Idempotent: `ready` when present, else starts (or joins) the background pull or build and
/// returns `pending` at once. A failed attempt is retried.
pub async fn build(engine: &Engine, src: &ImageSource, log: &Logger) -> Result<Build> {
  if let Some(info) = present(engine, &src.reference).await? {
    return ready(engine, src, info, log).await;
  }
  start(engine, src, log);
  status(engine, src, log).await
}

/// Starts the work unless it is already in flight in this process. The work itself runs only
/// where the engine's lease is taken: when another process holds it, this one leaves the work
/// to it and reports the lease.
fn start(engine: &Engine, src: &ImageSource, log: &Logger) {
  let k = key(&src.reference);
  let first = {
    let works = engine.shared.state::<Works>();
    let mut w = works.works.lock().expect("works");
    if matches!(w.get(&k), Some(Work::Pulling(_) | Work::Building(_))) {
      return;
    }
    let first = match &src.build {
      Some(_) => Work::Building(format!("building {}: sending the context", src.reference)),
      None => Work::Pulling(Progress::default()),
    };
    w.insert(k.clone(), first.clone());
    first
  };
  let (task_engine, src, log) = (engine.clone(), src.clone(), log.clone());
  engine.shared.background.spawn(|stop| async move {
    let engine = task_engine;
    let what = if src.build.is_some() { "build" } else { "pull" };
    let progress = describe(&first, &src.reference);
    let lease = match work::acquire(&engine, &src.reference, what, progress).await {
      Ok(Acquired::Held(lease)) => Some(lease),
      Ok(Acquired::Elsewhere(seen)) => {
        with_works(&engine, |w| w.remove(&k));
        log.info(
          &format!("image {what} already running in another server process"),
          json!({ "image": src.reference, "holder": seen.record.holder }),
        );
        return;
      }
      Err(e) => {
        log.warn(
          "could not record the image work in the engine; other server processes will not see it",
          json!({ "image": src.reference, "error": e.to_string() }),
        );
        None
      }
    };
    log.info(
      &format!("image {what} started"),
      json!({ "image": src.reference }),
    );
    let work = async {
      match &src.build {
        Some(spec) => run_build(&engine, &src.reference, spec, &k, &log).await,
        None => pull(&engine, &src, &k, &log).await,
      }
    };
    let finished = tokio::select! {
      o = with_heartbeat(&engine, lease.as_ref(), what, &k, &src.reference, work) => Some(o),
      _ = stop.cancelled() => None,
    };
    let Some(outcome) = finished else {
      // Disposed: the work is dropped; its lease goes too (dispose awaits it, for at most a
      // few seconds), so no other process waits on work nobody does. A lease left behind by a
      // hung engine stops beating and reads as dead after `work::STALE_AFTER`.
      if let Some(lease) = lease {
        let _ = tokio::time::timeout(Duration::from_secs(5), lease.release(&engine)).await;
      }
      with_works(&engine, |w| w.remove(&k));
      log.info(
        &format!("image {what} stopped: the provider was disposed"),
        json!({ "image": src.reference }),
      );
      return;
    };
    match &outcome {
      Ok(()) => {
        if let Some(lease) = lease {
          let _ = lease.release(&engine).await;
        }
        log.info(
          &format!("image {what} finished"),
          json!({ "image": src.reference }),
        );
      }
      Err(reason) => {
        if let Some(lease) = &lease {
          let _ = lease
            .write(&engine, &Record::failed(what, reason.clone()))
            .await;
        }
        log.warn(
          &format!("image {what} failed"),
          json!({ "image": src.reference, "reason": reason }),
        );
      }
    }
    let works = &engine.shared.state::<Works>();
    let mut w = works.works.lock().expect("works");
    match outcome {
      Ok(()) => w.remove(&k),
      Err(reason) => w.insert(k, Work::Failed(reason)),
    };
  });
}

/// Runs `work`, rewriting the lease with the latest progress every `HEARTBEAT` meanwhile.
async fn with_heartbeat(
  engine: &Engine,
  lease: Option<&work::Lease>,
  what: &str,
  k: &str,
  image: &str,
  work: impl std::future::Future<Output = std::result::Result<(), String>>,
) -> std::result::Result<(), String> {
  let Some(lease) = lease else {
    return work.await;
  };
  tokio::pin!(work);
  let mut tick = tokio::time::interval(work::HEARTBEAT);
  tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
  tick.tick().await;
  loop {
    tokio::select! {
      outcome = &mut work => return outcome,
      _ = tick.tick() => {
        let current = with_works(engine, |w| w.get(k).cloned());
        let progress = current.map(|w| describe(&w, image)).unwrap_or_default();
        // A missed beat is not fatal: the next one follows, and the work goes on regardless.
        let _ = lease.write(engine, &Record::running(what, progress)).await;
      }
    }
  }
}

/// Makes sure the image is present before a sandbox is created from it: starts or joins the
/// single pull or build and waits for it, up to `limit`.
pub async fn ensure(
  engine: &Engine,
  src: &ImageSource,
  log: &Logger,
  limit: Duration,
) -> Result<()> {
  if present(engine, &src.reference).await?.is_some() {
    return Ok(());
  }
  log.info(
    "image absent; fetching it before creating the sandbox",
    json!({ "image": src.reference }),
  );
  let k = key(&src.reference);
  // A failure from an earlier attempt is retried once here.
  with_works(engine, |w| {
    if matches!(w.get(&k), Some(Work::Failed(_))) {
      w.remove(&k);
    }
  });
  start(engine, src, log);
  let deadline = Instant::now() + limit;
  let mut last_reason = String::new();
  let mut takeovers = 0;
  loop {
    let work = with_works(engine, |w| w.get(&k).cloned());
    match work {
      None => {
        if present(engine, &src.reference).await?.is_some() {
          return Ok(());
        }
        // Not here: another process holds the work, it died, or the image vanished.
        match work::observe(engine, &src.reference).await? {
          Some(seen) if seen.liveness() == Liveness::Alive => {
            if seen.record.progress != last_reason {
              log.info(&seen.record.progress, json!({ "image": src.reference }));
              last_reason = seen.record.progress.clone();
            }
          }
          Some(seen) if seen.liveness() == Liveness::Failed => {
            return Err(SandboxError::ImageNotAvailable {
              image: src.reference.clone(),
              reason: seen
                .record
                .reason
                .unwrap_or_else(|| "the fetch failed".into()),
            })
          }
          _ if takeovers < 3 => {
            takeovers += 1;
            start(engine, src, log);
          }
          _ => {
            return Err(SandboxError::ImageNotAvailable {
              image: src.reference.clone(),
              reason: "it vanished right after it was fetched".into(),
            })
          }
        }
      }
      Some(Work::Failed(reason)) => {
        return Err(SandboxError::ImageNotAvailable {
          image: src.reference.clone(),
          reason,
        })
      }
      Some(Work::Pulling(p)) => {
        let r = p.describe(&src.reference);
        if r != last_reason {
          log.info(&r, json!({ "image": src.reference }));
          last_reason = r;
        }
      }
      Some(Work::Building(step)) => {
        if step != last_reason {
          log.info(&step, json!({ "image": src.reference }));
          last_reason = step;
        }
      }
    }
    if Instant::now() > deadline {
      return Err(SandboxError::ImageNotAvailable {
        image: src.reference.clone(),
        reason: format!(
          "still being fetched after {} s ({last_reason})",
          limit.as_secs()
        ),
      });
    }
    // Work elsewhere is followed through the engine: poll it less often than our own.
    let elsewhere = with_works(engine, |w| w.get(&k).is_none());
    tokio::time::sleep(Duration::from_millis(if elsewhere { 1000 } else { 200 })).await;
  }
}

/// How long a pull or build may go without a single message before it counts as failed (a
/// partitioned network can leave a stream open and silent forever).
const STALL: Duration = Duration::from_secs(300);

async fn next_or_stall<S, T>(stream: &mut S, image: &str) -> std::result::Result<Option<T>, String>
where
  S: futures_util::Stream<Item = T> + Unpin,
{
  tokio::time::timeout(STALL, stream.next())
    .await
    .map_err(|_| {
      format!(
        "{image}: the engine sent no progress for {} s; giving up",
        STALL.as_secs()
      )
    })
}

async fn pull(
  engine: &Engine,
  src: &ImageSource,
  k: &str,
  log: &Logger,
) -> std::result::Result<(), String> {
  let image = &src.reference;
  let (repo, tag) = split_reference(image);
  let opts = CreateImageOptions {
    from_image: Some(repo),
    tag: Some(tag),
    ..Default::default()
  };
  // No `registryAuth` for this registry: the Docker config's, as the CLI finds them (blocking:
  // a file and maybe a credential helper).
  let credentials = match &src.credentials {
    Some(c) => Some(c.clone()),
    None if src.build.is_none() => {
      let registry = registry_of(image);
      tokio::task::spawn_blocking(move || {
        crate::engine::credentials::from_docker_config(
          &registry,
          &crate::engine::endpoint::ProcessEnv,
        )
      })
      .await
      .map_err(|e| format!("pulling {image}: reading the Docker config panicked: {e}"))?
      .map_err(|e| format!("pulling {image}: {e}"))?
    }
    None => None,
  };
  let stream = engine.create_image("pull the image", opts, None, credentials);
  futures_util::pin_mut!(stream);
  let mut last_log = Instant::now();
  while let Some(item) = next_or_stall(&mut stream, image).await? {
    let info = item.map_err(|e| match e {
      SandboxError::Engine { detail, .. } => format!("pulling {image} failed: {detail}"),
      other => other.to_string(),
    })?;
    if let Some(err) = info.error_detail.and_then(|d| d.message) {
      return Err(format!("pulling {image} failed: {err}"));
    }
    // Messages about the tag itself ("Pulling from …", "Digest: …") carry an id too; only the
    // per-layer ones count as layers.
    let is_layer = |st: &str| {
      [
        "Pulling fs layer",
        "Waiting",
        "Downloading",
        "Verifying Checksum",
        "Download complete",
        "Extracting",
        "Pull complete",
        "Already exists",
      ]
      .iter()
      .any(|p| st.starts_with(p))
    };
    if let (Some(id), Some(status)) = (info.id, info.status.filter(|s| is_layer(s))) {
      let works = engine.shared.state::<Works>();
      let mut w = works.works.lock().expect("works");
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
        if last_log.elapsed() > Duration::from_secs(2) {
          log.debug(&p.describe(image), json!({ "image": image }));
          last_log = Instant::now();
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

async fn run_build(
  engine: &Engine,
  tag: &str,
  spec: &BuildSpec,
  k: &str,
  log: &Logger,
) -> std::result::Result<(), String> {
  let spec2 = spec.clone();
  let prepared = tokio::task::spawn_blocking(move || context::prepare(&spec2, true))
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
  if prepared.tag != tag {
    return Err(format!(
      "the build context changed while {tag} was being prepared (it is now {}); save the sandbox settings again",
      prepared.tag
    ));
  }
  let opts = BuildImageOptions {
    dockerfile: spec.dockerfile.clone(),
    t: Some(tag.to_string()),
    rm: true,
    forcerm: true,
    buildargs: Some(context::build_args(spec)),
    labels: Some(HashMap::from([(
      labels::LABEL_MANAGED_BY.to_string(),
      labels::MANAGED_BY.to_string(),
    )])),
    ..Default::default()
  };
  let stream = engine.build_image(opts, prepared.tar.into());
  futures_util::pin_mut!(stream);
  let mut log_lines: Vec<String> = Vec::new();
  while let Some(item) = next_or_stall(&mut stream, tag).await? {
    let info = match item {
      Ok(i) => i,
      Err(e) => {
        let detail = match e {
          SandboxError::Engine { detail, .. } => detail,
          other => other.to_string(),
        };
        log_lines.push(detail);
        return Err(format!(
          "building {tag} failed:\n{}",
          context::last_lines(&log_lines, 15)
        ));
      }
    };
    if let Some(line) = info.stream {
      if let Some(step) = line.lines().find(|l| l.starts_with("Step ")) {
        let step = step.split(" : ").next().unwrap_or(step).to_string();
        let works = engine.shared.state::<Works>();
        let mut w = works.works.lock().expect("works");
        if let Some(Work::Building(s)) = w.get_mut(k) {
          *s = format!("building {tag}: {step}");
        }
        log.debug(&format!("building {tag}: {step}"), json!({}));
      }
      log_lines.push(line);
      if log_lines.len() > 200 {
        log_lines.drain(..100);
      }
    }
    if let Some(err) = info.error_detail.and_then(|d| d.message) {
      log_lines.push(err);
      return Err(format!(
        "building {tag} failed:\n{}",
        context::last_lines(&log_lines, 15)
      ));
    }
  }
  match present(engine, tag).await {
    Ok(Some(_)) => Ok(()),
    Ok(None) => Err(format!(
      "building {tag} ended without an image:\n{}",
      context::last_lines(&log_lines, 15)
    )),
    Err(e) => Err(e.to_string()),
  }
}

#[cfg(test)]
mod tests {
  use super::*;

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
