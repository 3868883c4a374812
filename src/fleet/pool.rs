//! The warm pool: ready sandboxes (started, layout made) kept per provider configuration and
//! shared by every provider instance in the process. A member is named `<final name>-pool`, so
//! no id resolves to it (it is nobody's session) until it is claimed by renaming it to the name
//! its id derives from. The engine serialises renames of one container, so when two processes
//! race for a member exactly one rename succeeds.

use std::collections::HashMap;
use std::sync::Mutex;

use bollard::models::{ContainerSummary, ContainerSummaryStateEnum};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::ProviderConfig;
use crate::engine::Engine;
use crate::sandbox::container::{self, Role, Scope, Target};
use crate::util::errors::Result;
use crate::util::labels;
use crate::util::labels::LABEL_POOL;
use crate::util::logging::Logger;

/// A stable fingerprint of everything that shapes a sandbox: members are only handed to a
/// provider whose configuration would have created the same container.
pub fn fingerprint(cfg: &ProviderConfig, image: &str) -> String {
  let body =
    crate::sandbox::body::container_body(cfg, "/workspace/00000000000000000000000000", image, None);
  let mut h = Sha256::new();
  let host = body.host_config.clone().unwrap_or_default();
  h.update(format!("{:?}", host).as_bytes());
  h.update(
    format!(
      "{:?}{:?}{:?}{:?}",
      body.env, body.user, body.volumes, body.entrypoint
    )
    .as_bytes(),
  );
  let mut labels: Vec<_> = cfg.labels.iter().collect();
  labels.sort();
  h.update(format!("{labels:?}{:?}{}{}", cfg.tenant, cfg.namespace, image).as_bytes());
  h.finalize()
    .iter()
    .take(8)
    .map(|b| format!("{b:02x}"))
    .collect()
}

/// Per-engine state (kept per engine: `EngineShared::state`), by configuration fingerprint.
#[derive(Default)]
pub struct State {
  /// What a member is (its owner, user and the agent's facts), learnt when this process made
  /// one, so a claim needs no inspect.
  owners: Mutex<HashMap<String, Target>>,
  /// Refills in flight; `true` means "asked again meanwhile".
  refilling: Mutex<HashMap<String, bool>>,
}

impl State {
  /// Refills in flight.
  pub fn refills(&self) -> usize {
    self.refilling.lock().expect("refilling").len()
  }
}

fn list_filters(scope: &Scope, fp: &str) -> HashMap<String, Vec<String>> {
  HashMap::from([(
    "label".to_string(),
    vec![
      labels::ours(),
      labels::filter(labels::LABEL_NAMESPACE, &scope.namespace),
      labels::filter(LABEL_POOL, fp),
    ],
  )])
}

/// A container's id and sandbox id when it is an unclaimed member of ours for `scope` (its name,
/// labels and tenant all say so).
fn member(c: &ContainerSummary, scope: &Scope) -> Option<(String, String)> {
  let name = c.names.as_ref()?.first()?;
  let o = container::owned(name, c.labels.as_ref(), Some(&scope.namespace))?;
  let tenant = c.labels.as_ref()?.get(labels::LABEL_TENANT);
  (o.role == Role::PoolMember && tenant == scope.tenant.as_ref())
    .then(|| (c.id.clone(), o.sandbox_id))
    .and_then(|(id, s)| Some((id?, s)))
}

/// Takes one running member, if any. Returns the claimed sandbox.
pub async fn claim(engine: &Engine, scope: &Scope, fp: &str) -> Result<Option<Target>> {
  let mut filters = list_filters(scope, fp);
  filters.insert("status".to_string(), vec!["running".to_string()]);
  let list = engine
    .list_containers("list pool members", false, false, filters)
    .await?;
  for c in list {
    let Some((id, sandbox_id)) = member(&c, scope) else {
      continue;
    };
    let Ok(final_name) = container::name_for(&scope.namespace, &sandbox_id) else {
      continue;
    };
    // Not retried: a second attempt could "win" a member the first already took.
    if engine
      .rename_container("claim a pool member", &id, &final_name)
      .await
      .is_err()
    {
      continue;
    }
    let owner = engine
      .shared
      .state::<State>()
      .owners
      .lock()
      .expect("owners")
      .get(fp)
      .cloned();
    let target = match owner {
      // Members of one configuration differ only in their names and ids.
      Some(made) => Target {
        sandbox_id: sandbox_id.clone(),
        name: final_name,
        container_id: id,
        tenant: scope.tenant.clone(),
        ..made
      },
      None => container::resolve(engine, scope, &sandbox_id).await?,
    };
    container::remember(engine, &target);
    return Ok(Some(target));
  }
  Ok(None)
}

/// How long a refill waits after a claim before it starts creating.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(750);

/// Tops the pool up to `cfg.warm_pool_size` running members in the background (one refill per
/// configuration at a time). Stopped members are removed: they are nobody's session. A stop of
/// the engine's background work ends it after the create in progress, if any.
pub fn refill(engine: &Engine, cfg: &ProviderConfig, image: &str, fp: &str, log: &Logger) {
  let key = fp.to_string();
  {
    let state = engine.shared.state::<State>();
    let mut r = state.refilling.lock().expect("refilling");
    if let Some(again) = r.get_mut(&key) {
      // One is running: it makes another pass when it is done, so claims made meanwhile are
      // replaced too.
      *again = true;
      return;
    }
    r.insert(key.clone(), false);
  }
  let (task_engine, cfg, image, fp, log) = (
    engine.clone(),
    cfg.clone(),
    image.to_string(),
    fp.to_string(),
    log.clone(),
  );
  engine.shared.background.spawn(|stop| async move {
    let engine = task_engine;
    // Ended early by a stop, the task must still let the next refill start.
    let mut entry = RefillEntry(&engine, &key, true);
    // Let the caller's first command run before the refill's creates compete with it for the
    // engine and the CPU.
    tokio::select! {
      _ = tokio::time::sleep(REFILL_DELAY) => {}
      _ = stop.cancelled() => return,
    }
    loop {
      let pass = async {
        let scope = Scope::of(&cfg);
        let list = engine
          .list_containers("list pool members", true, false, list_filters(&scope, &fp))
          .await?;
        let mut running = 0usize;
        for c in list {
          if member(&c, &scope).is_none() {
            continue;
          }
          match c.state {
            Some(ContainerSummaryStateEnum::RUNNING) => running += 1,
            // Stopped members are nobody's session: remove them (not forced: one started
            // meanwhile stays). A member still being made (by this or another process) is left
            // alone.
            Some(ContainerSummaryStateEnum::EXITED | ContainerSummaryStateEnum::DEAD) => {
              if let Some(id) = c.id {
                let _ = engine
                  .remove_stopped("remove a stopped pool member", &id)
                  .await;
              }
            }
            _ => {}
          }
        }
        for _ in running..cfg.warm_pool_size as usize {
          // Checked between creates, never inside one: a create dropped halfway could leave
          // a member nobody finishes or removes. So a stop waits for at most one create,
          // which its engine deadlines bound.
          if stop.is_cancelled() {
            break;
          }
          let t = crate::sandbox::create::create(&engine, &cfg, &image, Some(&fp), &log).await?;
          engine
            .shared
            .state::<State>()
            .owners
            .lock()
            .expect("owners")
            .insert(fp.clone(), t);
        }
        Ok::<_, crate::util::errors::SandboxError>(())
      };
      if let Err(e) = pass.await {
        log.warn("warm pool refill failed", json!({ "error": e.to_string() }));
      }
      let state = engine.shared.state::<State>();
      let mut r = state.refilling.lock().expect("refilling");
      if r.get(&key) == Some(&true) && !stop.is_cancelled() {
        r.insert(key.clone(), false);
        continue;
      }
      r.remove(&key);
      entry.2 = false;
      break;
    }
  });
}

/// A refill's entry, removed on drop while still armed (its task was cancelled).
struct RefillEntry<'a>(&'a Engine, &'a str, bool);

impl Drop for RefillEntry<'_> {
  fn drop(&mut self) {
    if !self.2 {
      return;
    }
    self
      .0
      .shared
      .state::<State>()
      .refilling
      .lock()
      .expect("refilling")
      .remove(self.1);
  }
}
