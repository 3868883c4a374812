//! What counts as ours: a container whose labels say so and whose name its id and namespace
//! derive, as the sandbox itself, an unclaimed warm-pool member, or a container a GPU move set
//! aside.

use std::collections::HashMap;

use crate::util::ids;
use crate::util::labels;

/// Suffix of the new container's name in a GPU move, until it takes the sandbox's name.
pub const MOVING_SUFFIX: &str = ".gpu-move";

/// Suffix of the old container's name in a GPU move, between the renames.
pub const MOVED_SUFFIX: &str = ".gpu-moved";

/// What a container of ours is, told by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
  /// The sandbox's container, under the name its id derives from.
  Sandbox,
  /// An unclaimed warm-pool member (`<name>-pool`).
  PoolMember,
  /// Left under `<name>.gpu-move` or `<name>.gpu-moved` by a GPU move; it shares its volumes
  /// with the sandbox's current container.
  SetAside,
}

/// A container that is ours: its labels say so (managed-by, namespace, a well-formed id) *and*
/// its name is one its id and namespace derive. Forged labels, or a container made from a
/// commit of a sandbox (it inherits the labels, not the name), are not ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
  pub namespace: String,
  pub sandbox_id: String,
  /// The container's name, without the engine's leading `/`.
  pub name: String,
  pub role: Role,
}

/// `Some` when the container named `name` (with or without the engine's `/`) carrying
/// `labels` is ours, in `namespace` when one is given.
pub fn owned(
  name: &str,
  labels: Option<&HashMap<String, String>>,
  namespace: Option<&str>,
) -> Option<Owned> {
  let labels = labels?;
  if !labels::managed(Some(labels)) {
    return None;
  }
  let ns = labels.get(labels::LABEL_NAMESPACE)?;
  if namespace.is_some_and(|n| n != ns) {
    return None;
  }
  let sandbox_id = labels.get(labels::LABEL_ID)?;
  let derived = ids::container_name(ns, ids::parse_sandbox_id(sandbox_id)?);
  let name = name.trim_start_matches('/');
  let role = match name.strip_prefix(derived.as_str())? {
    "" => Role::Sandbox,
    "-pool" if labels.contains_key(labels::LABEL_POOL) => Role::PoolMember,
    s if s == MOVED_SUFFIX || s == MOVING_SUFFIX => Role::SetAside,
    _ => return None,
  };
  Some(Owned {
    namespace: ns.clone(),
    sandbox_id: sandbox_id.clone(),
    name: name.to_string(),
    role,
  })
}
