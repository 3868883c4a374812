//! `trueforge-agent`: the TrueForge sandbox agent. Started by the host through an engine exec
//! (as root, stdin and stdout attached), it serves the agent protocol on that stream until stdin
//! closes. Run as `mcp-client` (a link to it), it is the static Code Mode CLI.

mod activity;
mod codemode;
mod conn;
mod contain;
mod ctx;
mod egress;
mod exec;
mod files;
mod held;
mod lane;
mod mcp_client;
mod pool;
mod pyjson;
mod recover;
mod resolve;
mod serve;
mod shepherd;
mod staged;
mod sys;
mod users;
mod watch;

fn main() {
  let mut args = std::env::args_os();
  let argv0 = args.next().unwrap_or_default();
  let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
  let name = std::path::Path::new(&argv0)
    .file_name()
    .map(|n| n.to_string_lossy().into_owned())
    .unwrap_or_default();
  let code = if name == "mcp-client" {
    mcp_client::main(rest)
  } else {
    match rest.first().map(String::as_str) {
      Some("mcp-client") => mcp_client::main(rest[1..].to_vec()),
      Some("codemode-lane") => lane::main(rest[1..].to_vec()),
      Some("--version") => {
        println!(
          "{} {}",
          trueforge_agent_proto::msg::AGENT_NAME,
          trueforge_agent_proto::VERSION
        );
        0
      }
      Some(other) => {
        eprintln!(
          "trueforge-agent: unknown argument {other:?} (the agent takes requests on stdin)"
        );
        2
      }
      None => serve::run(),
    }
  };
  std::process::exit(code);
}
