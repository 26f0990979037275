"""`tidal controller`: run the control plane for a pool beside its workers.

    tidal controller --redis redis://10.0.0.5:6379/0 --pool resnet --policy predictive \\
        --workers 8 --latency-model profile.json --events sales.yaml --port 8000

With `--redis none` the bus lives in this process: for one machine, with the workers
hosted here too (`--local-workers 2 --model demo-cnn`). The operator API (OpenAPI at
/docs) and /metrics serve on `--host:--port`; SIGTERM or Ctrl-C stop it cleanly.

This module registers the flags and checks what needs nothing loaded; serving is
`server.control.serve`, imported only then, so `--help` loads no web stack.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from server.api_token import TOKEN_ENV
from simulations.cli import DEFAULT_LATENCY_MODEL, ROUTINGS, duration_arg, positive_int_arg
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
        "--workers",
        type=positive_int_arg,
        default=1,
        help="workers in the pool, which the policy plans its configs for (default 1; with "
        "--max-replicas, the count it starts from)",
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
        choices=ROUTINGS,
        default="round-robin",
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
    api.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the API (and any --local-workers) listen on; 0.0.0.0 for every "
        "interface (default 127.0.0.1)",
    )
    api.add_argument("--port", type=int, default=8000, help="the API's port (default 8000)")
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


def run_controller(args: argparse.Namespace) -> int:
    """Check what needs nothing loaded, then serve (the web stack loads only now)."""
    if args.lease <= args.tick:
        raise InvalidInput(
            f"--lease ({args.lease:g}s) must be longer than --tick ({args.tick:g}s): "
            "the leader renews its lease once a tick"
        )
    from server.control.serve import serve

    return serve(args)
