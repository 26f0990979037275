"""Running batches of a served model: the `ModelRunner` seam and its torch implementation.

`run(inputs, padded_size)` executes one batch padded to a warmed bucket and returns one
output per input; `warm(size)` prepares a bucket (dummy batches; with `compile=True`
that compiles the bucket's shape with `torch.compile`) and returns how long it took.
Both block: the batcher calls them on worker threads, so the event loop keeps
accepting requests while a batch runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from server.worker.models import ServedModel


class ModelRunner(Protocol):
    def run(self, inputs: Sequence[Any], padded_size: int) -> list[Any]: ...

    def warm(self, size: int) -> float:
        """Prepare batches of `size`; returns the seconds it took."""
        ...


class OutOfMemory(Exception):
    """A batch did not fit in device memory (torch's OOM, normalised across devices)."""


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
            self.module = torch.compile(self.module, dynamic=False)

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
