"""What a worker served since its pool's `StatsCollector` last looked: per-request
latencies, batch sizes, execution seconds by padded size, and ingress seconds.

Kept only once a collector keeps them (`keep`): a standalone worker has no pool link to
empty them, and would grow them by about 100 bytes a request (the soak found it).
"""

from __future__ import annotations

from collections.abc import Sequence

from adaptive.batcher import Queued


class StatsWindows:
    """The batcher's per-request windows, each emptied by the `take_*` that hands it over."""

    def __init__(self) -> None:
        self.kept = False
        self._latencies: list[float] = []  # queue wait + execution, seconds
        self._batch_sizes: dict[int, int] = {}  # requests in a batch -> batches
        self._execution: dict[int, list[float]] = {}  # padded size -> seconds
        self._ingress: list[float] = []  # seconds from the socket to the batcher

    def keep(self) -> None:
        """Keep the windows from now on; whoever calls this takes them regularly."""
        self.kept = True

    def record_batch(
        self, batch: Sequence[Queued], padded_size: int, done_at: float, execution_s: float
    ) -> None:
        """A batch that ran padded to `padded_size` for `execution_s`, done at `done_at`
        (on the clock its requests' `arrived_at` are on)."""
        if not self.kept:
            return
        self._batch_sizes[len(batch)] = self._batch_sizes.get(len(batch), 0) + 1
        self._execution.setdefault(padded_size, []).append(execution_s)
        self._latencies.extend(done_at - queued.arrived_at for queued in batch)

    def record_ingress(self, seconds: float) -> None:
        """How long one request took from the worker's socket to the batcher."""
        if self.kept:
            self._ingress.append(seconds)

    def take(self) -> tuple[list[float], dict[int, int]]:
        """Latencies and batch sizes since the last call."""
        window = self._latencies, self._batch_sizes
        self._latencies, self._batch_sizes = [], {}
        return window

    def take_ingress(self) -> list[float]:
        """Ingress seconds since the last call."""
        window, self._ingress = self._ingress, []
        return window

    def take_execution(self) -> dict[int, list[float]]:
        """Execution seconds of each batch run since the last call, by padded size."""
        window, self._execution = self._execution, {}
        return window
