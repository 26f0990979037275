"""The pool's desired replica count, carried out by Ray Serve's own autoscaler.

Tidal's controller plans the replica count with the batches (`--max-replicas`) and
publishes it on the bus (`{prefix}:{pool}:replicas`). `TidalReplicas` is a Ray Serve
custom autoscaling policy (`autoscaling_config.policy`, Ray 2.60) that returns that count,
so Serve starts and stops replicas as it always does (placement, health checks, graceful
drain) and Tidal only says how many:

    DemoCnn.options(autoscaling_config=tidal_autoscaling_config("cnn", url, 1, 3))

Serve calls a policy on its controller's event loop every 0.1 s, so the policy never
waits on Redis there: a daemon thread reads the key every `poll_s` and the policy returns
the last count read. Fail-static: before a count is known, or while Redis is away, it
keeps Serve's current target (the fleet stays as it is; nothing scales on missing
data); every failure to read is logged with its cause, the first of a streak as a
warning and its end with the streak's length. Serve bounds the count by the config's
`min_replicas`/`max_replicas` and would delay it by `upscale_delay_s`/`downscale_delay_s`
(30 s and 600 s by default): `tidal_autoscaling_config` sets both delays to 0, since
the controller already times its decisions (it scales out ahead by the start-up and
scales in only on load measured over its own window).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Protocol

import redis

from server.bus.redis_bus import parse_desired_replicas, pool_key
from server.engines.ray_serve import MemberSettings

log = logging.getLogger("tidal.ray_serve")


class ScalingContext(Protocol):
    """What the policy reads of Serve's `AutoscalingContext`."""

    target_num_replicas: int
    policy_state: dict[str, Any]


class TidalReplicas:
    """A Ray Serve autoscaling policy class: `__call__(ctx)` returns the pool's desired
    replicas as last read (every `poll_s`; Serve instantiates the class once, with
    `policy_kwargs`). `pool`, `redis_url` and `redis_prefix` default to $TIDAL_POOL,
    $TIDAL_REDIS_URL and $TIDAL_REDIS_PREFIX of Serve's controller process."""

    def __init__(
        self,
        pool: str | None = None,
        redis_url: str | None = None,
        redis_prefix: str | None = None,
        poll_s: float | None = 0.5,
    ) -> None:
        settings = MemberSettings(pool, redis_url, redis_prefix).resolved(os.environ)
        assert settings.pool and settings.redis_url and settings.redis_prefix
        self.pool = settings.pool
        self.key = pool_key(settings.redis_prefix, settings.pool, "replicas")
        self.desired: int | None = None
        self.read_at: float | None = None  # Unix time of the last successful read
        self.failed_reads = 0
        self._ignored: str | None = None
        self._streak = 0  # failed reads in a row
        self._client = redis.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_timeout=1, socket_connect_timeout=1
        )
        self._halt = threading.Event()
        self._reader: threading.Thread | None = None
        if poll_s is not None:  # None: the caller refreshes (tests)
            self._reader = threading.Thread(
                target=self._poll, args=(poll_s,), name="tidal-replicas", daemon=True
            )
            self._reader.start()

    def __call__(self, ctx: ScalingContext) -> tuple[int, dict[str, Any]]:
        desired = self.desired
        state = {
            **ctx.policy_state,
            "tidal_desired_replicas": desired,
            "tidal_read_at": self.read_at,
            "tidal_failed_reads": self.failed_reads,
        }
        if desired is None:  # nothing known yet, or never readable: hold the fleet
            return ctx.target_num_replicas, state
        return desired, state

    def close(self) -> None:
        self._halt.set()
        if self._reader is not None:
            self._reader.join(5)
        self._client.close()

    def refresh(self) -> bool:
        """Read the stored count once; False (logged at the first of a streak, counted)
        when Redis cannot be read. A missing key keeps the last count known: a Redis
        that lost its data gets the count again when a controller next leads."""
        try:
            text = self._client.get(self.key)
        except (redis.RedisError, OSError) as error:
            self.failed_reads += 1
            self._streak += 1
            if self._streak == 1:
                log.warning(
                    "%s: cannot read the desired replicas (%r); Serve keeps its target",
                    self.pool,
                    error,
                )
            return False
        if self._streak:
            log.info("%s: desired replicas readable again after %d tries", self.pool, self._streak)
            self._streak = 0
        desired = parse_desired_replicas(text)
        if text is not None and desired is None and text != self._ignored:
            log.warning("%s: %s holds %r, not a replica count; ignored", self.pool, self.key, text)
            self._ignored = text  # said once per bad value, not every poll
        if desired is not None and desired != self.desired:
            log.info("%s: desired replicas %s -> %d", self.pool, self.desired, desired)
            self.desired = desired
        self.read_at = time.time()
        return True

    def _poll(self, every_s: float) -> None:
        while not self._halt.is_set():
            self.refresh()
            self._halt.wait(every_s)


def tidal_autoscaling_config(
    pool: str,
    redis_url: str,
    min_replicas: int,
    max_replicas: int,
    initial_replicas: int | None = None,
    redis_prefix: str = "tidal",
) -> dict[str, Any]:
    """A deployment's `autoscaling_config` whose replica count Tidal's controller sets:
    Serve's bounds as given (match the controller's --min-replicas/--max-replicas), its
    own delays off."""
    return {
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "initial_replicas": initial_replicas or min_replicas,
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "policy": {
            "policy_function": f"{__name__}:TidalReplicas",
            "policy_kwargs": {"pool": pool, "redis_url": redis_url, "redis_prefix": redis_prefix},
        },
    }
