//! `mcp-client`: the agent binary run under that name (a link in /trueforge/codemode/bin) is a
//! static Code Mode CLI that behaves as the Python CLI in `codemode/mcp_client.py`: the same
//! arguments and usage errors, the same checks (allowed tools from `TFY_MCP_SERVERS`, destructive
//! tools refused while `TFY_ENABLE_AGENT_APPROVALS` is true), the same request over the relay
//! socket named by `TFY_CM_SOCK`, the same projection of the result, the same messages and exit
//! codes (0; 1 with `mcp-client: <message>` on stderr; 2 for a usage error), and JSON printed as
//! Python prints it. It starts in about a millisecond where Python needs ~50.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use trueforge_agent_proto::codemode::MAX_MESSAGE_BYTES;

use crate::codemode::pyjson::{self, format_g, py_str, Value};

const DEFAULT_TIMEOUT_SECONDS: f64 = 300.0;
const PROG: &str = "mcp-client";

/// Runs the CLI on `args` (without the program name); returns the exit code.
pub fn main(args: Vec<String>) -> i32 {
  let cmd = match parse_args(&args) {
    Ok(c) => c,
    Err(Exit::Usage { usage, prog, msg }) => {
      eprint!("{usage}\n{prog}: error: {msg}\n");
      return 2;
    }
    Err(Exit::Help(text)) => {
      print!("{text}");
      return 0;
    }
  };
  let result = match cmd {
    Command::CallTool {
      server,
      tool,
      arguments,
    } => call_tool(&server, &tool, arguments),
    Command::ListTools { server } => list_tools(&server).map(Value::List),
  };
  match result {
    Ok(v) => {
      let mut out = std::io::stdout().lock();
      let _ = writeln!(out, "{}", pyjson::dumps(&v));
      let _ = out.flush();
      0
    }
    Err(e) => {
      eprintln!("{PROG}: {e}");
      1
    }
  }
}

#[derive(Debug, PartialEq)]
enum Command {
  CallTool {
    server: String,
    tool: String,
    arguments: Value,
  },
  ListTools {
    server: String,
  },
}

#[derive(Debug, PartialEq)]
enum Exit {
  Usage {
    usage: String,
    prog: String,
    msg: String,
  },
  Help(String),
}

const MAIN_USAGE: &str = "usage: mcp-client [-h] {call-tool,list-tools} ...";
const CALL_USAGE: &str = "usage: mcp-client call-tool [-h] server tool [args-json]";
const LIST_USAGE: &str = "usage: mcp-client list-tools [-h] server";

const MAIN_HELP: &str = "usage: mcp-client [-h] {call-tool,list-tools} ...

Call MCP tools from the sandbox.

positional arguments:
  {call-tool,list-tools}
    call-tool           call one tool and print its result as JSON
    list-tools          print a server's tools as JSON

options:
  -h, --help            show this help message and exit
";

const CALL_HELP: &str = "usage: mcp-client call-tool [-h] server tool [args-json]

positional arguments:
  server
  tool
  args-json

options:
  -h, --help  show this help message and exit
";

const LIST_HELP: &str = "usage: mcp-client list-tools [-h] server

positional arguments:
  server

options:
  -h, --help  show this help message and exit
";

fn is_help(a: &str) -> bool {
  a == "-h" || (a.len() >= 3 && "--help".starts_with(a))
}

/// Whether argparse takes `a` for an option rather than a value.
fn looks_like_option(a: &str) -> bool {
  if !a.starts_with('-') || a == "-" || a.contains(' ') {
    return false;
  }
  // Negative numbers are values (the parser has no options that look like them).
  let rest = &a[1..];
  let negative_number = !rest.is_empty()
    && (rest.bytes().all(|b| b.is_ascii_digit())
      || rest.split_once('.').is_some_and(|(i, f)| {
        i.bytes().all(|b| b.is_ascii_digit())
          && !f.is_empty()
          && f.bytes().all(|b| b.is_ascii_digit())
      }));
  !negative_number
}

fn usage_error(usage: &str, prog: &str, msg: String) -> Exit {
  Exit::Usage {
    usage: usage.to_string(),
    prog: prog.to_string(),
    msg,
  }
}

/// The main parser's part: options before the subcommand (kept in `extras`), then the
/// subcommand and where its arguments start.
fn subcommand(args: &[String], extras: &mut Vec<String>) -> Result<(String, usize), Exit> {
  let required = || {
    usage_error(
      MAIN_USAGE,
      PROG,
      "the following arguments are required: command".into(),
    )
  };
  let mut i = 0;
  loop {
    let a = args.get(i).ok_or_else(required)?;
    i += 1;
    if a == "--" {
      let c = args.get(i).ok_or_else(required)?;
      return Ok((c.clone(), i + 1));
    }
    if looks_like_option(a) {
      if is_help(a) {
        return Err(Exit::Help(MAIN_HELP.into()));
      }
      extras.push(a.clone());
      continue;
    }
    return Ok((a.clone(), i));
  }
}

/// `call-tool`'s JSON arguments: an object, or a usage error.
fn arguments_of(text: Option<&String>, usage: &str, sub: &str) -> Result<Value, Exit> {
  match text {
    None => Ok(Value::Dict(Vec::new())),
    Some(text) => match pyjson::loads(text) {
      Ok(v @ Value::Dict(_)) => Ok(v),
      Ok(_) => Err(usage_error(
        usage,
        sub,
        "argument args-json: must be a JSON object".into(),
      )),
      Err(e) => Err(usage_error(
        usage,
        sub,
        format!("argument args-json: not JSON: {e}"),
      )),
    },
  }
}

/// argparse's behaviour for this CLI's two subcommands.
fn parse_args(args: &[String]) -> Result<Command, Exit> {
  let mut extras: Vec<String> = Vec::new();
  let (command, i) = subcommand(args, &mut extras)?;
  let (usage, help, sub, max) = match command.as_str() {
    "call-tool" => (CALL_USAGE, CALL_HELP, "mcp-client call-tool", 3),
    "list-tools" => (LIST_USAGE, LIST_HELP, "mcp-client list-tools", 1),
    other => {
      return Err(usage_error(
        MAIN_USAGE,
        PROG,
        format!(
          "argument command: invalid choice: {} (choose from 'call-tool', 'list-tools')",
          pyjson::py_repr(&Value::Str(other.to_string()))
        ),
      ))
    }
  };
  let mut positionals: Vec<String> = Vec::new();
  let mut only_values = false;
  for a in &args[i..] {
    if !only_values && a == "--" {
      only_values = true;
      continue;
    }
    if !only_values && looks_like_option(a) {
      if is_help(a) {
        return Err(Exit::Help(help.into()));
      }
      extras.push(a.clone());
      continue;
    }
    if positionals.len() < max {
      positionals.push(a.clone());
    } else {
      extras.push(a.clone());
    }
  }
  let required: &[&str] = if max == 3 {
    &["server", "tool"]
  } else {
    &["server"]
  };
  if positionals.len() < required.len() {
    return Err(usage_error(
      usage,
      sub,
      format!(
        "the following arguments are required: {}",
        required[positionals.len()..].join(", ")
      ),
    ));
  }
  let cmd = if max == 3 {
    Command::CallTool {
      server: positionals[0].clone(),
      tool: positionals[1].clone(),
      arguments: arguments_of(positionals.get(2), usage, sub)?,
    }
  } else {
    Command::ListTools {
      server: positionals[0].clone(),
    }
  };
  if !extras.is_empty() {
    return Err(usage_error(
      MAIN_USAGE,
      PROG,
      format!("unrecognized arguments: {}", extras.join(" ")),
    ));
  }
  Ok(cmd)
}

fn env(name: &str) -> Option<String> {
  std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Python's `base64.b64decode` (characters outside the alphabet are skipped).
fn b64decode(s: &str) -> Result<Vec<u8>, String> {
  let val = |c: u8| -> Option<u32> {
    Some(match c {
      b'A'..=b'Z' => c - b'A',
      b'a'..=b'z' => c - b'a' + 26,
      b'0'..=b'9' => c - b'0' + 52,
      b'+' => 62,
      b'/' => 63,
      _ => return None,
    } as u32)
  };
  let mut data = Vec::new();
  let mut pads = 0;
  for c in s.bytes() {
    if c == b'=' {
      pads += 1;
      if (data.len() % 4 == 2 && pads >= 2) || (data.len() % 4 == 3 && pads >= 1) {
        break;
      }
    } else if let Some(v) = val(c) {
      if pads > 0 && data.len() % 4 != 0 {
        pads = 0;
      }
      data.push(v);
    }
  }
  match data.len() % 4 {
    1 => {
      return Err(format!(
        "Invalid base64-encoded string: number of data characters ({}) cannot be 1 more than a multiple of 4",
        data.len()
      ))
    }
    2 if pads < 2 => return Err("Incorrect padding".into()),
    3 if pads < 1 => return Err("Incorrect padding".into()),
    _ => {}
  }
  let mut out = Vec::with_capacity(data.len() * 3 / 4);
  for chunk in data.chunks(4) {
    let mut n = 0u32;
    for (i, v) in chunk.iter().enumerate() {
      n |= v << (18 - 6 * i);
    }
    let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
    out.extend_from_slice(&bytes[..chunk.len() - 1]);
  }
  Ok(out)
}

fn allowed_servers() -> Result<Value, String> {
  let raw = match env("TFY_MCP_SERVERS") {
    Some(r) if !r.is_empty() => r,
    _ => return Ok(Value::Dict(Vec::new())),
  };
  let bad = |e: String| format!("TFY_MCP_SERVERS is not base64 JSON: {e}");
  let bytes = b64decode(&raw).map_err(bad)?;
  let text = String::from_utf8(bytes).map_err(|e| {
    let pos = e.utf8_error().valid_up_to();
    let byte = e.as_bytes()[pos];
    bad(format!(
      "'utf-8' codec can't decode byte 0x{byte:02x} in position {pos}: invalid start byte"
    ))
  })?;
  let v = pyjson::loads(&text).map_err(|e| bad(e.to_string()))?;
  Ok(if matches!(v, Value::Dict(_)) {
    v
  } else {
    Value::Dict(Vec::new())
  })
}

fn approvals_enabled() -> bool {
  env("TFY_ENABLE_AGENT_APPROVALS")
    .unwrap_or_else(|| "true".into())
    .trim()
    .to_lowercase()
    == "true"
}

/// Python's `float()` of the variable, else the default (also for values not above 0).
fn timeout_seconds() -> f64 {
  let parsed = env("TFY_CM_REQUEST_TIMEOUT_SECONDS")
    .filter(|r| !r.is_empty())
    .and_then(|r| {
      let t = r.trim();
      // float() allows single underscores between digits.
      let digits_around = |t: &str| {
        let b = t.as_bytes();
        b.windows(3)
          .filter(|w| w[1] == b'_')
          .all(|w| w[0].is_ascii_digit() && w[2].is_ascii_digit())
          && !t.starts_with('_')
          && !t.ends_with('_')
      };
      if t.contains('_') && !digits_around(t) {
        return None;
      }
      t.replace('_', "").parse::<f64>().ok()
    });
  match parsed {
    Some(v) if v > 0.0 => v,
    _ => DEFAULT_TIMEOUT_SECONDS,
  }
}

fn check_allowed(server: &str, tool: &str) -> Result<(), String> {
  let servers = allowed_servers()?;
  let config = match servers.get(server) {
    Some(c @ Value::Dict(_)) => c,
    _ => {
      return Err(format!(
        "Access denied: MCP server '{server}' is not available for this agent"
      ))
    }
  };
  let tools = config.get("allowed_tools").filter(|t| t.truthy());
  let allowed = match tools {
    None => true,
    Some(Value::List(items)) => items.iter().any(|t| t.as_str() == Some(tool)),
    Some(Value::Str(s)) => s.contains(tool),
    Some(Value::Dict(items)) => items.iter().any(|(k, _)| k == tool),
    Some(_) => false,
  };
  if !allowed {
    return Err(format!(
      "Access denied: tool '{tool}' is not enabled on server '{server}'"
    ));
  }
  Ok(())
}

/// Python's `str(OSError)`: "[Errno 2] No such file or directory".
fn os_error(e: &std::io::Error) -> String {
  match e.raw_os_error() {
    Some(n) => {
      let text = std::io::Error::from_raw_os_error(n).to_string();
      let text = text
        .strip_suffix(&format!(" (os error {n})"))
        .unwrap_or(&text)
        .to_string();
      format!("[Errno {n}] {text}")
    }
    None => e.to_string(),
  }
}

/// One request over the relay socket: connect, send, close our side, read the reply to EOF.
fn request(mut payload: Vec<(String, Value)>) -> Result<Value, String> {
  let path = match env("TFY_CM_SOCK") {
    Some(p) if !p.is_empty() => p,
    _ => return Err("Code Mode is not available in this command (TFY_CM_SOCK is not set); MCP tools can only be called from commands the agent runs in its sandbox".into()),
  };
  let mut carrier = Vec::new();
  for (key, var) in [
    ("traceparent", "TFY_TRACEPARENT"),
    ("tracestate", "TFY_TRACESTATE"),
  ] {
    if let Some(v) = env(var).filter(|v| !v.is_empty()) {
      carrier.push((key.to_string(), Value::Str(v)));
    }
  }
  if !carrier.is_empty() {
    payload.push(("trace".into(), Value::Dict(carrier)));
  }
  let data = pyjson::dumps(&Value::Dict(payload)).into_bytes();
  if data.len() > MAX_MESSAGE_BYTES {
    return Err(format!(
      "Code Mode request of {} bytes exceeds the limit of {} bytes",
      data.len(),
      MAX_MESSAGE_BYTES
    ));
  }
  let timeout = timeout_seconds();
  let raw = exchange(&path, &data, timeout)?;
  if raw.is_empty() {
    return Err("the Code Mode relay closed the connection without a reply".into());
  }
  let reply = std::str::from_utf8(&raw)
    .ok()
    .and_then(|t| pyjson::loads(t).ok())
    .ok_or("the Code Mode reply is not JSON")?;
  let ok = match reply.get("ok") {
    Some(Value::Bool(b)) if matches!(reply, Value::Dict(_)) => *b,
    _ => return Err("the Code Mode reply has an unexpected shape".into()),
  };
  if ok {
    return Ok(reply.get("result").cloned().unwrap_or(Value::Null));
  }
  let error = reply
    .get("error")
    .map(py_str)
    .unwrap_or_else(|| "unknown error".into());
  Err(match reply.get("source").and_then(Value::as_str) {
    Some("caller") => format!("Invalid MCP request: {error}"),
    Some("transport") => format!("Code Mode transport error: {error}"),
    _ => format!("Internal MCP error: {error}"),
  })
}

fn exchange(path: &str, data: &[u8], timeout: f64) -> Result<Vec<u8>, String> {
  let deadline = Instant::now() + Duration::from_secs_f64(timeout.min(1e9));
  let timed_out = || format!("Code Mode request timed out after {} s", format_g(timeout));
  let unreachable = |e: &std::io::Error| {
    format!(
      "cannot reach the Code Mode relay at {path}: {}",
      os_error(e)
    )
  };
  let left = || {
    deadline
      .checked_duration_since(Instant::now())
      .filter(|d| !d.is_zero())
  };
  let is_timeout = |e: &std::io::Error| {
    matches!(
      e.kind(),
      std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
  };
  let mut sock = UnixStream::connect(path).map_err(|e| unreachable(&e))?;
  let mut sent = 0;
  while sent < data.len() {
    sock
      .set_write_timeout(Some(left().ok_or_else(timed_out)?))
      .map_err(|e| unreachable(&e))?;
    match sock.write(&data[sent..]) {
      Ok(n) => sent += n,
      Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
      Err(e) if is_timeout(&e) => return Err(timed_out()),
      Err(e) => return Err(unreachable(&e)),
    }
  }
  let _ = sock.shutdown(std::net::Shutdown::Write);
  let mut out = Vec::new();
  let mut buf = vec![0u8; 256 * 1024];
  loop {
    sock
      .set_read_timeout(Some(left().ok_or_else(timed_out)?))
      .map_err(|e| unreachable(&e))?;
    match sock.read(&mut buf) {
      Ok(0) => return Ok(out),
      Ok(n) => out.extend_from_slice(&buf[..n]),
      Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
      Err(e) if is_timeout(&e) => return Err(timed_out()),
      Err(e) => return Err(unreachable(&e)),
    }
  }
}

fn s(v: &str) -> Value {
  Value::Str(v.to_string())
}

fn list_tools(server: &str) -> Result<Vec<Value>, String> {
  let result = request(vec![
    ("op".into(), s("list_tools")),
    ("server".into(), s(server)),
  ])?;
  let result = match &result {
    Value::Dict(_) => result
      .get("tools")
      .cloned()
      .unwrap_or(Value::List(Vec::new())),
    _ => result,
  };
  Ok(match result {
    Value::List(items) => items,
    _ => Vec::new(),
  })
}

fn is_destructive(tool: &Value) -> bool {
  let hints = match tool.get("annotations") {
    Some(h) if h.truthy() => h,
    _ => return false,
  };
  if !matches!(hints, Value::Dict(_)) {
    return false;
  }
  hints.get("destructiveHint").is_some_and(Value::truthy)
    || hints.get("readOnlyHint") == Some(&Value::Bool(false))
}

fn refuse_destructive(server: &str, name: &str) -> Result<(), String> {
  for tool in list_tools(server)? {
    if matches!(tool, Value::Dict(_)) && tool.get("name").and_then(Value::as_str) == Some(name) {
      if is_destructive(&tool) {
        return Err(format!("Tool '{name}' on MCP server '{server}' is destructive and cannot be called in Code Mode; call it directly so that it goes through the user's approval"));
      }
      return Ok(());
    }
  }
  Err(format!("Tool '{name}' not found on MCP server '{server}'"))
}

/// The tool's result as the Python API returns it.
fn project(server: &str, tool: &str, result: Value) -> Result<Value, String> {
  if !matches!(result, Value::Dict(_)) {
    return Ok(result);
  }
  let content = result
    .get("content")
    .filter(|c| c.truthy())
    .cloned()
    .unwrap_or(Value::List(Vec::new()));
  let blocks: &[Value] = match &content {
    Value::List(items) => items,
    _ => &[],
  };
  if result.get("isError").is_some_and(Value::truthy) {
    let texts: Vec<String> = blocks
      .iter()
      .filter(|c| {
        matches!(c, Value::Dict(_)) && c.get("type").and_then(Value::as_str) == Some("text")
      })
      .filter_map(|c| c.get("text").filter(|t| t.truthy()).map(py_str))
      .collect();
    return Err(format!(
      "MCP tool error (server={server}, tool={tool}): {}",
      if texts.is_empty() {
        "the tool returned an error".to_string()
      } else {
        texts.join("; ")
      }
    ));
  }
  if let Some(sc) = result.get("structuredContent") {
    if *sc != Value::Null {
      return Ok(sc.clone());
    }
  }
  if content.len() == Some(1) {
    if let Some(first @ Value::Dict(_)) = blocks.first() {
      if first.get("type").and_then(Value::as_str) == Some("text") {
        if let Some(Value::Str(text)) = first.get("text") {
          if !text.is_empty() {
            if let Ok(v) = pyjson::loads(text) {
              return Ok(v);
            }
          }
        }
      }
    }
  }
  Ok(if content.truthy() {
    content
  } else {
    Value::Null
  })
}

fn call_tool(server: &str, tool: &str, arguments: Value) -> Result<Value, String> {
  check_allowed(server, tool)?;
  if approvals_enabled() {
    refuse_destructive(server, tool)?;
  }
  let result = request(vec![
    ("op".into(), s("call_tool")),
    ("server".into(), s(server)),
    ("tool".into(), s(tool)),
    ("arguments".into(), arguments),
  ])?;
  project(server, tool, result)
}

#[cfg(test)]
mod tests {
  use super::*;

  fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
  }

  #[test]
  fn arguments_parse_as_argparse_does() {
    assert_eq!(
      parse_args(&args(&["call-tool", "s", "t"])),
      Ok(Command::CallTool {
        server: "s".into(),
        tool: "t".into(),
        arguments: Value::Dict(vec![])
      })
    );
    assert_eq!(
      parse_args(&args(&["list-tools", "-5"])),
      Ok(Command::ListTools {
        server: "-5".into()
      })
    );
    let err = |a: &[&str]| match parse_args(&args(a)) {
      Err(Exit::Usage { prog, msg, .. }) => format!("{prog}: {msg}"),
      other => panic!("{other:?}"),
    };
    assert_eq!(
      err(&[]),
      "mcp-client: the following arguments are required: command"
    );
    assert_eq!(
      err(&["call-tool", "s"]),
      "mcp-client call-tool: the following arguments are required: tool"
    );
    assert_eq!(
      err(&["call-tool", "s", "t", "[1]"]),
      "mcp-client call-tool: argument args-json: must be a JSON object"
    );
    assert_eq!(
      err(&["call-tool", "s", "t", "{", "x"]),
      "mcp-client call-tool: argument args-json: not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    );
    assert_eq!(
      err(&["list-tools", "a", "b", "--x"]),
      "mcp-client: unrecognized arguments: b --x"
    );
    assert_eq!(
      err(&["nope"]),
      "mcp-client: argument command: invalid choice: 'nope' (choose from 'call-tool', 'list-tools')"
    );
    assert!(matches!(
      parse_args(&args(&["list-tools", "-h"])),
      Err(Exit::Help(_))
    ));
  }

  #[test]
  fn base64_like_python() {
    assert_eq!(b64decode("eyJhIjoxfQ==").unwrap(), b"{\"a\":1}");
    assert_eq!(b64decode("eyJh\nIjox fQ==").unwrap(), b"{\"a\":1}");
    assert_eq!(b64decode("eyJhIjoxfQ").unwrap_err(), "Incorrect padding");
    assert!(b64decode("abcde").unwrap_err().contains("cannot be 1 more"));
  }

  #[test]
  fn results_project_as_the_python_client_does() {
    let p = |r: &str| project("s", "t", pyjson::loads(r).unwrap());
    assert_eq!(
      p(r#"{"structuredContent": {"a": 1}, "content": []}"#),
      Ok(pyjson::loads(r#"{"a": 1}"#).unwrap())
    );
    assert_eq!(
      p(r#"{"content": [{"type": "text", "text": "[1, 2]"}]}"#),
      Ok(pyjson::loads("[1, 2]").unwrap())
    );
    assert_eq!(
      p(r#"{"content": [{"type": "text", "text": "plain"}]}"#).map(|v| pyjson::dumps(&v)),
      Ok(r#"[{"type": "text", "text": "plain"}]"#.into())
    );
    assert_eq!(p(r#"{"content": []}"#), Ok(Value::Null));
    assert_eq!(
      p(
        r#"{"isError": true, "content": [{"type": "text", "text": "boom"}, {"type": "text", "text": "again"}]}"#
      ),
      Err("MCP tool error (server=s, tool=t): boom; again".into())
    );
    assert_eq!(p("[1]"), Ok(pyjson::loads("[1]").unwrap()));
  }

  #[test]
  fn destructive_hints() {
    let d = |t: &str| is_destructive(&pyjson::loads(t).unwrap());
    assert!(d(r#"{"annotations": {"destructiveHint": true}}"#));
    assert!(d(r#"{"annotations": {"readOnlyHint": false}}"#));
    assert!(!d(r#"{"annotations": {"readOnlyHint": 0}}"#));
    assert!(!d(r#"{"annotations": null}"#));
    assert!(!d(r#"{"annotations": "x"}"#));
    assert!(!d(r#"{}"#));
  }
}
