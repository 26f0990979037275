"""The live batcher shell: rule, config changes, warm-up, OOM split, deadlines, drain.

Shell logic runs in virtual time (`run_virtual`) on a `ModelledExecution`, so dispatch
instants and warm-ups are asserted exactly; a few tests run the real thing (threads, a
real torch model) as proof that it works outside virtual time.
"""

import asyncio
import logging
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from virtual_time import run_virtual

from adaptive.config import BatchConfig
from adaptive.warmup import WarmupTracker
from server.clock import LoopClock
from server.worker.admission import QueueLimit
from server.worker.batching import DeadlineExceeded, DynamicBatcher, QueueFull, WorkerFailed
from server.worker.metrics import WorkerMetrics
from server.worker.runner import ModelledExecution, OutOfMemory


class EchoRunner:
    """Returns each input doubled after base + per-item seconds; records batch sizes.
    `fits`: larger batches run out of memory; `warm_fits`: larger buckets do when warmed."""

    def __init__(self, base_s=0.002, per_item_s=0.0, fits=None, warm_fits=None):
        self.base_s, self.per_item_s, self.fits, self.warm_fits = (
            base_s,
            per_item_s,
            fits,
            warm_fits,
        )
        self.batches: list[list[int]] = []
        self.warmed: list[int] = []
        self.dispatched_at: list[float] = []  # loop time at each run (inline: the dispatch)

    def run(self, inputs, padded_size):
        if self.fits is not None and len(inputs) > self.fits:
            raise OutOfMemory(f"{len(inputs)} do not fit")
        time.sleep(self.base_s + self.per_item_s * padded_size)
        self.dispatched_at.append(_loop_time())
        self.batches.append(list(inputs))
        return [2 * x for x in inputs]

    def warm(self, size):
        if self.warm_fits is not None and size > self.warm_fits:
            raise OutOfMemory(f"bucket {size} does not fit")
        self.warmed.append(size)
        return 0.001


def _loop_time():
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:  # on a model thread
        return float("nan")


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def virtual(runner, config, service_s=0.25, warm_s=1.0, **options) -> DynamicBatcher:
    """A batcher whose batches take `service_s` (a number or f(size, padded)) and whose
    buckets take `warm_s` each, exactly, on the virtual-time loop (and its clock)."""
    service = service_s if callable(service_s) else (lambda size, padded: service_s)
    execution = ModelledExecution(runner, service, lambda size: warm_s)
    options.setdefault("clock", LoopClock())
    return DynamicBatcher(runner, config, execution=execution, spin_s=0.0, **options)


def cold():
    """An echo runner that takes no real time: virtual-time tests model the service."""
    return EchoRunner(base_s=0.0)


async def at(instant_s):
    """Sleep until loop time `instant_s` (virtual: exactly)."""
    await asyncio.sleep(instant_s - asyncio.get_running_loop().time())


def test_full_batches_go_at_once_and_outputs_match_inputs():
    async def scenario():
        runner = cold()
        batcher = virtual(runner, BatchConfig(8, 5.0))  # only full batches leave early
        await batcher.start()
        await at(4.5)  # buckets 1, 2, 4, 8 take 1 s each
        assert not batcher.warming and batcher.warmed_buckets == (1, 2, 4, 8)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(16)))
        await batcher.drain()
        return runner, results

    runner, results = run_virtual(scenario())
    assert [r.output for r in results] == [2 * i for i in range(16)]
    assert runner.batches == [list(range(8)), list(range(8, 16))]
    assert runner.dispatched_at == [4.5, 4.75]  # the second waits for the one instance
    assert [r.queue_wait_s for r in results] == [0.0] * 8 + [0.25] * 8
    assert runner.warmed == [1, 2, 4, 8]
    assert all(r.batch_size == 8 and r.padded_size == 8 for r in results)


def test_a_partial_batch_leaves_when_its_oldest_request_has_waited_the_timeout():
    async def scenario():
        runner = cold()
        batcher = virtual(runner, BatchConfig(4, 0.5), warm_at_start=False)
        await batcher.start()
        first = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
        await at(0.25)
        fourth = asyncio.create_task(batcher.submit(3))  # fills the batch: leaves at once
        await at(2.0)
        fifth = asyncio.create_task(batcher.submit(4))
        await asyncio.gather(*first, fourth, fifth)
        await batcher.drain()
        return runner

    runner = run_virtual(scenario())
    assert runner.batches == [[0, 1, 2, 3], [4]]
    assert runner.dispatched_at == [0.25, 2.5]


def test_config_change_mid_load_loses_duplicates_and_reorders_nothing():
    """Real threads and the wall clock: the shell as it runs in production."""

    async def scenario():
        runner = EchoRunner(base_s=0.001)
        batcher = DynamicBatcher(runner, BatchConfig(4, 0.002))
        await batcher.start()
        tasks = []
        for i in range(300):
            tasks.append(asyncio.create_task(batcher.submit(i)))
            if i % 50 == 25:
                batcher.reconfigure(BatchConfig(1 + (i % 7) * 5, 0.001 * (i % 3)))
            await asyncio.sleep(0.0002)
        results = await asyncio.gather(*tasks)
        await batcher.drain()
        return runner, results

    runner, results = run(scenario())
    assert [r.output for r in results] == [2 * i for i in range(300)]
    served = [x for batch in runner.batches for x in batch]
    assert served == list(range(300))  # FIFO, once each


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.0, 0.0625, 0.125, 0.5]), min_size=1, max_size=60),
    changes=st.lists(
        st.tuples(st.integers(1, 12), st.sampled_from([0.0, 0.125, 0.25])), max_size=5
    ),
)
def test_config_changes_in_virtual_time_keep_fifo_and_the_caps(gaps, changes):
    async def scenario():
        runner = cold()
        batcher = virtual(runner, BatchConfig(4, 0.125), service_s=0.1875, warm_at_start=False)
        await batcher.start()
        tasks, caps = [], [4]
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(batcher.submit(i)))
            if changes and i % 10 == 5:
                cap, timeout = changes[(i // 10) % len(changes)]
                batcher.reconfigure(BatchConfig(cap, timeout))
                caps.append(cap)
        results = await asyncio.gather(*tasks)
        await batcher.drain()
        return runner, results, caps

    runner, results, caps = run_virtual(scenario())
    assert [r.output for r in results] == [2 * i for i in range(len(gaps))]
    assert [x for batch in runner.batches for x in batch] == list(range(len(gaps)))
    assert max(len(b) for b in runner.batches) <= max(caps)


def test_out_of_memory_splits_until_it_runs_and_lowers_the_cap():
    async def scenario():
        runner = EchoRunner(base_s=0.0, fits=4)
        batcher = virtual(runner, BatchConfig(16, 1.0), warm_at_start=False)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(i) for i in range(16)))
        await batcher.drain()
        return runner, batcher, results

    runner, batcher, results = run_virtual(scenario())
    assert [r.output for r in results] == [2 * i for i in range(16)]
    assert batcher.stats.oom_splits == 3  # 16 -> 8+8 -> 4+4+4+4
    assert batcher.accepted_cap == 4 and batcher.serving_cap == 4
    assert max(len(b) for b in runner.batches) == 4
    assert runner.dispatched_at == [0.0, 0.25, 0.5, 0.75]  # the halves one after another
    assert batcher.warmed_buckets == (1, 2, 4)  # what does not fit is not kept warm


def test_bounded_queue_sheds_and_deadline_expires_in_the_queue():
    async def scenario():
        batcher = virtual(
            cold(), BatchConfig(64, 0.25), queue_limit=QueueLimit(max_queue=3), warm_at_start=False
        )
        await batcher.start()
        late = asyncio.create_task(batcher.submit(0, deadline_s=0.0625))
        kept = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await batcher.submit(3)
        with pytest.raises(DeadlineExceeded):
            await late
        expired_at = asyncio.get_running_loop().time()
        await at(0.125)
        kept.append(asyncio.create_task(batcher.submit(4)))  # the expired one's place
        served = await asyncio.gather(*kept)
        done_at = asyncio.get_running_loop().time()
        await batcher.drain()
        return batcher, served, expired_at, done_at

    batcher, served, expired_at, done_at = run_virtual(scenario())
    assert [s.output for s in served] == [2, 4, 8]
    assert expired_at == 0.0625  # at its deadline, not when the batch forms (0.25 s)
    assert done_at == 0.5 and [s.queue_wait_s for s in served] == [0.25, 0.25, 0.125]
    assert batcher.stats.shed == 1 and batcher.stats.expired == 1


def test_a_request_expires_at_its_deadline_and_the_timeout_runs_from_the_oldest_waiting():
    """Cap 8, timeout 100 ms: A arrives at 0 with a 50 ms deadline, B at 10 ms, C at
    30 ms. A's 504 comes at exactly 50 ms; the batch of B and C forms at 110 ms (B's
    timeout), not at 100 ms (A's, had it stayed)."""

    async def scenario():
        runner = cold()
        batcher = virtual(runner, BatchConfig(8, 0.1), warm_at_start=False)
        await batcher.start()
        loop = asyncio.get_running_loop()
        a = asyncio.create_task(batcher.submit("A", deadline_s=0.05))
        await at(0.01)
        b = asyncio.create_task(batcher.submit("B"))
        await at(0.03)
        c = asyncio.create_task(batcher.submit("C", deadline_s=0.2))
        with pytest.raises(DeadlineExceeded):
            await a
        expired_at = loop.time()
        served = await asyncio.gather(b, c)
        await batcher.drain()
        return runner, expired_at, served, loop.time()

    runner, expired_at, served, done_at = run_virtual(scenario())
    assert expired_at == 0.05
    assert runner.batches == [["B", "C"]] and runner.dispatched_at == [0.11]
    assert [s.queue_wait_s for s in served] == pytest.approx([0.1, 0.08], abs=1e-12)
    assert done_at == 0.36  # 110 ms + the 250 ms service


def test_an_expiry_in_the_middle_moves_the_batch_to_the_next_full_one():
    """Cap 3, timeout 1 s: A and B arrive at 0 (B with a 250 ms deadline), C at 0.5 s,
    D at 0.75 s. B expires at 0.25 s, so three are waiting only when D arrives: the
    batch is A, C, D at 0.75 s (with B it would have been A, B, C at 0.5 s)."""

    async def scenario():
        runner = cold()
        batcher = virtual(runner, BatchConfig(3, 1.0), warm_at_start=False)
        await batcher.start()
        tasks = [
            asyncio.create_task(batcher.submit("A")),
            asyncio.create_task(batcher.submit("B", deadline_s=0.25)),
        ]
        await at(0.5)
        tasks.append(asyncio.create_task(batcher.submit("C")))
        await at(0.75)
        tasks.append(asyncio.create_task(batcher.submit("D")))
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await batcher.drain()
        return runner, batcher, outcomes

    runner, batcher, outcomes = run_virtual(scenario())
    assert runner.batches == [["A", "C", "D"]] and runner.dispatched_at == [0.75]
    assert isinstance(outcomes[1], DeadlineExceeded) and batcher.stats.expired == 1


def test_a_request_due_in_a_batch_at_its_deadline_expires_instead():
    """The batch and the deadline fall at the same instant (timeout 250 ms, deadline
    250 ms): the request has stopped waiting, so it expires and the other is served."""

    async def scenario():
        runner = cold()
        batcher = virtual(runner, BatchConfig(4, 0.25), warm_at_start=False)
        await batcher.start()
        late = asyncio.create_task(batcher.submit(1, deadline_s=0.25))
        kept = asyncio.create_task(batcher.submit(2))
        outcomes = await asyncio.gather(late, kept, return_exceptions=True)
        await batcher.drain()
        return runner, outcomes

    runner, (late, kept) = run_virtual(scenario())
    assert isinstance(late, DeadlineExceeded) and kept.output == 4
    assert runner.batches == [[2]] and runner.dispatched_at == [0.25]


DYADIC = st.integers(0, 32).map(lambda n: n / 64)  # exact in binary and in loop ticks


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(DYADIC, st.one_of(st.none(), st.integers(1, 24).map(lambda n: n / 64))),
        min_size=1,
        max_size=40,
    ),
    cap=st.integers(1, 6),
    timeout_s=st.sampled_from([0.0, 1 / 16, 1 / 4]),
    service_s=st.sampled_from([1 / 32, 1 / 8]),
    instances=st.integers(1, 2),
)
def test_no_request_waits_past_its_deadline_and_each_is_answered_once(
    arrivals, cap, timeout_s, service_s, instances
):
    """Each request is answered exactly once: served (it left the queue strictly before
    its deadline) or 504 at exactly its deadline; each batch holds the oldest requests
    still waiting when it left, in order; nothing expired ran."""

    async def scenario():
        runner = cold()
        batcher = virtual(
            runner, BatchConfig(cap, timeout_s), service_s, instances=instances, warm_at_start=False
        )
        await batcher.start()
        loop = asyncio.get_running_loop()

        async def one(i, deadline_s):
            try:
                served = await batcher.submit(i, deadline_s)
            except DeadlineExceeded:
                return "expired", loop.time()
            assert served.output == 2 * i
            return "served", served.queue_wait_s

        tasks, arrived = [], []
        for i, (gap, deadline_s) in enumerate(arrivals):
            await asyncio.sleep(gap)
            arrived.append(loop.time())
            tasks.append(asyncio.create_task(one(i, deadline_s)))
        outcomes = await asyncio.gather(*tasks)
        await batcher.drain()
        return runner, batcher, arrived, outcomes

    runner, batcher, arrived, outcomes = run_virtual(scenario())
    deadline_at = [a if d is None else a + d for a, (_, d) in zip(arrived, arrivals, strict=True)]
    ran = [i for batch in runner.batches for i in batch]
    served = [i for i, (kind, _) in enumerate(outcomes) if kind == "served"]
    assert ran == served  # once each, in arrival order, and nothing expired ran
    for i, ((kind, value), (_, deadline_s)) in enumerate(zip(outcomes, arrivals, strict=True)):
        if kind == "expired":
            assert deadline_s is not None and value == deadline_at[i]  # answered then
        else:
            assert deadline_s is None or value < deadline_s  # queue wait: left in time
    assert batcher.stats.expired == len(arrivals) - len(served)
    waited = 0
    for batch, left_at in zip(runner.batches, runner.dispatched_at, strict=True):
        waiting = [
            i
            for i in range(len(arrivals))
            if arrived[i] <= left_at and i not in ran[:waited]
            and (arrivals[i][1] is None or deadline_at[i] > left_at)
        ]  # fmt: skip
        assert all(deadline_at[i] > left_at or arrivals[i][1] is None for i in batch)
        assert batch == waiting[: len(batch)] and len(batch) <= cap
        waited += len(batch)


def test_raising_the_cap_serves_the_old_cap_until_warm():
    async def scenario():
        runner = cold()
        batcher = virtual(runner, BatchConfig(4, 0.0), warm_at_start=False)
        await batcher.start()
        batcher.reconfigure(BatchConfig(32, 0.0))
        caps = []
        for instant in (0.5, 1.5, 2.5, 3.5):
            await at(instant)
            caps.append((batcher.serving_cap, batcher.warming))
        await batcher.drain()
        return runner, caps

    runner, caps = run_virtual(scenario())
    assert caps == [(4, True), (8, True), (16, True), (32, False)]
    assert runner.warmed == [8, 16, 32]


def test_the_bucket_warm_gauge_is_1_per_warm_bucket_and_0_per_bucket_warming():
    """`tidal_worker_bucket_warm{size}` scraped mid-way from 4 to 32 (8 warm at 1 s, 16
    warming), then after lowering to 8: the released buckets' series end."""

    def scrape(registry):
        (family,) = (f for f in registry.collect() if f.name == "tidal_worker_bucket_warm")
        return {int(s.labels["size"]): s.value for s in family.samples}

    async def scenario():
        batcher = virtual(cold(), BatchConfig(4, 0.0), warm_at_start=False)
        registry = CollectorRegistry()
        WorkerMetrics(registry, batcher)
        await batcher.start()
        batcher.reconfigure(BatchConfig(32, 0.0))
        await at(1.5)
        warming = scrape(registry)
        batcher.reconfigure(BatchConfig(8, 0.0))
        lowered = scrape(registry)
        await batcher.drain()
        return warming, lowered

    warming, lowered = run_virtual(scenario())
    assert warming == {1: 1, 2: 1, 4: 1, 8: 1, 16: 0, 32: 0}
    assert lowered == {1: 1, 2: 1, 4: 1, 8: 1}


def test_lowering_mid_warm_up_releases_like_the_tracker():
    """Up to 64 at 0 s, down to 8 at 2.5 s (16 is warm, 32 warming), up to 32 at 3.25 s:
    the released 16 must warm again, as the simulator's tracker says."""
    plan = [(0.0, 64), (2.5, 8), (3.25, 32)]

    async def scenario():
        batcher = virtual(cold(), BatchConfig(4, 0.0), warm_at_start=False)
        await batcher.start()
        seen = []
        for instant, cap in plan:
            await at(instant)
            batcher.reconfigure(BatchConfig(cap, 0.0))
            seen.append((instant, batcher.warmed_buckets))
        for instant in (3.5, 4.5, 5.5):
            await at(instant)
            seen.append((instant, batcher.warmed_buckets))
        await batcher.drain()
        return seen

    seen = run_virtual(scenario())
    tracker = WarmupTracker(1.0, 4)
    expected = []
    for instant, cap in plan:
        tracker.request(cap, instant)
        expected.append((instant, tracker.status(instant).warmed))
    expected += [(t, tracker.status(t).warmed) for t in (3.5, 4.5, 5.5)]
    assert seen == expected
    assert seen[1] == (2.5, (1, 2, 4, 8))  # 16 released at once
    assert seen[-2:] == [(4.5, (1, 2, 4, 8, 16)), (5.5, (1, 2, 4, 8, 16, 32))]


@settings(max_examples=60, deadline=None)
@given(
    initial=st.integers(1, 64),
    requests=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 100)), min_size=1, max_size=12),
)
def test_live_warm_up_follows_the_trackers_rules(initial, requests):
    """Every bucket takes 1 s; request j lands at an instant whose fraction (j+1)/16 no
    other request shares, so no request coincides with a warm-up finishing."""
    times = []
    whole = 0
    for j, (gap, _) in enumerate(requests):
        whole += gap
        times.append(whole + (j + 1) / 16)
    checks = {t - 1 / 32 for t in times} | {times[-1] + 0.5, times[-1] + 20}
    caps = [cap for _, cap in requests]
    events = sorted(
        [(t, cap) for t, cap in zip(times, caps, strict=True)] + [(t, 0) for t in checks]
    )

    async def scenario():
        batcher = virtual(cold(), BatchConfig(initial, 0.0), warm_at_start=False)
        await batcher.start()
        seen = []
        for instant, cap in events:
            await at(instant)
            if cap:
                batcher.reconfigure(BatchConfig(cap, 0.0))
            else:
                seen.append((instant, batcher.warmed_buckets, batcher.warming))
        await batcher.drain()
        return seen

    seen = run_virtual(scenario())
    tracker = WarmupTracker(1.0, initial)
    expected = []
    for instant, cap in events:
        if cap:
            tracker.request(cap, instant)
        else:
            status = tracker.status(instant)
            expected.append((instant, status.warmed, bool(status.warming)))
    assert seen == expected


def test_a_bucket_out_of_memory_while_warming_ends_the_warm_up_and_lowers_the_cap(caplog):
    async def scenario():
        runner = EchoRunner(base_s=0.0, warm_fits=8)
        batcher = virtual(runner, BatchConfig(32, 0.0))
        await batcher.start()
        await at(10.0)
        state = (batcher.warming, batcher.warmed_buckets, batcher.accepted_cap, batcher.serving_cap)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(20)))
        await asyncio.wait_for(batcher.drain(), 5)  # nothing resurfaces here
        return runner, batcher, state, results

    with caplog.at_level(logging.WARNING, logger="tidal.worker"):
        runner, batcher, state, results = run_virtual(scenario())
    assert state == (False, (1, 2, 4, 8), 8, 8)
    assert runner.warmed == [1, 2, 4, 8]
    assert batcher.stats.warmup_ooms == 1 and batcher.stats.oom_splits == 0
    assert batcher.errors.counts == {}  # handled like a batch OOM, not a crash
    assert [r.output for r in results] == [2 * i for i in range(20)]
    assert max(len(b) for b in runner.batches) == 8
    assert any("bucket 16 ran out of memory while warming" in r.message for r in caplog.records)


def test_drain_while_the_last_batch_runs_returns_when_it_is_done():
    """The in-flight set used to be emptied in a done-callback after the wake-up, so a
    draining loop saw the batch still running and slept for good."""

    async def scenario():
        batcher = virtual(cold(), BatchConfig(1, 0.0), service_s=1.0, warm_at_start=False)
        await batcher.start()
        served = asyncio.create_task(batcher.submit(7))
        await at(0.5)
        await asyncio.wait_for(batcher.drain(), 10)  # a hang fails here, at 10.5 s
        return (await served).output, asyncio.get_running_loop().time()

    assert run_virtual(scenario()) == (14, 1.0)


def test_a_dead_dispatch_loop_is_logged_counted_and_makes_the_worker_unready(caplog):
    async def scenario():
        batcher = virtual(cold(), BatchConfig(1, 0.0), service_s=1.0, warm_at_start=False)

        def broken_hook(_late_s):
            raise ZeroDivisionError("a bug in a metrics hook")

        batcher.on_dispatch = broken_hook
        await batcher.start()
        first = asyncio.create_task(batcher.submit(1))
        second = asyncio.create_task(batcher.submit(2))
        await at(0.5)
        with pytest.raises(WorkerFailed):
            await second  # queued behind the dead loop: failed, not left hanging
        with pytest.raises(WorkerFailed, match="dispatch loop died"):
            await batcher.submit(3)
        ready = batcher.ready
        output = (await first).output  # the batch that was launched still completes
        await asyncio.wait_for(batcher.drain(), 5)
        return batcher, ready, output

    with caplog.at_level(logging.ERROR, logger="tidal.worker"):
        batcher, ready, output = run_virtual(scenario())
    assert not ready and output == 2
    assert batcher.errors.counts == {"dispatch": 1}
    [record] = [r for r in caplog.records if "background task dispatch failed" in r.message]
    assert record.exc_info and record.exc_info[0] is ZeroDivisionError  # with its traceback


def test_a_failing_warm_up_is_logged_counted_and_abandoned(caplog):
    class BrokenWarm(EchoRunner):
        def warm(self, size):
            if size == 4:
                raise RuntimeError("compiler crashed")
            return super().warm(size)

    async def scenario():
        runner = BrokenWarm(base_s=0.0)
        batcher = virtual(runner, BatchConfig(16, 0.0))
        await batcher.start()
        await at(5.0)
        state = (batcher.warming, batcher.warmed_buckets, batcher.ready)
        await asyncio.wait_for(batcher.drain(), 5)
        return batcher, state

    with caplog.at_level(logging.ERROR, logger="tidal.worker"):
        batcher, state = run_virtual(scenario())
    assert state == (False, (1, 2), True)
    assert batcher.errors.counts == {"warm-up": 1}
    assert any(r.exc_info and "warm-up" in r.message for r in caplog.records)


def test_compiled_buckets_warm_slowly_once_and_answer_like_eager():
    import torch

    from server.worker.models import load_model
    from server.worker.runner import TorchRunner

    # The ranker: five linear layers compile in a fraction of demo-cnn's time.
    model = load_model("demo-ranker")
    eager = TorchRunner(model)
    compiled = TorchRunner(load_model("demo-ranker"), compile=True)
    warm_s = compiled.warm(2)
    inputs = [model.validate(model.example(i)) for i in range(2)]
    runs_s = []
    for _ in range(5):
        started = time.perf_counter()
        outputs = compiled.run(inputs, 2)
        runs_s.append(time.perf_counter() - started)
    # Compiling costs, running does not: seconds against milliseconds. The fastest of five
    # runs, so that a run the scheduler preempted on a busy machine does not count (one
    # such run took 0.29 s beside a 2.8 s compile).
    assert warm_s > 10 * min(runs_s)
    expected = torch.tensor(eager.run(inputs, 2))
    assert torch.allclose(torch.tensor(outputs), expected, atol=1e-4)


def test_torchscript_files_and_user_factories_load_and_run(tmp_path):
    import torch

    from server.worker.models import load_model
    from server.worker.runner import TorchRunner
    from tidal_base.errors import InvalidInput

    factory = load_model("tests.fixtures.user_model:build")
    expected = factory.module(torch.ones(2, 4)).tolist()
    assert TorchRunner(factory).run([factory.validate([1.0] * 4)] * 2, 2) == expected
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(factory.module), path)
    scripted = load_model(str(path))
    outputs = TorchRunner(scripted).run([scripted.validate([1.0] * 4)], 4)
    assert outputs == [expected[0]]  # padded to 4, answered for 1
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(
        factory.module, (torch.ones(2, 4),), dynamic_shapes={"input": {0: batch}}
    )
    torch.export.save(exported, tmp_path / "model.pt2")
    program = load_model(str(tmp_path / "model.pt2"))
    assert TorchRunner(program).run([program.validate([1.0] * 4)], 2) == [expected[0]]
    with pytest.raises(InvalidInput, match="unknown model"):
        load_model("no-such-model")
    bogus = tmp_path / "bogus.pt"
    bogus.write_text("not a model")
    with pytest.raises(InvalidInput, match="not a TorchScript file"):
        load_model(str(bogus))


def test_instances_run_batches_concurrently():
    async def scenario():
        runner = cold()
        batcher = virtual(
            runner, BatchConfig(1, 0.0), service_s=0.05, instances=4, warm_at_start=False
        )
        await batcher.start()
        await asyncio.gather(*(batcher.submit(i) for i in range(8)))
        finished_at = asyncio.get_running_loop().time()
        await batcher.drain()
        return runner, finished_at

    runner, finished_at = run_virtual(scenario())
    assert runner.dispatched_at == [0.0] * 4 + [0.05] * 4  # four at a time
    assert finished_at == 0.1


def test_real_short_batches_on_uvloop_are_timed_to_the_microsecond():
    """uvloop's `loop.time()` is libuv's millisecond clock, cached once per loop
    iteration: timed on it, 113 of 200 batches of 0.2 ms of work measured exactly 0.0
    and 199 of 200 queue waits 0.0. The batcher's own clock is `time.perf_counter()`."""
    uvloop = pytest.importorskip("uvloop")
    work_s = 0.0002

    class Busy(EchoRunner):
        def run(self, inputs, padded_size):
            until = time.perf_counter() + work_s  # real work, well under a millisecond
            while time.perf_counter() < until:
                pass
            return [2 * x for x in inputs]

    async def scenario():
        batcher = DynamicBatcher(Busy(), BatchConfig(1, 0.0), warm_at_start=False)
        executions = []
        batcher.on_batch = lambda size, cap, execution_s: executions.append(execution_s)
        batcher.keep_windows()
        await batcher.start()
        served = [await batcher.submit(i) for i in range(50)]
        await batcher.drain()
        return served, executions, batcher.take_window()[0], batcher.stats.busy_s

    served, executions, latencies, busy_s = uvloop.run(scenario())
    assert [r.output for r in served] == [2 * i for i in range(50)]
    assert min(executions) >= work_s and min(r.execution_s for r in served) >= work_s
    assert min(latencies) >= work_s and busy_s >= 50 * work_s
    assert all(r.queue_wait_s > 0 for r in served)  # from submit to the dispatch loop


def test_instances_run_on_threads_at_the_same_time():
    """The real execution: four batches are inside the model at once (a barrier of four
    passes only then), while the event loop stays free."""
    barrier = threading.Barrier(4, timeout=10)

    class Meeting(EchoRunner):
        def run(self, inputs, padded_size):
            barrier.wait()  # BrokenBarrierError unless four threads meet
            return super().run(inputs, padded_size)

    async def scenario():
        batcher = DynamicBatcher(
            Meeting(base_s=0.0), BatchConfig(1, 0.0), instances=4, warm_at_start=False
        )
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(i) for i in range(8)))
        await batcher.drain()
        return [r.output for r in results], batcher.stats.failed

    assert run(scenario()) == ([2 * i for i in range(8)], 0)


def test_the_window_reports_execution_times_by_the_padded_size_that_ran():
    from server.worker.reporter import StatsCollector

    async def scenario():
        runner = cold()
        service = lambda size, padded: 0.010 + 0.001 * padded  # noqa: E731
        batcher = virtual(runner, BatchConfig(8, 0.5), service, warm_at_start=False)
        collector = StatsCollector(batcher, "w", 1.0)
        await batcher.start()
        await asyncio.gather(*(batcher.submit(i) for i in range(3)))  # one batch of 3
        await asyncio.gather(*(batcher.submit(i) for i in range(8)))  # one of 8
        stats = collector.collect()
        again = collector.collect()
        await batcher.drain()
        return stats, again

    stats, again = run_virtual(scenario())
    # 3 requests run padded to bucket 4 (14 ms), 8 run as 8 (18 ms).
    assert [(t.padded_size, t.batches) for t in stats.execution] == [(4, 1), (8, 1)]
    assert [t.total_s for t in stats.execution] == pytest.approx([0.014, 0.018])
    assert dict(stats.batch_sizes) == {3: 1, 8: 1}  # the sizes asked for, as before
    assert again.execution == ()  # each batch in one window only


def test_a_worker_is_warmed_up_once_its_starting_buckets_are_and_stays_so():
    async def scenario():
        batcher = virtual(cold(), BatchConfig(4, 0.0), warm_s=1.0)
        seen = [batcher.warmed_up]
        await batcher.start()
        seen.append(batcher.warmed_up)  # buckets 1, 2, 4 warm one a second
        await at(2.5)
        seen.append(batcher.warmed_up)
        await at(3.5)
        seen.append(batcher.warmed_up)
        batcher.reconfigure(BatchConfig(4, 0.0, 16))  # warming ahead: still ready
        await at(4.0)
        seen.append((batcher.warmed_up, batcher.warming))
        await batcher.drain()
        return seen

    assert run_virtual(scenario()) == [False, False, False, True, (True, True)]


def test_a_batcher_keeps_stats_windows_only_for_a_collector_that_takes_them():
    """A standalone worker has no pool link to empty its windows: it keeps none (the
    soak found them growing about 100 bytes a request); a collector's are exact."""
    from server.worker.reporter import StatsCollector

    async def serve(batcher, count):
        await batcher.start()
        for i in range(count):
            batcher.record_ingress(0.001)
            await batcher.submit(i)
        await batcher.drain()

    standalone = virtual(cold(), BatchConfig(1, 0.0), service_s=0.01, warm_at_start=False)
    run_virtual(serve(standalone, 50))
    assert standalone.take_window() == ([], {})
    assert standalone.take_ingress_window() == [] and standalone.take_execution_window() == {}

    async def collected(batcher, count):
        collector = StatsCollector(batcher, "w", window_s=1.0)
        await serve(batcher, count)
        return collector.collect()

    pooled = virtual(cold(), BatchConfig(1, 0.0), service_s=0.01, warm_at_start=False)
    stats = run_virtual(collected(pooled, 50))
    assert stats.completed == 50 and sum(n for _, n in stats.latency_buckets) == 50
    assert pooled.take_window() == ([], {})  # taken


def test_the_ranker_scores_feature_vectors_alone_as_in_a_batch_and_refuses_others():
    import torch

    from server.worker.models import RANKER_FEATURES, load_model
    from server.worker.runner import TorchRunner
    from tidal_base.errors import InvalidInput

    ranker = load_model("demo-ranker")
    runner = TorchRunner(ranker)
    inputs = [ranker.validate(ranker.example(i)) for i in range(3)]
    together = runner.run(inputs, 4)  # padded to 4, answered for 3
    alone = [runner.run([x], 1)[0] for x in inputs]
    assert len(together) == 3 and all(len(score) == 1 for score in together)
    assert torch.allclose(torch.tensor(together), torch.tensor(alone), atol=1e-5)
    as_bytes = ranker.from_bytes(ranker.to_bytes(ranker.example(0)))
    assert torch.equal(as_bytes, inputs[0])
    with pytest.raises(InvalidInput, match=f"shape {RANKER_FEATURES}, got 3"):
        ranker.validate([0.5, 0.5, 0.5])
    with pytest.raises(InvalidInput, match="finite"):
        ranker.validate([float("nan")] * RANKER_FEATURES)
    with pytest.raises(InvalidInput, match=f"{4 * RANKER_FEATURES} bytes"):
        ranker.from_bytes(b"\0" * 8)


def test_a_bucket_compiles_as_a_cuda_graph_on_cuda_and_with_inductor_elsewhere():
    from server.worker.runner import compile_mode

    # On a GPU a warmed bucket is a captured CUDA Graph; there is none on this machine,
    # so the choice is tested, and docs/worker.md reports no GPU figure.
    assert compile_mode("cuda") == "reduce-overhead"
    assert compile_mode("cpu") is None and compile_mode("mps") is None


@pytest.mark.parametrize("command", ["worker", "profile"])
def test_a_bucket_compiles_as_the_model_says_unless_the_flag_says_otherwise(command):
    """demo-ranker's warm-up compiles each bucket by default, the other demos' does not;
    --compile and --no-compile overrule either. Parsing and deciding only: nothing runs."""
    from server.cli import build_parser
    from server.worker.models import load_model
    from server.worker.runner import compile_choice

    parser = build_parser(command)
    given = {
        flags: parser.parse_args([command, "--model", "m", *flags]).compile
        for flags in ((), ("--compile",), ("--no-compile",))
    }
    assert given == {(): None, ("--compile",): True, ("--no-compile",): False}
    for name, default in (("demo-ranker", True), ("demo-cnn", False), ("demo-text", False)):
        model = load_model(name)
        assert model.compile_buckets is default
        assert compile_choice(given[()], model) is default
        assert compile_choice(given[("--compile",)], model) is True
        assert compile_choice(given[("--no-compile",)], model) is False


def test_a_threaded_warm_up_freezes_what_it_built_out_of_the_collectors_way():
    import gc

    from server.worker.runner import ThreadedExecution

    execution = ThreadedExecution(EchoRunner())
    gc.unfreeze()
    try:
        assert asyncio.run(execution.warm(4)) == 0.001
        assert gc.get_freeze_count() > 0  # full collections skip the compiled heap
    finally:
        gc.unfreeze()
        execution.close()
