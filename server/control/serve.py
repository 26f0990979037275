"""Running `tidal controller`: the bus, the pool's control, the API and its servers.

`server.control.cli` registers and checks the flags, then calls `serve`; this module
holds what needs the web stack, Redis and the simulator, so `tidal controller --help`
loads none of them.
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
    parse_guardrails,
    warn_bare_guard_durations,
    warn_bare_policy_durations,
    warn_implausible_durations,
)
from simulations.engine import Routing
from tidal_base.errors import InvalidInput


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


def serve(args: argparse.Namespace) -> int:
    """Everything that can fail on the user's input fails before anything serves."""
    plan = plan_from(args)
    _warn(args)
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


def _warn(args: argparse.Namespace) -> None:
    """Durations that are most likely milliseconds written without a unit."""
    prog = "tidal controller"
    warn_implausible_durations(prog, args.slo)
    for spec in filter(None, (args.policy, args.shadow)):
        warn_bare_policy_durations(prog, spec)
    warn_bare_guard_durations(prog, args.guard)
    if args.local_workers > 0:
        config = args.worker_config
        warn_bare_policy_durations(prog, f"static:{config}", f"--worker-config {config}")


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
