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
import selectors
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


def _finish(conn, payload, timeout=None):
    try:
        conn.settimeout(timeout)
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()


class _Incoming:
    """A request being read: its parts so far, or None once it went over the limit."""

    __slots__ = ("parts", "size")

    def __init__(self):
        self.parts = []
        self.size = 0


def _read_some(selector, conn, incoming):
    # Whatever is there already, up to 16 MiB per turn (other connections get theirs next): a
    # request and its end of file usually arrive together, and are then handled in one wake.
    for _ in range(16):
        try:
            chunk = conn.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            selector.unregister(conn)
            conn.close()
            return
        if not chunk:
            break
        incoming.size += len(chunk)
        if incoming.size > MAX_MESSAGE_BYTES:
            incoming.parts = None
        elif incoming.parts is not None:
            incoming.parts.append(chunk)
    else:
        return
    selector.unregister(conn)
    if incoming.parts is None:
        reply = _error_reply("Code Mode request of %d bytes exceeds the limit of %d bytes"
                             % (incoming.size, MAX_MESSAGE_BYTES))
        threading.Thread(target=_finish, args=(conn, reply, 10), daemon=True).start()
        return
    with _pending_lock:
        _next_id[0] = (_next_id[0] + 1) & 0xFFFFFFFF
        rid = _next_id[0]
        _pending[rid] = conn
    try:
        _write_frame(REQUEST, rid, b"".join(incoming.parts))
    except OSError:
        os._exit(0)


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
        sent = 0
        if len(payload) <= INLINE_REPLY_BYTES:
            # Usually fits in the socket's buffer: sent here without blocking the stream.
            try:
                sent = conn.send(payload)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                conn.close()
                continue
            if sent == len(payload):
                try:
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                conn.close()
                continue
        # The rest waits for the client on its own thread.
        threading.Thread(target=_finish, args=(conn, payload[sent:]), daemon=True).start()
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
    # Requests are read on this thread, all connections at once; replies go out from the pump.
    server.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is None:
                try:
                    conn, _ = server.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                conn.setblocking(False)
                incoming = _Incoming()
                selector.register(conn, selectors.EVENT_READ, incoming)
                _read_some(selector, conn, incoming)
            else:
                _read_some(selector, key.fileobj, key.data)


if __name__ == "__main__":
    main()
