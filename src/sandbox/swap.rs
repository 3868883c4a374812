//! The rename protocol a GPU move uses to replace a sandbox's container, and what a moved
//! sandbox holds beyond its container. A move makes the new container under
//! `<name>.gpu-move`, sets the old one aside as `<name>.gpu-moved`, gives the new one the name,
//! then removes the old one; between the renames the name is briefly absent, which a lookup
//! waits out (or repairs, after a move that died). A moved sandbox's labels name the image its
//! files were saved as and the volumes it carried over: they go when it goes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::ContainerInspectResponse;
use serde_json::json;

use crate::engine::Engine;
use crate::util::errors::Result;
use crate::util::labels::{LABEL_CARRIED_VOLUMES, LABEL_SAVED_FROM, LABEL_SAVED_IMAGE};
use crate::util::logging::Logger;

pub use crate::sandbox::ours::{MOVED_SUFFIX, MOVING_SUFFIX};

/// A saved image no container uses is swept once older than this (a move that crashed).
pub const SAVED_IMAGE_STALE: Duration = Duration::from_secs(600);

/// The renames of a move take milliseconds; a name absent for longer is a move that died.
const SWAP_GRACE: Duration = Duration::from_secs(5);

/// What a moved sandbox holds beyond its container; removed with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
  pub image: Option<String>,
  pub volumes: Vec<String>,
}

/// The saved image and carried volumes a container's labels name (empty when never moved).
pub fn saved_of(labels: Option<&HashMap<String, String>>) -> Saved {
  let get = |k: &str| labels.and_then(|l| l.get(k)).filter(|v| !v.is_empty());
  Saved {
    image: get(LABEL_SAVED_IMAGE).cloned(),
    volumes: get(LABEL_CARRIED_VOLUMES)
      .map(|v| {
        v.split(',')
          .filter(|s| !s.is_empty())
          .map(String::from)
          .collect()
      })
      .unwrap_or_default(),
  }
}

/// Removes what a removed moved sandbox held; best effort (a sweep finds a left image).
pub async fn remove_saved(engine: &Engine, saved: &Saved, log: &Logger) {
  // An agent volume is shared by every sandbox: never removed with one.
  for v in saved
    .volumes
    .iter()
    .filter(|v| !crate::sandbox::agent::facts::is_agent_volume(v))
  {
    if let Err(e) = engine.remove_unused_volume(v).await {
      log.warn(
        "could not remove a moved sandbox's volume",
        json!({ "volume": v, "error": e.to_string() }),
      );
    }
  }
  if let Some(image) = &saved.image {
    let _ = engine.remove_unused_image(image).await;
  }
}

/// Removes saved images that no container uses and that are older than `SAVED_IMAGE_STALE`
/// (younger ones may belong to a move under way). Best effort.
pub async fn sweep_saved_images(engine: &Engine, now_secs: u64) {
  let Ok(images) = engine
    .list_dangling_images(vec![LABEL_SAVED_FROM.to_string()])
    .await
  else {
    return;
  };
  for i in images {
    let age = now_secs.saturating_sub(u64::try_from(i.created).unwrap_or(u64::MAX));
    if i.containers <= 0 && age >= SAVED_IMAGE_STALE.as_secs() {
      let _ = engine.remove_unused_image(&i.id).await;
    }
  }
}

/// After a lookup of `name` missed: whether a move of that sandbox is between its renames (the
/// old container set aside under `{name}.gpu-moved`). Waits up to `SWAP_GRACE` for the new one
/// to take the name; a set-aside container still alone after that is from a move that died,
/// and gets its name back. `true` when the caller should look again.
pub async fn await_move(engine: &Engine, name: &str) -> Result<bool> {
  let moved = format!("{name}{MOVED_SUFFIX}");
  let Some(aside) = engine
    .inspect_container("inspect a sandbox being moved", &moved)
    .await?
  else {
    return Ok(false);
  };
  let until = Instant::now() + SWAP_GRACE;
  while Instant::now() < until {
    tokio::time::sleep(Duration::from_millis(25)).await;
    if engine
      .inspect_container("inspect the sandbox container", name)
      .await?
      .is_some()
    {
      return Ok(true);
    }
  }
  if let (true, Some(id)) = (set_aside_of(&aside, name), aside.id.as_deref()) {
    let _ = engine
      .rename_container("give a sandbox container its name back", id, name)
      .await;
  }
  Ok(true)
}

/// Whether inspect output is the container a move of the sandbox named `name` set aside: ours
/// by name and labels (namespace and id deriving `name`), so anything else that happens to
/// carry the name is never renamed.
fn set_aside_of(info: &ContainerInspectResponse, name: &str) -> bool {
  let moved = format!("{name}{MOVED_SUFFIX}");
  let labels = info.config.as_ref().and_then(|c| c.labels.as_ref());
  info.name.as_deref() == Some(format!("/{moved}").as_str())
    && crate::sandbox::ours::owned(&moved, labels, None)
      .is_some_and(|o| o.role == crate::sandbox::ours::Role::SetAside)
}
