"""Hand out a trace's arrivals tick by tick, generating them chunk by chunk.

Several policies replay the same arrivals side by side; the stream generates each
chunk once and every policy's pool consumes the same array for each tick.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class ArrivalStream:
    """Arrival times in order, taken by `take_until(t)`, with bounded look-ahead."""

    def __init__(self, chunks: Iterator[tuple[float, np.ndarray]]) -> None:
        self._chunks = chunks
        self._buffer = np.zeros(0)
        self._complete_until = -np.inf
        self.exhausted = False

    def take_until(self, t_end: float) -> np.ndarray:
        """All not-yet-taken arrivals before `t_end`."""
        pending = [self._buffer]
        while self._complete_until < t_end and not self.exhausted:
            chunk = next(self._chunks, None)
            if chunk is None:  # a source that ends without an infinite last bound
                self.exhausted = True
                self._complete_until = np.inf
            else:
                self._complete_until, arrivals = chunk
                pending.append(arrivals)
        buffer = np.concatenate(pending) if len(pending) > 1 else self._buffer
        cut = int(np.searchsorted(buffer, t_end, side="left"))
        self._buffer = buffer[cut:]
        return buffer[:cut]

    @property
    def drained(self) -> bool:
        """True once no arrival is left to come and every arrival was taken."""
        return self._complete_until == np.inf and self._buffer.size == 0
