//! Maps kept per container or per image for the life of the process, bounded so that a
//! long-lived server never grows them without end.

use std::collections::HashMap;
use std::hash::Hash;

/// Past this many entries a map starts over: an entry lost costs one lookup or one start again.
pub const MAX_ENTRIES: usize = 4096;

/// Inserts `k`, first clearing the map when it is full and `k` is new.
pub fn bounded_insert<K: Eq + Hash, V>(map: &mut HashMap<K, V>, k: K, v: V) {
  if map.len() >= MAX_ENTRIES && !map.contains_key(&k) {
    map.clear();
  }
  map.insert(k, v);
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn maps_stay_bounded() {
    let mut m = HashMap::new();
    for i in 0..(MAX_ENTRIES * 2) {
      bounded_insert(&mut m, i, ());
    }
    assert!(m.len() <= MAX_ENTRIES);
    bounded_insert(&mut m, 0, ());
    assert!(m.contains_key(&0));
  }
}
