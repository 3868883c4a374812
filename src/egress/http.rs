//! HTTP/1.x proxy requests: `CONNECT host:port` for a tunnel, and absolute-form requests
//! (`GET http://host/path`) forwarded in origin form. One request per client connection: the
//! forwarded request asks the origin to close after its reply, so the connection is a plain
//! byte relay from then on and no second request is ever parsed or sent elsewhere.

use super::target::Target;

/// The longest request head read; longer ones get 431.
pub(super) const HEAD_CAP: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;

pub(super) const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

const NOT_A_SERVER: &str = "this is the sandbox's egress proxy: send requests in absolute \
  form (GET http://host/path) or tunnel with CONNECT host:port";

/// What the client asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ask {
  Connect(Target),
  /// The target and the request head to send it, in origin form.
  Forward(Target, Vec<u8>),
}

/// A request the proxy answers itself.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Bad {
  pub status: u16,
  pub message: String,
}

fn bad(status: u16, message: impl Into<String>) -> Bad {
  Bad {
    status,
    message: message.into(),
  }
}

/// Where a complete head ends, searching from `from` (bytes before it were searched already).
pub(super) fn head_end(buf: &[u8], from: usize) -> Option<usize> {
  let start = from.saturating_sub(3);
  let tail = &buf[start..];
  let crlf = tail
    .windows(4)
    .position(|w| w == b"\r\n\r\n")
    .map(|i| i + 4);
  let lf = tail.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
  match (crlf, lf) {
    (Some(a), Some(b)) => Some(start + a.min(b)),
    (a, b) => a.or(b).map(|i| start + i),
  }
}

/// Parses a complete head (`head` ends where `head_end` said).
pub(super) fn parse(head: &[u8]) -> Result<Ask, Bad> {
  let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
  let mut req = httparse::Request::new(&mut headers);
  match req.parse(head) {
    Ok(httparse::Status::Complete(_)) => {}
    Ok(httparse::Status::Partial) => return Err(bad(400, "incomplete request head")),
    Err(httparse::Error::TooManyHeaders) => {
      return Err(bad(431, format!("more than {MAX_HEADERS} header fields")))
    }
    Err(e) => {
      return Err(bad(
        400,
        format!("malformed request head ({e}); {NOT_A_SERVER}"),
      ))
    }
  }
  let (method, path) = (req.method.unwrap_or(""), req.path.unwrap_or(""));
  if method == "CONNECT" {
    return Target::from_authority(path, None)
      .map(Ask::Connect)
      .map_err(|e| bad(400, format!("CONNECT target {e}")));
  }
  let scheme = path.get(..8).map(str::to_ascii_lowercase);
  if scheme.as_deref() == Some("https://") {
    return Err(bad(
      400,
      "https:// goes through a CONNECT tunnel; set HTTPS_PROXY, not an https:// URL to the proxy",
    ));
  }
  if path.get(..7).map(str::to_ascii_lowercase).as_deref() != Some("http://") {
    return Err(bad(400, NOT_A_SERVER));
  }
  let rest = &path[7..];
  let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
  let (authority, tail) = rest.split_at(end);
  if authority.contains('@') {
    return Err(bad(400, "credentials in the URL are not supported here"));
  }
  let target = Target::from_authority(authority, Some(80)).map_err(|e| bad(400, e))?;
  let tail = match tail.as_bytes().first() {
    Some(b'/') => tail.to_string(),
    _ => format!("/{tail}"),
  };
  let version = req.version.unwrap_or(1);
  Ok(Ask::Forward(
    target,
    origin_head(method, &tail, version, authority, req.headers),
  ))
}

/// The request as the origin gets it: origin form, `Host` from the URL (as RFC 9112 has a
/// proxy do), the proxy's own and hop-by-hop fields dropped, and `Connection: close`.
fn origin_head(
  method: &str,
  path: &str,
  version: u8,
  authority: &str,
  headers: &[httparse::Header<'_>],
) -> Vec<u8> {
  let listed: Vec<String> = headers
    .iter()
    .filter(|h| h.name.eq_ignore_ascii_case("connection"))
    .flat_map(|h| {
      String::from_utf8_lossy(h.value)
        .split(',')
        .map(|t| t.trim().to_ascii_lowercase())
        .collect::<Vec<_>>()
    })
    .collect();
  let hop = |n: &str| {
    let n = n.to_ascii_lowercase();
    [
      "proxy-connection",
      "proxy-authorization",
      "connection",
      "keep-alive",
      "host",
    ]
    .contains(&n.as_str())
      || listed.contains(&n)
  };
  let mut out = Vec::with_capacity(256);
  out.extend_from_slice(format!("{method} {path} HTTP/1.{version}\r\n").as_bytes());
  out.extend_from_slice(format!("Host: {}\r\n", authority.to_ascii_lowercase()).as_bytes());
  for h in headers.iter().filter(|h| !hop(h.name)) {
    out.extend_from_slice(h.name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(h.value);
    out.extend_from_slice(b"\r\n");
  }
  out.extend_from_slice(b"Connection: close\r\n\r\n");
  out
}

fn phrase(status: u16) -> &'static str {
  match status {
    400 => "Bad Request",
    403 => "Forbidden",
    408 => "Request Timeout",
    431 => "Request Header Fields Too Large",
    502 => "Bad Gateway",
    503 => "Service Unavailable",
    504 => "Gateway Timeout",
    _ => "Error",
  }
}

/// A reply with a one-line plain-text body, closing the connection.
pub(super) fn response(status: u16, line: &str) -> Vec<u8> {
  let body = format!("{line}\n");
  format!(
    "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: \
     close\r\n\r\n{body}",
    phrase(status),
    body.len()
  )
  .into_bytes()
}

#[cfg(test)]
mod tests {
  use super::*;

  fn ask(s: &str) -> Result<Ask, Bad> {
    assert_eq!(head_end(s.as_bytes(), 0), Some(s.len()), "{s:?}");
    parse(s.as_bytes())
  }

  #[test]
  fn connect() {
    let a = ask("CONNECT Pkg.Example:443 HTTP/1.1\r\nHost: pkg.example:443\r\n\r\n").unwrap();
    let Ask::Connect(t) = a else { panic!() };
    assert_eq!(t.to_string(), "pkg.example:443");
    let a = ask("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
    assert!(matches!(a, Ask::Connect(t) if t.to_string() == "[::1]:8443"));
    let e = ask("CONNECT pkg.example HTTP/1.1\r\n\r\n").unwrap_err();
    assert_eq!(e.status, 400);
    assert!(e.message.contains("no port"), "{}", e.message);
  }

  #[test]
  fn absolute_form_is_rewritten() {
    let a = ask(
      "GET http://Origin.Test:8080/a/b?c=1 HTTP/1.1\r\nHost: wrong.test\r\nProxy-Connection: \
       keep-alive\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Hop\r\nX-Hop: \
       1\r\nKeep-Alive: 5\r\nUser-Agent: t/1\r\nAccept: */*\r\n\r\n",
    )
    .unwrap();
    let Ask::Forward(t, head) = a else { panic!() };
    assert_eq!(t.to_string(), "origin.test:8080");
    assert_eq!(
      String::from_utf8(head).unwrap(),
      "GET /a/b?c=1 HTTP/1.1\r\nHost: origin.test:8080\r\nUser-Agent: t/1\r\nAccept: \
       */*\r\nConnection: close\r\n\r\n"
    );
    let Ask::Forward(t, head) = ask("HEAD http://o.test?x HTTP/1.0\n\n").unwrap() else {
      panic!()
    };
    assert_eq!(t.port, 80);
    assert!(head.starts_with(b"HEAD /?x HTTP/1.0\r\nHost: o.test\r\n"));
  }

  #[test]
  fn what_the_proxy_answers_itself() {
    let e = ask("GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap_err();
    assert_eq!(e.status, 400);
    assert!(e.message.starts_with("this is the sandbox's egress proxy"));
    let e = ask("GET https://x.test/ HTTP/1.1\r\n\r\n").unwrap_err();
    assert!(e.message.contains("CONNECT"));
    let e = ask("GET http://u:p@x.test/ HTTP/1.1\r\n\r\n").unwrap_err();
    assert!(e.message.contains("credentials"));
    assert_eq!(
      ask("GET http://x.test:0/ HTTP/1.1\r\n\r\n")
        .unwrap_err()
        .status,
      400
    );
    assert_eq!(ask("\x16\x03\x01 junk\r\n\r\n").unwrap_err().status, 400);
    let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
    let e = ask(&format!("GET http://x.test/ HTTP/1.1\r\n{many}\r\n")).unwrap_err();
    assert_eq!(e.status, 431);
  }

  #[test]
  fn the_head_end_is_found_across_reads() {
    let s = b"GET http://x.test/ HTTP/1.1\r\nA: b\r\n\r\nBODY";
    assert_eq!(head_end(&s[..36], 0), None);
    assert_eq!(head_end(s, 36), Some(37));
  }

  #[test]
  fn responses() {
    assert_eq!(
      String::from_utf8(response(403, "no")).unwrap(),
      "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: \
       close\r\n\r\nno\n"
    );
  }
}
