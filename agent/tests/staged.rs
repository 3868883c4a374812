//! Staged uploads through the real agent, the test playing the engine (it writes the staged file
//! as root where the agent's `Head` says): checked, given to the user and moved into place;
//! declined where staging would not be safe or could not work, and (that write only) when what
//! arrived is not what the host put or went elsewhere; nothing left behind on any path.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::*;
use trueforge_agent_proto::client::{StagedUpload, Staging};
use trueforge_agent_proto::msg::StagedUploadSpec;

const NOBODY_UID: u32 = 65534;

/// A root-owned directory (0755) with the staging directory's path in it and a `work` directory
/// anyone may write.
fn place() -> (TempDir, String) {
  let t = TempDir::new("staged");
  std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o755)).unwrap();
  std::fs::create_dir(t.0.join("work")).unwrap();
  std::fs::set_permissions(t.0.join("work"), std::fs::Permissions::from_mode(0o777)).unwrap();
  let staging = t.path("stage");
  (t, staging)
}

fn spec(path: &str, size: usize, staging: &str) -> StagedUploadSpec {
  StagedUploadSpec {
    path: path.into(),
    user: Some("nobody".into()),
    mode: 0o644,
    parents: true,
    size: size as u64,
    staging: Some(staging.into()),
  }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
  (0..n)
    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
    .collect()
}

fn entries(dir: &str) -> Vec<String> {
  let mut v: Vec<String> = std::fs::read_dir(dir)
    .map(|r| {
      r.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
    })
    .unwrap_or_default();
  v.sort();
  v
}

async fn ready(a: &Agent, s: StagedUploadSpec) -> StagedUpload {
  match a.client.upload_staged(s).await.expect("staged") {
    Staging::Ready(s) => s,
    Staging::Declined(why) => panic!("declined: {why}"),
  }
}

async fn declined(a: &Agent, s: StagedUploadSpec) -> String {
  match a.client.upload_staged(s).await.expect("staged") {
    Staging::Ready(s) => panic!("staged at {:?}", s.head),
    Staging::Declined(why) => why,
  }
}

fn put(s: &StagedUpload, bytes: &[u8]) {
  std::fs::write(format!("{}/{}", s.head.dir, s.head.name), bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_arrived_is_checked_given_to_the_user_and_put_in_place() {
  let a = start().await;
  let (t, staging) = place();
  let target = t.path("work/new/dir/f.bin");
  for (round, n) in [(1u8, 3 << 20), (2, (3 << 20) + 5), (3, 100)] {
    let bytes = data(n, round);
    let s = ready(&a, spec(&target, n, &staging)).await;
    // A directory of its own per write, named as the file in it.
    assert_eq!(s.head.dir, format!("{staging}/{}", s.head.name));
    let (pid, hex) = s.head.name.split_once('.').expect("pid.hex");
    assert_eq!(pid, a.pid.to_string());
    assert!(hex.len() == 32 && hex.bytes().all(|c| c.is_ascii_hexdigit()));
    let st = std::fs::metadata(&staging).unwrap();
    assert_eq!((st.uid(), st.mode() & 0o7777), (0, 0o700));
    put(&s, &bytes);
    let done = s.commit().await.unwrap().expect("placed");
    assert_eq!(done.size, n as u64);
    // The second round replaces the first (swapped), the third a large file by a small one.
    assert_eq!(std::fs::read(&target).unwrap(), bytes, "round {round}");
    let md = std::fs::metadata(&target).unwrap();
    assert_eq!(
      (md.uid(), md.mode() & 0o7777, md.nlink()),
      (NOBODY_UID, 0o644, 1)
    );
    assert_eq!(entries(&staging), Vec::<String>::new());
    assert_eq!(entries(&t.path("work/new/dir")), vec!["f.bin".to_string()]);
  }
  let made = std::fs::metadata(t.path("work/new")).unwrap();
  assert_eq!(made.uid(), NOBODY_UID, "missing parents are the user's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declined_where_staging_is_not_safe_or_would_copy() {
  let a = start().await;
  let (t, _) = place();
  let target = t.path("work/f.bin");
  // A parent others may write: they could swap the staging directory for a link.
  std::fs::create_dir(t.0.join("open")).unwrap();
  std::fs::set_permissions(t.0.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
  let why = declined(&a, spec(&target, 10, &t.path("open/stage"))).await;
  assert!(why.contains("may be written by others"), "{why}");
  // A link, a FIFO, a directory others may enter where the staging directory should be.
  std::os::unix::fs::symlink(t.path("work"), t.0.join("link")).unwrap();
  assert!(declined(&a, spec(&target, 10, &t.path("link")))
    .await
    .contains("not a directory"));
  let fifo = std::ffi::CString::new(t.path("fifo")).unwrap();
  assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
  assert!(declined(&a, spec(&target, 10, &t.path("fifo")))
    .await
    .contains("not a directory"));
  std::fs::create_dir(t.0.join("wide")).unwrap();
  std::fs::set_permissions(t.0.join("wide"), std::fs::Permissions::from_mode(0o755)).unwrap();
  assert!(declined(&a, spec(&target, 10, &t.path("wide")))
    .await
    .contains("entered by others"));
  assert!(declined(&a, spec(&target, 10, "relative/stage"))
    .await
    .contains("not a usable"));
  // A target on another file system: the staged file would have to be copied.
  let shm = std::path::Path::new("/dev/shm");
  if shm.is_dir() && std::fs::metadata(shm).unwrap().dev() != std::fs::metadata(&t.0).unwrap().dev()
  {
    let (t2, staging) = place();
    let elsewhere = format!("/dev/shm/tf-staged-{}.bin", std::process::id());
    let why = declined(&a, spec(&elsewhere, 10, &staging)).await;
    assert!(why.contains("another file system"), "{why}");
    assert!(!std::path::Path::new(&elsewhere).exists());
    drop(t2);
  }
  assert_eq!(
    entries(&t.path("work")),
    Vec::<String>::new(),
    "no temporary file left"
  );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_the_agent_cannot_see_are_declined_and_after_two_so_is_every_later_one() {
  // What a runtime with a root file system of its own (gVisor) does: the engine reports the
  // write, the file is not there. Once could be a root workload's doing; twice with none ever
  // placed, the runtime cannot stage.
  let a = start().await;
  let (t, staging) = place();
  let target = t.path("work/f.bin");
  for _ in 0..2 {
    let s = ready(&a, spec(&target, 10, &staging)).await;
    assert_eq!(s.commit().await.unwrap(), None);
  }
  let why = declined(&a, spec(&target, 10, &staging)).await;
  assert!(why.contains("does not appear"), "{why}");
  assert_eq!(entries(&t.path("work")), Vec::<String>::new());
  // The stream still works.
  a.client
    .upload_bytes(
      trueforge_agent_proto::msg::UploadSpec {
        path: target.clone(),
        user: Some("nobody".into()),
        mode: 0o644,
        max_bytes: None,
        parents: true,
      },
      bytes::Bytes::from_static(b"by stream"),
    )
    .await
    .unwrap();
  assert_eq!(std::fs::read(&target).unwrap(), b"by stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_not_put_by_the_host_is_declined_and_removed() {
  // Declined, that write only: the host then sends the bytes on the stream.
  let a = start().await;
  let (t, staging) = place();
  let target = t.path("work/f.bin");
  std::fs::write(&target, b"before").unwrap();
  // The wrong size.
  let s = ready(&a, spec(&target, 10, &staging)).await;
  put(&s, b"short");
  assert_eq!(s.commit().await.unwrap(), None);
  // A link instead of a file, a second link to it.
  let s = ready(&a, spec(&target, 6, &staging)).await;
  std::os::unix::fs::symlink(&target, format!("{}/{}", s.head.dir, s.head.name)).unwrap();
  assert_eq!(s.commit().await.unwrap(), None);
  let s = ready(&a, spec(&target, 6, &staging)).await;
  std::fs::write(t.path("other"), b"linked").unwrap();
  std::fs::hard_link(t.path("other"), format!("{}/{}", s.head.dir, s.head.name)).unwrap();
  assert_eq!(s.commit().await.unwrap(), None);
  assert_eq!(std::fs::read(&target).unwrap(), b"before");
  assert_eq!(std::fs::read(t.path("other")).unwrap(), b"linked");
  assert_eq!(entries(&staging), Vec::<String>::new());
  assert_eq!(entries(&t.path("work")), vec!["f.bin".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_uploads_and_what_gone_agents_left_are_removed() {
  let a = start().await;
  let (t, staging) = place();
  let target = t.path("work/f.bin");
  let s = ready(&a, spec(&target, 4, &staging)).await;
  put(&s, b"data");
  drop(s);
  for _ in 0..100 {
    if entries(&staging).is_empty() && entries(&t.path("work")).is_empty() {
      break;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
  }
  assert_eq!(entries(&staging), Vec::<String>::new());
  assert_eq!(entries(&t.path("work")), Vec::<String>::new());
  // Left by an agent that is gone, by this one after its upload ended, by one that is alive.
  let own = format!("{}.abandoned", a.pid);
  for name in ["999999999.gone", own.as_str(), "1.alive"] {
    std::fs::write(format!("{staging}/{name}"), b"x").unwrap();
  }
  // A write's own directory, with what the engine put in it, of an agent that is gone.
  std::fs::create_dir(format!("{staging}/999999998.gone")).unwrap();
  std::fs::write(format!("{staging}/999999998.gone/999999998.gone"), b"x").unwrap();
  let s = ready(&a, spec(&target, 4, &staging)).await;
  let mut left = entries(&staging);
  left.retain(|n| n != &s.head.name);
  assert_eq!(left, vec!["1.alive".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_directory_swapped_for_a_link_fails_that_write_only() {
  // A root workload swaps the staging directory for a link between the agent's open and the
  // engine's write: the engine follows it. That write is declined (the stream carries it);
  // staging goes on for the next ones, whether the directory is back by then or not.
  let a = start().await;
  let (t, staging) = place();
  let target = t.path("work/f.bin");
  std::fs::create_dir(t.path("elsewhere")).unwrap();
  let aside = t.path("stage.aside");
  for back_in_place in [false, true, false, true] {
    let s = ready(&a, spec(&target, 4, &staging)).await;
    std::fs::rename(&staging, &aside).unwrap();
    std::os::unix::fs::symlink(t.path("elsewhere"), &staging).unwrap();
    // The engine follows the link, and finds no directory of that write's there.
    assert!(std::fs::write(format!("{}/{}", s.head.dir, s.head.name), b"lost").is_err());
    if back_in_place {
      std::fs::remove_file(&staging).unwrap();
      std::fs::rename(&aside, &staging).unwrap();
    }
    assert_eq!(s.commit().await.unwrap(), None, "back: {back_in_place}");
    if !back_in_place {
      std::fs::remove_file(&staging).unwrap();
      std::fs::rename(&aside, &staging).unwrap();
    }
    // The next staged write is placed.
    let s = ready(&a, spec(&target, 6, &staging)).await;
    put(&s, b"staged");
    assert!(s.commit().await.unwrap().is_some(), "back: {back_in_place}");
    assert_eq!(std::fs::read(&target).unwrap(), b"staged");
    std::fs::remove_file(&target).unwrap();
  }
  assert_eq!(entries(&staging), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_miss_after_a_write_was_placed_never_gives_staging_up() {
  let a = start().await;
  let (t, staging) = place();
  let target = t.path("work/f.bin");
  let s = ready(&a, spec(&target, 2, &staging)).await;
  put(&s, b"ok");
  assert!(s.commit().await.unwrap().is_some());
  // Missing, with the directory in place, again and again (a root workload removing it).
  for _ in 0..3 {
    let s = ready(&a, spec(&target, 4, &staging)).await;
    assert_eq!(s.commit().await.unwrap(), None);
  }
  let s = ready(&a, spec(&target, 6, &staging)).await;
  put(&s, b"staged");
  assert!(s.commit().await.unwrap().is_some());
  assert_eq!(std::fs::read(&target).unwrap(), b"staged");
}
