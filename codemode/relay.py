"""Code Mode relay: runs inside the sandbox, started by the provider through the engine's exec
API with stdin and stdout attached. It listens on a Unix socket (owner only) and carries each
connection's request to the host over stdout, and the host's reply back from stdin.

Socket side: one request per connection; the client writes the JSON request, shuts down its
write side, and reads the reply until EOF.
Stream side: frames of a 9-byte header (kind u8, request id u32, payload length u32, big
endian) followed by the payload. Relay to host: READY (payload: JSON with the relay's pid),
REQUEST. Host to relay: REPLY. The relay exits when its stdin closes.
Python 3.9 or later, standard library only.
"""
import json
import os
import signal
import socket
import struct
import sys
import threading

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
INLINE_REPLY_BYTES = 64 * 1024
HEADER = struct.Struct(">BII")
READY, REQUEST, REPLY = 1, 2, 3

_write_lock = threading.Lock()
_pending_lock = threading.Lock()
_pending = {}
_next_id = [0]


def _write_frame(kind, rid, payload):
    data = memoryview(HEADER.pack(kind, rid, len(payload)) + payload)
    with _write_lock:
        while data:
            n = os.write(1, data)
            data = data[n:]


def _read_exact(n):
    parts = []
    while n > 0:
        chunk = os.read(0, min(n, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _error_reply(message):
    return json.dumps({"ok": False, "error": message, "source": "caller"}).encode()


def _finish(conn, payload):
    try:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()


def _serve(conn):
    try:
        parts = []
        size = 0
        too_big = False
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_MESSAGE_BYTES:
                too_big = True
                parts = []
            elif not too_big:
                parts.append(chunk)
        if too_big:
            _finish(conn, _error_reply(
                "Code Mode request of %d bytes exceeds the limit of %d bytes" % (size, MAX_MESSAGE_BYTES)))
            return
        with _pending_lock:
            _next_id[0] = (_next_id[0] + 1) & 0xFFFFFFFF
            rid = _next_id[0]
            _pending[rid] = conn
        try:
            _write_frame(REQUEST, rid, b"".join(parts))
        except OSError:
            os._exit(0)
    except OSError:
        conn.close()


def _pump(path):
    while True:
        header = _read_exact(HEADER.size)
        if header is None:
            break
        kind, rid, length = HEADER.unpack(header)
        if length > MAX_MESSAGE_BYTES + 4096:
            break
        payload = _read_exact(length)
        if payload is None:
            break
        if kind != REPLY:
            continue
        with _pending_lock:
            conn = _pending.pop(rid, None)
        if conn is None:
            continue
        if len(payload) <= INLINE_REPLY_BYTES:
            # Fits in the socket's buffer, so sending it here does not hold up the stream (the
            # timeout guards against a peer that shrank its buffer).
            try:
                conn.settimeout(2)
            except OSError:
                pass
            _finish(conn, payload)
        else:
            threading.Thread(target=_finish, args=(conn, payload), daemon=True).start()
    _cleanup(path)


def _cleanup(path):
    try:
        os.unlink(path)
    except OSError:
        pass
    os._exit(0)


def main():
    path = sys.argv[1]
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    server.listen(128)
    signal.signal(signal.SIGTERM, lambda *_: _cleanup(path))
    ready = {"pid": os.getpid(), "python": "%d.%d" % sys.version_info[:2]}
    _write_frame(READY, 0, json.dumps(ready).encode())
    threading.Thread(target=_pump, args=(path,), daemon=True).start()
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
