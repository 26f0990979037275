"""The model process's side of `tidal worker --frontends N`: start the front-end
processes, take their hand-offs into the one batcher, answer them, and keep them alive.

Why processes: a request's CPU work (HTTP parsing, JSON or binary decoding, input
validation, and for real models image decoding or tokenising) holds the GIL, and in one
process it competes with the batcher's event loop and the model's own Python. Front ends
scale that work over cores while the model process sizes batches for the device alone;
the batching rule still sees every request of the worker, because there is one batcher
(Triton does the same with front-end threads feeding one scheduler).

The pool owns what must outlive a front end: the shared-memory arenas (one per front
end, reused by its restart), the hand-off socket, and which slots requests of a dead
front end still hold (queued here, read in place): its restart is told them when it
connects and gets each back once its request is done, so an input is never rewritten
before its batch has run (`server.worker.handoff`). A front end that dies is logged
with its exit code, counted (`tidal_worker_frontend_restarts_total`) and started again
after a backoff (`RestartBackoff`: 1 s, doubled for each exit in a row, at most 30 s,
counted from the start again once a process has run a minute), so a front end that
cannot start is not respawned every second forever; the worker is not ready until every
front end has connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from server.http_edge import EdgeLimits
from server.tasks import BackgroundErrors, spawn
from server.worker import handoff
from server.worker.frontend import FrontendSpec, run_frontend
from server.worker.inference import Answer, Parsed
from server.worker.models import InputCodec
from tidal_base.errors import InvalidInput

log = logging.getLogger("tidal.worker")

SLOTS_PER_FRONTEND = 1024
"""Requests a front end may have handed off at once before inputs travel inline."""
POLL_S = 1.0
"""How often the front ends' processes are looked at."""

Serve = Callable[[Parsed, float], Awaitable[Answer]]
"""(parsed request, ingress seconds) -> its answer: `server.worker.inference.answer`."""


@dataclass(frozen=True, slots=True)
class RestartBackoff:
    """How long a front end that exited waits to be started again: `first_s`, doubled
    for each exit in a row, at most `max_s`. A process that ran `stable_after_s` or more
    ends the row: its exit waits `first_s` again."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.first_s > 0:
            raise InvalidInput(f"first_s must be > 0, got {self.first_s}")
        if not self.max_s >= self.first_s:
            raise InvalidInput(f"max_s must be >= first_s ({self.first_s}), got {self.max_s}")
        if not self.stable_after_s > 0:
            raise InvalidInput(f"stable_after_s must be > 0, got {self.stable_after_s}")

    def exits_in_a_row(self, before: int, ran_s: float) -> int:
        """The row's length after the exit of a process that ran `ran_s`."""
        return 1 if ran_s >= self.stable_after_s else before + 1

    def delay_s(self, exits_in_a_row: int) -> float:
        """The wait before the next start, the row this long."""
        return min(self.max_s, self.first_s * 2.0 ** max(0, exits_in_a_row - 1))


@dataclass
class _Frontend:
    """One front end's process and counters (the totals survive its restarts)."""

    index: int
    arena: handoff.SlotArena
    process: multiprocessing.process.BaseProcess | None = None
    connected: bool = False
    started_at: float = 0.0
    restart_at: float | None = None  # exited: when it is started again
    restarts: int = 0
    exits_in_a_row: int = 0
    cpu_s: float = 0.0  # this process's report
    requests: int = 0
    cpu_s_before: float = 0.0  # earlier processes' last reports
    requests_before: int = 0
    writer: handoff.FrameWriter | None = None  # its process's hand-off connection
    # slot -> the connection whose request reads it, until that request is done
    held: dict[int, handoff.FrameWriter] = field(default_factory=dict)


class FrontendPool:
    """N front-end processes on `listening`, handing requests to `serve`."""

    def __init__(
        self,
        count: int,
        model: str,
        codec: InputCodec,
        listening: socket.socket,
        limits: EdgeLimits,
        client_timeout_s: float,
        slots_per_frontend: int = SLOTS_PER_FRONTEND,
        backoff: RestartBackoff = RestartBackoff(),
        poll_s: float = POLL_S,
    ) -> None:
        self.count, self.model, self.listening = count, model, listening
        self.limits, self.client_timeout_s = limits, client_timeout_s
        self.backoff, self.poll_s = backoff, poll_s
        self._folder = Path(tempfile.mkdtemp(prefix="tidal-worker-"))
        self.api_path = str(self._folder / "api.sock")  # the model process's own API
        self.handoff_path = str(self._folder / "handoff.sock")
        slot_bytes = handoff.slot_bytes_for(torch.as_tensor(codec.validate(codec.example(0))))
        self._frontends = [
            _Frontend(i, handoff.SlotArena.create(slots_per_frontend, slot_bytes))
            for i in range(count)
        ]
        self._context = multiprocessing.get_context("spawn")  # no fork of torch's threads
        self._serve: Serve | None = None
        self._errors: BackgroundErrors | None = None
        self._server: asyncio.Server | None = None
        self._supervisor: asyncio.Task | None = None
        self._connections: set[asyncio.Task] = set()  # every hand-off connection open
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, serve: Serve, errors: BackgroundErrors) -> None:
        """Listen for hand-offs, then start every front end (they connect on start)."""
        self._serve, self._errors = serve, errors
        self._server = await asyncio.start_unix_server(self._connection, self.handoff_path)
        for frontend in self._frontends:
            self._start(frontend)
        self._supervisor = spawn(self._supervise(), "frontends", errors)

    async def stop(self) -> None:
        """SIGTERM every front end and wait while they finish what they hold (their
        requests are still answered here), then close the hand-off."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        processes = [f.process for f in self._frontends if f.process is not None]
        for process in processes:
            if process.is_alive():
                process.terminate()
        await asyncio.get_running_loop().run_in_executor(None, _join_all, processes)
        if self._server is not None:
            self._server.close()  # no new connections; it leaves the open ones be
        await _cancel_all(self._connections)  # closes each one's socket
        for frontend in self._frontends:
            with contextlib.suppress(BufferError):  # a view still held by a dead request
                frontend.arena.close()
        with contextlib.suppress(OSError):
            for path in (self.api_path, self.handoff_path):
                os.unlink(path)
            self._folder.rmdir()

    @property
    def ready(self) -> bool:
        return all(f.connected for f in self._frontends)

    def summary(self) -> list[dict]:
        return [
            {
                "index": f.index,
                "pid": f.process.pid if f.process is not None else None,
                "connected": f.connected,
                "restarts": f.restarts,
                "exits_in_a_row": f.exits_in_a_row,
                "requests": f.requests_before + f.requests,
                "cpu_s": round(f.cpu_s_before + f.cpu_s, 3),
            }
            for f in self._frontends
        ]

    # -- processes -------------------------------------------------------------------

    def _start(self, frontend: _Frontend) -> None:
        spec = FrontendSpec(
            frontend.index,
            self.model,
            self.handoff_path,
            self.api_path,
            frontend.arena.name,
            frontend.arena.slots,
            frontend.arena.slot_bytes,
            self.limits,
            self.client_timeout_s,
        )
        frontend.process = self._context.Process(
            target=run_frontend,
            args=(spec, self.listening),
            name=f"tidal-frontend-{frontend.index}",
            daemon=True,
        )
        frontend.process.start()
        frontend.started_at = time.monotonic()

    async def _supervise(self) -> None:
        """Start again a front end that exits while the worker serves, after its backoff."""
        while not self._stopping:
            await asyncio.sleep(self._next_look_s())
            now = time.monotonic()
            for frontend in self._frontends:
                if not self._stopping:
                    self._look_after(frontend, now)

    def _next_look_s(self) -> float:
        """Until the next poll, or the next restart that falls due before it."""
        now = time.monotonic()
        due = [f.restart_at - now for f in self._frontends if f.restart_at is not None]
        return max(0.0, min([self.poll_s, *due]))

    def _look_after(self, frontend: _Frontend, now: float) -> None:
        process = frontend.process
        if frontend.restart_at is not None:
            if now >= frontend.restart_at:
                frontend.restart_at = None
                self._start(frontend)
        elif process is not None and not process.is_alive():
            self._exited(frontend, process, now)
        elif frontend.exits_in_a_row and now - frontend.started_at >= self.backoff.stable_after_s:
            log.info(
                "front end %d has run %.0f s since its restart: its backoff starts over",
                frontend.index,
                now - frontend.started_at,
            )
            frontend.exits_in_a_row = 0

    def _exited(self, frontend: _Frontend, process, now: float) -> None:
        ran_s = now - frontend.started_at
        frontend.exits_in_a_row = self.backoff.exits_in_a_row(frontend.exits_in_a_row, ran_s)
        delay_s = self.backoff.delay_s(frontend.exits_in_a_row)
        log.error(
            "front end %d (pid %s) exited with code %s after %.1f s (%d in a row); "
            "starting it again in %g s",
            frontend.index,
            process.pid,
            process.exitcode,
            ran_s,
            frontend.exits_in_a_row,
            delay_s,
        )
        frontend.restarts += 1
        frontend.connected = False
        frontend.cpu_s_before += frontend.cpu_s
        frontend.requests_before += frontend.requests
        frontend.cpu_s, frontend.requests = 0.0, 0
        frontend.restart_at = now + delay_s

    # -- hand-offs -------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One front end's requests until it closes its side (or `stop` cancels it)."""
        frontend: _Frontend | None = None
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        out, splitter = handoff.FrameWriter(writer), handoff.FrameSplitter()
        try:
            while True:
                for payload in await handoff.read_frames(reader, splitter):
                    frontend = self._received(payload, frontend, out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front end closed: it exited, or was stopped
        finally:
            self._connections.discard(task)
            if frontend is not None and frontend.writer is out:  # not its successor's
                frontend.connected, frontend.writer = False, None
            out.close()

    def _received(
        self, payload: bytes, frontend: _Frontend | None, writer: handoff.FrameWriter
    ) -> _Frontend | None:
        """One frame from a front end's connection; the front end it is (once it said)."""
        kind = handoff.kind_of(payload)
        if kind == handoff.HELLO:
            frontend = self._frontends[handoff.decode_hello(payload)]
            frontend.connected, frontend.writer = True, writer
            writer.write(handoff.encode_welcome(frontend.held))  # all its predecessors'
        elif kind == handoff.STATS and frontend is not None:
            frontend.cpu_s, frontend.requests = handoff.decode_stats(payload)
        elif kind == handoff.REQUEST and frontend is not None:
            self._take(frontend, handoff.decode_request(payload), writer)
        return frontend

    def _take(self, frontend: _Frontend, request: handoff.RequestFrame, writer) -> None:
        slot = request.slot
        if slot == handoff.INLINE:
            item = handoff.inline_tensor(request)
        else:
            item = frontend.arena.view(slot, request.dtype, request.shape)
            frontend.held[slot] = writer
        parsed = Parsed(item, request.deadline_ms, request.origin_wall_s, request.stamped)
        ingress_s = max(0.0, time.time() - request.origin_wall_s)
        assert self._serve is not None and self._errors is not None
        task = spawn(
            self._answer(request.request_id, parsed, ingress_s, writer),
            "frontend-request",
            self._errors,
            lambda error: _send(writer, request.request_id, 500, _internal(error)),
        )
        if slot != handoff.INLINE:
            task.add_done_callback(lambda _: _release(frontend, slot, writer))

    async def _answer(self, request_id: int, parsed: Parsed, ingress_s: float, writer) -> None:
        assert self._serve is not None
        answer = await self._serve(parsed, ingress_s)
        _send(writer, request_id, answer.status, answer.body)

    # -- metrics ---------------------------------------------------------------------

    def collect(self):
        """Prometheus collector (registered by the worker's app)."""
        requests = CounterMetricFamily(
            "tidal_worker_frontend_requests",
            "Inference requests a front-end process took (parsed and handed off, or refused).",
            labels=["frontend"],
        )
        cpu = CounterMetricFamily(
            "tidal_worker_frontend_cpu_seconds",
            "CPU seconds of a front-end process: with the requests counter, requests per "
            "CPU-second of front end.",
            labels=["frontend"],
        )
        restarts = CounterMetricFamily(
            "tidal_worker_frontend_restarts", "Front ends that exited and were started again."
        )
        connected = GaugeMetricFamily(
            "tidal_worker_frontends_connected",
            "Front-end processes connected to the model process.",
        )
        in_a_row = GaugeMetricFamily(
            "tidal_worker_frontend_exits_in_a_row",
            "Exits of a front end with no stable run between (its restart waits longer "
            "for each); 0 once a process has run long enough.",
            labels=["frontend"],
        )
        for f in self._frontends:
            requests.add_metric([str(f.index)], f.requests_before + f.requests)
            cpu.add_metric([str(f.index)], f.cpu_s_before + f.cpu_s)
            in_a_row.add_metric([str(f.index)], f.exits_in_a_row)
        restarts.add_metric([], sum(f.restarts for f in self._frontends))
        connected.add_metric([], sum(f.connected for f in self._frontends))
        return [requests, cpu, restarts, connected, in_a_row]


def _release(frontend: _Frontend, slot: int, writer: handoff.FrameWriter) -> None:
    """Done with the request in `slot`, which came on `writer`. The front end that sent
    it takes the slot back with the answer; if that process is gone, its successor is
    told (or, not connected yet, will not hear of the slot as held)."""
    if frontend.held.get(slot) is writer:
        del frontend.held[slot]
    successor = frontend.writer
    if successor is not None and successor is not writer and not successor.is_closing():
        successor.write(handoff.encode_release(slot))


def _send(writer: handoff.FrameWriter, request_id: int, status: int, body: dict) -> None:
    if not writer.is_closing():  # else its front end is gone, and the client with it
        writer.write(handoff.encode_answer(request_id, status, json.dumps(body).encode()))


def _internal(error: BaseException) -> dict:
    return {"error": f"internal error ({error!r}); see the worker's log", "field": None}


async def _cancel_all(tasks: set[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _join_all(processes: list, timeout_s: float = 60.0) -> None:
    """Wait for each to exit: uvicorn's graceful shutdown takes up to 30 s, then kill."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            log.error("front end %s did not stop in %g s; killing it", process.pid, timeout_s)
            process.kill()
            process.join()
