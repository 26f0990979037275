"""What the live benchmarks share: `tidal` processes started on free ports, waited for
until ready and stopped however the benchmark ends."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from processes import free_ports, stop, wait_for

from server.tools.processes import torch_threads_env

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "tidal_process", "tidal_workers", "torch_threads_env"]


def tidal_process(argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen:
    """`tidal ARGV` from the checkout measured, its output in `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", *argv],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=ROOT,
    )


@contextlib.contextmanager
def tidal_workers(
    argv: list[str], count: int, env: Mapping[str, str], logs: Path, ready_s: float = 240
) -> Iterator[list[str]]:
    """`count` `tidal worker ARGV` processes on consecutive free ports, their base URLs
    yielded once each answers /readyz 200 (its starting buckets warm); stopped on exit.
    Their logs go to `logs`/worker-N.log."""
    logs.mkdir(parents=True, exist_ok=True)
    first = free_ports(count)
    urls = [f"http://127.0.0.1:{first + i}" for i in range(count)]
    processes = []
    try:
        for i in range(count):
            worker_argv = ["worker", *argv, "--port", str(first + i)]
            processes.append(tidal_process(worker_argv, env, logs / f"worker-{i}.log"))
        for i, (url, process) in enumerate(zip(urls, processes, strict=True)):
            wait_for(
                lambda url=url: httpx.get(f"{url}/readyz", timeout=2).status_code == 200,
                ready_s,
                f"worker {url}",
                process=process,
                log=logs / f"worker-{i}.log",
            )
        yield urls
    finally:
        for process in processes:
            stop(process, 30)
