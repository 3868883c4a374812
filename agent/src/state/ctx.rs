//! What every request handler shares.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use crate::base::conn::Conn;
use crate::base::pool::Pool;
use crate::base::sys::{Creds, Identity};
use crate::base::users::{User, Users};
use crate::state::activity::Activity;
use crate::state::held::{Egress, Relays};
use crate::state::watch::Watcher;

pub struct Ctx {
  pub conn: Rc<Conn>,
  /// The agent's own identity (root, normally).
  pub me: Identity,
  /// Whether the agent may change its supplementary groups (CAP_SETGID kept).
  pub can_set_groups: bool,
  pub users: Users,
  /// The container's environment as inherited (image ENV + container Env), less the agent's
  /// own variables and an engine-supplied HOME; commands start from it.
  pub base_env: Vec<(Vec<u8>, Vec<u8>)>,
  pub pool: Pool,
  pub activity: Activity,
  /// Commands running now.
  pub running: Cell<u32>,
  /// Running commands' shepherds, reaped children and the last recovery (`exec::recover`).
  pub procs: crate::state::procs::Pressure,
  pub started: Instant,
  pub relays: Relays,
  /// The egress port and its connections.
  pub egress: Egress,
  /// Whether downloads move file pages pipe to pipe (`TRUEFORGE_AGENT_NO_SPLICE=1` copies them
  /// instead, so tests cover the path taken where a file system takes no splice).
  pub splice: bool,
  /// Writes to files being downloaded (`TRUEFORGE_AGENT_NO_INOTIFY=1`: none watched, so tests
  /// cover the path taken where inotify is not to be had).
  pub watcher: Watcher,
}

impl Ctx {
  /// The ids a request for `user` runs with. A container started without CAP_SETGID cannot
  /// change supplementary groups: acting as its own uid and gid, the agent then keeps the groups
  /// it has rather than fail every request.
  pub fn creds_of(&self, user: &User) -> Creds {
    let mut c = user.creds();
    if !self.can_set_groups && c.uid == self.me.uid && c.gid == self.me.gid {
      c.groups = self.me.groups.clone();
    }
    c
  }
}
