"""A raw HTTP server for client tests: each connection gets a scripted reply (bytes, or a function of the
socket that may trickle or hang), after its request has been read."""
from __future__ import annotations

import socket
import threading
import time


def response(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers))
    return head.encode() + b"\r\n" + body


def read_request(conn: socket.socket) -> None:
    """Reads one request (headers, then a Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(65536)


def trickled(data: bytes, interval: float = 0.1):
    """A reply that sends `data` a byte every `interval` seconds."""
    def reply(conn: socket.socket) -> None:
        for byte in data:
            conn.sendall(bytes([byte]))
            time.sleep(interval)
    return reply


class ScriptedServer:
    """Serves connections one at a time: the i-th gets replies[i] (the last one from then on), raw bytes sent
    whole or a function of the socket, after its request has been read."""

    def __init__(self, *replies):
        self.replies, self.connections = replies, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # shut down
                return
            reply = self.replies[min(self.connections, len(self.replies) - 1)]
            self.connections += 1
            with conn:
                try:
                    read_request(conn)
                    reply(conn) if callable(reply) else conn.sendall(reply)
                except OSError:  # the client gave up
                    pass

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.sock.close()
        self.thread.join()
