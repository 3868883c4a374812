//! Every label key we put on containers, in one place: what marks a container as ours, whose it
//! is, and what kind of helper container it is. Only containers carrying `LABEL_MANAGED_BY` with
//! `MANAGED_BY` are ever touched.

use std::collections::HashMap;

/// Label keys we set ourselves; a user label may not shadow them.
pub const LABEL_PREFIX: &str = "trueforge.sandbox.";

/// Labels every container of ours carries.
pub const LABEL_MANAGED_BY: &str = "trueforge.sandbox.managed-by";
pub const LABEL_NAMESPACE: &str = "trueforge.sandbox.namespace";
pub const LABEL_ID: &str = "trueforge.sandbox.id";
pub const LABEL_CREATED_AT: &str = "trueforge.sandbox.created-at";
/// The value of `LABEL_MANAGED_BY`.
pub const MANAGED_BY: &str = "trueforge-docker-sandbox";

/// The label naming the tenant a sandbox belongs to.
pub const LABEL_TENANT: &str = "trueforge.sandbox.tenant";
/// The label marking a warm-pool member (its value: the configuration's fingerprint).
pub const LABEL_POOL: &str = "trueforge.sandbox.pool";
/// The label recording an exclusive sandbox's GPUs, comma-separated.
pub const LABEL_GPUS: &str = "trueforge.sandbox.gpus";

/// On a sandbox made to run the in-sandbox agent on Docker: whom commands and files run as (a
/// `docker exec -u` spec; empty for root). Its main process then runs as root, because with
/// `no-new-privileges` an exec as root in a container whose user is not root gets no
/// capability at all, and the agent needs some to run things as that user.
pub const LABEL_USER: &str = "trueforge.sandbox.user";
/// On a sandbox: what it may reach (`config::egress::Egress::record`), read by whoever starts its
/// agent.
pub const LABEL_EGRESS: &str = "trueforge.sandbox.egress";
/// The label an agent volume and its claim carry (value: the binaries' tag).
pub const LABEL_AGENT: &str = "trueforge.sandbox.agent";

/// The label on probe containers, so a crash mid-probe leaves nothing the reaper cannot find.
pub const LABEL_PROBE: &str = "trueforge.sandbox.probe";
/// The label an image-work lease carries; its value is the image reference the work is for.
pub const LABEL_IMAGEWORK: &str = "trueforge.sandbox.imagework";
/// The label marking the GPU allocation lock; its value is the holder (`host:pid`).
pub const LABEL_GPU_LOCK: &str = "trueforge.sandbox.gpu-lock";
/// When the GPU lock was taken, in milliseconds since the epoch (the holder's clock).
pub const LABEL_GPU_LOCK_AT: &str = "trueforge.sandbox.gpu-lock-at";

/// On a sandbox container moved to other GPUs (`gpu::relocate`): the image its files were saved as,
/// and the volumes it took over from the container it replaced; both go when it goes.
pub const LABEL_SAVED_IMAGE: &str = "trueforge.sandbox.saved-image";
pub const LABEL_CARRIED_VOLUMES: &str = "trueforge.sandbox.carried-volumes";
/// On an image saved from a sandbox for a move (its value: the sandbox id), so a sweep finds
/// one a crashed move left behind.
pub const LABEL_SAVED_FROM: &str = "trueforge.sandbox.saved-from";

/// The engine's list filter (`label=…`) matching every container of ours.
pub fn ours() -> String {
  format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// The filter matching `key=value`.
pub fn filter(key: &str, value: &str) -> String {
  format!("{key}={value}")
}

/// Whether a container's labels mark it as ours (managed by this package).
pub fn managed(labels: Option<&HashMap<String, String>>) -> bool {
  labels
    .and_then(|l| l.get(LABEL_MANAGED_BY))
    .map(String::as_str)
    == Some(MANAGED_BY)
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn every_key_is_under_the_reserved_prefix() {
    for key in [
      LABEL_MANAGED_BY,
      LABEL_NAMESPACE,
      LABEL_ID,
      LABEL_CREATED_AT,
      LABEL_TENANT,
      LABEL_POOL,
      LABEL_GPUS,
      LABEL_PROBE,
      LABEL_IMAGEWORK,
      LABEL_GPU_LOCK,
      LABEL_GPU_LOCK_AT,
      LABEL_SAVED_IMAGE,
      LABEL_CARRIED_VOLUMES,
      LABEL_SAVED_FROM,
      LABEL_EGRESS,
    ] {
      assert!(key.starts_with(LABEL_PREFIX), "{key}");
    }
  }
}
