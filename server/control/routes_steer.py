"""Steering a pool (tag `steer`): its policy, a shadow beside it, a pinned override,
declared events, and the rollout gate that replays recorded traffic through a candidate
policy.

Writes need the token (`Access.WRITE`, or `WRITE_BODY` where they take a JSON body: the
edge bounds it and documents its 400, 408 and 413); the events read needs it only with
--protect-reads. Every write goes to the pool's leader (409 on a standby).
"""

from __future__ import annotations

from fastapi import Query

from adaptive.config import BatchConfig
from forecaster.events import event_to_dict, events_from_document
from server.control.api_state import NOT_LEADER, POOL_READ, POOL_WRITE, UNKNOWN_POOL, Api, bus_call
from server.control.plane import InsufficientHistory
from server.control.pool_views import pool_summary
from server.control.route_table import Access, RouteTable
from server.control.schemas import (
    EventsRequest,
    GateResult,
    OverrideLifted,
    OverrideRequest,
    OverrideSet,
    PolicyRequest,
    PoolEvents,
    PoolSummary,
    ShadowRequest,
    SimulateRequest,
)
from server.http_errors import ApiError, error_responses
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_duration_s

routes = RouteTable("steer")


@routes.put(
    "/v1/pools/{pool}/policy",
    access=Access.WRITE_BODY,
    responses=error_responses(
        when=POOL_WRITE
        | {422: "a malformed body, or a policy spec that does not build (`field`: policy)"}
    ),
)
async def put_policy(pool: str, body: PolicyRequest, api: Api) -> PoolSummary:
    control = api.leading(pool)
    await bus_call(control.set_policy(body.policy))
    return await pool_summary(control)


@routes.put(
    "/v1/pools/{pool}/shadow",
    access=Access.WRITE_BODY,
    responses=error_responses(
        when=POOL_WRITE
        | {422: "a malformed body, or a policy spec that does not build (`field`: policy)"}
    ),
)
async def put_shadow(pool: str, body: ShadowRequest, api: Api) -> PoolSummary:
    """Run a policy beside the pool's from the next tick, with its own forecast, recorded
    in the decisions and never applied (how to try predictive before rolling it out);
    `null` lifts it. Persisted like the policy."""
    control = api.leading(pool)
    await bus_call(control.set_shadow(body.policy))
    return await pool_summary(control)


@routes.put(
    "/v1/pools/{pool}/override",
    access=Access.WRITE_BODY,
    responses=error_responses(
        when=POOL_WRITE
        | {
            422: "a malformed body, a config out of bounds, a duration that is not > 0, "
            "or replicas for a pool that does not scale (`field` names it)"
        }
    ),
)
async def put_override(pool: str, body: OverrideRequest, api: Api) -> OverrideSet:
    control = api.leading(pool)
    try:
        config = BatchConfig(body.max_batch, body.timeout_ms / 1e3, body.warm_max_batch)
    except InvalidInput as error:
        raise ApiError(422, str(error), "max_batch") from None
    for_s = _duration(body.duration, "duration")
    pinned = await bus_call(control.pin(config, for_s, body.reason, body.replicas), "replicas")
    return OverrideSet(pool=pool, override=pinned.to_dict())


@routes.delete(
    "/v1/pools/{pool}/override", access=Access.WRITE, responses=error_responses(when=POOL_WRITE)
)
async def delete_override(pool: str, api: Api) -> OverrideLifted:
    lifted = await bus_call(api.leading(pool).unpin())
    return OverrideLifted(pool=pool, lifted=lifted)


@routes.get(
    "/v1/pools/{pool}/events",
    access=Access.READ,
    responses=error_responses(when=POOL_READ),
    response_model_exclude_unset=True,
)
async def get_events(pool: str, api: Api) -> PoolEvents:
    return _events(pool, api.running(pool).events)


@routes.post(
    "/v1/pools/{pool}/events",
    access=Access.WRITE_BODY,
    responses=error_responses(
        when=POOL_WRITE | {422: "a malformed body, or an event that is not valid (`field`: events)"}
    ),
    response_model_exclude_unset=True,
)
async def post_events(pool: str, body: EventsRequest, api: Api) -> PoolEvents:
    control = api.leading(pool)
    try:
        added = events_from_document(body.events, "events")
    except InvalidInput as error:
        raise ApiError(422, str(error), "events") from None
    kept = tuple(e for e in control.events if e.name not in {a.name for a in added})
    await bus_call(control.set_events(kept + added))
    return _events(pool, control.events)


@routes.delete(
    "/v1/pools/{pool}/events",
    access=Access.WRITE,
    responses=error_responses(
        when=POOL_WRITE | {404: UNKNOWN_POOL + ", or no event of that name (`field`: name)"}
    ),
    response_model_exclude_unset=True,
)
async def delete_events(
    pool: str,
    api: Api,
    name: str | None = Query(None, description="only this event (default all)"),
) -> PoolEvents:
    control = api.leading(pool)
    kept = () if name is None else tuple(e for e in control.events if e.name != name)
    if name is not None and len(kept) == len(control.events):
        raise ApiError(404, f"no event named {name!r} in pool {pool!r}", "name")
    await bus_call(control.set_events(kept))
    return _events(pool, kept)


@routes.post(
    "/v1/pools/{pool}/simulate",
    access=Access.WRITE_BODY,
    responses=error_responses(
        when=POOL_WRITE
        | {
            409: NOT_LEADER + "; or the pool has recorded too little traffic for the gate "
            "(`field`: hours)",
            422: "a malformed body, or a candidate spec that does not build (`field`: candidate)",
        }
    ),
)
async def rollout_gate(pool: str, body: SimulateRequest, api: Api) -> GateResult:
    control = api.leading(pool)
    try:
        gate = control.rollout_gate(body.candidate, body.hours, body.seed)
        result = await bus_call(gate, field="candidate")
    except InsufficientHistory as error:
        raise ApiError(409, str(error), "hours") from None
    promoted = False
    if body.promote and result["no_worse_on_slo"]:
        # Built afresh from its spec: the replay's policy object holds state on the
        # replay's clock (an HPA's next sync at 3,601 s, windows that never expire).
        await bus_call(control.set_policy(body.candidate))
        promoted = True
    return GateResult.model_validate(
        {"pool": pool, "current_policy": control.policy_spec, **result, "promoted": promoted}
    )


def _events(pool: str, events) -> PoolEvents:
    return PoolEvents(pool=pool, events=[event_to_dict(e) for e in events])


def _duration(value: str | float, field: str) -> float:
    try:
        seconds = parse_duration_s(value, field=field)
    except InvalidInput as error:
        raise ApiError(422, str(error), field) from None
    if seconds <= 0:
        raise ApiError(422, f"{field} must be > 0", field)
    return seconds
