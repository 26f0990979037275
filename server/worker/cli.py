"""`tidal worker`: serve a model over HTTP through Tidal's dynamic batcher.

    tidal worker --model demo-cnn --port 8001 --config max_batch=32,timeout=10ms

Checks what it can first (config, device, Redis URL, token file, and that it can listen
on host:port: the socket is bound before the model loads and handed to uvicorn), so a
mistake costs one line and exit 2, not a warm-up. Then loads the model, warms the
buckets of its starting config, and serves until SIGTERM or Ctrl-C, which drain: stop
accepting, finish what is queued, exit 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from server.api_token import TOKEN_ENV
from server.worker.admission import QueueLimit
from server.worker.defaults import MAX_BODY_BYTES
from simulations.cli import duration_arg
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_size_bytes

MEMORY_BUDGET = "8GiB"
"""What stands for device memory on CPU when bounding caps (as `tidal profile`'s)."""
SLO_S = 0.1
"""As the controller's default, so a worker and its pool agree unless told otherwise."""
CLIENT_TIMEOUT_S = 10.0
"""A slow client (one byte every few seconds) would otherwise hold a connection forever."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    worker = subparsers.add_parser("worker", help="serve a model through the dynamic batcher")
    worker.add_argument(
        "--model",
        required=True,
        help="demo-cnn, demo-ranker, demo-text, a TorchScript file or module:factory",
    )
    worker.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    worker.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; 0.0.0.0 for every interface (default 127.0.0.1)",
    )
    worker.add_argument("--port", type=int, default=8001, help="port to listen on (default 8001)")
    worker.add_argument(
        "--config",
        default="max_batch=32,timeout=10ms",
        help="starting batch config, e.g. max_batch=32,timeout=10ms (a bare number is seconds)",
    )
    worker.add_argument(
        "--slo",
        type=duration_arg,
        default=SLO_S,
        help="the latency objective; by default the queue holds what the measured service "
        f"rate clears within it, and sheds (429) past that (default {SLO_S * 1e3:g}ms)",
    )
    worker.add_argument(
        "--max-queue",
        metavar="N|none",
        help="a fixed queue bound instead of the SLO's (past it requests get 429), or none "
        "for an unbounded queue",
    )
    worker.add_argument(
        "--memory-budget",
        default=MEMORY_BUDGET,
        help="device memory on CPU: caps are bounded by the largest batch the model fits in "
        f"it, measured at start as tidal profile does (default {MEMORY_BUDGET})",
    )
    worker.add_argument(
        "--instances", type=int, default=1, help="model instances (batches in flight)"
    )
    worker.add_argument(
        "--frontends",
        type=int,
        default=0,
        help="front-end processes that parse HTTP and decode inputs, handing ready tensors "
        "to this process's one batcher through shared memory (default 0: all in one process)",
    )
    worker.add_argument(
        "--max-body-bytes",
        type=int,
        default=MAX_BODY_BYTES,
        help=f"refuse a larger request body with 413, unread (default {MAX_BODY_BYTES})",
    )
    worker.add_argument(
        "--client-timeout",
        type=duration_arg,
        default=CLIENT_TIMEOUT_S,
        help="close a connection whose request head, or answer 408 to one whose body, "
        f"takes longer to arrive (default {CLIENT_TIMEOUT_S:g}s)",
    )
    worker.add_argument("--pool", default="default", help="the pool this worker serves")
    worker.add_argument(
        "--redis",
        metavar="URL",
        help="join the pool on this Redis (redis://[user:password@]host:port/db, rediss://)",
    )
    worker.add_argument("--redis-prefix", default="tidal", help="key prefix (default tidal)")
    worker.add_argument("--name", help="worker name on the bus (default host:port)")
    worker.add_argument(
        "--token-file",
        type=Path,
        help=f"bearer token for PUT /v1/config without a pool (else ${TOKEN_ENV})",
    )
    add_compile_flag(worker)
    worker.add_argument(
        "--group-by-length",
        action="store_true",
        help="batch variable-length inputs by length bucket (less padding; demo-text)",
    )
    worker.set_defaults(handler=run_worker)


def add_compile_flag(parser: argparse.ArgumentParser) -> None:
    """`--compile/--no-compile`, the worker's and `tidal profile`'s alike: None when
    neither is given, so the model decides (`server.worker.runner.compile_choice`)."""
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile each batch-size bucket when it is warmed (static shapes: each "
        "warm-up pays its compile); default: the model's choice (demo-ranker compiles, "
        "demo-cnn, demo-text and loaded files do not)",
    )


def parse_config(text: str):
    """`max_batch=32,timeout=10ms[,warm=64]`, the static policy's grammar."""
    from adaptive.specs import PolicyContext, build_policy  # numpy: not for --help

    try:
        return build_policy(f"static:{text}", PolicyContext(0.1, 1)).initial_config()
    except InvalidInput as error:
        raise InvalidInput(f"--config: {str(error).split(': ', 1)[-1]}") from None


def parse_queue_limit(max_queue: str | None, slo_s: float) -> QueueLimit:
    """`--max-queue N` (a fixed bound), `none` (unbounded), or absent (from `--slo`)."""
    if not slo_s > 0:
        raise InvalidInput(f"--slo must be > 0, got {slo_s:g}s")
    if max_queue is None:
        return QueueLimit(wait_s=slo_s)
    if max_queue.strip().lower() == "none":
        return QueueLimit()
    try:
        count = int(max_queue)
    except ValueError:
        count = 0
    if count < 1:
        raise InvalidInput(f"--max-queue must be an integer >= 1 or none, got {max_queue!r}")
    return QueueLimit(max_queue=count)


def run_worker(args: argparse.Namespace) -> int:
    """Check the cheap things first (one line and exit 2 for a mistake), then serve."""
    from server.worker.serve import serve  # torch, the web stack: only when serving
    from simulations.cli import warn_bare_policy_durations, warn_implausible_durations

    config = parse_config(args.config)
    bare = warn_bare_policy_durations(
        "tidal worker", f"static:{args.config}", f"--config {args.config}"
    )
    timeouts = [] if "timeout" in bare else [("--config", config.timeout_s)]
    warn_implausible_durations("tidal worker", args.slo, timeouts)
    if args.instances < 1:
        raise InvalidInput(f"--instances must be >= 1, got {args.instances}")
    queue_limit = parse_queue_limit(args.max_queue, args.slo)
    memory_budget = parse_size_bytes(args.memory_budget, field="--memory-budget")
    if memory_budget <= 0:
        raise InvalidInput(f"--memory-budget must be > 0, got {args.memory_budget!r}")
    if not 0 <= args.frontends <= 64:
        raise InvalidInput(f"--frontends must be in 0..64, got {args.frontends}")
    if args.max_body_bytes < 1024:
        raise InvalidInput(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    if not args.client_timeout > 0:
        raise InvalidInput(f"--client-timeout must be > 0, got {args.client_timeout:g}s")
    return serve(args, config, queue_limit, memory_budget)
