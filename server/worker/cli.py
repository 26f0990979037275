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
import contextlib
import logging
import signal
import socket
from pathlib import Path

import uvicorn

from adaptive.specs import PolicyContext, build_policy
from server.bus.redis_bus import RedisBus, connect
from server.http_auth import TOKEN_ENV, api_token
from server.worker.app import create_app
from server.worker.batching import DynamicBatcher
from server.worker.link import WorkerLink
from server.worker.models import load_model
from server.worker.runner import TorchRunner, parse_device
from tidal_base.errors import InvalidInput

log = logging.getLogger("tidal.worker")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    worker = subparsers.add_parser("worker", help="serve a model through the dynamic batcher")
    worker.add_argument(
        "--model", required=True, help="demo-cnn, demo-text, a TorchScript file or module:factory"
    )
    worker.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument("--port", type=int, default=8001)
    worker.add_argument(
        "--config", default="max_batch=32,timeout=10ms", help="starting batch config"
    )
    worker.add_argument("--max-queue", type=int, help="queue bound; past it requests get 429")
    worker.add_argument(
        "--instances", type=int, default=1, help="model instances (batches in flight)"
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
    worker.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each batch-size bucket when it is warmed (static shapes)",
    )
    worker.add_argument(
        "--group-by-length",
        action="store_true",
        help="batch variable-length inputs by length bucket (less padding; demo-text)",
    )
    worker.set_defaults(handler=run_worker)


def parse_config(text: str):
    """`max_batch=32,timeout=10ms[,warm=64]`, the static policy's grammar."""
    try:
        return build_policy(f"static:{text}", PolicyContext(0.1, 1)).initial_config()
    except InvalidInput as error:
        raise InvalidInput(f"--config: {str(error).split(': ', 1)[-1]}") from None


def _group_key(model, wanted: bool):
    if not wanted:
        return None
    if model.length_group is None:
        raise InvalidInput(f"--group-by-length: {model.name} has fixed-size inputs")
    return model.length_group


def run_worker(args: argparse.Namespace) -> int:
    config = parse_config(args.config)
    if args.instances < 1:
        raise InvalidInput(f"--instances must be >= 1, got {args.instances}")
    if args.max_queue is not None and args.max_queue < 1:
        raise InvalidInput(f"--max-queue must be >= 1, got {args.max_queue}")
    device = parse_device(args.device)
    client = _redis_client(args.redis) if args.redis else None
    token = api_token(args.token_file)
    listening = listen(args.host, args.port)
    model = load_model(args.model)
    runner = TorchRunner(model, str(device), compile=args.compile)
    batcher = DynamicBatcher(
        runner,
        config,
        instances=args.instances,
        max_queue=args.max_queue,
        padding_waste=model.padding_waste,
        group_key=_group_key(model, args.group_by_length),
    )
    link = None
    if client is not None:
        bus = RedisBus(client, prefix=args.redis_prefix)
        link = WorkerLink(batcher, bus, args.pool, args.name or f"{args.host}:{args.port}")
    elif token is None:
        log.warning("no API token (%s or --token-file): PUT /v1/config is refused", TOKEN_ENV)
    app = create_app(model, batcher, link, token)
    server_config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=30
    )
    _DrainingServer(server_config).run(sockets=[listening])
    return 0


def _redis_client(url: str):
    try:
        return connect(url)
    except ValueError as error:  # redis-py's word for a URL it cannot parse
        raise InvalidInput(f"--redis {url!r}: {error}") from None


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for uvicorn, or one line saying why there is none."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as error:
        sock.close()
        reason = getattr(error, "strerror", None) or str(error)
        raise InvalidInput(f"--host/--port: cannot listen on {host}:{port} ({reason})") from None
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
