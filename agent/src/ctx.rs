//! What every request handler shares.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use crate::activity::Activity;
use crate::codemode::Relays;
use crate::conn::Conn;
use crate::pool::Pool;
use crate::sys::Identity;
use crate::users::Users;

pub struct Ctx {
  pub conn: Rc<Conn>,
  /// The agent's own identity (root, normally).
  pub me: Identity,
  pub users: Users,
  /// The container's environment as inherited (image ENV + container Env), less the agent's
  /// own variables and an engine-supplied HOME; commands start from it.
  pub base_env: Vec<(Vec<u8>, Vec<u8>)>,
  pub pool: Pool,
  pub activity: Activity,
  /// Commands running now.
  pub running: Cell<u32>,
  pub started: Instant,
  pub relays: Relays,
}
