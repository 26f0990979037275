"""Deadlines in the batching state machine (`adaptive.batcher`, `adaptive.grouped`): a
request expires at its deadline, and the rule then counts only the requests still
waiting (docs/batching.md). Hand-computed cases, and a property against a plain list."""

from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.batcher import Batcher
from adaptive.config import BatchConfig
from adaptive.grouped import GroupedBatcher


def test_an_expired_oldest_request_moves_the_timeout_to_the_next_oldest():
    batcher = Batcher(BatchConfig(8, 0.1))
    batcher.offer("a", 0.0, deadline_at=0.05)
    batcher.offer("b", 0.01)
    assert (batcher.next_deadline(), batcher.next_expiry()) == (0.1, 0.05)
    assert batcher.expire(0.049) == []
    [expired] = batcher.expire(0.05)  # at its deadline, not after it
    assert (expired.item, expired.arrived_at, expired.deadline_at) == ("a", 0.0, 0.05)
    assert len(batcher) == 1 and batcher.next_deadline() == 0.11
    assert batcher.next_expiry() is None
    assert [q.item for q in batcher.take_nowait(0.11)] == ["b"]


def test_an_expiry_in_the_middle_leaves_the_cap_to_the_waiting():
    batcher = Batcher(BatchConfig(3, 1.0))
    batcher.offer("a", 0.0)
    batcher.offer("b", 0.0, deadline_at=0.25)
    batcher.offer("c", 0.5)
    assert batcher.next_deadline() == 0.5  # full with b
    assert [q.item for q in batcher.expire(0.5)] == ["b"]
    assert len(batcher) == 2 and batcher.next_deadline() == 1.0  # a's timeout now
    batcher.offer("d", 0.75)
    assert batcher.next_deadline() == 0.75
    assert [q.item for q in batcher.take_nowait(0.75)] == ["a", "c", "d"]
    assert len(batcher) == 0 and batcher.drain() == []


def test_a_taken_request_never_expires_and_drain_skips_the_expired():
    batcher = Batcher(BatchConfig(1, 0.0))
    batcher.offer("a", 0.0, deadline_at=1.0)
    batcher.offer("b", 0.0, deadline_at=0.5)
    batcher.offer("c", 0.0)
    assert [q.item for q in batcher.take_nowait(0.0)] == ["a"]
    assert batcher.next_expiry() == 0.5
    assert [q.item for q in batcher.expire(2.0)] == ["b"]  # a left already
    assert [q.item for q in batcher.drain()] == ["c"]
    assert batcher.next_expiry() is None and len(batcher) == 0


def test_the_queue_bound_counts_only_the_waiting():
    batcher = Batcher(BatchConfig(8, 1.0), max_queue=2)
    assert batcher.offer("a", 0.0)
    assert batcher.offer("b", 0.0, deadline_at=0.5)
    assert not batcher.offer("c", 0.25)
    batcher.expire(0.5)
    assert batcher.offer("d", 0.5) and len(batcher) == 2


def test_groups_expire_together_and_each_group_keeps_its_rule():
    batcher = GroupedBatcher(BatchConfig(4, 0.1), key=lambda item: item[0])
    batcher.offer(("S", "a"), 0.0, deadline_at=0.3)
    batcher.offer(("L", "b"), 0.0, deadline_at=0.05)
    batcher.offer(("L", "c"), 0.01)
    assert batcher.next_expiry() == 0.05 and batcher.next_deadline() == 0.1
    assert [q.item for q in batcher.expire(0.05)] == [("L", "b")]
    assert len(batcher) == 2 and batcher.next_deadline() == 0.1  # S's a leads now
    assert [q.item for q in batcher.take_nowait(0.1)] == [("S", "a")]
    assert batcher.next_deadline() == 0.11 and batcher.next_expiry() is None


class ListBatcher:
    """The rule over a plain list, rescanned at every step: the oracle."""

    def __init__(self, config):
        self.config, self.waiting = config, []  # (arrived_at, deadline_at, item)

    def expire(self, now):
        gone = [w for w in self.waiting if w[1] is not None and w[1] <= now]
        self.waiting = [w for w in self.waiting if w not in gone]
        return sorted(gone, key=lambda w: (w[1], w[2]))

    def next_deadline(self):
        cap = self.config.max_batch_size
        if not self.waiting:
            return None
        if len(self.waiting) >= cap:
            return self.waiting[cap - 1][0]
        return self.waiting[0][0] + self.config.timeout_s

    def take(self, now):
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return None
        batch = self.waiting[: self.config.max_batch_size]
        self.waiting = self.waiting[len(batch) :]
        return batch


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 8),  # sixteenths of a second to the next arrival
            st.one_of(st.none(), st.integers(0, 40)),  # deadline, sixteenths after arrival
            st.booleans(),  # take a batch after it
        ),
        min_size=1,
        max_size=80,
    ),
    cap=st.integers(1, 5),
    timeout=st.integers(0, 6),
)
def test_the_batcher_matches_a_plain_list_under_any_mix_of_deadlines(steps, cap, timeout):
    config = BatchConfig(cap, timeout / 16)
    batcher, oracle = Batcher(config), ListBatcher(config)
    now = 0.0
    for item, (gap, deadline, take) in enumerate(steps):
        now += gap / 16
        deadline_at = None if deadline is None else now + deadline / 16
        batcher.offer(item, now, deadline_at)
        oracle.waiting.append((now, deadline_at, item))
        assert [q.item for q in batcher.expire(now)] == [w[2] for w in oracle.expire(now)]
        assert batcher.next_deadline() == oracle.next_deadline()
        assert batcher.next_expiry() == min(
            (w[1] for w in oracle.waiting if w[1] is not None), default=None
        )
        if take:
            taken = batcher.take_nowait(now)
            wanted = oracle.take(now)
            assert (taken and [q.item for q in taken]) == (wanted and [w[2] for w in wanted])
        assert len(batcher) == len(oracle.waiting)
    assert [q.item for q in batcher.drain()] == [w[2] for w in oracle.waiting]
