//! `trueforge-agent`: the TrueForge sandbox agent. Started by the host through an engine exec
//! (as root, stdin and stdout attached), it serves the agent protocol on that stream until stdin
//! closes. Run as `mcp-client` (a link to it), it is the static Code Mode CLI.

// The folders in the order they may use each other (`tests/layers.rs` holds it): base, then
// state, then exec, files and egress, then codemode, then serve.
mod base;
mod codemode;
mod egress;
mod exec;
mod files;
mod serve;
mod state;

fn main() {
  let mut args = std::env::args_os();
  let argv0 = args.next().unwrap_or_default();
  let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
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
      Some(exec::spare::ARG) => exec::spare::main(rest[1..].to_vec()),
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
