"""`tidal controller`: run the control plane for a pool beside its workers.

    tidal controller --redis redis://10.0.0.5:6379/0 --pool resnet --policy predictive \\
        --workers 8 --latency-model profile.json --events sales.yaml --port 8000

With `--redis none` the bus lives in this process: for one machine, with the workers
hosted here too (`--local-workers 2 --model demo-cnn`). The operator API (OpenAPI at
/docs) and /metrics serve on `--host:--port`; SIGTERM or Ctrl-C stop it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
from pathlib import Path

import uvicorn

from adaptive.fleet import FleetLimits
from adaptive.latency import parse_latency_model
from adaptive.learned_latency import LearningSettings
from forecaster.events import load_events
from server.api_token import TOKEN_ENV, api_token
from server.bus.local import LocalPoolBus
from server.bus.protocols import PoolBus
from server.bus.redis_bus import RedisBus, connect
from server.control.app import create_app
from server.control.metrics import ControllerMetrics
from server.control.plane import PoolControl, PoolPlan
from server.http_edge import EdgeLimits, uvicorn_config
from server.metrics_registry import process_registry
from server.ports import check_free
from server.tasks import cancel_and_wait
from simulations.cli import (
    DEFAULT_LATENCY_MODEL,
    duration_arg,
    parse_guardrails,
    positive_int_arg,
    warn_implausible_durations,
)
from simulations.engine import Routing
from tidal_base.errors import InvalidInput


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "controller", help="run the control plane: forecast, decide, push configs, serve the API"
    )
    bus = parser.add_argument_group("bus")
    bus.add_argument(
        "--redis",
        default="none",
        metavar="URL|none",
        help="redis://[user:password@]host:port/db or rediss://; none: in-process (default)",
    )
    bus.add_argument("--redis-prefix", default="tidal", help="key prefix (default tidal)")
    bus.add_argument("--name", help="this controller's name in leader election (default host:pid)")
    bus.add_argument("--lease", type=duration_arg, default=3.0, help="leader lease (default 3s)")
    pool = parser.add_argument_group("pool")
    pool.add_argument("--pool", default="default", help="the pool to control (default default)")
    pool.add_argument(
        "--policy", default="predictive", help="policy spec (default predictive; see docs)"
    )
    pool.add_argument("--shadow", help="a policy that decides beside, recorded, never applied")
    pool.add_argument("--slo", type=duration_arg, default=0.1, help="p99 SLO (default 100ms)")
    pool.add_argument("--tick", type=duration_arg, default=1.0, help="control tick (default 1s)")
    pool.add_argument(
        "--workers", type=positive_int_arg, default=1, help="workers the pool plans for"
    )
    pool.add_argument(
        "--warmup", type=duration_arg, default=0.0, help="warm-up time per batch-size bucket"
    )
    pool.add_argument(
        "--reload",
        type=duration_arg,
        default=0.0,
        help="model reload per config change (Triton: about 3s; default 0: changes are free)",
    )
    pool.add_argument(
        "--latency-model",
        default=DEFAULT_LATENCY_MODEL,
        help=f"linear:BASE_MS,PER_ITEM_MS or a profile JSON (default {DEFAULT_LATENCY_MODEL})",
    )
    pool.add_argument(
        "--latency-half-life",
        type=duration_arg,
        default=300.0,
        help="the latency model learned from serving forgets a batch measured this long "
        "ago by half (default 5m; a bare number is seconds)",
    )
    pool.add_argument(
        "--latency-drift",
        type=float,
        default=0.2,
        help="rebuild the planner's table when the learned mean or p99 at a batch size "
        "moves this far (relative) from the one planned with (default 0.2; 0: never, "
        "learn and show only)",
    )
    pool.add_argument(
        "--routing",
        choices=[r.value for r in Routing],
        default=Routing.ROUND_ROBIN.value,
        help="how the load balancer spreads requests (default round-robin)",
    )
    pool.add_argument(
        "--max-replicas",
        type=positive_int_arg,
        help="the replica count is the policy's to plan, up to N (from --workers): the "
        "API and /metrics (tidal_controller_desired_replicas) say how many the pool "
        "should have, for an autoscaler to act on",
    )
    pool.add_argument(
        "--min-replicas", type=positive_int_arg, help="with --max-replicas: the fewest (1)"
    )
    pool.add_argument(
        "--replica-startup",
        type=duration_arg,
        default=0.0,
        help="with --max-replicas: time from asking for a replica to its model loaded",
    )
    pool.add_argument("--events", type=Path, help="declared traffic events (YAML or JSON)")
    pool.add_argument("--guard", default="", help="guardrails, e.g. min_batch=4,dwell=60s")
    api = parser.add_argument_group("API")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--token-file", type=Path, help=f"bearer token for writes (else ${TOKEN_ENV})")
    api.add_argument("--protect-reads", action="store_true", help="reads need the token too")
    api.add_argument(
        "--client-timeout",
        type=duration_arg,
        default=10.0,
        help="close a connection whose request head, or answer 408 to one whose body, "
        "takes longer to arrive (default 10s)",
    )
    local = parser.add_argument_group("workers in this process (one machine)")
    local.add_argument("--local-workers", type=int, default=0, help="host N workers here")
    local.add_argument("--model", default="demo-cnn", help="their model (default demo-cnn)")
    local.add_argument(
        "--worker-port", type=int, default=8001, help="first worker's port (then +1, ...)"
    )
    local.add_argument(
        "--worker-config", default="max_batch=8,timeout=5ms", help="their starting config"
    )
    parser.set_defaults(handler=run_controller)


def make_bus(url: str, prefix: str) -> PoolBus:
    if url == "none":
        return LocalPoolBus()
    try:
        return RedisBus(connect(url), prefix=prefix)
    except ValueError as error:
        raise InvalidInput(f"--redis: {error}") from None


def plan_from(args: argparse.Namespace) -> PoolPlan:
    return PoolPlan(
        pool=args.pool,
        policy=args.policy,
        latency=parse_latency_model(args.latency_model),
        slo_s=args.slo,
        tick_s=args.tick,
        workers=args.workers,
        warmup_s=args.warmup,
        reload_s=args.reload,
        routing=Routing(args.routing),
        events=load_events(args.events) if args.events else (),
        guardrails=parse_guardrails(args.guard),
        shadow=args.shadow,
        lease_s=args.lease,
        fleet=_fleet_limits(args),
        learning=_learning(args),
    )


def _learning(args: argparse.Namespace) -> LearningSettings:
    if not (args.latency_drift >= 0 and math.isfinite(args.latency_drift)):
        raise InvalidInput(f"--latency-drift must be >= 0, got {args.latency_drift}")
    if args.latency_half_life <= 0:
        raise InvalidInput(f"--latency-half-life must be > 0, got {args.latency_half_life}")
    drift = args.latency_drift if args.latency_drift > 0 else math.inf
    return LearningSettings(half_life_s=args.latency_half_life, drift_threshold=drift)


def _fleet_limits(args: argparse.Namespace) -> FleetLimits | None:
    if args.max_replicas is None:
        if args.min_replicas is not None or args.replica_startup:
            raise InvalidInput("--min-replicas and --replica-startup need --max-replicas")
        return None
    limits = FleetLimits(args.min_replicas or 1, args.max_replicas, args.replica_startup)
    if limits.clamp(args.workers) != args.workers:
        raise InvalidInput(
            f"--workers {args.workers} must be within the replica limits "
            f"({limits.min_replicas}-{limits.max_replicas})"
        )
    return limits


def run_controller(args: argparse.Namespace) -> int:
    if args.lease <= args.tick:
        raise InvalidInput(
            f"--lease ({args.lease:g}s) must be longer than --tick ({args.tick:g}s): "
            "the leader renews its lease once a tick"
        )
    plan = plan_from(args)
    warn_implausible_durations("tidal controller", args.slo)
    token = api_token(args.token_file)
    if args.local_workers < 0:
        raise InvalidInput(f"--local-workers must be >= 0, got {args.local_workers}")
    if not args.client_timeout > 0:
        raise InvalidInput(f"--client-timeout must be > 0, got {args.client_timeout:g}s")
    ports = [args.port, *(args.worker_port + i for i in range(args.local_workers))]
    for port in ports:
        check_free(args.host, port)
    bus = make_bus(args.redis, args.redis_prefix)
    holder = args.name or f"{socket.gethostname()}:{os.getpid()}"
    registry = process_registry("controller")
    metrics = ControllerMetrics(registry)
    pools = {plan.pool: PoolControl(plan, bus, holder, metrics.observe)}
    for control in pools.values():
        control.prepare()  # a bad policy spec is one line and exit 2, before serving

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # Building a planning policy compiles its table (seconds): the API answers
        # meanwhile, /readyz says not ready until the pool ticks.
        starting = [asyncio.create_task(c.start()) for c in pools.values()]
        yield
        for task in starting:
            await cancel_and_wait(task)
        for control in pools.values():
            await control.stop()

    limits = EdgeLimits(read_timeout_s=args.client_timeout)
    app = create_app(pools, registry, metrics, token, args.protect_reads, lifespan, limits)
    servers = [_server(app, args.host, args.port, args.client_timeout)]
    servers += [
        _server(_local_worker(args, bus, i), args.host, args.worker_port + i, args.client_timeout)
        for i in range(args.local_workers)
    ]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if token is None:
        logging.getLogger("tidal.controller").warning(
            "no API token (%s or --token-file): write endpoints are refused", TOKEN_ENV
        )
    asyncio.run(_serve_all(servers))
    return 0


def _local_worker(args: argparse.Namespace, bus: PoolBus, index: int):
    # The worker's side needs torch (the worker extra); `tidal controller` alone does not.
    from server.worker.app import create_app as create_worker_app
    from server.worker.batching import DynamicBatcher
    from server.worker.cli import parse_config
    from server.worker.link import WorkerLink
    from server.worker.models import load_model
    from server.worker.runner import TorchRunner

    model = load_model(args.model)
    batcher = DynamicBatcher(TorchRunner(model, "cpu"), parse_config(args.worker_config))
    link = WorkerLink(batcher, bus, args.pool, f"local-{index}")
    return create_worker_app(model, batcher, link)


class _SharedLoopServer(uvicorn.Server):
    """Several servers share one event loop: signals are handled once, for all of them."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _server(app, host: str, port: int, client_timeout_s: float) -> uvicorn.Server:
    return _SharedLoopServer(uvicorn_config(app, client_timeout_s, host=host, port=port))


async def _serve_all(servers: list[uvicorn.Server]) -> None:
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stop)
    await asyncio.gather(*(server.serve() for server in servers))
