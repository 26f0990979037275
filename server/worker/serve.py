"""Serving `tidal worker`: bind the port, load the model, run the batcher behind uvicorn.

`server.worker.cli` parses and checks the cheap flags, then calls `serve`; this module
holds what needs torch and the web stack, so `tidal worker --help` loads neither.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket

import uvicorn

from adaptive.config import BatchConfig
from adaptive.latency import MemoryLimit
from server import ports
from server.api_token import TOKEN_ENV, api_token
from server.bus.redis_bus import RedisBus, connect
from server.http_edge import SMALL_BODY_BYTES, EdgeLimits, uvicorn_config
from server.worker.admission import QueueLimit
from server.worker.app import create_app
from server.worker.batching import DynamicBatcher
from server.worker.frontends import FrontendPool
from server.worker.link import WorkerLink
from server.worker.memory import describe_memory, measure_memory
from server.worker.models import load_model
from server.worker.runner import TorchRunner, compile_choice, parse_device
from tidal_base.errors import InvalidInput

log = logging.getLogger("tidal.worker")


def serve(
    args: argparse.Namespace, config: BatchConfig, queue_limit: QueueLimit, memory_budget: int
) -> int:
    """Everything that can fail on the user's input fails before the model loads."""
    device = parse_device(args.device)
    client = _redis_client(args.redis) if args.redis else None
    token = api_token(args.token_file)
    listening = listen(args.host, args.port)
    model = load_model(args.model)
    runner = TorchRunner(model, str(device), compile=compile_choice(args.compile, model))
    memory = measure_memory_bound(model, runner.device, memory_budget, args.memory_budget)
    batcher = DynamicBatcher(
        runner,
        config,
        instances=args.instances,
        queue_limit=queue_limit,
        memory=memory,
        padding_waste=model.padding_waste,
        group_key=_group_key(model, args.group_by_length),
    )
    limits = EdgeLimits(SMALL_BODY_BYTES, {"/v1/infer": args.max_body_bytes}, args.client_timeout)
    frontends = None
    if args.frontends:
        frontends = FrontendPool(
            args.frontends, args.model, model.codec, listening, limits, args.client_timeout
        )
    link = None
    if client is not None:
        bus = RedisBus(client, prefix=args.redis_prefix)
        name = args.name or f"{args.host}:{args.port}"
        link = WorkerLink(batcher, bus, args.pool, name, frontends=frontends)
    elif token is None:
        log.warning("no API token (%s or --token-file): PUT /v1/config is refused", TOKEN_ENV)
    app = create_app(model, batcher, link, token, limits=limits, frontends=frontends)
    if frontends is None:
        config = uvicorn_config(app, args.client_timeout, host=args.host, port=args.port)
        _DrainingServer(config).run(sockets=[listening])
    else:  # the front ends take the port; this process's own API is theirs alone
        config = uvicorn_config(app, args.client_timeout, uds=frontends.api_path)
        _DrainingServer(config).run()
    return 0


def measure_memory_bound(model, device, budget_bytes: int, budget_flag: str) -> MemoryLimit:
    """The largest batch the model fits (one probe forward pass: milliseconds), logged;
    a model whose parameters do not fit is one line naming the flag."""
    try:
        memory = measure_memory(model, device, budget_bytes)
    except InvalidInput as error:
        where = f"--memory-budget {budget_flag}" if device.type == "cpu" else f"--device {device}"
        raise InvalidInput(f"{where}: {model.name} does not fit: {error}") from None
    log.info(
        "memory: batches of up to %d fit, %s; caps above it are refused or clamped",
        memory.max_batch_size,
        describe_memory(memory),
    )
    return memory


def _group_key(model, wanted: bool):
    if not wanted:
        return None
    if model.length_group is None:
        raise InvalidInput(f"--group-by-length: {model.name} has fixed-size inputs")
    return model.length_group


def _redis_client(url: str):
    try:
        return connect(url)
    except ValueError as error:  # redis-py's word for a URL it cannot parse
        raise InvalidInput(f"--redis {url!r}: {error}") from None


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for uvicorn, or one line saying why there is none."""
    sock = ports.listen(host, port)
    sock.set_inheritable(True)
    return sock


class _DrainingServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process would die by
    the signal; a drained worker has done its job and exits 0."""

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
