"""Tidal's batching core: batch configs, batching semantics, latency models and policies.

Nothing here reads a clock, sleeps or does I/O: the live shell (`server/`) and the
simulated shell (`simulations/`) pass time and observations in, so the same code decides
in both.
"""

from adaptive.config import BatchConfig

__all__ = ["BatchConfig"]
