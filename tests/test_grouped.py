"""Batching by length group: the rule per group, exactly once, and less padding."""

import asyncio

import torch
from hypothesis import given
from hypothesis import strategies as st
from test_worker_batcher import EchoRunner

from adaptive.config import BatchConfig
from adaptive.grouped import GroupedBatcher
from server.worker.batching import DynamicBatcher
from server.worker.models import load_model


def test_each_group_follows_the_rule_on_its_own():
    batcher = GroupedBatcher(BatchConfig(4, 0.010), key=lambda item: item[0])
    for name in ("a", "b", "c", "d", "e"):
        batcher.offer(("L" if name == "b" else "S", name), 0.0)
    assert batcher.next_deadline() == 0.0  # four short ones fill a batch at once
    assert [q.item[1] for q in batcher.take_nowait(0.0)] == ["a", "c", "d", "e"]
    assert batcher.take_nowait(0.005) is None
    assert [q.item[1] for q in batcher.take_nowait(0.010)] == ["b"]  # its timeout
    assert len(batcher) == 0


@given(
    arrivals=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 0.01)), min_size=1, max_size=60),
    cap=st.integers(1, 6),
)
def test_every_request_leaves_once_in_a_single_group_fifo_within_it(arrivals, cap):
    batcher = GroupedBatcher(BatchConfig(cap, 0.002), key=lambda item: item[0])
    now = 0.0
    for index, (group, gap) in enumerate(arrivals):
        now += gap
        batcher.offer((group, index), now)
    taken = []
    while len(batcher):
        now = max(now, batcher.next_deadline())
        batch = batcher.take_nowait(now)
        assert batch and len(batch) <= cap and len({q.item[0] for q in batch}) == 1
        taken.extend(q.item for q in batch)
    assert sorted(i for _, i in taken) == list(range(len(arrivals)))
    for group in range(4):
        order = [i for g, i in taken if g == group]
        assert order == sorted(order)


def test_grouping_by_length_cuts_padding_waste():
    model = load_model("demo-text")
    generator = torch.Generator().manual_seed(3)
    lengths = [int(n) for n in torch.randint(4, 129, (256,), generator=generator)]
    inputs = [model.validate([1] * n) for n in lengths]

    async def waste(group_key):
        batcher = DynamicBatcher(
            EchoRunner(base_s=0.0005),
            BatchConfig(16, 0.02),
            warm_at_start=False,
            padding_waste=model.padding_waste,
            group_key=group_key,
        )
        batcher.runner.run = lambda items, padded: [0] * len(items)
        await batcher.start()
        await asyncio.gather(*(batcher.submit(x) for x in inputs))
        await batcher.drain()
        return batcher.stats.padding_waste_sum / batcher.stats.batches

    mixed, grouped = asyncio.run(waste(None)), asyncio.run(waste(model.length_group))
    # Uniform lengths: about 44% of token slots are padding mixed, about 23% grouped.
    assert grouped < 0.6 * mixed and grouped < 0.3, (mixed, grouped)
