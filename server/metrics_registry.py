"""The Prometheus registry each Tidal process serves at /metrics.

Every process exports the same base: `process_*` (CPU seconds, resident memory, open
file descriptors, start time), `python_info` and `python_gc_*`, and `tidal_build_info`
naming the release and the component. Counters do not emit `_created` families: they
double the series for nothing a dashboard or an alert reads.
"""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily

disable_created_metrics()


def process_registry(component: str) -> CollectorRegistry:
    """A registry with the process base and `tidal_build_info{component=...}`."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(_BuildInfo(component))
    return registry


class _BuildInfo:
    def __init__(self, component: str) -> None:
        try:
            self.version = importlib.metadata.version("tidal")
        except importlib.metadata.PackageNotFoundError:  # run from a checkout, uninstalled
            self.version = "unknown"
        self.component = component

    def collect(self):
        info = GaugeMetricFamily(
            "tidal_build_info",
            "1, labelled with the Tidal release, the component and the Python version.",
            labels=["version", "component", "python"],
        )
        info.add_metric([self.version, self.component, platform.python_version()], 1.0)
        yield info
