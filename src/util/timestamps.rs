//! Timestamps as the engine writes them (RFC 3339), formatted and parsed in one place without
//! a date crate: our labels carry them, and the engine's inspect and stat answers use them.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the epoch, by this machine's clock (lock and lease ages).
pub fn now_ms() -> u64 {
  SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .map(|d| d.as_millis() as u64)
    .unwrap_or(0)
}

/// RFC 3339 UTC timestamp (seconds) of now.
pub fn rfc3339_now() -> String {
  let secs = SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .map(|d| d.as_secs())
    .unwrap_or(0);
  rfc3339(secs)
}

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
  let days = (secs / 86_400) as i64;
  let rem = secs % 86_400;
  // Days to civil date (Howard Hinnant's algorithm).
  let z = days + 719_468;
  let era = z.div_euclid(146_097);
  let doe = z - era * 146_097;
  let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
  let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  let mp = (5 * doy + 2) / 153;
  let d = doy - (153 * mp + 2) / 5 + 1;
  let m = if mp < 10 { mp + 3 } else { mp - 9 };
  let y = yoe + era * 400 + i64::from(m <= 2);
  format!(
    "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
    rem / 3600,
    rem % 3600 / 60,
    rem % 60
  )
}

/// `parse_time` to the millisecond (`…:00.123456789Z`): whether a container started before or
/// after something this process did a moment ago.
pub fn parse_time_ms(s: &str) -> Option<u64> {
  let secs = parse_time(s)?;
  let frac = s.get(19..)?.strip_prefix('.').unwrap_or("");
  // The first three digits of the fraction, padded with zeros.
  let ms = frac
    .bytes()
    .take_while(u8::is_ascii_digit)
    .chain(std::iter::repeat(b'0'))
    .take(3)
    .fold(0, |ms, d| ms * 10 + u64::from(d - b'0'));
  Some(secs * 1000 + ms)
}

/// Parses the engine's RFC 3339 timestamps (`2026-11-29T09:00:00.123456789Z`) to epoch
/// seconds; `None` for the zero time the engine uses for "never".
pub fn parse_time(s: &str) -> Option<u64> {
  let b = s.as_bytes();
  if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
    return None;
  }
  let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
  let (y, mo, d, h, mi, se) = (
    n(0..4)?,
    n(5..7)?,
    n(8..10)?,
    n(11..13)?,
    n(14..16)?,
    n(17..19)?,
  );
  if y < 1970 {
    return None;
  }
  // Days from civil (Howard Hinnant's algorithm).
  let y2 = if mo <= 2 { y - 1 } else { y };
  let era = y2.div_euclid(400);
  let yoe = y2 - era * 400;
  let mp = (mo + 9) % 12;
  let doy = (153 * mp + 2) / 5 + d - 1;
  let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  let days = era * 146_097 + doe - 719_468;
  let mut secs = days * 86_400 + h * 3600 + mi * 60 + se;
  // A zone offset such as +02:00 after the seconds (and any fraction).
  let rest = &s[19..];
  let rest = rest.trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
  if let Some(off) = rest.strip_prefix(['+', '-']) {
    let sign = if rest.starts_with('+') { -1 } else { 1 };
    let oh = off.get(0..2)?.parse::<i64>().ok()?;
    let om = off.get(3..5)?.parse::<i64>().ok()?;
    secs += sign * (oh * 3600 + om * 60);
  }
  u64::try_from(secs).ok()
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn engine_times_read_to_the_millisecond() {
    let whole = parse_time_ms("2026-12-06T08:00:00Z").expect("a time");
    assert_eq!(whole % 1000, 0);
    assert_eq!(
      parse_time_ms("2026-12-06T08:00:00.123456789Z"),
      Some(whole + 123)
    );
    assert_eq!(parse_time_ms("2026-12-06T08:00:00.5Z"), Some(whole + 500));
    assert_eq!(parse_time_ms("0001-01-01T00:00:00Z"), None);
  }

  #[test]
  fn formatted() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
  }

  #[test]
  fn parsed() {
    assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(
      parse_time("2026-12-31T23:59:59.123456789Z"),
      Some(1_798_761_599)
    );
    assert_eq!(parse_time("2000-02-29T00:00:00Z"), Some(951_782_400));
    assert_eq!(parse_time("2000-02-29T02:00:00+02:00"), Some(951_782_400));
    assert_eq!(parse_time("0001-01-01T00:00:00Z"), None);
    assert_eq!(parse_time("garbage"), None);
  }

  #[test]
  fn round_trip() {
    for secs in [0, 951_782_400, 1_798_761_599, 4_102_444_800] {
      assert_eq!(parse_time(&rfc3339(secs)), Some(secs));
    }
  }
}
