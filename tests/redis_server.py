"""A real redis-server on a free port, private to a test (no disk, no shared state)."""

from __future__ import annotations

import socket
import subprocess
import time
from contextlib import contextmanager

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def redis_server(*extra: str):
    """Yields the server's URL; `extra` are redis-server options (`--requirepass x`)."""
    server = RedisProcess(*extra)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


class RedisProcess:
    """A redis-server on a fixed port that a test can stop and start again."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.extra = extra
        password = extra[extra.index("--requirepass") + 1] if "--requirepass" in extra else None
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                if redis.Redis.from_url(self.url).ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None
