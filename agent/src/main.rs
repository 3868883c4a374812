//! `trueforge-agent`: the TrueForge sandbox agent. Started by the host through an engine exec
//! (as root, stdin and stdout attached), it serves the agent protocol on that stream until stdin
//! closes. Run as `mcp-client` (a link to it), it is the static Code Mode CLI.

#![cfg_attr(not(test), no_main)]

// The folders in the order they may use each other (`tests/layers.rs` holds it): base, then
// state, then exec, files and egress, then codemode, then serve.
mod base;
mod codemode;
mod egress;
mod exec;
mod files;
mod serve;
mod state;

// The standard library's start-up (its stack-overflow handler, a poll of fds 0-2, signal
// dispositions and more: about twenty system calls) is skipped: a spare shepherd starts before
// each command, and under gVisor each of those calls costs tens of microseconds. The other
// modes do what of it they need (`start`).
#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
  use std::os::unix::ffi::OsStrExt;
  let args: Vec<std::ffi::OsString> = (0..argc.max(0) as usize)
    .map(|i| {
      // SAFETY: the kernel's argv: `argc` NUL-terminated strings.
      let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) };
      std::ffi::OsStr::from_bytes(arg.to_bytes()).to_os_string()
    })
    .collect();
  start(args)
}

#[cfg_attr(test, allow(dead_code))]
fn start(args: Vec<std::ffi::OsString>) -> i32 {
  let mut args = args.into_iter();
  let argv0 = args.next().unwrap_or_default();
  let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
  if rest.first().map(String::as_str) == Some(exec::spare::ARG) {
    // A spare shepherd sets up its own signals and descriptors.
    std::process::exit(exec::spare::main(rest[1..].to_vec()));
  }
  // What the standard library's start-up would have done that these modes rely on: a write
  // to a closed pipe is an error, not a signal that kills, and fds 0-2 are open.
  unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
  base::sys::ensure_std_fds();
  let _ = exec::spare::ARGV0.set(argv0.clone());
  let name = std::path::Path::new(&argv0)
    .file_name()
    .map(|n| n.to_string_lossy().into_owned())
    .unwrap_or_default();
  let code = if name == "mcp-client" {
    codemode::mcp_client::main(rest)
  } else {
    match rest.first().map(String::as_str) {
      Some("mcp-client") => codemode::mcp_client::main(rest[1..].to_vec()),
      Some("codemode-lane") => codemode::lane::main(rest[1..].to_vec()),
      Some("--version") => {
        println!(
          "{} {}",
          trueforge_agent_proto::msg::AGENT_NAME,
          trueforge_agent_proto::VERSION
        );
        0
      }
      Some("--link") => serve::run(rest.get(1).map(String::as_str)),
      Some(other) => {
        eprintln!(
          "trueforge-agent: unknown argument {other:?} (the agent takes requests on stdin)"
        );
        2
      }
      None => serve::run(None),
    }
  };
  std::process::exit(code);
}
