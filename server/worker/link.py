"""A worker's membership of a pool: its batcher as an engine (`TidalWorkerEngine`,
server/worker/engine.py) on a `PoolMember` (stats out each interval, configs in,
fail-static; see `server/engines/member.py`). Its loops' failures are counted with the
batcher's (`tidal_worker_background_errors_total{task="link-report"|"link-config"}`),
and its windows are measured on the batcher's clock.
"""

from __future__ import annotations

from server.bus.protocols import WorkerBus
from server.engines.member import PoolMember
from server.worker.batching import DynamicBatcher
from server.worker.engine import TidalWorkerEngine
from server.worker.readiness import Frontends


class WorkerLink(PoolMember):
    def __init__(
        self,
        batcher: DynamicBatcher,
        bus: WorkerBus,
        pool: str,
        worker: str,
        interval_s: float = 1.0,
        heartbeat_ttl_s: float = 3.0,
        max_unsent: int = 3600,
        frontends: Frontends | None = None,
    ) -> None:
        self.batcher = batcher
        self.worker_engine = TidalWorkerEngine(batcher, worker, interval_s, frontends)
        super().__init__(
            self.worker_engine,
            bus,
            pool,
            worker,
            batcher.clock,
            batcher.errors,
            interval_s=interval_s,
            heartbeat_ttl_s=heartbeat_ttl_s,
            max_unsent=max_unsent,
        )

    def start(self) -> None:
        self.worker_engine.collector.begin()
        super().start()
