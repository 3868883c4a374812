//! The engine's own record of a pull or build in flight, so that every server process on one
//! engine sees the same status. The Engine API has no list of pulls in progress, so the process
//! doing the work holds a *lease*: a container that is created and never started, named after
//! the image (names are unique per engine, so creating it is an atomic claim), holding a small
//! JSON record that the holder rewrites every `HEARTBEAT`. A holder that crashed stops writing,
//! and after `STALE_AFTER` any process reads the lease as dead.
//!
//! The record's timestamp is the holder's wall clock, read by other processes with theirs: the
//! server replicas sharing an engine are assumed to keep their clocks within a few seconds.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::{claim, Engine};
use crate::util::errors::{Result, SandboxError};
use crate::util::labels;
use crate::util::labels::LABEL_IMAGEWORK;

/// How often a holder rewrites its record.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// A running record older than this belongs to a holder that died (crash, restart, SIGKILL).
pub const STALE_AFTER: Duration = Duration::from_secs(12);
/// Dead or failed leases nobody asked about for this long are removed by the reaper.
pub const FORGOTTEN_AFTER: Duration = Duration::from_secs(3600);

/// What a lease says about the work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
  /// `running` while the holder works, `failed` after it gave up (`reason` says why).
  pub state: String,
  /// `pull` or `build`.
  pub kind: String,
  /// The last progress line, as the settings page shows it.
  pub progress: String,
  pub reason: Option<String>,
  /// `host:pid` of the holder, for the operator.
  pub holder: String,
  /// The holder's wall clock at the last write, in milliseconds since the epoch.
  pub beat_ms: u64,
}

impl Record {
  /// A record for work this process is doing now.
  pub fn running(kind: &str, progress: String) -> Self {
    Self {
      state: "running".into(),
      kind: kind.into(),
      progress,
      reason: None,
      holder: crate::util::ids::holder(),
      beat_ms: crate::util::timestamps::now_ms(),
    }
  }

  /// The record a holder leaves behind when its work failed.
  pub fn failed(kind: &str, reason: String) -> Self {
    Self {
      state: "failed".into(),
      reason: Some(reason),
      ..Self::running(kind, String::new())
    }
  }
}

/// A lease seen by any process.
#[derive(Debug, Clone)]
pub struct Observed {
  pub container_id: String,
  pub record: Record,
  /// When the lease was made (the engine's creation time), in ms since the epoch.
  pub created_ms: u64,
}

/// What a lease means now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
  /// The holder is working and was heard from recently.
  Alive,
  /// The holder gave up; `Record::reason` says why.
  Failed,
  /// The holder has not been heard from for this many seconds: it died.
  Silent(u64),
}

impl Observed {
  /// Milliseconds since the record was last written.
  pub fn age_ms(&self) -> u64 {
    crate::util::timestamps::now_ms().saturating_sub(self.record.beat_ms)
  }

  pub fn liveness(&self) -> Liveness {
    if self.record.state == "failed" {
      return Liveness::Failed;
    }
    let age = crate::util::timestamps::now_ms().saturating_sub(self.record.beat_ms);
    if age > STALE_AFTER.as_millis() as u64 {
      Liveness::Silent(age / 1000)
    } else {
      Liveness::Alive
    }
  }
}

/// A lease this process holds.
#[derive(Debug)]
pub struct Lease {
  container_id: String,
}

/// The outcome of trying to take the lease.
pub enum Acquired {
  /// This process does the work.
  Held(Lease),
  /// Another process is doing it.
  Elsewhere(Observed),
}

/// The container name of the lease for `image`: the same in every process on the engine.
pub fn lease_name(image: &str) -> String {
  let digest = Sha256::digest(image.as_bytes());
  let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
  format!("trueforge-imagework-{hex}")
}

/// Takes the lease for `image`, or reports who holds it. A dead or failed lease is removed
/// (by its container id, so a fresh one made meanwhile by another process is never touched;
/// unforced, so only while it is still never started) and taken over. A container under the
/// lease's name that is not a lease (`observe`) is never touched: it is an error naming it.
pub async fn acquire(
  engine: &Engine,
  image: &str,
  kind: &str,
  progress: String,
) -> Result<Acquired> {
  let name = lease_name(image);
  for _ in 0..3 {
    let created = claim::create(
      engine,
      "create the image-work lease",
      &name,
      [(LABEL_IMAGEWORK.to_string(), image.to_string())],
    )
    .await?;
    match created {
      Some(container_id) => {
        let lease = Lease { container_id };
        lease
          .write(engine, &Record::running(kind, progress))
          .await?;
        return Ok(Acquired::Held(lease));
      }
      None => match observe(engine, image).await? {
        Some(seen) if seen.liveness() == Liveness::Alive => return Ok(Acquired::Elsewhere(seen)),
        Some(seen) => {
          remove(engine, &seen.container_id).await?;
        }
        None => {}
      },
    }
  }
  Err(SandboxError::Internal(format!(
    "could not take the image-work lease {name} for {image}: a container of that name that is \
     not our lease (one created and never started, labelled {LABEL_IMAGEWORK}={image}) holds \
     the name, or other server processes keep replacing it; if `docker inspect {name}` shows \
     a container that is not an image-work lease, remove or rename it"
  )))
}

/// Removes a lease by id, unforced: a container that was started is no lease and stays.
async fn remove(engine: &Engine, container_id: &str) -> Result<bool> {
  engine
    .remove_stopped("remove an image-work lease", container_id)
    .await
}

/// Reads the lease for `image`, if any: the container named `lease_name(image)`, with our labels
/// naming that image, created and never started. Anything else under the name (a container that
/// ran, forged labels) is nobody's lease. A lease whose record is not written yet (it was created
/// a moment ago) counts as running since its creation.
pub async fn observe(engine: &Engine, image: &str) -> Result<Option<Observed>> {
  let name = lease_name(image);
  let Some(info) = engine
    .inspect_container("inspect the image-work lease", &name)
    .await?
  else {
    return Ok(None);
  };
  let labels = info
    .config
    .as_ref()
    .and_then(|c| c.labels.clone())
    .unwrap_or_default();
  if !labels::managed(Some(&labels))
    || labels.get(LABEL_IMAGEWORK).map(String::as_str) != Some(image)
    || !claim::never_started(&info)
  {
    return Ok(None);
  }
  let Some(container_id) = info.id else {
    return Ok(None);
  };
  let created_ms = info
    .created
    .as_deref()
    .and_then(crate::util::timestamps::parse_time)
    .map(|s| s * 1000)
    .unwrap_or_else(crate::util::timestamps::now_ms);
  let body = match claim::read(engine, "read the image-work lease", &container_id).await {
    Ok(body) => body,
    // Removed since the inspect: the lease is gone.
    Err(SandboxError::FileNotFound { .. }) => return Ok(None),
    Err(e) => return Err(e),
  };
  // The placeholder the claim image ships, or a torn write, reads as "not written yet": running
  // since the lease was created.
  let record = body
    .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
    .filter(|r| r.kind != "none")
    .unwrap_or_else(|| Record {
      beat_ms: created_ms,
      ..Record::running("pull", String::new())
    });
  Ok(Some(Observed {
    container_id,
    record,
    created_ms,
  }))
}

impl Lease {
  /// Rewrites the record (the heartbeat).
  pub async fn write(&self, engine: &Engine, record: &Record) -> Result<()> {
    let body = serde_json::to_vec(record)
      .map_err(|e| SandboxError::Internal(format!("encoding the image-work record: {e}")))?;
    claim::write(
      engine,
      "write the image-work lease",
      &self.container_id,
      &body,
    )
    .await
  }

  /// Ends the lease: the work is done and its result is in the engine (the image).
  pub async fn release(self, engine: &Engine) -> Result<()> {
    remove(engine, &self.container_id).await.map(|_| ())
  }
}

/// A lease on the engine, as `ls`, `rm` and `doctor` see it.
#[derive(Debug, Clone)]
pub struct Found {
  /// Its container name, `lease_name(image)`.
  pub name: String,
  pub image: String,
  pub seen: Observed,
}

/// Every image-work lease on the engine (leases have no namespace: one pull serves them all).
/// Only containers under the name their image label derives, created and never started.
pub async fn leases(engine: &Engine) -> Result<Vec<Found>> {
  let labels = vec![labels::ours(), LABEL_IMAGEWORK.to_string()];
  let list = engine
    .list_labelled("list image-work leases", labels)
    .await?;
  let mut out = Vec::new();
  for c in list {
    let Some(image) = c.labels.as_ref().and_then(|l| l.get(LABEL_IMAGEWORK)) else {
      continue;
    };
    let name = lease_name(image);
    let named = c
      .names
      .as_ref()
      .and_then(|n| n.first())
      .is_some_and(|n| n.trim_start_matches('/') == name);
    if !named {
      continue;
    }
    match observe(engine, image).await? {
      Some(seen) if c.id.as_deref() == Some(seen.container_id.as_str()) => out.push(Found {
        name,
        image: image.clone(),
        seen,
      }),
      _ => {}
    }
  }
  out.sort_by(|a, b| a.name.cmp(&b.name));
  Ok(out)
}

/// Removes one lease found by `leases` unless its holder is alive; whether it went.
pub async fn remove_found(engine: &Engine, found: &Found) -> Result<bool> {
  if found.seen.liveness() == Liveness::Alive {
    return Ok(false);
  }
  remove(engine, &found.seen.container_id).await
}

/// Removes the leases that are dead or failed and were last written at least `older_than` ago;
/// those removed.
pub async fn remove_stale(engine: &Engine, older_than: Duration) -> Result<Vec<Found>> {
  let mut removed = Vec::new();
  for found in leases(engine).await? {
    if found.seen.age_ms() >= older_than.as_millis() as u64 && remove_found(engine, &found).await? {
      removed.push(found);
    }
  }
  Ok(removed)
}

/// Removes leases that are dead or failed and were last written over an hour ago (the
/// reaper's sweep): nobody is waiting on them any more, and a failed one has long been reported.
pub async fn reap_forgotten(engine: &Engine) -> Result<usize> {
  Ok(remove_stale(engine, FORGOTTEN_AFTER).await?.len())
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn lease_names_are_stable_valid_container_names_and_differ_per_image() {
    let a = lease_name("python:3.12");
    assert_eq!(a, lease_name("python:3.12"));
    assert_ne!(a, lease_name("python:3.13"));
    assert!(a.starts_with("trueforge-imagework-"));
    assert_eq!(a.len(), "trueforge-imagework-".len() + 32);
    assert!(a
      .chars()
      .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
  }

  #[test]
  fn liveness_follows_state_and_heartbeat_age() {
    let seen = |record: Record| Observed {
      container_id: "x".into(),
      record,
      created_ms: 0,
    };
    assert_eq!(
      seen(Record::running("pull", "p".into())).liveness(),
      Liveness::Alive
    );
    assert_eq!(
      seen(Record::failed("pull", "r".into())).liveness(),
      Liveness::Failed
    );
    let old = Record {
      beat_ms: crate::util::timestamps::now_ms() - 60_000,
      ..Record::running("pull", "p".into())
    };
    assert!(matches!(seen(old).liveness(), Liveness::Silent(s) if (59..=61).contains(&s)));
  }

  #[test]
  fn records_round_trip_as_json() {
    let rec = Record::running("build", "step 2/5".into());
    let body = serde_json::to_vec(&rec).unwrap();
    assert_eq!(serde_json::from_slice::<Record>(&body).unwrap(), rec);
    // The claim image's placeholder is no record.
    assert!(serde_json::from_slice::<Record>(b"{}").is_err());
  }
}
