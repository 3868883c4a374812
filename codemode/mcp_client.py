#!/usr/bin/env python3
"""Code Mode client for TrueForge's Docker sandbox provider (Python 3.9+, standard library only).

In Python:   from mcp_client import call_tool
             result = await call_tool("server", "tool", body={"key": "value"})
In a shell:  mcp-client call-tool <server> <tool> '<json object>'
             mcp-client list-tools <server>

Each request goes to the provider's relay over the Unix socket named by TFY_CM_SOCK; the relay
carries it to the agent server, which runs the MCP tool. TFY_MCP_SERVERS (base64 JSON) names
the servers and tools this agent may use; with TFY_ENABLE_AGENT_APPROVALS (default true)
destructive tools are refused, since they need the user's approval outside Code Mode.
"""
import argparse
import asyncio
import base64
import json
import os
import socket
import sys

__all__ = ["call_tool", "list_tools", "CodeModeError"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 300.0


class CodeModeError(RuntimeError):
    """A Code Mode call failed: refused here, by the server, by the tool, or in transit."""


def _allowed_servers():
    raw = os.environ.get("TFY_MCP_SERVERS")
    if not raw:
        return {}
    try:
        servers = json.loads(base64.b64decode(raw).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CodeModeError("TFY_MCP_SERVERS is not base64 JSON: %s" % e) from None
    return servers if isinstance(servers, dict) else {}


def _approvals_enabled():
    return os.environ.get("TFY_ENABLE_AGENT_APPROVALS", "true").strip().lower() == "true"


def _timeout_seconds():
    raw = os.environ.get("TFY_CM_REQUEST_TIMEOUT_SECONDS")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_SECONDS
    except ValueError:
        value = DEFAULT_TIMEOUT_SECONDS
    return value if value > 0 else DEFAULT_TIMEOUT_SECONDS


def _trace_carrier():
    carrier = {}
    for key, var in (("traceparent", "TFY_TRACEPARENT"), ("tracestate", "TFY_TRACESTATE")):
        value = os.environ.get(var)
        if value:
            carrier[key] = value
    return carrier


def _check_allowed(server, tool):
    config = _allowed_servers().get(server)
    if not isinstance(config, dict):
        raise CodeModeError("Access denied: MCP server '%s' is not available for this agent" % server)
    tools = config.get("allowed_tools") or []
    if tools and tool not in tools:
        raise CodeModeError("Access denied: tool '%s' is not enabled on server '%s'" % (tool, server))


async def _exchange(path, data):
    # The socket itself rather than asyncio's streams, and the request with its end written
    # right after the connect: the relay, woken by the connect, then finds the whole request.
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        while True:
            try:
                sock.connect(path)
                break
            except (BlockingIOError, InterruptedError):
                # The relay's backlog is full: it is accepting others (the caller's timeout
                # bounds the wait).
                await asyncio.sleep(0.005)
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            await loop.sock_sendall(sock, memoryview(data)[sent:])
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        sock.close()


async def _request(payload):
    path = os.environ.get("TFY_CM_SOCK")
    if not path:
        raise CodeModeError(
            "Code Mode is not available in this command (TFY_CM_SOCK is not set); "
            "MCP tools can only be called from commands the agent runs in its sandbox")
    carrier = _trace_carrier()
    if carrier:
        payload = dict(payload, trace=carrier)
    data = json.dumps(payload).encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise CodeModeError("Code Mode request of %d bytes exceeds the limit of %d bytes"
                            % (len(data), MAX_MESSAGE_BYTES))
    timeout = _timeout_seconds()
    try:
        raw = await asyncio.wait_for(_exchange(path, data), timeout)
    except asyncio.TimeoutError:
        raise CodeModeError("Code Mode request timed out after %g s" % timeout) from None
    except OSError as e:
        raise CodeModeError("cannot reach the Code Mode relay at %s: %s" % (path, e)) from None
    if not raw:
        raise CodeModeError("the Code Mode relay closed the connection without a reply")
    try:
        reply = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise CodeModeError("the Code Mode reply is not JSON") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise CodeModeError("the Code Mode reply has an unexpected shape")
    if reply["ok"]:
        return reply.get("result")
    error = reply.get("error", "unknown error")
    source = reply.get("source")
    if source == "caller":
        raise CodeModeError("Invalid MCP request: %s" % error)
    if source == "transport":
        raise CodeModeError("Code Mode transport error: %s" % error)
    raise CodeModeError("Internal MCP error: %s" % error)


_tools_by_server = {}


async def list_tools(server):
    """The tools of one MCP server, as the server lists them (one request per server and event
    loop, shared by concurrent callers)."""
    loop = asyncio.get_running_loop()
    task = _tools_by_server.get(server)
    if task is None or task.get_loop() is not loop or (task.done() and (task.cancelled() or task.exception() is not None)):
        task = loop.create_task(_request({"op": "list_tools", "server": server}))
        _tools_by_server[server] = task
    result = await asyncio.shield(task)
    if isinstance(result, dict):
        result = result.get("tools", [])
    return result if isinstance(result, list) else []


def _is_destructive(tool):
    hints = tool.get("annotations") or {}
    if not isinstance(hints, dict):
        return False
    return bool(hints.get("destructiveHint")) or hints.get("readOnlyHint") is False


async def _refuse_destructive(server, name):
    for tool in await list_tools(server):
        if isinstance(tool, dict) and tool.get("name") == name:
            if _is_destructive(tool):
                raise CodeModeError(
                    "Tool '%s' on MCP server '%s' is destructive and cannot be called in Code Mode; "
                    "call it directly so that it goes through the user's approval" % (name, server))
            return
    raise CodeModeError("Tool '%s' not found on MCP server '%s'" % (name, server))


def _project(server, tool, result):
    if not isinstance(result, dict):
        return result
    content = result.get("content") or []
    if result.get("isError"):
        texts = [c.get("text") for c in content if isinstance(c, dict) and c.get("type") == "text" and c.get("text")]
        raise CodeModeError("MCP tool error (server=%s, tool=%s): %s"
                            % (server, tool, "; ".join(texts) if texts else "the tool returned an error"))
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    if len(content) == 1 and isinstance(content[0], dict) and content[0].get("type") == "text" and content[0].get("text"):
        try:
            return json.loads(content[0]["text"])
        except ValueError:
            pass
    return content if content else None


async def call_tool(server, tool, body=None):
    """Calls one MCP tool and returns its result: the structured content, a single text block
    parsed as JSON, or else the content list. Raises CodeModeError on any failure."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise CodeModeError("the tool's arguments must be a JSON object (a dict)")
    _check_allowed(server, tool)
    if _approvals_enabled():
        await _refuse_destructive(server, tool)
    result = await _request({"op": "call_tool", "server": server, "tool": tool, "arguments": body})
    return _project(server, tool, result)


def _json_object(text):
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError("not JSON: %s" % e) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _main(argv=None):
    parser = argparse.ArgumentParser(prog="mcp-client", description="Call MCP tools from the sandbox.")
    commands = parser.add_subparsers(dest="command", required=True)
    call = commands.add_parser("call-tool", help="call one tool and print its result as JSON")
    call.add_argument("server")
    call.add_argument("tool")
    call.add_argument("arguments", nargs="?", default={}, type=_json_object, metavar="args-json")
    listing = commands.add_parser("list-tools", help="print a server's tools as JSON")
    listing.add_argument("server")
    args = parser.parse_args(argv)
    try:
        if args.command == "call-tool":
            result = asyncio.run(call_tool(args.server, args.tool, args.arguments))
        else:
            result = asyncio.run(list_tools(args.server))
    except CodeModeError as e:
        sys.exit("mcp-client: %s" % e)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    _main()
