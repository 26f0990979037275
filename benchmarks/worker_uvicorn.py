"""`tidal worker` served with another uvicorn HTTP protocol and event loop.

    python benchmarks/worker_uvicorn.py h11 asyncio --model demo-cnn --port 8000 ...

For benchmarks/http_steps.py, which measures what each step of the HTTP path saves: the
worker is the same in every other respect; only the `uvicorn.Config` it serves with is
swapped (the shipped one adds a deadline on request heads to httptools on uvloop,
`server.http_edge`).
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

import server.worker.serve
from server.cli import main as tidal


def uvicorn_config_with(http: str, loop: str):
    def config(app: Any, header_timeout_s: float = 10.0, **kwargs: Any) -> uvicorn.Config:
        del header_timeout_s  # the shipped protocol's deadline; h11's has its own timeouts
        return uvicorn.Config(
            app, http=http, loop=loop, log_level="warning", timeout_graceful_shutdown=30,
            **kwargs,
        )  # fmt: skip

    return config


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("h11", "httptools") or argv[1] not in ("asyncio", "uvloop"):
        print(
            "usage: worker_uvicorn.py {h11,httptools} {asyncio,uvloop} WORKER_ARGS...",
            file=sys.stderr,
        )
        return 2
    server.worker.serve.uvicorn_config = uvicorn_config_with(argv[0], argv[1])
    return tidal(["worker", *argv[2:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
