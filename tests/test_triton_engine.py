"""`TritonEngine` and `tidal engine triton` against a real tritonserver (the one the
nvidia-pytriton wheel carries, serving examples/triton/models), without a controller:
what the pool member does when Triton goes away and comes back, and that the config
watch and a change do not race; and that a local Triton's three ports are one checked
block.

tests/test_triton.py runs the whole pool (controller, load, overrides, a restart); these
are the engine's own edges, each on the module's tritonserver, in real time.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
from pathlib import Path

import pytest

from adaptive.bus import VersionedConfig
from adaptive.config import BatchConfig
from server.bus.local import LocalPoolBus
from server.clock import LoopClock
from server.engines.member import PoolMember
from server.engines.triton import Knobs, TritonEngine
from server.engines.triton_local import TritonPorts, TritonProcess
from server.tasks import BackgroundErrors

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "triton" / "models"
MODEL = "tidal_sleep"


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton-engine")
    repository = tmp / "models"  # a copy: the python backend writes __pycache__ beside it
    shutil.copytree(EXAMPLES, repository, ignore=shutil.ignore_patterns("__pycache__"))
    process = TritonProcess(repository, [MODEL], log_path=tmp / "tritonserver.log")
    try:
        process.start()
        yield process
    finally:
        process.close()


def engine_on(triton: TritonProcess, errors: BackgroundErrors, **kwargs) -> TritonEngine:
    return TritonEngine(
        triton.grpc_url, triton.metrics_url, MODEL, "t0", LoopClock(), errors, **kwargs
    )


async def until(condition, timeout_s: float, what: str):
    """Poll `condition` on the running loop (real time: a real Triton) until truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if value := await condition():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_watch_reads_what_triton_serves_under_the_lock(triton):
    """A change that lands while the watch's read is on the wire must not look like a
    restart: the read is held here until the change has either finished (the race) or
    is waiting for the watch (the read under the lock)."""

    async def scenario():
        errors = BackgroundErrors()
        engine = engine_on(triton, errors, watch_interval_s=0.05)
        await engine.start()
        await engine.apply(VersionedConfig(1, BatchConfig(4, 0.002)))
        client = engine._grpc()
        read = client.get_model_config
        watch_reading, release = asyncio.Event(), asyncio.Event()
        change_read = asyncio.Event()

        async def held_read(*args, **kwargs):
            task = asyncio.current_task()
            watching = task is not None and task.get_name() == "triton-watch"
            if not watching:
                change_read.set()
            answer = await read(*args, **kwargs)
            if watching and not release.is_set():
                watch_reading.set()
                await release.wait()
            return answer

        client.get_model_config = held_read
        try:
            await asyncio.wait_for(watch_reading.wait(), 10)
            change = asyncio.create_task(engine.apply(VersionedConfig(2, BatchConfig(6, 0.003))))
            for _ in range(5):  # the change runs to its first read, or to the lock
                await asyncio.sleep(0)
            if change_read.is_set():  # not held off by the watch: let it finish first
                await asyncio.wait({change}, timeout=60)
            release.set()
            await asyncio.wait_for(change, 60)
            await asyncio.sleep(0.5)  # the watch's next rounds
            serving = Knobs.read(await engine._read_config())
        finally:
            client.get_model_config = read
            await engine.close()
        return serving, engine.counts, errors.counts

    serving, counts, errors = asyncio.run(scenario())
    assert serving == Knobs(6, 3000)
    assert (counts.restarts_detected, counts.reapplied) == (0, 0)
    assert len(counts.reloads_s) == 2 and errors == {}


def test_triton_away_is_an_outage_the_member_beats_through(triton, caplog):
    """Last of the in-process tests: it stops the module's Triton and starts it again.
    Logged once, no traceback per window, heartbeats on with the member not ready, and
    ready again with windows flowing once Triton is back."""

    async def beat(bus) -> dict | None:
        return (await bus.workers_alive("p")).get("t0")

    async def scenario():
        errors, bus = BackgroundErrors(), LocalPoolBus()
        engine = engine_on(triton, errors)
        await engine.start()
        member = PoolMember(
            engine, bus, "p", "t0", engine.clock, errors, interval_s=0.2, heartbeat_ttl_s=0.6
        )
        member.start()
        seen = {"up": await until(lambda: beat(bus), 10, "a heartbeat")}
        await asyncio.to_thread(triton.stop)
        seen["away"] = await until(
            lambda: _when(beat(bus), lambda b: b.get("ready") is False), 20, "not ready"
        )
        await asyncio.sleep(1.5)  # past the heartbeat's TTL twice over
        seen["still"] = await beat(bus)
        await asyncio.to_thread(triton.start)
        sent = await windows(bus)
        seen["back"] = await until(
            lambda: _when(beat(bus), lambda b: "ready" not in b), 30, "ready again"
        )
        await until(lambda: _when(windows(bus), lambda n: n > sent + 2), 10, "windows again")
        await member.stop()
        await engine.close()
        return seen, errors.counts

    with caplog.at_level(logging.INFO, logger="tidal"):
        seen, errors = asyncio.run(scenario())
    assert "ready" not in seen["up"]
    assert seen["away"]["not_ready"].startswith("triton unreachable: GET ")
    assert seen["still"] is not None and seen["still"]["ready"] is False
    assert errors == {}
    said = [r.getMessage() for r in caplog.records if r.name == "tidal.member"]
    assert sum("unreachable" in line for line in said) == 1, said
    assert sum("answers again" in line for line in said) == 1, said
    assert not [r for r in caplog.records if r.exc_info], "a traceback for an outage"


async def _when(value, condition):
    got = await value
    return got if got is not None and condition(got) else None


async def windows(bus: LocalPoolBus) -> int:
    return len((await bus.read_worker_stats("p"))[0])


def test_tritons_three_ports_are_one_block_each_free():
    """One free port says nothing of the next (tests/processes.py's lesson): three
    separate probes could even name one port twice. The block is checked as a whole."""
    ports = TritonPorts.free()
    assert (ports.grpc, ports.metrics) == (ports.http + 1, ports.http + 2)
    for port in (ports.http, ports.grpc, ports.metrics):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
