//! Exec output handling: a byte cap that keeps the head and the tail, a scanner that finds the
//! wrapper's per-call markers in the stream without ever buffering more than a marker, and a
//! reader that drives both over an exec's attached output frames.

use std::time::Instant;

use bollard::container::LogOutput;
use futures_util::{Stream, StreamExt};

/// The head-and-tail cap, shared with the agent's client so that both paths return identical
/// text.
pub use trueforge_agent_proto::output::CappedOutput;

/// What the scanner found.
#[derive(Debug, PartialEq, Eq)]
pub enum Marker {
  /// The wrapper's pid inside the container (it leads the command's process group).
  Pid(u32),
  /// The command's exit status.
  Exit(i32),
}

/// Splits a byte stream into payload and markers `\x1eTFX<token>:<kind>:<value>\x1e`.
pub struct MarkerScanner {
  prefix: Vec<u8>,
  pending: Vec<u8>,
}

const MARK: u8 = 0x1e;
const MAX_MARKER_VALUE: usize = 24;

impl MarkerScanner {
  pub fn new(token: &str) -> Self {
    let mut prefix = vec![MARK];
    prefix.extend_from_slice(b"TFX");
    prefix.extend_from_slice(token.as_bytes());
    prefix.push(b':');
    Self {
      prefix,
      pending: Vec::new(),
    }
  }

  /// Feeds a chunk; calls `out` with payload bytes and returns markers in order. Bytes that may
  /// begin a marker are held until the next chunk decides.
  pub fn feed(&mut self, chunk: &[u8], out: &mut dyn FnMut(&[u8]), markers: &mut Vec<Marker>) {
    self.pending.extend_from_slice(chunk);
    let buf = std::mem::take(&mut self.pending);
    let mut start = 0;
    let mut i = 0;
    while i < buf.len() {
      if buf[i] != MARK {
        i += 1;
        continue;
      }
      let rest = &buf[i..];
      let cmp = rest.len().min(self.prefix.len());
      if rest[..cmp] != self.prefix[..cmp] {
        i += 1;
        continue;
      }
      if rest.len() < self.prefix.len() {
        break; // maybe a marker: wait for more
      }
      let body = &rest[self.prefix.len()..];
      match body.iter().position(|&b| b == MARK) {
        Some(end) => {
          if let Some(m) = parse_marker(&body[..end]) {
            out(&buf[start..i]);
            markers.push(m);
            i += self.prefix.len() + end + 1;
            start = i;
          } else {
            i += 1;
          }
        }
        None if body.len() <= MAX_MARKER_VALUE => break,
        None => i += 1,
      }
    }
    if i < buf.len() {
      out(&buf[start..i]);
      self.pending = buf[i..].to_vec();
    } else {
      out(&buf[start..]);
    }
  }

  /// Bytes still held at the end of the stream (they were not a marker after all).
  pub fn finish(&mut self, out: &mut dyn FnMut(&[u8])) {
    let rest = std::mem::take(&mut self.pending);
    out(&rest);
  }
}

/// Which marker a read waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
  /// The wrapper's pid: the command has started and can be killed by its group.
  Pid,
  /// The exit status: the command is over, whatever still holds its output open.
  Exit,
}

/// Why a read stopped.
#[derive(Debug)]
pub enum ReadEnd<E> {
  /// The marker waited for is known.
  Marker,
  /// The output ended first.
  Ended,
  /// The deadline passed first.
  Deadline,
  /// Reading the output failed.
  Failed(E),
}

/// What the reads of one exec found, once the output is no longer read.
#[derive(Debug)]
pub struct ReadResult {
  pub pid: Option<u32>,
  pub exit: Option<i32>,
  pub output: CappedOutput,
}

/// Reads an exec's output frames, keeping the payload under the cap and the wrapper's markers.
/// Every frame kind carrying output counts the same: a TTY exec sends `Console` frames, others
/// `StdOut` and `StdErr`, and the markers may be split across any of them.
pub struct MarkerReader {
  scanner: MarkerScanner,
  kept: CappedOutput,
  pid: Option<u32>,
  exit: Option<i32>,
  /// The stream ended or failed: polling it again is not allowed for every stream.
  closed: bool,
}

impl MarkerReader {
  /// `token` is the call's marker token; `cap` the total output bytes kept.
  pub fn new(token: &str, cap: usize) -> Self {
    Self {
      scanner: MarkerScanner::new(token),
      kept: CappedOutput::new(cap),
      pid: None,
      exit: None,
      closed: false,
    }
  }

  pub fn pid(&self) -> Option<u32> {
    self.pid
  }

  pub fn exit(&self) -> Option<i32> {
    self.exit
  }

  /// Reads until the marker `until` is known, the stream ends or fails, or `deadline` passes.
  /// It may be called again on the same stream (with another goal or a later deadline).
  pub async fn read_until<S, E>(
    &mut self,
    output: &mut S,
    until: Until,
    deadline: Instant,
  ) -> ReadEnd<E>
  where
    S: Stream<Item = std::result::Result<LogOutput, E>> + Unpin,
  {
    loop {
      if self.reached(until) {
        return ReadEnd::Marker;
      }
      if self.closed {
        return ReadEnd::Ended;
      }
      // Frames already waiting are still taken once the deadline has passed (the inner future
      // is polled first), so an exit marker that arrived in time is never lost to it.
      match tokio::time::timeout_at(deadline.into(), output.next()).await {
        Err(_) => return ReadEnd::Deadline,
        Ok(None) => {
          self.closed = true;
          return ReadEnd::Ended;
        }
        Ok(Some(Err(e))) => {
          self.closed = true;
          return ReadEnd::Failed(e);
        }
        Ok(Some(Ok(frame))) => self.feed(frame),
      }
    }
  }

  fn reached(&self, until: Until) -> bool {
    match until {
      Until::Pid => self.pid.is_some(),
      Until::Exit => self.exit.is_some(),
    }
  }

  fn feed(&mut self, frame: LogOutput) {
    let bytes = match frame {
      LogOutput::StdOut { message }
      | LogOutput::StdErr { message }
      | LogOutput::Console { message } => message,
      LogOutput::StdIn { .. } => return,
    };
    let mut markers = Vec::new();
    let kept = &mut self.kept;
    self
      .scanner
      .feed(&bytes, &mut |b| kept.push(b), &mut markers);
    for m in markers {
      match m {
        // The wrapper prints its pid before the command runs, so the first one is its own.
        Marker::Pid(p) => self.pid = self.pid.or(Some(p)),
        Marker::Exit(c) => self.exit = Some(c),
      }
    }
  }

  /// Stops reading. Bytes held back as a possible marker are output after all, unless the exit
  /// marker came: the wrapper prints nothing after it.
  pub fn finish(mut self) -> ReadResult {
    if self.exit.is_none() {
      let kept = &mut self.kept;
      self.scanner.finish(&mut |b| kept.push(b));
    }
    ReadResult {
      pid: self.pid,
      exit: self.exit,
      output: self.kept,
    }
  }
}

fn parse_marker(body: &[u8]) -> Option<Marker> {
  let s = std::str::from_utf8(body).ok()?;
  let (kind, value) = s.split_once(':')?;
  match kind {
    "p" => value.parse().ok().map(Marker::Pid),
    "x" => value.parse().ok().map(Marker::Exit),
    _ => None,
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn scan(token: &str, chunks: &[&[u8]]) -> (Vec<u8>, Vec<Marker>) {
    let mut s = MarkerScanner::new(token);
    let mut out = Vec::new();
    let mut marks = Vec::new();
    for ch in chunks {
      s.feed(ch, &mut |b| out.extend_from_slice(b), &mut marks);
    }
    s.finish(&mut |b| out.extend_from_slice(b));
    (out, marks)
  }

  #[test]
  fn markers_are_found_across_any_split() {
    let stream = b"\x1eTFXab12:p:42\x1ehello\x1e world\x1eTFXab12:x:3\x1etrailing";
    for split in 0..stream.len() {
      let (a, b) = stream.split_at(split);
      let (out, marks) = scan("ab12", &[a, b]);
      assert_eq!(
        marks,
        vec![Marker::Pid(42), Marker::Exit(3)],
        "split at {split}"
      );
      assert_eq!(out, b"hello\x1e worldtrailing", "split at {split}");
    }
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    let (out, marks) = scan("ab12", &bytes);
    assert_eq!(marks.len(), 2);
    assert_eq!(out, b"hello\x1e worldtrailing");
  }

  #[test]
  fn other_tokens_and_lookalikes_are_payload() {
    let (out, marks) = scan(
      "ab12",
      &[b"\x1eTFXzz99:x:1\x1e\x1eTFXab12:q:1\x1e\x1eTFXab12:x:"],
    );
    assert!(marks.is_empty());
    assert_eq!(out, b"\x1eTFXzz99:x:1\x1e\x1eTFXab12:q:1\x1e\x1eTFXab12:x:");
  }

  type Frame = Result<LogOutput, String>;

  fn out(b: &[u8]) -> Result<LogOutput, String> {
    Ok(LogOutput::StdOut {
      message: bytes::Bytes::copy_from_slice(b),
    })
  }

  fn err(b: &[u8]) -> Result<LogOutput, String> {
    Ok(LogOutput::StdErr {
      message: bytes::Bytes::copy_from_slice(b),
    })
  }

  fn console(b: &[u8]) -> Result<LogOutput, String> {
    Ok(LogOutput::Console {
      message: bytes::Bytes::copy_from_slice(b),
    })
  }

  fn soon() -> Instant {
    Instant::now() + std::time::Duration::from_secs(5)
  }

  /// A stream that yields `frames` and then stays open, as an exec whose background process
  /// still holds the output.
  fn held_open(
    frames: Vec<Result<LogOutput, String>>,
  ) -> impl Stream<Item = Result<LogOutput, String>> + Unpin {
    futures_util::stream::iter(frames).chain(futures_util::stream::pending())
  }

  #[tokio::test]
  async fn reader_finds_markers_split_across_frames_of_any_kind() {
    let stream = b"\x1eTFXab12:p:42\x1ehello\n\x1eTFXab12:x:7\x1e";
    let kinds: [fn(&[u8]) -> Frame; 3] = [out, err, console];
    for split in 1..stream.len() {
      for (i, first) in kinds.iter().enumerate() {
        let second = kinds[(i + 1) % 3];
        let (a, b) = stream.split_at(split);
        let mut frames = held_open(vec![first(a), second(b)]);
        let mut r = MarkerReader::new("ab12", 1000);
        let end = r.read_until(&mut frames, Until::Exit, soon()).await;
        assert!(matches!(end, ReadEnd::Marker), "split at {split}");
        let res = r.finish();
        assert_eq!((res.pid, res.exit), (Some(42), Some(7)), "split at {split}");
        assert_eq!(res.output.into_text(), "hello\n", "split at {split}");
      }
    }
  }

  #[tokio::test]
  async fn reader_takes_markers_from_console_frames() {
    // A TTY exec sends everything as console frames.
    let mut frames = held_open(vec![
      console(b"\x1eTFXab12:p:9\x1e"),
      console(b"tty output\r\n\x1eTFXab12:x:0\x1e"),
    ]);
    let mut r = MarkerReader::new("ab12", 1000);
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, soon()).await,
      ReadEnd::Marker
    ));
    let res = r.finish();
    assert_eq!((res.pid, res.exit), (Some(9), Some(0)));
    assert_eq!(res.output.into_text(), "tty output\r\n");
  }

  #[tokio::test]
  async fn reader_stops_at_the_marker_it_waits_for() {
    let mut frames = held_open(vec![
      out(b"\x1eTFXab12:p:5\x1e"),
      out(b"a"),
      Ok(LogOutput::StdIn {
        message: bytes::Bytes::from_static(b"never output"),
      }),
      out(b"\x1eTFXab12:x:3\x1e"),
      out(b"from a background process"),
    ]);
    let mut r = MarkerReader::new("ab12", 1000);
    assert!(matches!(
      r.read_until(&mut frames, Until::Pid, soon()).await,
      ReadEnd::Marker
    ));
    assert_eq!((r.pid(), r.exit()), (Some(5), None));
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, soon()).await,
      ReadEnd::Marker
    ));
    // A goal already reached reads nothing more.
    assert!(matches!(
      r.read_until(&mut frames, Until::Pid, soon()).await,
      ReadEnd::Marker
    ));
    let res = r.finish();
    assert_eq!(res.exit, Some(3));
    assert_eq!(res.output.into_text(), "a");
    // Output after the exit marker is left unread.
    assert!(frames.next().await.is_some());
  }

  #[tokio::test]
  async fn reader_keeps_head_and_tail_of_output_over_the_cap() {
    let mut frames = vec![out(b"\x1eTFXab12:p:1\x1e")];
    for i in 0..100u8 {
      frames.push(err(&[b'a' + i % 26; 10]));
    }
    frames.push(console(b"the end\x1eTFXab12:x:0\x1e"));
    let mut frames = held_open(frames);
    let mut r = MarkerReader::new("ab12", 20);
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, soon()).await,
      ReadEnd::Marker
    ));
    let res = r.finish();
    assert_eq!(res.exit, Some(0));
    assert_eq!(res.output.omitted(), 1007 - 20);
    assert_eq!(
      res.output.into_text(),
      "aaaaaaaaaa\n[... 987 bytes of output omitted ...]\nvvvthe end"
    );
  }

  #[tokio::test]
  async fn reader_reports_a_stream_that_ends_without_the_marker() {
    let mut frames = futures_util::stream::iter(vec![
      out(b"\x1eTFXab12:p:8\x1epartial"),
      // Held back as a possible marker until the end shows it was not one.
      out(b"\x1eTFXab12:x:"),
    ]);
    let mut r = MarkerReader::new("ab12", 1000);
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, soon()).await,
      ReadEnd::Ended
    ));
    // An ended stream is not polled again.
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, soon()).await,
      ReadEnd::Ended
    ));
    let res = r.finish();
    assert_eq!((res.pid, res.exit), (Some(8), None));
    assert_eq!(res.output.into_text(), "partial\x1eTFXab12:x:");

    let mut frames = futures_util::stream::iter(vec![out(b"cannot fork")]);
    let mut r = MarkerReader::new("ab12", 1000);
    assert!(matches!(
      r.read_until(&mut frames, Until::Pid, soon()).await,
      ReadEnd::Ended
    ));
    assert_eq!(r.finish().pid, None);
  }

  #[tokio::test]
  async fn reader_reports_a_failed_stream() {
    let mut frames = futures_util::stream::iter(vec![
      out(b"\x1eTFXab12:p:8\x1e"),
      out(b"x"),
      Err("connection reset".to_string()),
    ]);
    let mut r = MarkerReader::new("ab12", 1000);
    match r.read_until(&mut frames, Until::Exit, soon()).await {
      ReadEnd::Failed(e) => assert_eq!(e, "connection reset"),
      other => panic!("{other:?}"),
    }
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, soon()).await,
      ReadEnd::Ended
    ));
    assert_eq!(r.finish().output.into_text(), "x");
  }

  #[tokio::test]
  async fn reader_stops_at_the_deadline() {
    let mut frames = held_open(vec![out(b"\x1eTFXab12:p:8\x1estill running")]);
    let mut r = MarkerReader::new("ab12", 1000);
    let started = Instant::now();
    let deadline = started + std::time::Duration::from_millis(100);
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, deadline).await,
      ReadEnd::Deadline
    ));
    assert!(started.elapsed() >= std::time::Duration::from_millis(100));
    assert_eq!((r.pid(), r.exit()), (Some(8), None));
    assert_eq!(r.finish().output.into_text(), "still running");
  }

  #[tokio::test]
  async fn frames_waiting_at_the_deadline_are_still_read() {
    let mut frames = held_open(vec![
      out(b"\x1eTFXab12:p:8\x1e"),
      out(b"\x1eTFXab12:x:0\x1e"),
    ]);
    let mut r = MarkerReader::new("ab12", 1000);
    let past = Instant::now() - std::time::Duration::from_millis(1);
    assert!(matches!(
      r.read_until(&mut frames, Until::Exit, past).await,
      ReadEnd::Marker
    ));
    assert_eq!(r.exit(), Some(0));
  }
}
