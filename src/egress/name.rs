//! Host names as rules and requests spell them: one grammar for both, so that a rule and the
//! name a client asks for are compared in the same normal form.

/// Why a string is not a host name; `detail` is `None` where the generic message says it all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NotAName {
  pub detail: Option<String>,
}

fn bad(detail: Option<&str>) -> NotAName {
  NotAName {
    detail: detail.map(str::to_string),
  }
}

/// The name in normal form: lowercase, without a trailing dot. ASCII letters, digits, `-`, `_`
/// and `.`; labels of 1 to 63 characters, at most 253 in all.
pub(super) fn normalize(s: &str) -> Result<String, NotAName> {
  if !s.is_ascii() {
    return Err(bad(Some(
      "it is not ASCII: write an internationalized name in its punycode form (xn--…)",
    )));
  }
  let s = s.strip_suffix('.').unwrap_or(s);
  if s.is_empty() {
    return Err(bad(Some("it is empty")));
  }
  if !s
    .bytes()
    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
  {
    return Err(bad(None));
  }
  if s.len() > 253 {
    return Err(bad(Some("a name has at most 253 characters")));
  }
  if s.split('.').any(str::is_empty) {
    return Err(bad(Some("it has an empty label")));
  }
  if s.split('.').any(|l| l.len() > 63) {
    return Err(bad(Some("a label has at most 63 characters")));
  }
  if looks_numeric(s) {
    // The system resolver reads forms like `2130706433` or `0x7f.1` as IPv4 addresses; taken
    // as names they would let an address through a name rule.
    return Err(bad(Some(
      "it looks like an IPv4 address but is not one in dotted-decimal form",
    )));
  }
  Ok(s.to_ascii_lowercase())
}

/// Whether every label is a decimal or `0x` hexadecimal number, the forms inet_aton takes.
fn looks_numeric(s: &str) -> bool {
  s.split('.').all(|l| {
    let hex = l.strip_prefix("0x").or_else(|| l.strip_prefix("0X"));
    match hex {
      Some(h) => h.bytes().all(|b| b.is_ascii_hexdigit()),
      None => l.bytes().all(|b| b.is_ascii_digit()),
    }
  })
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn names_are_lowercased_and_lose_a_trailing_dot() {
    assert_eq!(normalize("Mirror.Example.").unwrap(), "mirror.example");
    assert_eq!(normalize("_svc.a-b.test").unwrap(), "_svc.a-b.test");
    assert_eq!(normalize("localhost").unwrap(), "localhost");
  }

  #[test]
  fn bad_names_say_why() {
    let d = |s: &str| normalize(s).unwrap_err().detail;
    assert_eq!(d("foo bar"), None);
    assert!(d("bücher.example").unwrap().contains("punycode"));
    assert!(d("a..b").unwrap().contains("empty label"));
    assert!(d(&format!("{}.test", "a".repeat(64)))
      .unwrap()
      .contains("63"));
    assert!(d(&"a.".repeat(128)).unwrap().contains("253"));
    assert!(d("2130706433").unwrap().contains("IPv4"));
    assert!(d("0x7f.1").unwrap().contains("IPv4"));
    assert!(d("1.2.3.256").unwrap().contains("IPv4"));
    assert_eq!(d("."), Some("it is empty".to_string()));
  }

  #[test]
  fn names_with_a_numeric_label_but_a_word_are_names() {
    assert_eq!(normalize("0xdead.example").unwrap(), "0xdead.example");
    assert_eq!(normalize("123.example").unwrap(), "123.example");
  }
}
