//! A few long-lived threads for blocking file work, made at start: under a full pids cgroup no
//! new thread could be made, and a slow file system must never stall the protocol thread.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

pub struct Pool {
  tx: mpsc::Sender<Job>,
}

impl Pool {
  pub fn start(threads: usize) -> std::io::Result<Pool> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..threads {
      let rx = rx.clone();
      std::thread::Builder::new()
        .name(format!("files-{i}"))
        .stack_size(256 * 1024)
        .spawn(move || loop {
          let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
          };
          match job {
            Ok(job) => job(),
            Err(_) => return,
          }
        })?;
    }
    Ok(Pool { tx })
  }

  /// Runs `f` on a pool thread.
  pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
      let _ = tx.send(f());
    });
    if self.tx.send(job).is_err() {
      // The threads are gone (they never exit while the agent runs).
      std::process::abort();
    }
    match rx.await {
      Ok(v) => v,
      Err(_) => std::process::abort(),
    }
  }
}
