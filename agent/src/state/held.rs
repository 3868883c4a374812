//! What the agent holds open between requests, apart from the requests themselves: Code Mode's
//! relay sockets and the egress listener. The request handlers (`codemode`, `egress`) fill them;
//! the server's context keeps them, and closes them when the agent exits.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use trueforge_agent_proto::msg::{EgressListenSpec, MAX_CODE_MODE_CALLS};

use crate::base::sys::{self, Creds, Identity};

/// The relays by socket path.
pub struct Relays {
  pub open: RefCell<HashMap<String, Relay>>,
  pub calls: Semaphore,
}

pub struct Relay {
  pub task: tokio::task::JoinHandle<()>,
  pub creds: Creds,
}

impl Relays {
  pub fn new() -> Relays {
    Relays {
      open: RefCell::new(HashMap::new()),
      calls: Semaphore::new(MAX_CODE_MODE_CALLS),
    }
  }

  /// Stops every relay and removes its socket (the agent is exiting).
  pub fn close_all(&self, me: &Identity) {
    let all: Vec<(String, Relay)> = self.open.borrow_mut().drain().collect();
    for (path, relay) in all {
      relay.task.abort();
      remove_socket(me, &path, &relay.creds);
    }
  }
}

pub fn remove_socket(me: &Identity, path: &str, creds: &Creds) {
  if let Ok(p) = CString::new(path) {
    // As the user: a socket in the user's directory is the user's to remove.
    let _ = sys::as_user(me, creds, || unsafe { libc::unlink(p.as_ptr()) });
  }
}

/// The egress listener and the connections it carries.
#[derive(Default)]
pub struct Egress {
  pub listening: RefCell<Option<Listening>>,
  /// Connections carried now.
  pub in_flight: Cell<u32>,
  /// Connections reset unopened because `max_connections` were in flight.
  pub turned_away: Cell<u64>,
}

impl Egress {
  pub fn turned_away(&self) -> u64 {
    self.turned_away.get()
  }
}

pub struct Listening {
  pub spec: EgressListenSpec,
  /// The listening sockets (127.0.0.1, and ::1 where there is one), each with its accept task.
  pub listeners: Vec<(Rc<TcpListener>, JoinHandle<()>)>,
}

impl Drop for Listening {
  fn drop(&mut self) {
    for (l, task) in &self.listeners {
      // Stops listening now, not when the aborted task is next polled: a client connecting
      // after the answer must be refused.
      unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
      task.abort();
    }
  }
}
