"""The design's keystone: the simulator's per-policy driver and the live control loop,
fed the same trace, warm-up and events, decide the same things at the same ticks.

The live side is the real `ControlLoop` on a `LocalPoolBus`: a simulated pool (the
simulator's engine) plays the workers, running whatever config the bus holds, and
reports its stats and heartbeat over the bus each tick; the loop reads them, builds the
observation, steps the controller, numbers versions and logs decisions on the bus. A
manual clock makes both sides tick at the same instants. If the live shell built its
observation differently (another worker count, another window, another warm state), or
published, numbered or applied configs differently, the decision logs would differ.
"""

import asyncio

import numpy as np
import pytest

from adaptive.clock import ManualClock
from adaptive.controller import Controller
from adaptive.guards import Guardrails
from adaptive.latency import LinearLatency
from adaptive.specs import build_policy
from forecaster.events import Event
from server.bus.local import LocalPoolBus
from server.control.loop import ControlLoop
from simulations.arrivals import ArrivalStream
from simulations.cli import policy_context
from simulations.engine import PoolSettings, SimulatedPool
from simulations.run import SimulationSettings, pool_report, simulate
from simulations.traces import CountTrace

LATENCY = LinearLatency(base_s=0.005, per_item_s=0.0004)
POOL = "simulated"  # the name the simulator gives its pool


def trace() -> CountTrace:
    """A quiet minute, a ramp, noise, and a declared step to 6x at 150 s."""
    rng = np.random.default_rng(7)
    base = np.concatenate([np.full(60, 200.0), np.linspace(200, 900, 60), np.full(120, 900.0)])
    base[150:210] *= 6
    return CountTrace("parity", 1.0, np.maximum(0, base + rng.normal(0, 30, base.size)))


SETTINGS = SimulationSettings(
    pool=PoolSettings(workers=3, slo_s=0.1, warmup_s=4.0),
    tick_s=1.0,
    seed=11,
    events=(Event("sale", 150.0, 210.0, multiplier=6.0),),
    guardrails=Guardrails(dwell_s=10.0),
)


def simulated_decisions(spec: str) -> list[dict]:
    policy = build_policy(spec, policy_context(trace(), LATENCY, SETTINGS.pool))
    (result,) = simulate(trace(), [policy], SETTINGS, LATENCY).results
    return [r.to_dict() for r in result.decisions]


async def live_decisions(spec: str) -> list[dict]:
    settings, bus, clock = SETTINGS, LocalPoolBus(), ManualClock()
    policy = build_policy(spec, policy_context(trace(), LATENCY, settings.pool))
    controller = Controller(policy, settings.controller_settings(POOL))
    loop = ControlLoop(controller, bus, "controller", lease_s=60.0, clock=clock)
    arrival_seed, jitter_seed = np.random.SeedSequence(settings.seed).spawn(2)
    stream = ArrivalStream(
        trace().arrival_chunks(settings.chunk_s, np.random.default_rng(arrival_seed))
    )
    pool = SimulatedPool(settings.pool, LATENCY, np.random.default_rng(jitter_seed))
    await loop.tick()  # elected with no stats yet: publishes the initial config, v1
    tick = 0
    while True:
        start, end = tick * settings.tick_s, (tick + 1) * settings.tick_s
        running = await bus.current_config(POOL)  # the workers run what the bus holds
        stats = pool.advance(start, end, stream.take_until(end), running.config)
        report = pool_report(pool, stats, end, settings.tick_s, running.version)
        await bus.publish_worker_stats(POOL, report)
        info = {"config_version": running.version, "replicas": settings.pool.workers}
        await bus.heartbeat(POOL, "simulated", info, ttl_s=60.0)
        clock.set(end)
        await loop.tick()
        tick += 1
        if end >= trace().duration_s and stream.drained and pool.queue_depth == 0:
            break
    records = await bus.decisions(POOL, count=100_000)
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


@pytest.mark.parametrize(
    "spec", ["predictive:lead=20s", "aimd:start=4,step=4,timeout=2ms", "reactive"]
)
def test_the_simulator_and_the_live_loop_decide_alike(spec):
    simulated = simulated_decisions(spec)
    live = asyncio.run(live_decisions(spec))
    assert len(simulated) > 3  # configs did move
    assert [r["chosen"] for r in live] == [r["chosen"] for r in simulated]
    assert live == simulated  # times, inputs, reasons, guards, versions: all of it
