"""`tidal profile`: measure a model's latency per batch size and write a latency profile.

    tidal profile --model demo-cnn --batch-sizes 1,2,4,8,16,32,64 --out profile.json

Per batch size: its warm-up (the first two runs, untimed in the figures; with
`--compile`, the model's default for demo-ranker, that is the bucket's compile, as a
worker pays it), then mean and p99 execution time, items/s and the gain over the
smallest size (batch 1 by default). Memory:
parameter bytes, and activation bytes per sample (on CUDA the peak allocated above the
parameters; on CPU the sum of every module's output tensors, an upper bound on what a
forward pass holds). The largest feasible batch is `(device memory - parameters) /
per-sample activations`, with `--memory-budget` standing in for device memory on CPU:
measured by `server.worker.memory`, as the worker measures the bound on its caps.
The JSON loads directly into `simulate --latency-model profile.json` and the controller.

    tidal profile --model demo-cnn --under-load http://127.0.0.1:8001 --out served.json

measures a running worker while it serves load instead (`profile_under_load`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from server.worker.cli import MEMORY_BUDGET, add_compile_flag
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_size_bytes

if TYPE_CHECKING:  # torch and numpy load when a profile runs, not for --help
    import numpy as np

    from adaptive.latency import MemoryLimit
    from server.worker.models import ServedModel
    from server.worker.runner import TorchRunner

DEFAULT_SIZES = "1,2,4,8,16,32,64,128"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    profile = subparsers.add_parser("profile", help="measure latency per batch size")
    profile.add_argument(
        "--model",
        required=True,
        help="demo-cnn, demo-ranker, demo-text, TorchScript or module:factory",
    )
    profile.add_argument(
        "--device",
        default="cpu",
        help="where the model runs: cpu, cuda or cuda:N (default cpu)",
    )
    profile.add_argument("--batch-sizes", default=DEFAULT_SIZES, help=f"default {DEFAULT_SIZES}")
    profile.add_argument("--seq-len", type=int, help="token count for demo-text inputs")
    profile.add_argument(
        "--memory-budget",
        default=MEMORY_BUDGET,
        help=f"device memory on CPU (default {MEMORY_BUDGET})",
    )
    profile.add_argument(
        "--runs", type=int, default=20, help="timed runs per batch size (default 20)"
    )
    add_compile_flag(profile)
    load = profile.add_argument_group(
        "under serving load (the profile the hardware gives while it serves)"
    )
    load.add_argument(
        "--under-load",
        metavar="URL[,URL]",
        help="measure running tidal workers while they serve open-loop Poisson load, in "
        "turn (their config forms the batches); --runs is then the fewest batches a size "
        "needs to be a point",
    )
    load.add_argument(
        "--rates",
        default="20,50,100",
        help="req/s to the workers together, each rate in turn (default 20,50,100)",
    )
    load.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="seconds of load at each rate (default 10)",
    )
    load.add_argument("--seed", type=int, default=0, help="of the arrivals (default 0)")
    profile.add_argument("--out", type=Path, help="write the profile JSON here")
    profile.add_argument("--plot", type=Path, help="write a PNG of latency and throughput")
    profile.set_defaults(handler=run_profile)


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise InvalidInput(
            f"--batch-sizes: expected integers separated by commas, got {text!r}"
        ) from None
    if not sizes or sizes[0] < 1:
        raise InvalidInput("--batch-sizes: sizes must be >= 1")
    return sizes


def _inputs(model: ServedModel, size: int, seq_len: int | None) -> list:
    examples = [model.example(i) for i in range(size)]
    if seq_len is not None and model.name == "demo-text":
        examples = [(e * (seq_len // len(e) + 1))[:seq_len] for e in examples]
    return [model.validate(e) for e in examples]


def measure(runner: TorchRunner, inputs: list, runs: int) -> tuple[float, np.ndarray]:
    """The seconds two untimed runs took (the size's warm-up: its compile, when the runner
    compiles), and the seconds of each timed run after them."""
    import numpy as np

    started = time.perf_counter()
    for _ in range(2):
        runner.run(inputs, len(inputs))
    warm_up_s = time.perf_counter() - started
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        runner.run(inputs, len(inputs))
        times.append(time.perf_counter() - started)
    return warm_up_s, np.array(times)


def run_profile(args: argparse.Namespace) -> int:
    if args.under_load is not None:
        return _run_under_load(args)
    from adaptive.latency import parse_latency_model
    from server.worker.memory import PROBE_BATCH, measure_memory
    from server.worker.models import load_model
    from server.worker.runner import TorchRunner, compile_choice, parse_device

    sizes = _sizes(args.batch_sizes)
    budget = parse_size_bytes(args.memory_budget, field="--memory-budget")
    if args.runs < 1:
        raise InvalidInput(f"--runs must be >= 1, got {args.runs}")
    if args.seq_len is not None and args.seq_len < 1:
        raise InvalidInput(f"--seq-len must be >= 1, got {args.seq_len}")
    device = parse_device(args.device)
    model = load_model(args.model)
    compiled = compile_choice(args.compile, model)
    runner = TorchRunner(model, str(device), compile=compiled)
    probe = max(sizes[0], min(PROBE_BATCH, sizes[-1]))
    # First: a budget the parameters do not fit in fails before the timing runs.
    memory = measure_memory(model, runner.device, budget, _inputs(model, probe, args.seq_len))
    points, warm_ups = _measure_sizes(runner, sizes, args.seq_len, args.runs)
    points = _physical(points)
    if compiled:
        print(f"{model.name} compiles each size (torch.compile): warm-up s is that compile")
    print(_table(points, memory, warm_ups))
    if args.out is not None:
        document = _document(runner, compiled, points, warm_ups, memory)
        _write(args.out, document)
        model_check = parse_latency_model(str(args.out))  # what simulate will load
        print(f"wrote {args.out} ({model_check.describe()})")
    if args.plot is not None:
        _plot(points, args.plot, model.name)
        print(f"wrote {args.plot}")
    return 0


def _measure_sizes(
    runner: TorchRunner, sizes: list[int], seq_len: int | None, runs: int
) -> tuple[list[tuple[int, float, float]], list[float]]:
    """Per size (batch size, mean s, p99 s) as measured, and its warm-up seconds."""
    import numpy as np

    points, warm_ups = [], []
    for size in sizes:
        warm_up_s, times = measure(runner, _inputs(runner.model, size, seq_len), runs)
        points.append((size, float(times.mean()), float(np.quantile(times, 0.99))))
        warm_ups.append(warm_up_s)
    return points, warm_ups


def _document(
    runner: TorchRunner,
    compiled: bool,
    points: list[tuple[int, float, float]],
    warm_ups: list[float],
    memory: MemoryLimit,
) -> dict:
    """The profile JSON: what `simulate --latency-model` and the controller load (they
    read `batch_size`, `mean_ms`, `p99_ms` and `memory`; `warmup_s` is for people)."""
    return {
        "model": runner.model.name,
        "device": str(runner.device),
        "compiled": compiled,
        "points": [
            {
                "batch_size": b,
                "mean_ms": round(m * 1e3, 4),
                "p99_ms": round(p * 1e3, 4),
                "warmup_s": round(w, 4),
            }
            for (b, m, p), w in zip(points, warm_ups, strict=True)
        ],
        "memory": {
            "device_bytes": memory.device_bytes,
            "parameter_bytes": memory.parameter_bytes,
            "activation_bytes_per_sample": memory.activation_bytes_per_sample,
        },
    }


def _physical(points: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """The measured points as the monotone fit the planner reads (adaptive.latency_fit):
    a noisy point is said and smoothed, not written for the planner to believe."""
    from adaptive.latency_fit import monotone_table

    sizes = [b for b, _, _ in points]
    means, p99s = monotone_table(sizes, [m for _, m, _ in points], [p for _, _, p in points])
    assert p99s is not None
    fitted = list(zip(sizes, means, p99s, strict=True))
    for (size, mean, _), (_, fit, _) in zip(points, fitted, strict=True):
        if abs(fit - mean) > 1e-6 * mean:
            print(
                f"note: batch {size}: measured mean {mean * 1e3:.3f} ms, written as "
                f"{fit * 1e3:.3f} ms (a larger batch never runs faster, nor slower per item)"
            )
    return fitted


def _run_under_load(args: argparse.Namespace) -> int:
    from adaptive.latency import parse_latency_model
    from server.tools import profile_under_load as under_load
    from server.worker.models import load_model

    rates = under_load.parse_rates(args.rates)
    if not 0 < args.seconds <= 3600:
        raise InvalidInput(f"--seconds must be in (0, 3600], got {args.seconds:g}")
    if args.runs < 1:
        raise InvalidInput(f"--runs must be >= 1, got {args.runs}")
    if args.out is not None:
        _write(args.out, {})  # an unwritable --out fails now, not after the load
    urls = under_load.parse_urls(args.under_load)
    for url in urls:
        under_load.check_worker(url)
    model = load_model(args.model)
    document, _ = under_load.profile_under_load(
        urls, model, rates, args.seconds, args.runs, args.seed
    )
    points = [(p["batch_size"], p["mean_ms"] / 1e3, p["p99_ms"] / 1e3) for p in document["points"]]
    print(_table(points, None))
    counts = ", ".join(f"{p['batch_size']}: {p['batches']}" for p in document["points"])
    print(
        f"{document['requests']:,} requests ({document['failed']} failed); batches per "
        f"size: {counts}"
    )
    for overhead in document["request_overhead_ms"]:
        print(
            f"outside the batcher at {overhead['rate_rps']:g} req/s a worker (client latency "
            f"- queue wait - execution): p50 {overhead['p50']:.2f} ms, "
            f"p99 {overhead['p99']:.2f} ms"
        )
    if args.out is not None:
        _write(args.out, document)
        print(f"wrote {args.out} ({parse_latency_model(str(args.out)).describe()})")
    return 0


def _table(
    points: list[tuple[int, float, float]],
    memory: MemoryLimit | None,
    warm_ups: list[float] | None = None,
) -> str:
    """Per size: mean and p99 ms, items/s, the gain in items/s over the smallest size and
    (in process) the size's warm-up seconds; then the gain in one line, a linear fit and
    the memory bound."""
    import numpy as np

    base_throughput = points[0][0] / points[0][1]
    header = f"{'batch':>6} {'mean ms':>9} {'p99 ms':>9} {'items/s':>10} {'gain':>7}"
    lines = [header + ("" if warm_ups is None else f" {'warm-up s':>10}")]
    for i, (size, mean, p99) in enumerate(points):
        throughput = size / mean
        gain = f"{throughput / base_throughput:.1f}x"
        warm_up = "" if warm_ups is None else f" {warm_ups[i]:>10.2f}"
        lines.append(
            f"{size:>6} {mean * 1e3:>9.3f} {p99 * 1e3:>9.3f} {throughput:>10.0f} {gain:>7}"
            + warm_up
        )
    lines.append(_gain_line(points))
    sizes = np.array([p[0] for p in points], dtype=float)
    means = np.array([p[1] for p in points]) * 1e3
    slope, intercept = np.polyfit(sizes, means, 1) if len(points) > 1 else (0.0, means[0])
    lines.append(f"linear fit: linear:{max(intercept, 0):.3f},{max(slope, 0):.4f} (ms)")
    if memory is None:  # measured under load: memory is the in-process profile's job
        return "\n".join(lines)
    lines.append(
        f"parameters {memory.parameter_bytes / 2**20:.1f} MiB, activations "
        f"{memory.activation_bytes_per_sample / 2**20:.2f} MiB/sample: largest feasible batch "
        f"{memory.max_batch_size:,}"
    )
    return "\n".join(lines)


def _gain_line(points: list[tuple[int, float, float]]) -> str:
    """`gain 8.1x items/s from batch 1 to 128`: what batching buys, in one line."""
    (first, first_s, _), (last, last_s, _) = points[0], points[-1]
    gain = (last / last_s) / (first / first_s)
    return f"gain {gain:.1f}x items/s from batch {first} to {last}"


def _write(path: Path, document: dict) -> None:
    try:
        path.write_text(json.dumps(document, indent=2) + "\n")
    except OSError as error:
        raise InvalidInput(f"{path}: cannot write ({error.strerror})") from None


def _plot(points: list[tuple[int, float, float]], path: Path, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [p[0] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.plot(sizes, [p[1] * 1e3 for p in points], marker="o", label="mean")
    left.plot(sizes, [p[2] * 1e3 for p in points], marker=".", label="p99")
    left.set(xscale="log", xlabel="batch size", ylabel="ms per batch", title=f"{name}: latency")
    left.legend()
    right.plot(sizes, [p[0] / p[1] for p in points], marker="o")
    right.set(xscale="log", xlabel="batch size", ylabel="requests/s", title="throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
