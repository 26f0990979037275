"""How large a batch a model's memory allows, measured: what the worker bounds its caps
by and what `tidal profile` reports, from one place.

The formula is the latency models' (`adaptive.latency.MemoryLimit.max_batch_size`, the
bound the simulator clamps caps to): `(device memory - parameters) / activations per
sample`. Parameters are counted. Activations per sample come from one forward pass of a
probe batch: on CUDA the peak allocated above the parameters, on CPU the sum of every
leaf module's outputs (an upper bound on what a forward pass holds). Device memory is
the CUDA device's, or on CPU a stated budget (`--memory-budget`, default 8 GiB), since a
process shares the host's memory with everything else on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from adaptive.latency import MemoryLimit
from server.worker.models import ServedModel

PROBE_BATCH = 8
"""Requests in the measuring forward pass: enough that per-batch overheads do not count
as per-sample, cheap enough to add milliseconds to a start (demo-cnn: about 10 ms)."""


def example_inputs(model: ServedModel, size: int) -> list[Any]:
    """`size` of the model's own example inputs, validated as requests are."""
    return [model.validate(model.example(i)) for i in range(size)]


def parameter_bytes(model: ServedModel) -> int:
    return sum(p.numel() * p.element_size() for p in model.module.parameters())


def activation_bytes(model: ServedModel, inputs: Sequence[Any], device: torch.device) -> int:
    """Bytes one forward pass over `inputs` holds (on CPU an upper bound: every leaf
    module's outputs, as if none were freed)."""
    if device.type == "cuda":
        from server.worker.runner import TorchRunner

        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        TorchRunner(model, str(device)).run(inputs, len(inputs))
        return int(torch.cuda.max_memory_allocated(device) - base)
    total = 0

    def count(_module, _args, output):
        nonlocal total
        for tensor in output if isinstance(output, tuple) else (output,):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()

    leaves = [m for m in model.module.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.inference_mode():
            model.module(*model.collate(inputs, len(inputs)))
    finally:
        for hook in hooks:
            hook.remove()
    return total


def device_bytes(device: torch.device, budget_bytes: int) -> int:
    """The device's memory on CUDA; the budget on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return budget_bytes


def measure_memory(
    model: ServedModel,
    device: torch.device,
    budget_bytes: int,
    probe: Sequence[Any] | None = None,
) -> MemoryLimit:
    """The model's memory limit on `device`, activations measured on `probe` (default:
    `PROBE_BATCH` example inputs). Raises `InvalidInput` when the parameters alone do
    not fit."""
    inputs = probe if probe is not None else example_inputs(model, PROBE_BATCH)
    per_sample = activation_bytes(model, inputs, device) // len(inputs)
    return MemoryLimit(device_bytes(device, budget_bytes), parameter_bytes(model), per_sample)


def describe_memory(memory: MemoryLimit) -> str:
    """`(8 GiB - 1.8 MiB of parameters) / 1.31 MiB per sample`, the formula filled in."""
    return (
        f"({_mib(memory.device_bytes)} - {_mib(memory.parameter_bytes)} of parameters) / "
        f"{_mib(memory.activation_bytes_per_sample)} of activations per sample"
    )


def _mib(size: int) -> str:
    if size >= 2**30:
        return f"{size / 2**30:.3g} GiB"
    return f"{size / 2**20:.3g} MiB" if size >= 2**20 else f"{size:,} B"
