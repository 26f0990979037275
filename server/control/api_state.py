"""What the operator API's routes share: the pools it serves, found by name.

`create_app` puts one `ControlApi` on `app.state`; a handler asks for it by naming a
parameter of type `Api` (a FastAPI dependency), so routes live in modules of their own
(`routes_*.py`) with nothing captured from `create_app`. The lookups raise the API's
errors (unknown pool 404, not running 503, a write to a standby 409), and `bus_call`
turns a bus outage into a 503 and a spec that does not build into a 422. They run in
the handler, after FastAPI has validated the request: a malformed request is a 422
before its pool is looked up, as it always was.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from server.control.plane import InsufficientHistory, PoolControl
from server.http_errors import ApiError
from tidal_base.errors import InvalidInput

T = TypeVar("T")

UNKNOWN_POOL = "no pool of that name (`field`: pool)"
POOL_DOWN = "the pool is starting or failed to start (`field`: pool)"
BUS_DOWN = POOL_DOWN + ", or the bus is unreachable"
NOT_LEADER = "this controller does not lead the pool: write to the leader"
POOL_READ = {404: UNKNOWN_POOL, 503: POOL_DOWN}
"""What a route that reads one pool answers besides its own (for `error_responses`)."""
POOL_WRITE = {404: UNKNOWN_POOL, 409: NOT_LEADER, 503: BUS_DOWN}
"""What a route that writes to one pool answers besides its own."""


@dataclass(frozen=True, slots=True)
class ControlApi:
    """The pools this API serves, by name, and the registry `/metrics` exposes."""

    pools: Mapping[str, PoolControl]
    registry: CollectorRegistry

    def running(self, pool: str) -> PoolControl:
        """The pool named `pool`, with its control loop running."""
        control = self.pools.get(pool)
        if control is None:
            known = ", ".join(self.pools)
            raise ApiError(404, f"unknown pool {pool!r} (known: {known})", "pool")
        if control.loop is None:
            why = f"failed to start: {control.start_error}" if control.start_error else "starting"
            raise ApiError(503, f"pool {pool!r} is {why}", "pool")
        return control

    def leading(self, pool: str) -> PoolControl:
        """The running pool named `pool`, led by this controller: a standby's change
        would be overwritten when it next takes over."""
        control = self.running(pool)
        if not control.loop.state.leader:
            raise ApiError(409, f"this controller does not lead pool {pool!r}: write to the leader")
        return control


def control_api(request: Request) -> ControlApi:
    """The app's `ControlApi` (a FastAPI dependency: use the `Api` type)."""
    return request.app.state.control_api


Api = Annotated[ControlApi, Depends(control_api)]
"""A handler parameter typed `Api` receives the app's `ControlApi`."""


async def bus_call(awaitable: Awaitable[T], field: str = "policy") -> T:
    """Await a bus-backed operation: an unreachable bus is a 503, a bad spec a 422 that
    names `field` (the policy factories' own messages say what is wrong)."""
    try:
        return await awaitable
    except (RedisError, OSError) as error:
        raise ApiError(503, f"bus unreachable: {error}") from None
    except InsufficientHistory:
        raise
    except InvalidInput as error:
        raise ApiError(422, str(error), field) from None
