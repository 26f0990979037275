"""`tidal engine triton`: make a Triton model a member of a pool, steered from beside it.

    tidal engine triton --redis redis://10.0.0.5:6379/0 --pool resnet \\
        --grpc 127.0.0.1:8001 --metrics http://127.0.0.1:8002/metrics --model resnet

One process per Triton model, next to Triton (it needs Triton's gRPC port, for config
overrides, and its metrics port). Every flag is checked before anything connects, so a
mistake costs one line and exit 2; then it waits for the model to be ready (`--wait`),
joins the pool and follows its configs until SIGTERM or Ctrl-C. The engine is
`server.engines.triton.TritonEngine` on a `server.engines.member.PoolMember`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from simulations.cli import duration_arg
from tidal_base.errors import InvalidInput

log = logging.getLogger("tidal.triton")

LEAVE_TIMEOUT_S = 10.0
"""How long the member may take to send its last window when the process stops."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    engine = subparsers.add_parser(
        "engine", help="join an engine you run (Triton) to a pool, steered by the controller"
    )
    engines = engine.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    triton = engines.add_parser(
        "triton", help="a Triton model: config overrides over gRPC, stats from /metrics"
    )
    triton.add_argument(
        "--redis",
        required=True,
        metavar="URL",
        help="the pool's bus: redis://[user:password@]host:port/db or rediss://",
    )
    triton.add_argument("--redis-prefix", default="tidal", help="key prefix (default tidal)")
    triton.add_argument("--pool", required=True, help="the pool this model serves")
    triton.add_argument(
        "--grpc", default="127.0.0.1:8001", metavar="HOST:PORT", help="Triton's gRPC address"
    )
    triton.add_argument(
        "--metrics",
        default="http://127.0.0.1:8002/metrics",
        metavar="URL",
        help="Triton's Prometheus metrics (default http://127.0.0.1:8002/metrics)",
    )
    triton.add_argument("--model", required=True, help="the model in Triton's repository")
    triton.add_argument("--name", help="this member's name in the pool (default host:model)")
    triton.add_argument(
        "--reload",
        type=duration_arg,
        default=3.0,
        help="what a change costs until a reload is timed (default 3s)",
    )
    triton.add_argument(
        "--interval", type=duration_arg, default=1.0, help="stats window (default 1s)"
    )
    triton.add_argument(
        "--wait",
        type=duration_arg,
        default=60.0,
        help="how long to wait for the model to be ready (default 60s)",
    )
    triton.set_defaults(handler=run_triton)


@dataclass(frozen=True, slots=True)
class TritonFlags:
    """The checked flags."""

    redis: str
    grpc: str
    metrics: str
    model: str
    name: str


def check_flags(args: argparse.Namespace) -> TritonFlags:
    """Every flag, checked before anything connects: one line naming the flag."""
    _check_redis(args.redis)
    grpc = _host_port(args.grpc, "--grpc")
    metrics = _http_url(args.metrics, "--metrics")
    if not args.model.strip():
        raise InvalidInput("--model must name a model")
    if not args.pool.strip():
        raise InvalidInput("--pool must name a pool")
    if args.interval <= 0:
        raise InvalidInput(f"--interval must be > 0, got {args.interval:g}s")
    if args.wait < 0:
        raise InvalidInput(f"--wait must be >= 0, got {args.wait:g}s")
    name = args.name or f"{socket.gethostname()}:{args.model}"
    return TritonFlags(args.redis, grpc, metrics, args.model, name)


def _check_redis(url: str) -> None:
    from server.bus.redis_bus import connect  # redis-py: the triton extra has it

    try:
        connect(url)
    except ValueError as error:  # redis-py's word for a URL it cannot parse
        raise InvalidInput(f"--redis {url!r}: {error}") from None


def _host_port(text: str, flag: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"{flag} must be HOST:PORT (a port 1-65535), got {text!r}")
    return text


def _http_url(text: str, flag: str) -> str:
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as error:
        raise InvalidInput(f"{flag} {text!r}: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{flag} must be an http(s)://host:port/path URL, got {text!r}")
    if port is None and ":" in parts.netloc.rsplit("@", 1)[-1]:
        raise InvalidInput(f"{flag} has no port number: {text!r}")
    return text


def run_triton(args: argparse.Namespace) -> int:
    flags = check_flags(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per scrape otherwise
    return asyncio.run(_serve(args, flags))


async def _serve(args: argparse.Namespace, flags: TritonFlags) -> int:
    from server.bus.redis_bus import RedisBus, connect
    from server.clock import LoopClock
    from server.engines.member import PoolMember
    from server.engines.protocols import ConfigRejected
    from server.engines.triton import TritonEngine, TritonUnreachable
    from server.tasks import BackgroundErrors

    errors = BackgroundErrors()
    engine = TritonEngine(
        flags.grpc,
        flags.metrics,
        flags.model,
        flags.name,
        LoopClock(),
        errors,
        reload_s=args.reload,
    )
    try:
        await _start_within(engine, args.wait)
    except (TritonUnreachable, ConfigRejected) as error:
        await engine.close()
        raise InvalidInput(f"--model {flags.model!r} on {flags.grpc}: {error}") from None
    member = PoolMember(
        engine,
        RedisBus(connect(flags.redis), prefix=args.redis_prefix),
        args.pool,
        flags.name,
        engine.clock,
        errors,
        interval_s=args.interval,
    )
    member.start()
    log.info(
        "triton model %s (%s) in pool %s as %s: serving %s",
        flags.model,
        flags.grpc,
        args.pool,
        flags.name,
        engine.status()["serving_max_batch"],
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stopping.set)
    await stopping.wait()
    log.info("stopping: the model keeps serving config v%d", engine.version)
    await leave_pool(member)
    await engine.close()
    return 0


async def leave_pool(member, timeout_s: float = LEAVE_TIMEOUT_S) -> None:
    """Stop `member` (its last window sent) within `timeout_s`. The member rides out
    Redis or Triton being gone; anything else (a hang, a bug) is logged with its
    traceback, and the process goes on to exit: the model serves on either way."""
    try:
        await asyncio.wait_for(member.stop(), timeout=timeout_s)
    except Exception:
        log.exception("leaving the pool failed (its last window may be lost)")


async def _start_within(engine, wait_s: float) -> None:
    """Start the engine, retrying while Triton is not up yet (it may start after us)."""
    from server.engines.triton import TritonUnreachable

    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            await engine.start()
            return
        except TritonUnreachable:
            await engine.close()
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(0.5)
