"""Running batches of a served model: the `ModelRunner` seam, its torch implementation,
and the `Execution` seam through which the batcher awaits it.

`run(inputs, padded_size)` executes one batch padded to a warmed bucket and returns one
output per input; `warm(size)` prepares a bucket (dummy batches; with `compile=True`
that compiles the bucket's shape with `torch.compile`, as `compile_choice` decides for a
served model) and returns how long it took.
Both block. The batcher awaits them through an `Execution`: `ThreadedExecution` runs
them on worker threads, so the event loop keeps accepting requests while a batch runs;
`ModelledExecution` runs the runner inline and then takes a modelled service time on
the event loop's clock, so the shell can be tested in virtual time at exact instants.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import torch

from server.worker.models import ServedModel
from tidal_base.errors import InvalidInput


def parse_device(text: str) -> torch.device:
    """`--device`: cpu, cuda or cuda:N, and only a CUDA device this machine has (checked
    before a model is loaded, so a typo costs a line, not a warm-up)."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise InvalidInput(f"--device: expected cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InvalidInput(f"--device {text}: this machine has no CUDA device")
        if device.index is not None and device.index >= count:
            raise InvalidInput(f"--device {text}: this machine has {count} CUDA device(s)")
    return device


class ModelRunner(Protocol):
    """A model the batcher can run: `TorchRunner` live, cheap runners in tests.

    Called from one thread per model instance (`Execution` decides which); blocking."""

    def run(self, inputs: Sequence[Any], padded_size: int) -> list[Any]:
        """One output per input, in order, for a batch padded to `padded_size` (a warmed
        bucket, or len(inputs) when none holds it). Raises `OutOfMemory` when the batch
        does not fit (the batcher splits it); any other exception fails the batch."""
        ...

    def warm(self, size: int) -> float:
        """Prepare batches of `size`; returns the seconds it took."""
        ...


class Execution(Protocol):
    """Where the batcher's model calls run. `run` and `warm` are awaited on the event
    loop and must not block it; several `run`s may be in flight at once (one per model
    instance, the batcher keeps count), and a `warm` beside them. Cancelling an awaited
    call abandons its result. `close` is called once, after the last call."""

    async def run(self, inputs: Sequence[Any], padded_size: int) -> list[Any]:
        """`ModelRunner.run(inputs, padded_size)` awaited: one output per input, in order;
        `OutOfMemory` when the batch does not fit, any other exception when the model fails."""
        ...

    async def warm(self, size: int) -> float:
        """`ModelRunner.warm(size)` awaited: the seconds the warm-up took."""
        ...

    def close(self) -> None:
        """Release what it holds (`ThreadedExecution`: its threads); called once, after the
        last call."""
        ...


class ThreadedExecution:
    """A blocking `ModelRunner` on threads: `instances` for batches, one for warm-ups."""

    def __init__(self, runner: ModelRunner, instances: int = 1) -> None:
        self.runner = runner
        self._batches = ThreadPoolExecutor(instances, thread_name_prefix="model")
        self._warm_ups = ThreadPoolExecutor(1, thread_name_prefix="warmup")

    async def run(self, inputs: Sequence[Any], padded_size: int) -> list[Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._batches, self.runner.run, inputs, padded_size)

    async def warm(self, size: int) -> float:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._warm_ups, self._warm_then_freeze, size)

    def _warm_then_freeze(self, size: int) -> float:
        seconds = self.runner.warm(size)
        # What a warm-up builds (torch.compile's graphs and caches: a heap of objects)
        # lives as long as the process. Left in the collector's generations, every full
        # collection walked it: 100-200 ms pauses of a compiled demo-ranker worker,
        # several a minute under load (docs/benchmarks.md). Frozen, collections skip it.
        gc.freeze()
        return seconds

    def close(self) -> None:
        self._batches.shutdown(wait=True)
        self._warm_ups.shutdown(wait=False, cancel_futures=True)


class ModelledExecution:
    """Runs the runner inline (it must be cheap: a test's echo), then sleeps a modelled
    time on the event loop: `service_s(size, padded_size)` per batch, `warm_s(size)` per
    warm-up. Under a virtual-time loop every batch and warm-up takes exactly that long,
    so a test can assert dispatch instants and batch boundaries exactly."""

    def __init__(
        self,
        runner: ModelRunner,
        service_s: Callable[[int, int], float],
        warm_s: Callable[[int], float] = lambda size: 0.0,
    ) -> None:
        self.runner = runner
        self.service_s = service_s
        self.warm_s = warm_s

    async def run(self, inputs: Sequence[Any], padded_size: int) -> list[Any]:
        outputs = self.runner.run(inputs, padded_size)
        await asyncio.sleep(self.service_s(len(inputs), padded_size))
        return outputs

    async def warm(self, size: int) -> float:
        self.runner.warm(size)
        seconds = self.warm_s(size)
        await asyncio.sleep(seconds)
        return seconds

    def close(self) -> None:
        pass


class OutOfMemory(Exception):
    """A batch did not fit in device memory (torch's OOM, normalised across devices):
    the batcher splits the batch; warming stops there, and the cap falls below the bucket.

    Not a `TidalError`: a device's limit, not a refusal of Tidal's. Where nothing catches
    it (`tidal profile` asked for a batch that does not fit) it keeps its traceback, with
    torch's message chained, as any other failure of the device."""


def compile_choice(flag: bool | None, model: ServedModel) -> bool:
    """Whether warming a bucket compiles it: `--compile` / `--no-compile` when given
    (`flag`), else the model's own choice (`ServedModel.compile_buckets`: demo-ranker
    compiles, the other demos and loaded files do not). The worker and `tidal profile`
    decide alike, so a profile measures the model as a worker serves it."""
    return model.compile_buckets if flag is None else flag


def compile_mode(device_type: str) -> str | None:
    """`torch.compile`'s mode for a bucket on `device_type`: on CUDA "reduce-overhead",
    which captures each static shape as a CUDA Graph (one graph per padded bucket, replayed
    without per-kernel launches, the point of warming sizes on a GPU); elsewhere the
    default (inductor's fused kernels; CUDA Graphs do not exist there)."""
    return "reduce-overhead" if device_type == "cuda" else None


class TorchRunner:
    """Runs a `ServedModel` under `torch.inference_mode` on one device."""

    def __init__(
        self, model: ServedModel, device: str = "cpu", warm_runs: int = 2, compile: bool = False
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.module = model.module.to(self.device)
        self.warm_runs = warm_runs
        if compile:
            # Static shapes: every padded bucket compiles once, on its first (warm-up)
            # batch, which is exactly the warm-up the batcher plans around.
            self.module = torch.compile(
                self.module, dynamic=False, mode=compile_mode(self.device.type)
            )

    def run(self, inputs: Sequence[Any], padded_size: int) -> list[Any]:
        arguments = [a.to(self.device) for a in self.model.collate(inputs, padded_size)]
        try:
            with torch.inference_mode():
                output = self.module(*arguments)
        except torch.OutOfMemoryError as error:
            raise OutOfMemory(str(error)) from error
        return output[: len(inputs)].float().cpu().tolist()

    def warm(self, size: int) -> float:
        started = time.perf_counter()
        inputs = [self.model.validate(self.model.example(i)) for i in range(size)]
        for _ in range(self.warm_runs):
            self.run(inputs, size)
        return time.perf_counter() - started
