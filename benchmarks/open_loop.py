"""An open-loop Poisson load on a lean HTTP/1.1 client, and the CPU it and the server cost.

The server-comparison benchmarks run the client on the same two cores as the server, so
every CPU-millisecond the client spends is taken from the server it measures. This load
rides `server.tools.lean_http` (keep-alive connections reused from an idle stack,
requests encoded once, answers parsed by httptools), arrivals fired by `loop.call_at`
(no task or coroutine per request), the answer's `"batch_size"` read from its bytes
without a JSON parse.

Chosen by measurement (2 cores, one `tidal worker --model demo-cnn --config
max_batch=16,timeout=10ms` at 2 torch threads, Poisson 100 req/s for 10 s, binary bodies,
twice each; the client thread's CPU time while sending over the requests sent, the
kernel's loopback work for its writes included): httpx, as tests/ray_cluster.OpenLoopLoad
drives it, 1.17-1.26 ms a request; aiohttp 3.14 (installed as a Ray dependency, not one of
Tidal's) 0.47-0.49 ms; this client 0.20 ms. p50 was the same within 2 ms (16-18 ms), the
server's latency, not the client's; the cheapest client leaves the most CPU to the server.

Latency runs from the instant a request was written (as OpenLoopLoad measures it); how
late the loop wrote it after its Poisson instant is reported apart (`send_lag_p99_ms`),
so a starved client shows as lag, not as server latency. A request past the in-flight
bound is not sent and counts as an error, as in `tidal loadgen`.

`cpu_snapshot` reads the CPU seconds of every process under a root (this process's
children and theirs) from /proc, labelled by the process it descends from, so a run can
say how many CPU-milliseconds a request cost each server process; `machine_busy_s`
reads the whole machine's, so it can say how much went to processes it did not start.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from server.tools.lean_http import Endpoint, PostRequest

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Answer:
    """One request: seconds after the load began that it was due, how late it was
    written, its status (-1: no answer, 0: not sent at the in-flight bound), latency, and
    the batch it ran in as the server reports it."""

    due_s: float
    lag_s: float
    status: int
    latency_s: float
    batch_size: int | None


@dataclass(frozen=True, slots=True)
class LoadRun:
    """A run's answers, its measured window and the arrivals due in it (an arrival left
    unanswered when the run gave up on it counts there, not in `answers`), the client's
    CPU over that window, and what `probe` returned at the window's start and end."""

    rate_rps: float
    window: tuple[float, float]
    due_in_window: int
    answers: tuple[Answer, ...]
    client_cpu_s: float
    probes: tuple[object, object]

    def __post_init__(self) -> None:
        if not self.window[1] > self.window[0]:
            raise ValueError(f"window must end after it starts, got {self.window}")

    @property
    def window_s(self) -> float:
        return self.window[1] - self.window[0]

    def measured(self) -> list[Answer]:
        """The answers due inside the window (the settling seconds before it excluded)."""
        start, end = self.window
        return [a for a in self.answers if start <= a.due_s < end]


def batch_size_of(body: bytes) -> int | None:
    """The `"batch_size"` a worker or replica reports in its answer's timing, read from
    the bytes (a JSON parse per answer costs the client more than the rest of its work)."""
    at = body.find(b'"batch_size":')
    if at < 0:
        return None
    digits = body[at + 13 : at + 24].lstrip()
    end = 0
    while end < len(digits) and 48 <= digits[end] <= 57:
        end += 1
    return int(digits[:end]) if end else None


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """How a run is driven: seconds of arrivals, the first `settle_s` of them not
    measured, an answer's timeout, and the in-flight bound."""

    seconds: float
    settle_s: float
    timeout_s: float = 5.0
    max_in_flight: int = 512

    def __post_init__(self) -> None:
        if not self.seconds > self.settle_s >= 0:
            raise ValueError(
                f"seconds must exceed settle_s >= 0, got {self.seconds:g} and {self.settle_s:g}"
            )
        if not self.timeout_s > 0 or self.max_in_flight < 1:
            raise ValueError(
                f"timeout_s must be > 0 and max_in_flight >= 1, got {self.timeout_s:g} "
                f"and {self.max_in_flight}"
            )


def run_load(
    request: PostRequest,
    rate_rps: float,
    settings: LoadSettings,
    seed: int,
    probe: Callable[[], object] = lambda: None,
) -> LoadRun:
    """Poisson arrivals at `rate_rps` for `settings.seconds`, open loop; `probe` (a
    server's CPU, its metrics) is called on a thread at the measured window's start and
    end. Returns once every answer is in or timed out."""
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0, got {rate_rps:g}")
    rng = np.random.default_rng(seed)
    count = int(rate_rps * settings.seconds * 1.5) + 16
    due = np.cumsum(rng.exponential(1.0 / rate_rps, count))
    due = due[due < settings.seconds]
    return asyncio.run(_Load(request, settings, rate_rps).run(due.tolist(), probe))


class _Load:
    """One run's event-loop state: the idle connections, what is in flight, the answers."""

    def __init__(self, request: PostRequest, settings: LoadSettings, rate_rps: float) -> None:
        self.request = request
        self.settings = settings
        self.rate_rps = rate_rps
        self.endpoint = Endpoint(request.host, request.port)
        self.in_flight = 0
        self.answers: list[Answer] = []
        self.sent = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    async def run(self, due: list[float], probe: Callable[[], object]) -> LoadRun:
        self.loop = asyncio.get_running_loop()
        started = self.loop.time()
        start, end = self.settings.settle_s, self.settings.seconds
        for at in due:
            self.loop.call_at(started + at, self._arrive, at, started)
        await asyncio.sleep(max(0.0, started + start - self.loop.time()))
        first = self.loop.run_in_executor(None, probe)
        cpu_at_start = time.thread_time()
        await asyncio.sleep(max(0.0, started + end - self.loop.time()))
        client_cpu_s = time.thread_time() - cpu_at_start
        last = self.loop.run_in_executor(None, probe)
        await self._drain(len(due))
        probes = (await first, await last)
        answers = tuple(sorted(self.answers, key=lambda a: a.due_s))
        due_in_window = sum(start <= at < end for at in due)
        return LoadRun(self.rate_rps, (start, end), due_in_window, answers, client_cpu_s, probes)

    async def _drain(self, expected: int) -> None:
        """Until every arrival has its answer (a timed-out one is aborted, so answered
        -1), then close the idle connections. Polled: only at a run's end."""
        deadline = self.loop.time() + self.settings.timeout_s + 1.0
        while len(self.answers) < expected and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        self.endpoint.close()

    def _arrive(self, due_s: float, started: float) -> None:
        lag_s = self.loop.time() - started - due_s
        if self.in_flight >= self.settings.max_in_flight:
            self._record(Answer(due_s, lag_s, 0, 0.0, None))
            return
        self.in_flight += 1
        data = self.request.encode(self.sent)
        self.sent += 1
        sent_at = time.perf_counter()

        def done(status: int, body: bytes) -> None:
            size = batch_size_of(body) if status == 200 else None
            self._answered(Answer(due_s, lag_s, status, time.perf_counter() - sent_at, size))

        self.endpoint.post(data, done, self.settings.timeout_s)

    def _answered(self, answer: Answer) -> None:
        self.in_flight -= 1
        self._record(answer)

    def _record(self, answer: Answer) -> None:
        self.answers.append(answer)


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    """A process's label (the process it descends from) and its CPU seconds so far."""

    label: str
    cpu_s: float


def cpu_snapshot(root_pid: int, labels: dict[int, str]) -> dict[int, ProcessCpu]:
    """CPU seconds (user + system) of every process below `root_pid` (not itself),
    labelled by `labels`; a process below a labelled one is "<label> children" (a
    worker's front ends apart from its model process), any other by its own name."""
    stats = dict(filter(None, map(_read_stat, _pids())))
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, ProcessCpu] = {}
    stack: list[tuple[int, str | None]] = [(pid, None) for pid in children.get(root_pid, [])]
    while stack:
        pid, inherited = stack.pop()
        name, _, cpu_s = stats[pid]
        own = labels.get(pid)
        out[pid] = ProcessCpu(own or inherited or name, cpu_s)
        below = f"{own} children" if own else inherited
        stack.extend((child, below) for child in children.get(pid, []) if child in stats)
    return out


def cpu_by_label(before: dict[int, ProcessCpu], after: dict[int, ProcessCpu]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, summed per label (a process born in
    between counts from zero; one that died in between is lost)."""
    spent: dict[str, float] = {}
    for pid, now in after.items():
        then = before.get(pid)
        spent[now.label] = spent.get(now.label, 0.0) + now.cpu_s - (then.cpu_s if then else 0.0)
    return spent


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process: /proc/stat's
    user, nice, system, irq, softirq and steal), so a run can say how much of the machine
    went to processes it did not start (the machine may be shared)."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICKS_PER_S


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _read_stat(pid: int) -> tuple[int, tuple[str, int, float]] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:  # gone since the listing
        return None
    name_end = text.rfind(b")")
    name = text[text.find(b"(") + 1 : name_end].decode(errors="replace")
    fields = text[name_end + 2 :].split()
    # Fields 4 (ppid), 14 (utime) and 15 (stime) of proc(5), counted from the state (3).
    ticks_s = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return pid, (name, int(fields[1]), _threads_cpu_s(pid, ticks_s))


def _threads_cpu_s(pid: int, ticks_s: float) -> float:
    """The process's threads' CPU time in nanoseconds (schedstat), summed: utime and
    stime come in ticks of 10 ms, too coarse for a run of a few hundred requests. A
    thread that exited is missing here, so the larger of the two counts."""
    total_ns = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total_ns += int(f.read().split()[0])
    except OSError:  # no schedstat on this kernel, or the process is exiting
        return ticks_s
    return max(total_ns / 1e9, ticks_s)
