"""HTTP(S) connections whose whole exchange (connect, send, the complete response) must be over by a deadline,
however slowly the peer trickles bytes: the `/retrieve` client's, the search-engine clients' and the chat
endpoint client's."""
from __future__ import annotations

import functools
import http.client
import socket
import ssl
import time
from typing import Any


class _Deadline:
    """Arms every receive and send with the time left before `deadline` (a `time.monotonic()` instant, None:
    never); past it, TimeoutError."""

    deadline: float | None = None

    def _arm(self) -> None:
        if self.deadline is None:
            return self.settimeout(None)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.settimeout(left)

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return super().recv_into(*args)

    def sendall(self, *args: Any) -> None:
        self._arm()
        super().sendall(*args)


class DeadlineSocket(_Deadline, socket.socket):
    """A plain socket under a deadline."""

    @classmethod
    def adopt(cls, sock: socket.socket) -> DeadlineSocket:
        """`sock`'s connection as a DeadlineSocket (`sock` is detached from it)."""
        return cls(fileno=sock.detach())


class DeadlineTLSSocket(_Deadline, ssl.SSLSocket):
    """A TLS socket under a deadline."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.sslsocket_class = DeadlineTLSSocket
    return context


def _timeout(deadline: float) -> float:
    return max(deadline - time.monotonic(), 1e-3)


class Connection(http.client.HTTPConnection):
    """An HTTP connection whose whole exchange must be over by `deadline`."""

    def __init__(self, host: str, port: int | None, deadline: float):
        super().__init__(host, port, timeout=_timeout(deadline))
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = DeadlineSocket.adopt(self.sock)
        self.sock.deadline = self.deadline


class TLSConnection(http.client.HTTPSConnection):
    """An HTTPS connection whose whole exchange must be over by `deadline`."""

    def __init__(self, host: str, port: int | None, deadline: float):
        super().__init__(host, port, timeout=_timeout(deadline), context=_tls_context())
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock.deadline = self.deadline
