"""Real processes in end-to-end tests: free ports, wait for a condition, start and stop a
controller."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 (a controller's API and
    its local workers take a block: one free port says nothing of the next)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count <= 65536 and all(_free(first + i) for i in range(1, count)):
            return first


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    retry_on: tuple[type[BaseException], ...] = (httpx.HTTPError, KeyError, TypeError, ValueError),
    process: subprocess.Popen | None = None,
    log: Path | None = None,
) -> T:
    """Poll `condition` until it returns something truthy, which is returned; the errors
    in `retry_on` count as not yet (a server still starting, a field not there yet).
    With `process`, its exit fails at once, with the end of its `log`: a server that
    died is not waited for."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"{what} exited ({process.returncode}) while waited for:\n{_tail(log)}"
            )
        try:
            value = condition()
        except retry_on:
            value = None
        if value:
            return value
        time.sleep(0.1)
    tail = f":\n{_tail(log)}" if log is not None else ""
    raise AssertionError(f"timed out waiting for {what}{tail}")


def _tail(log: Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return "(no log)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def start_controller(args: list[str], log: Path) -> subprocess.Popen:
    """`tidal controller` with `args`, its output in `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", "controller", *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def stop(process: subprocess.Popen, timeout_s: float = 20) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
