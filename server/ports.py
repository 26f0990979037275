"""Listening sockets, asked for before any slow work (a profile, a model load), so a port
that is taken fails the command in its first second with one line naming it."""

from __future__ import annotations

import socket

from tidal_base.errors import InvalidInput


def listen(host: str, port: int, flag: str = "--host/--port") -> socket.socket:
    """A socket bound to host:port (for uvicorn to serve on), or InvalidInput saying why."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as error:
        sock.close()
        reason = getattr(error, "strerror", None) or str(error)
        raise InvalidInput(f"{flag}: cannot listen on {host}:{port} ({reason})") from None
    return sock


def check_free(host: str, port: int, flag: str = "--host/--port") -> None:
    """InvalidInput if nothing could listen on host:port now."""
    listen(host, port, flag).close()
