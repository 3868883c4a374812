//! Code Mode in the sandbox, all three of its ends: the relay socket the agent serves
//! (`relay`), the lane the host runs as a program of its own (`lane`), and the static
//! `mcp-client` CLI (`mcp_client`) with the Python-compatible JSON it prints (`pyjson`).

pub mod lane;
pub mod mcp_client;
pub mod pyjson;
pub mod relay;
