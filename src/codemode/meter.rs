//! What a Code Mode request becomes on the host, known before any JavaScript sees it. The text is
//! read once, as it arrives: checked as JSON exactly as `JSON.parse` would, its depth and key
//! lengths bounded, and the memory its values will take in V8's heap estimated from above. The
//! budget holds a request by that estimate (or its bytes, whichever is more), so a request dense
//! in small values cannot make the host hold more than the bound; one over it is refused here.
//!
//! A request whose values take more than `WHOLE_MAX` also gets a plan: the steps by which the
//! JavaScript side builds it in slices (`lib`'s builder), each step small enough to take a few
//! milliseconds, so that no request holds the event loop for long. A step is a run of small
//! sibling values (parsed by `JSON.parse` at once), an object or array opened or closed, a key,
//! or one long string decoded in pieces.

use std::collections::HashMap;

/// Deepest nesting taken. `JSON.stringify` and most code that walks a value recurse.
pub const MAX_DEPTH: usize = 256;
/// Longest object key taken, in bytes as sent.
pub const MAX_KEY_BYTES: usize = 64 * 1024;
/// Requests whose values take at most this much are parsed whole (a few milliseconds).
pub const WHOLE_MAX: u64 = 2 << 20;
/// Most a run of values parsed at once may take.
const RUN_MAX: u64 = 256 << 10;
/// Strings longer than this (bytes as sent) are a step of their own, decoded in pieces of about
/// this size.
const PIECE: u32 = 256 << 10;

// What values take in V8's heap (Node.js 20, x86_64), measured with `JSON.parse` of many of each
// and rounded up; the estimate came out at or above the measured size for every shape tried,
// hostile ones included (empty objects and arrays, deep nesting, unique keys, key orders, wide
// strings, objects of 128 properties and more).
/// A value's slot in its object or array.
const SLOT: u64 = 8;
const OBJECT: u64 = 56;
const ARRAY: u64 = 48;
const NUMBER: u64 = 16;
const STRING: u64 = 24;
/// A property added along a path of keys not seen before: a new hidden class, its descriptors
/// and its transition, besides the key's own string.
const NEW_PROPERTY: u64 = 240;
/// From this many properties on, an object keeps them in a hash table instead of in a shared
/// hidden class, and each property costs about this much.
const DICTIONARY_FROM: u32 = 128;
const DICTIONARY_PROPERTY: u64 = 64;
/// Key paths remembered (objects of one shape share their hidden classes); past this, every
/// property not among them is charged as new.
const SHAPES_MAX: usize = 1 << 16;
const SHAPE_KEY_BYTES_MAX: usize = 1 << 20;

/// Plan steps: the op in the low byte, `ESCAPED` when a string holds escapes.
pub const OP_OBJECT: u32 = 1;
/// `n`: an array of n elements (made that long at once, not grown element by element).
pub const OP_ARRAY: u32 = 2;
pub const OP_END: u32 = 3;
/// `start, end`: a key, quotes included.
pub const OP_KEY: u32 = 4;
/// `start, end`: members or elements of the open object or array, without the brackets.
pub const OP_RUN: u32 = 5;
/// `start, end, n, cut₁…cutₙ`: a string's contents, quotes excluded, cut into n + 1 pieces.
pub const OP_STRING: u32 = 6;
pub const ESCAPED: u32 = 1 << 8;

/// Why a request cannot be held at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
  /// Not JSON (`JSON.parse` would throw).
  Malformed,
  TooDeep,
  KeyTooLong,
}

impl Unfit {
  /// The message for the caller in the sandbox.
  pub fn message(&self) -> String {
    match self {
      Unfit::Malformed => "Malformed Code Mode request".to_string(),
      Unfit::TooDeep => format!(
        "Code Mode request nests deeper than {MAX_DEPTH} levels; send flatter arguments"
      ),
      Unfit::KeyTooLong => format!(
        "Code Mode request has an object key longer than {MAX_KEY_BYTES} bytes; put long text in values, not keys"
      ),
    }
  }
}

/// A request measured whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured {
  /// Bytes its values will take in V8's heap, from above.
  pub heap: u64,
  /// How many values it holds.
  pub values: u64,
  /// The steps to build it in slices, when it is too large to parse whole.
  pub plan: Option<Vec<u32>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
  Value,
  /// After `[`.
  ValueOrClose,
  /// After `{`.
  KeyOrClose,
  /// After `,` in an object.
  Key,
  Colon,
  CommaOrClose,
  /// The request's one value is complete.
  End,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Escape {
  No,
  Backslash,
  Hex(u8),
}

struct Str {
  start: u32,
  key: bool,
  escape: Escape,
  escaped: bool,
  wide: bool,
  cuts: Vec<u32>,
  next_cut: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Num {
  Minus,
  Zero,
  Int,
  Dot,
  Frac,
  E,
  ESign,
  Exp,
}

enum Token {
  None,
  Str(Str),
  Num(Num),
  Lit(&'static [u8], usize),
}

/// Members or elements parsed together.
#[derive(Clone, Copy)]
struct Run {
  start: u32,
  end: u32,
  heap: u64,
}

/// An open object or array.
struct Frame {
  object: bool,
  heap: u64,
  /// Keys so far (an object) or elements (an array).
  members: u32,
  shape: u32,
  /// Where the current member began (its key) or element.
  member_start: u32,
  /// The current member's key: span, whether escaped, and what it cost.
  key: (u32, u32, bool, u64),
  run: Option<Run>,
  ops: Vec<u32>,
  /// Holds a step other than runs: the frame is built in steps itself.
  big: bool,
}

/// Measures one request as its bytes arrive (`push`, then `finish`).
pub struct Meter {
  expect: Expect,
  token: Token,
  stack: Vec<Frame>,
  /// Offset of the next byte.
  at: u32,
  values: u64,
  root: Option<(u64, Option<Vec<u32>>)>,
  shapes: HashMap<(u32, Box<[u8]>), u32>,
  shape_key_bytes: usize,
  key: Vec<u8>,
  failed: Option<Unfit>,
  run_max: u64,
  piece: u32,
  whole_max: u64,
}

impl Default for Meter {
  fn default() -> Self {
    Self {
      expect: Expect::Value,
      token: Token::None,
      stack: Vec::new(),
      at: 0,
      values: 0,
      root: None,
      shapes: HashMap::new(),
      shape_key_bytes: 0,
      key: Vec::new(),
      failed: None,
      run_max: RUN_MAX,
      piece: PIECE,
      whole_max: WHOLE_MAX,
    }
  }
}

/// Measures a whole request at once.
pub fn measure(payload: &[u8]) -> Result<Measured, Unfit> {
  let mut m = Meter::default();
  m.push(payload);
  m.finish()
}

impl Meter {
  /// A meter whose plans have tiny steps (runs of at most `run_max` bytes of values, strings cut
  /// every `piece` bytes, a plan for anything over `whole_max`): for tests of the builders,
  /// which then see every kind of step in small requests.
  pub fn with_steps(run_max: u64, piece: u32, whole_max: u64) -> Self {
    Self {
      run_max,
      piece,
      whole_max,
      ..Self::default()
    }
  }
}

fn is_space(b: u8) -> bool {
  matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn string_heap(raw: u32, wide: bool) -> u64 {
  (STRING + u64::from(raw) * if wide { 2 } else { 1 } + 7) & !7
}

impl Meter {
  /// The next bytes of the request.
  pub fn push(&mut self, chunk: &[u8]) {
    let mut i = 0;
    while i < chunk.len() && self.failed.is_none() {
      i = match self.token {
        Token::Str(_) => self.string_bytes(chunk, i),
        Token::Num(..) => self.number_byte(chunk[i], i),
        Token::Lit(..) => self.literal_byte(chunk[i], i),
        Token::None => self.structural(chunk[i], i),
      };
    }
    self.at += chunk.len() as u32;
  }

  /// The request ended: what it holds, or why it cannot be held.
  pub fn finish(mut self) -> Result<Measured, Unfit> {
    if let Token::Num(state) = self.token {
      if matches!(state, Num::Zero | Num::Int | Num::Frac | Num::Exp) {
        self.token = Token::None;
        self.done(self.at, SLOT + NUMBER, None);
      }
    }
    if let Some(why) = self.failed {
      return Err(why);
    }
    match (self.expect, self.root.take()) {
      (Expect::End, Some((heap, plan))) => Ok(Measured {
        heap,
        values: self.values,
        plan: plan.filter(|_| heap > self.whole_max),
      }),
      _ => Err(Unfit::Malformed),
    }
  }

  fn fail(&mut self, why: Unfit) -> usize {
    self.failed.get_or_insert(why);
    usize::MAX - 1
  }

  /// A byte between tokens.
  fn structural(&mut self, b: u8, i: usize) -> usize {
    if is_space(b) {
      return i + 1;
    }
    let pos = self.at + i as u32;
    match (self.expect, b) {
      (Expect::Value | Expect::ValueOrClose, _) if b != b']' => self.value_start(b, pos),
      (Expect::ValueOrClose | Expect::CommaOrClose, b']') if self.top_is(false) => self.close(pos),
      (Expect::KeyOrClose | Expect::CommaOrClose, b'}') if self.top_is(true) => self.close(pos),
      (Expect::KeyOrClose | Expect::Key, b'"') => self.string_start(pos, true),
      (Expect::Colon, b':') => self.expect = Expect::Value,
      (Expect::CommaOrClose, b',') => {
        let object = self.top_is(true);
        self.expect = if object { Expect::Key } else { Expect::Value };
      }
      _ => return self.fail(Unfit::Malformed),
    }
    i + 1
  }

  fn top_is(&self, object: bool) -> bool {
    self.stack.last().is_some_and(|f| f.object == object)
  }

  fn value_start(&mut self, b: u8, pos: u32) {
    if let Some(top) = self.stack.last_mut() {
      if !top.object {
        top.member_start = pos;
      }
    }
    match b {
      b'{' | b'[' => self.open(b == b'{', pos),
      b'"' => self.string_start(pos, false),
      b'-' => self.token = Token::Num(Num::Minus),
      b'0' => self.token = Token::Num(Num::Zero),
      b'1'..=b'9' => self.token = Token::Num(Num::Int),
      b't' => self.token = Token::Lit(b"true", 1),
      b'f' => self.token = Token::Lit(b"false", 1),
      b'n' => self.token = Token::Lit(b"null", 1),
      _ => {
        self.fail(Unfit::Malformed);
      }
    }
  }

  fn open(&mut self, object: bool, pos: u32) {
    if self.stack.len() >= MAX_DEPTH {
      self.fail(Unfit::TooDeep);
      return;
    }
    self.stack.push(Frame {
      object,
      heap: SLOT + if object { OBJECT } else { ARRAY },
      members: 0,
      shape: 0,
      member_start: pos,
      key: (0, 0, false, 0),
      run: None,
      ops: Vec::new(),
      big: false,
    });
    self.expect = if object {
      Expect::KeyOrClose
    } else {
      Expect::ValueOrClose
    };
  }

  fn close(&mut self, pos: u32) {
    let mut f = self.stack.pop().expect("a frame is open");
    let end = pos + 1;
    if !f.big && f.heap <= self.run_max {
      self.done(end, f.heap, None);
      return;
    }
    flush(&mut f);
    let mut ops = Vec::with_capacity(f.ops.len() + 3);
    match f.object {
      true => ops.push(OP_OBJECT),
      false => ops.extend([OP_ARRAY, f.members]),
    }
    ops.append(&mut f.ops);
    ops.push(OP_END);
    self.done(end, f.heap, Some(ops));
  }

  /// A value is complete: `ops` when it is built in steps of its own.
  fn done(&mut self, end: u32, heap: u64, ops: Option<Vec<u32>>) {
    self.values += 1;
    let Some(f) = self.stack.last_mut() else {
      self.root = Some((heap, ops));
      self.expect = Expect::End;
      return;
    };
    self.expect = Expect::CommaOrClose;
    if !f.object {
      f.members += 1;
    }
    let (key_start, key_end, key_escaped, key_heap) = f.key;
    let heap = heap + if f.object { key_heap } else { 0 };
    f.heap += heap;
    match ops {
      None => match &mut f.run {
        Some(r) if r.heap + heap <= self.run_max => {
          r.end = end;
          r.heap += heap;
        }
        _ => {
          flush(f);
          f.run = Some(Run {
            start: f.member_start,
            end,
            heap,
          });
        }
      },
      Some(mut ops) => {
        flush(f);
        f.big = true;
        if f.object {
          let flags = if key_escaped { ESCAPED } else { 0 };
          f.ops.extend([OP_KEY | flags, key_start, key_end]);
        }
        f.ops.append(&mut ops);
      }
    }
  }

  fn string_start(&mut self, pos: u32, key: bool) {
    self.key.clear();
    self.token = Token::Str(Str {
      start: pos,
      key,
      escape: Escape::No,
      escaped: false,
      wide: false,
      cuts: Vec::new(),
      next_cut: pos + 1 + self.piece,
    });
  }

  /// Bytes inside a string, from `i`; returns where the string's bytes in `chunk` end.
  fn string_bytes(&mut self, chunk: &[u8], mut i: usize) -> usize {
    let (at, piece) = (self.at, self.piece);
    let Token::Str(s) = &mut self.token else {
      unreachable!("in a string")
    };
    while i < chunk.len() {
      let b = chunk[i];
      let pos = at + i as u32;
      match s.escape {
        Escape::No => {
          if pos >= s.next_cut && !s.key && b != b'"' && !(0x80..0xC0).contains(&b) {
            s.cuts.push(pos);
            s.next_cut = pos + piece;
          }
          match b {
            b'"' => return self.string_end(pos, i),
            b'\\' => {
              s.escape = Escape::Backslash;
              s.escaped = true;
            }
            0..=0x1f => return self.fail(Unfit::Malformed),
            0x80.. => s.wide = true,
            _ => {}
          }
        }
        Escape::Backslash => match b {
          b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => s.escape = Escape::No,
          b'u' => {
            s.wide = true;
            s.escape = Escape::Hex(4);
          }
          _ => return self.fail(Unfit::Malformed),
        },
        Escape::Hex(n) => {
          if !b.is_ascii_hexdigit() {
            return self.fail(Unfit::Malformed);
          }
          s.escape = if n == 1 {
            Escape::No
          } else {
            Escape::Hex(n - 1)
          };
        }
      }
      if s.key {
        if self.key.len() >= MAX_KEY_BYTES {
          return self.fail(Unfit::KeyTooLong);
        }
        self.key.push(b);
      }
      i += 1;
    }
    i
  }

  fn string_end(&mut self, pos: u32, i: usize) -> usize {
    let Token::Str(s) = std::mem::replace(&mut self.token, Token::None) else {
      unreachable!("in a string")
    };
    let raw = pos - s.start - 1;
    let heap = string_heap(raw, s.wide);
    if s.key {
      self.key_done(s.start, pos + 1, s.escaped, heap);
      return i + 1;
    }
    let plan = (raw > self.piece).then(|| {
      let flags = if s.escaped { ESCAPED } else { 0 };
      let mut ops = vec![OP_STRING | flags, s.start + 1, pos, s.cuts.len() as u32];
      ops.extend(&s.cuts);
      ops
    });
    self.done(pos + 1, SLOT + heap, plan);
    i + 1
  }

  /// A member's key: what it adds to its object, by whether objects before took that path.
  fn key_done(&mut self, start: u32, end: u32, escaped: bool, key_heap: u64) {
    let f = self.stack.last_mut().expect("keys are inside objects");
    f.member_start = start;
    f.members += 1;
    let mut heap = match f.members {
      n if n == DICTIONARY_FROM => u64::from(n) * DICTIONARY_PROPERTY,
      n if n > DICTIONARY_FROM => DICTIONARY_PROPERTY,
      _ => 0,
    };
    let path = (f.shape, std::mem::take(&mut self.key).into_boxed_slice());
    match self.shapes.get(&path) {
      Some(&next) => f.shape = next,
      None => {
        heap += NEW_PROPERTY + key_heap;
        let next = self.shapes.len() as u32 + 1;
        f.shape = next;
        if self.shapes.len() < SHAPES_MAX && self.shape_key_bytes < SHAPE_KEY_BYTES_MAX {
          self.shape_key_bytes += path.1.len();
          self.shapes.insert(path, next);
        } else {
          // Not remembered: a path that no later object can share.
          f.shape = u32::MAX;
        }
      }
    }
    f.key = (start, end, escaped, heap);
    self.expect = Expect::Colon;
  }

  fn number_byte(&mut self, b: u8, i: usize) -> usize {
    let Token::Num(state) = self.token else {
      unreachable!("in a number")
    };
    let next = match (state, b) {
      (Num::Minus, b'0') => Some(Num::Zero),
      (Num::Minus, b'1'..=b'9') | (Num::Int, b'0'..=b'9') => Some(Num::Int),
      (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
      (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
      (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::E),
      (Num::E, b'+' | b'-') => Some(Num::ESign),
      (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Some(Num::Exp),
      _ => None,
    };
    if let Some(n) = next {
      self.token = Token::Num(n);
      return i + 1;
    }
    if !matches!(state, Num::Zero | Num::Int | Num::Frac | Num::Exp) {
      return self.fail(Unfit::Malformed);
    }
    self.token = Token::None;
    self.done(self.at + i as u32, SLOT + NUMBER, None);
    // The byte that ended the number is read again between tokens.
    i
  }

  fn literal_byte(&mut self, b: u8, i: usize) -> usize {
    let Token::Lit(word, n) = self.token else {
      unreachable!("in a literal")
    };
    if word[n] != b {
      return self.fail(Unfit::Malformed);
    }
    if n + 1 < word.len() {
      self.token = Token::Lit(word, n + 1);
    } else {
      self.token = Token::None;
      self.done(self.at + i as u32 + 1, SLOT, None);
    }
    i + 1
  }
}

/// Ends the frame's current run as a step.
fn flush(f: &mut Frame) {
  if let Some(r) = f.run.take() {
    f.ops.extend([OP_RUN, r.start, r.end]);
  }
}

#[cfg(test)]
mod tests;
