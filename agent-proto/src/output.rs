//! A command's output as the host keeps it: the head and the tail under a byte cap, with one
//! line saying how many bytes were left out (the same rules as the engine-exec path's
//! `CappedOutput` in the addon, so both paths return identical text).

use std::time::Duration;

/// Keeps the first half of the cap and the last half; counts what falls in between.
#[derive(Debug)]
pub struct CappedOutput {
  head: Vec<u8>,
  head_cap: usize,
  tail: Vec<u8>,
  tail_cap: usize,
  /// Write position in `tail` once it is full (a ring).
  tail_pos: usize,
  omitted: u64,
}

impl CappedOutput {
  /// `cap` is the total number of bytes kept. Memory grows with the output, up to `cap`.
  pub fn new(cap: usize) -> Self {
    let head_cap = cap / 2;
    let tail_cap = cap - head_cap;
    Self {
      head: Vec::new(),
      head_cap,
      tail: Vec::new(),
      tail_cap,
      tail_pos: 0,
      omitted: 0,
    }
  }

  pub fn push(&mut self, mut data: &[u8]) {
    if self.head.len() < self.head_cap {
      let n = data.len().min(self.head_cap - self.head.len());
      self.head.extend_from_slice(&data[..n]);
      data = &data[n..];
    }
    if data.is_empty() || self.tail_cap == 0 {
      self.omitted += data.len() as u64;
      return;
    }
    if data.len() >= self.tail_cap {
      // The chunk alone fills the tail: everything held before is pushed out.
      let cut = data.len() - self.tail_cap;
      self.omitted += (self.tail.len() + cut) as u64;
      self.tail.clear();
      self.tail.extend_from_slice(&data[cut..]);
      self.tail_pos = 0;
      return;
    }
    let room = self.tail_cap - self.tail.len();
    if room > 0 {
      let n = data.len().min(room);
      self.tail.extend_from_slice(&data[..n]);
      data = &data[n..];
    }
    // Ring overwrite of the oldest bytes.
    while !data.is_empty() {
      let n = data.len().min(self.tail_cap - self.tail_pos);
      self.tail[self.tail_pos..self.tail_pos + n].copy_from_slice(&data[..n]);
      self.omitted += n as u64;
      self.tail_pos = (self.tail_pos + n) % self.tail_cap;
      data = &data[n..];
    }
  }

  /// Bytes dropped from the middle.
  pub fn omitted(&self) -> u64 {
    self.omitted
  }

  /// The kept text: non-UTF-8 bytes become U+FFFD; a cut is marked by one line.
  pub fn into_text(self) -> String {
    let mut tail = self.tail;
    tail.rotate_left(self.tail_pos);
    if self.omitted == 0 {
      // Nothing was cut: decode in one piece so a character straddling head and tail survives.
      let mut all = self.head;
      all.extend_from_slice(&tail);
      return String::from_utf8_lossy(&all).into_owned();
    }
    let mut s = String::from_utf8_lossy(&self.head).into_owned();
    if !s.ends_with('\n') {
      s.push('\n');
    }
    s.push_str(&format!(
      "[... {} bytes of output omitted ...]\n",
      self.omitted
    ));
    s.push_str(&String::from_utf8_lossy(&tail));
    s
  }
}

/// Seconds as people write them: `5`, `1.5`.
pub fn format_secs(d: Duration) -> String {
  let s = d.as_secs_f64();
  if s.fract() == 0.0 {
    format!("{}", s as u64)
  } else {
    format!("{s:.1}")
  }
}

/// The text of a command killed by its timeout: its output so far and a line saying so.
pub fn timed_out_text(output: CappedOutput, timeout: Duration) -> String {
  let mut text = output.into_text();
  if !text.is_empty() && !text.ends_with('\n') {
    text.push('\n');
  }
  text.push_str(&format!(
    "[timed out after {} s: the command and every process it started were killed]",
    format_secs(timeout)
  ));
  text
}

#[cfg(test)]
mod tests {
  use super::*;
  use proptest::prelude::*;

  fn text(cap: usize, chunks: &[&[u8]]) -> (String, u64) {
    let mut c = CappedOutput::new(cap);
    for ch in chunks {
      c.push(ch);
    }
    let o = c.omitted();
    (c.into_text(), o)
  }

  #[test]
  fn under_the_cap_is_untouched() {
    assert_eq!(text(10, &[b"abc", b"def"]), ("abcdef".into(), 0));
    assert_eq!(text(10, &[b"0123456789"]), ("0123456789".into(), 0));
  }

  #[test]
  fn over_the_cap_keeps_head_and_tail() {
    let (t, o) = text(10, &[b"01234", b"56789", b"abcdef"]);
    assert_eq!(o, 6);
    assert_eq!(t, "01234\n[... 6 bytes of output omitted ...]\nbcdef");
    let (t, o) = text(10, &[b"0123456789abcdefghij"]);
    assert_eq!(o, 10);
    assert_eq!(t, "01234\n[... 10 bytes of output omitted ...]\nfghij");
    let mut c = CappedOutput::new(8);
    for b in b"abcdefghijklmnopqrstuvwxyz" {
      c.push(&[*b]);
    }
    assert_eq!(c.omitted(), 18);
    assert_eq!(
      c.into_text(),
      "abcd\n[... 18 bytes of output omitted ...]\nwxyz"
    );
  }

  #[test]
  fn invalid_utf8_becomes_replacement() {
    assert_eq!(text(100, &[b"a\xffb"]).0, "a\u{fffd}b");
    // A character split by the cut is replaced, never a panic.
    let (t, _) = text(4, &["ééé".as_bytes()]);
    assert!(t.contains("bytes of output omitted"));
  }

  #[test]
  fn timed_out_results_say_so_on_their_own_line() {
    let mut kept = CappedOutput::new(100);
    kept.push(b"partial");
    assert_eq!(
      timed_out_text(kept, Duration::from_millis(1500)),
      "partial\n[timed out after 1.5 s: the command and every process it started were killed]"
    );
    assert!(
      timed_out_text(CappedOutput::new(10), Duration::from_secs(2))
        .starts_with("[timed out after 2 s")
    );
  }

  proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn keeps_exact_head_and_tail(data in prop::collection::vec(any::<u8>(), 0..3000), cap in 0usize..600, cuts in prop::collection::vec(1usize..200, 1..40)) {
      let mut c = CappedOutput::new(cap);
      let mut rest = &data[..];
      let mut i = 0;
      while !rest.is_empty() {
        let n = cuts[i % cuts.len()].min(rest.len());
        c.push(&rest[..n]);
        rest = &rest[n..];
        i += 1;
      }
      let omitted = c.omitted() as usize;
      prop_assert_eq!(omitted, data.len().saturating_sub(cap));
      let mut tail = c.tail.clone();
      tail.rotate_left(c.tail_pos);
      let head_cap = cap / 2;
      let h = data.len().min(head_cap);
      prop_assert_eq!(&c.head[..], &data[..h]);
      if omitted > 0 {
        prop_assert_eq!(&tail[..], &data[data.len() - (cap - head_cap)..]);
        let text = c.into_text();
        let notice = format!("[... {omitted} bytes of output omitted ...]");
        prop_assert!(text.contains(&notice));
      } else {
        prop_assert_eq!(c.into_text(), String::from_utf8_lossy(&data).into_owned());
      }
    }
  }
}
