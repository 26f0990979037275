"""The largest value seen over a sliding time window, in O(1) amortised per sample.

A policy that scales in only when no sample of the last ten minutes wanted more would
otherwise scan 600 samples every one-second tick (half the joint policy's time on a
simulated day). The deque keeps only samples that can still be the window's maximum:
a sample followed by one at least as large never can, so it is dropped on arrival.
"""

from __future__ import annotations

from collections import deque


class SlidingMax:
    """The maximum of the values pushed at times >= the last `expire` cutoff."""

    def __init__(self) -> None:
        self._candidates: deque[tuple[float, float]] = deque()  # values strictly falling

    def push(self, at_s: float, value: float) -> None:
        """Add a sample; times must not go backwards."""
        candidates = self._candidates
        while candidates and candidates[-1][1] <= value:
            candidates.pop()
        candidates.append((at_s, value))

    def expire(self, before_s: float) -> None:
        """Forget samples taken before `before_s`."""
        candidates = self._candidates
        while candidates and candidates[0][0] < before_s:
            candidates.popleft()

    def max(self) -> float:
        """The window's largest value; raises `ValueError` on an empty window."""
        if not self._candidates:
            raise ValueError("no sample in the window")
        return self._candidates[0][1]
