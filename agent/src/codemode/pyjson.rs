//! JSON the way Python's `json` module reads and writes it, so the static `mcp-client` prints
//! byte for byte what the Python client prints: objects keep their key order (a repeated key
//! keeps its first place and its last value), integers keep every digit, floats print as
//! Python's `repr`, output uses `", "` and `": "` and escapes everything outside printable
//! ASCII; `NaN` and `Infinity` are accepted and written. Also Python's `str()` of a value, for
//! error messages.

/// A value as Python's `json.loads` returns it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
  Null,
  Bool(bool),
  /// The digits, as written (Python keeps every one), without a leading `-0`.
  Int(String),
  Float(f64),
  Str(String),
  List(Vec<Value>),
  Dict(Vec<(String, Value)>),
}

impl Value {
  /// `dict.get(key)`; `None` for a missing key or a non-dict.
  pub fn get(&self, key: &str) -> Option<&Value> {
    match self {
      Value::Dict(items) => items.iter().find(|(k, _)| k == key).map(|(_, v)| v),
      _ => None,
    }
  }

  pub fn as_str(&self) -> Option<&str> {
    match self {
      Value::Str(s) => Some(s),
      _ => None,
    }
  }

  /// Python's truth value.
  pub fn truthy(&self) -> bool {
    match self {
      Value::Null => false,
      Value::Bool(b) => *b,
      Value::Int(s) => s.bytes().any(|b| b.is_ascii_digit() && b != b'0'),
      Value::Float(f) => *f != 0.0,
      Value::Str(s) => !s.is_empty(),
      Value::List(v) => !v.is_empty(),
      Value::Dict(v) => !v.is_empty(),
    }
  }

  /// Python's `len()` of a container or string (`None` for others).
  pub fn len(&self) -> Option<usize> {
    match self {
      Value::Str(s) => Some(s.chars().count()),
      Value::List(v) => Some(v.len()),
      Value::Dict(v) => Some(v.len()),
      _ => None,
    }
  }
}

/// `json.loads`' error, in its words: "Expecting value: line 1 column 1 (char 0)".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
  fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    f.write_str(&self.0)
  }
}

/// `json.loads(text)`.
pub fn loads(text: &str) -> Result<Value, ParseError> {
  let mut p = Parser {
    s: text.as_bytes(),
    text,
    i: 0,
  };
  p.ws();
  let v = p.value()?;
  p.ws();
  if p.i != p.s.len() {
    return Err(p.err("Extra data", p.i));
  }
  Ok(v)
}

struct Parser<'a> {
  s: &'a [u8],
  text: &'a str,
  i: usize,
}

impl Parser<'_> {
  fn err(&self, msg: &str, at: usize) -> ParseError {
    // Python counts characters, not bytes.
    let before = &self.text[..at.min(self.text.len())];
    let line = before.matches('\n').count() + 1;
    let col = match before.rfind('\n') {
      Some(nl) => before[nl + 1..].chars().count() + 1,
      None => before.chars().count() + 1,
    };
    ParseError(format!(
      "{msg}: line {line} column {col} (char {})",
      before.chars().count()
    ))
  }

  fn ws(&mut self) {
    while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
      self.i += 1;
    }
  }

  fn value(&mut self) -> Result<Value, ParseError> {
    let start = self.i;
    match self.s.get(self.i) {
      Some(b'{') => self.object(),
      Some(b'[') => self.array(),
      Some(b'"') => Ok(Value::Str(self.string()?)),
      Some(b'n') if self.s[self.i..].starts_with(b"null") => {
        self.i += 4;
        Ok(Value::Null)
      }
      Some(b't') if self.s[self.i..].starts_with(b"true") => {
        self.i += 4;
        Ok(Value::Bool(true))
      }
      Some(b'f') if self.s[self.i..].starts_with(b"false") => {
        self.i += 5;
        Ok(Value::Bool(false))
      }
      Some(b'N') if self.s[self.i..].starts_with(b"NaN") => {
        self.i += 3;
        Ok(Value::Float(f64::NAN))
      }
      Some(b'I') if self.s[self.i..].starts_with(b"Infinity") => {
        self.i += 8;
        Ok(Value::Float(f64::INFINITY))
      }
      Some(b'-') if self.s[self.i..].starts_with(b"-Infinity") => {
        self.i += 9;
        Ok(Value::Float(f64::NEG_INFINITY))
      }
      Some(b'-' | b'0'..=b'9') => self
        .number()
        .ok_or_else(|| self.err("Expecting value", start)),
      _ => Err(self.err("Expecting value", start)),
    }
  }

  fn number(&mut self) -> Option<Value> {
    let start = self.i;
    if self.s.get(self.i) == Some(&b'-') {
      self.i += 1;
    }
    let int_start = self.i;
    match self.s.get(self.i) {
      Some(b'0') => self.i += 1,
      Some(b'1'..=b'9') => {
        while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
          self.i += 1;
        }
      }
      _ => {
        self.i = start;
        return None;
      }
    }
    let int_end = self.i;
    let mut float = false;
    if self.s.get(self.i) == Some(&b'.') && self.s.get(self.i + 1).is_some_and(u8::is_ascii_digit) {
      self.i += 1;
      while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
        self.i += 1;
      }
      float = true;
    }
    if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
      let save = self.i;
      self.i += 1;
      if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
        self.i += 1;
      }
      if self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
          self.i += 1;
        }
        float = true;
      } else {
        self.i = save;
      }
    }
    let text = &self.text[start..self.i];
    if float {
      return text.parse::<f64>().ok().map(Value::Float);
    }
    let digits = &self.text[int_start..int_end];
    let negative = start != int_start && digits != "0";
    Some(Value::Int(if negative {
      format!("-{digits}")
    } else {
      digits.to_string()
    }))
  }

  fn string(&mut self) -> Result<String, ParseError> {
    let start = self.i;
    self.i += 1;
    let mut out = String::new();
    loop {
      let Some(&b) = self.s.get(self.i) else {
        return Err(self.err("Unterminated string starting at", start));
      };
      match b {
        b'"' => {
          self.i += 1;
          return Ok(out);
        }
        b'\\' => {
          let esc = self.i;
          self.i += 1;
          let c = match self.s.get(self.i) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
              let hi = self.hex4(esc)?;
              if (0xd800..0xdc00).contains(&hi) && self.s[self.i + 1..].starts_with(b"\\u") {
                let save = self.i;
                self.i += 2;
                let lo = self.hex4(esc)?;
                if (0xdc00..0xe000).contains(&lo) {
                  let c = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
                  out.push(char::from_u32(c).unwrap_or('\u{fffd}'));
                  self.i += 1;
                  continue;
                }
                self.i = save;
              }
              // A lone surrogate has no UTF-8 form.
              char::from_u32(hi).unwrap_or('\u{fffd}')
            }
            _ => return Err(self.err("Invalid \\escape", esc)),
          };
          out.push(c);
          self.i += 1;
        }
        0..=0x1f => return Err(self.err("Invalid control character at", self.i)),
        _ => {
          // Copy a run of plain bytes (the input is valid UTF-8).
          let run = self.i;
          while self
            .s
            .get(self.i)
            .is_some_and(|&c| c != b'"' && c != b'\\' && c >= 0x20)
          {
            self.i += 1;
          }
          out.push_str(&self.text[run..self.i]);
        }
      }
    }
  }

  /// The 4 hex digits after `\u` (leaves `i` on the last one).
  fn hex4(&mut self, esc: usize) -> Result<u32, ParseError> {
    let digits = self.s.get(self.i + 1..self.i + 5);
    let v = digits
      .filter(|d| d.iter().all(u8::is_ascii_hexdigit))
      .and_then(|d| u32::from_str_radix(std::str::from_utf8(d).ok()?, 16).ok());
    match v {
      Some(v) => {
        self.i += 4;
        Ok(v)
      }
      None => Err(self.err("Invalid \\uXXXX escape", esc)),
    }
  }

  fn object(&mut self) -> Result<Value, ParseError> {
    self.i += 1;
    let mut items: Vec<(String, Value)> = Vec::new();
    self.ws();
    if self.s.get(self.i) == Some(&b'}') {
      self.i += 1;
      return Ok(Value::Dict(items));
    }
    loop {
      if self.s.get(self.i) != Some(&b'"') {
        return Err(self.err("Expecting property name enclosed in double quotes", self.i));
      }
      let key = self.string()?;
      self.ws();
      if self.s.get(self.i) != Some(&b':') {
        return Err(self.err("Expecting ':' delimiter", self.i));
      }
      self.i += 1;
      self.ws();
      let v = self.value()?;
      match items.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = v,
        None => items.push((key, v)),
      }
      self.ws();
      match self.s.get(self.i) {
        Some(b',') => {
          self.i += 1;
          self.ws();
        }
        Some(b'}') => {
          self.i += 1;
          return Ok(Value::Dict(items));
        }
        _ => return Err(self.err("Expecting ',' delimiter", self.i)),
      }
    }
  }

  fn array(&mut self) -> Result<Value, ParseError> {
    self.i += 1;
    let mut items = Vec::new();
    self.ws();
    if self.s.get(self.i) == Some(&b']') {
      self.i += 1;
      return Ok(Value::List(items));
    }
    loop {
      items.push(self.value()?);
      self.ws();
      match self.s.get(self.i) {
        Some(b',') => {
          self.i += 1;
          self.ws();
        }
        Some(b']') => {
          self.i += 1;
          return Ok(Value::List(items));
        }
        _ => return Err(self.err("Expecting ',' delimiter", self.i)),
      }
    }
  }
}

/// `json.dumps(value)`.
pub fn dumps(v: &Value) -> String {
  let mut out = String::new();
  write_value(&mut out, v);
  out
}

fn write_value(out: &mut String, v: &Value) {
  match v {
    Value::Null => out.push_str("null"),
    Value::Bool(true) => out.push_str("true"),
    Value::Bool(false) => out.push_str("false"),
    Value::Int(s) => out.push_str(s),
    Value::Float(f) => out.push_str(&float_json(*f)),
    Value::Str(s) => write_str(out, s),
    Value::List(items) => {
      out.push('[');
      for (i, item) in items.iter().enumerate() {
        if i > 0 {
          out.push_str(", ");
        }
        write_value(out, item);
      }
      out.push(']');
    }
    Value::Dict(items) => {
      out.push('{');
      for (i, (k, item)) in items.iter().enumerate() {
        if i > 0 {
          out.push_str(", ");
        }
        write_str(out, k);
        out.push_str(": ");
        write_value(out, item);
      }
      out.push('}');
    }
  }
}

fn write_str(out: &mut String, s: &str) {
  out.push('"');
  for c in s.chars() {
    match c {
      '"' => out.push_str("\\\""),
      '\\' => out.push_str("\\\\"),
      '\n' => out.push_str("\\n"),
      '\r' => out.push_str("\\r"),
      '\t' => out.push_str("\\t"),
      '\u{8}' => out.push_str("\\b"),
      '\u{c}' => out.push_str("\\f"),
      ' '..='~' => out.push(c),
      _ => {
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
          out.push_str(&format!("\\u{u:04x}"));
        }
      }
    }
  }
  out.push('"');
}

fn float_json(f: f64) -> String {
  if f.is_nan() {
    "NaN".into()
  } else if f.is_infinite() {
    if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
  } else {
    float_repr(f)
  }
}

/// Python's `repr(float)`: the shortest digits that read back the same, positional between
/// 1e-4 and 1e16, else `1.5e+16` style.
pub fn float_repr(f: f64) -> String {
  if f.is_nan() {
    return "nan".into();
  }
  if f.is_infinite() {
    return if f > 0.0 { "inf" } else { "-inf" }.into();
  }
  // Rust's shortest round-trip digits, as d.ddde±x.
  let e = format!("{:e}", f.abs());
  let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
  let exp: i32 = exp.parse().unwrap_or(0);
  let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
  let sign = if f.is_sign_negative() { "-" } else { "" };
  if f == 0.0 {
    return format!("{sign}0.0");
  }
  let decpt = exp + 1;
  if -4 < decpt && decpt <= 16 {
    let body = if decpt <= 0 {
      format!("0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt as usize >= digits.len() {
      format!("{digits}{}.0", "0".repeat(decpt as usize - digits.len()))
    } else {
      format!(
        "{}.{}",
        &digits[..decpt as usize],
        &digits[decpt as usize..]
      )
    };
    return format!("{sign}{body}");
  }
  let mantissa = if digits.len() > 1 {
    format!("{}.{}", &digits[..1], &digits[1..])
  } else {
    digits.clone()
  };
  let x = decpt - 1;
  format!(
    "{sign}{mantissa}e{}{:02}",
    if x < 0 { '-' } else { '+' },
    x.abs()
  )
}

/// Python's `str(value)` (a string is itself; anything else its `repr`).
pub fn py_str(v: &Value) -> String {
  match v {
    Value::Str(s) => s.clone(),
    other => py_repr(other),
  }
}

/// Python's `repr(value)`.
pub fn py_repr(v: &Value) -> String {
  match v {
    Value::Null => "None".into(),
    Value::Bool(true) => "True".into(),
    Value::Bool(false) => "False".into(),
    Value::Int(s) => s.clone(),
    Value::Float(f) => float_repr(*f),
    Value::Str(s) => str_repr(s),
    Value::List(items) => format!(
      "[{}]",
      items.iter().map(py_repr).collect::<Vec<_>>().join(", ")
    ),
    Value::Dict(items) => format!(
      "{{{}}}",
      items
        .iter()
        .map(|(k, v)| format!("{}: {}", str_repr(k), py_repr(v)))
        .collect::<Vec<_>>()
        .join(", ")
    ),
  }
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote.
fn str_repr(s: &str) -> String {
  let quote = if s.contains('\'') && !s.contains('"') {
    '"'
  } else {
    '\''
  };
  let mut out = String::new();
  out.push(quote);
  for c in s.chars() {
    match c {
      '\\' => out.push_str("\\\\"),
      '\n' => out.push_str("\\n"),
      '\r' => out.push_str("\\r"),
      '\t' => out.push_str("\\t"),
      c if c == quote => {
        out.push('\\');
        out.push(c);
      }
      c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
        out.push_str(&format!("\\x{:02x}", c as u32))
      }
      c => out.push(c),
    }
  }
  out.push(quote);
  out
}

/// Python's `"%g" % x`.
pub fn format_g(x: f64) -> String {
  if x.is_nan() {
    return "nan".into();
  }
  if x.is_infinite() {
    return if x > 0.0 { "inf" } else { "-inf" }.into();
  }
  if x == 0.0 {
    return if x.is_sign_negative() { "-0" } else { "0" }.into();
  }
  // Six significant digits, then the shorter of the two notations, trailing zeros removed.
  let e = format!("{:.5e}", x);
  let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
  let exp: i32 = exp.parse().unwrap_or(0);
  if (-4..6).contains(&exp) {
    let decimals = (5 - exp).max(0) as usize;
    let s = format!("{:.*}", decimals, x);
    let s = if s.contains('.') {
      s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
      s
    };
    return s;
  }
  let mant = if mant.contains('.') {
    mant.trim_end_matches('0').trim_end_matches('.')
  } else {
    mant
  };
  format!("{mant}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

#[cfg(test)]
mod tests {
  use super::*;

  fn round(s: &str) -> String {
    dumps(&loads(s).unwrap())
  }

  #[test]
  fn dumps_like_python() {
    assert_eq!(
      round(r#"{"b":1,"a":[true,false,null],"c":{"x":"y"}}"#),
      r#"{"b": 1, "a": [true, false, null], "c": {"x": "y"}}"#
    );
    assert_eq!(round(r#"{"a":1,"b":2,"a":3}"#), r#"{"a": 3, "b": 2}"#);
    assert_eq!(
      round(r#""é\u00e9😀\u0001\u007f\n\/""#),
      r#""\u00e9\u00e9\ud83d\ude00\u0001\u007f\n/""#
    );
    assert_eq!(
      round("123456789012345678901234567890"),
      "123456789012345678901234567890"
    );
    assert_eq!(round("-0"), "0");
    assert_eq!(
      round("[1.0, 1e16, 1e15, 0.0001, 0.00001, -2.5e-7, 1E400, NaN, -Infinity]"),
      "[1.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, -2.5e-07, Infinity, NaN, -Infinity]"
    );
    assert_eq!(round("0.1"), "0.1");
    assert_eq!(round("123.456"), "123.456");
    assert_eq!(round("-0.0"), "-0.0");
    assert_eq!(round("1.5e300"), "1.5e+300");
  }

  #[test]
  fn errors_read_like_python() {
    assert_eq!(
      loads("").unwrap_err().0,
      "Expecting value: line 1 column 1 (char 0)"
    );
    assert_eq!(
      loads("{\"a\" 1}").unwrap_err().0,
      "Expecting ':' delimiter: line 1 column 6 (char 5)"
    );
    assert_eq!(
      loads("[1 2]").unwrap_err().0,
      "Expecting ',' delimiter: line 1 column 4 (char 3)"
    );
    assert_eq!(
      loads("{1:2}").unwrap_err().0,
      "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    );
    assert_eq!(
      loads("1 2").unwrap_err().0,
      "Extra data: line 1 column 3 (char 2)"
    );
    assert_eq!(
      loads("\"abc").unwrap_err().0,
      "Unterminated string starting at: line 1 column 1 (char 0)"
    );
    assert_eq!(
      loads("\n\"é\\x\"").unwrap_err().0,
      "Invalid \\escape: line 2 column 3 (char 3)"
    );
  }

  #[test]
  fn str_and_repr_like_python() {
    let v = loads(r#"{"a": [1, "it's", null, true, 2.5], "b": "x\ny"}"#).unwrap();
    assert_eq!(
      py_str(&v),
      r#"{'a': [1, "it's", None, True, 2.5], 'b': 'x\ny'}"#
    );
    assert_eq!(py_str(&Value::Str("plain".into())), "plain");
  }

  #[test]
  fn percent_g_like_python() {
    for (x, s) in [
      (300.0, "300"),
      (1.5, "1.5"),
      (0.1, "0.1"),
      (1e-7, "1e-07"),
      (1234567.0, "1.23457e+06"),
      (123456.0, "123456"),
      (0.0001, "0.0001"),
      (0.00001234, "1.234e-05"),
      (1e100, "1e+100"),
    ] {
      assert_eq!(format_g(x), s, "{x}");
    }
  }
}
