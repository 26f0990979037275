"""How Tidal's tools start other Tidal processes that run torch."""

from __future__ import annotations

import os
from collections.abc import Mapping


def torch_threads_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with torch's intra-op threads set to
    `threads`: torch sizes its pool from OMP_NUM_THREADS (MKL's from MKL_NUM_THREADS) at
    start, and two workers on two cores at torch's default of every core thrash (58 ms a
    CNN image side by side against 3 ms alone: docs/control-plane.md)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    env = dict(os.environ if base is None else base)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env
