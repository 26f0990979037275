"""Real processes in end-to-end tests: wait for a condition, start and stop a controller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    retry_on: tuple[type[BaseException], ...] = (httpx.HTTPError, KeyError, TypeError, ValueError),
) -> T:
    """Poll `condition` until it returns something truthy, which is returned; the errors
    in `retry_on` count as not yet (a server still starting, a field not there yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
        except retry_on:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


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
