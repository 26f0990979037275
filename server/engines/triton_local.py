"""The `tritonserver` the nvidia-pytriton wheel carries, started for tests, examples and
benchmarks; and an open-loop load generator for it.

A user who runs their own Triton needs none of this: `tidal engine triton` only talks to
Triton's gRPC and metrics ports. Here Triton must run on a CPU machine from a wheel,
which takes three things the wheel does not set up for a model repository (PyTriton
sets them up for its own in-process models, which cannot be retuned by reloading):

- a backend directory holding the python backend's library, its utilities and the stub
  built for this Python (the wheel keeps the stubs apart, one per Python version);
- `LD_LIBRARY_PATH` with the wheel's bundled libraries and this Python's own libpython
  (the stub links against it);
- this Python's `bin` first on `PATH`, so the stub's models import what this Python has.

`TritonProcess` serves a model repository with `--model-control-mode=explicit` and
binds HTTP, gRPC and metrics to 127.0.0.1 on a block of free ports (or the ports given).
`replay` sends requests at given instants over gRPC, one task each, never waiting for
answers before sending the next (open loop), and records every outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import util
from pathlib import Path

import numpy as np

from tidal_base.errors import TidalError

SUMMARY_LATENCIES = "summary_latencies=true"
"""Triton's request-latency summary: the engine shapes each window's histogram from it."""


class TritonNotAvailable(TidalError):
    """The bundled tritonserver cannot be found or started; the message says why."""


@dataclass(frozen=True, slots=True)
class TritonInstall:
    """Where the wheel keeps what a CPU tritonserver needs."""

    binary: Path
    python_backend: Path  # libtriton_python.so and triton_python_backend_utils.py
    stub: Path  # triton_python_backend_stub for this Python
    library_dirs: tuple[Path, ...]
    python_bin: Path


def bundled_triton() -> TritonInstall:
    """The tritonserver of the installed nvidia-pytriton wheel, or one line saying why
    there is none."""
    spec = util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise TritonNotAvailable("nvidia-pytriton is not installed: pip install -e '.[triton]'")
    package = Path(spec.origin).parent
    root = package / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
        library_dirs=(
            package.parent / "nvidia_pytriton.libs",
            root / "backends" / "python",
            root / "caches" / "local",
            Path(sysconfig.get_config_var("LIBDIR") or sys.base_prefix + "/lib"),
        ),
        python_bin=Path(sys.executable).parent,
    )
    for needed in (install.binary, install.python_backend / "libtriton_python.so", install.stub):
        if not needed.exists():
            raise TritonNotAvailable(f"nvidia-pytriton has no {needed} (Python {version})")
    return install


def backend_directory(install: TritonInstall, into: Path) -> Path:
    """A `--backend-directory` with the python backend and this Python's stub in it."""
    python = into / "backends" / "python"
    python.mkdir(parents=True, exist_ok=True)
    for source in (
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ):
        shutil.copy2(source, python / source.name)
    return into / "backends"


def triton_environment(install: TritonInstall) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(p) for p in install.library_dirs]
    if env.get("LD_LIBRARY_PATH"):
        paths.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(paths)
    env["PATH"] = f"{install.python_bin}:{env.get('PATH', '')}"
    return env


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1, each checked, and all
    held at once while they are: one free port says nothing of the next, and probes one
    after another may even name the same port twice (tests/processes.py's block). A
    port can still be taken between this check and Triton's bind: `TritonProcess.start`
    then fails at once, with the end of Triton's log, rather than waiting."""
    while True:
        with contextlib.ExitStack() as probes:
            first = _probe(probes, 0)
            block = range(first, first + count)
            if block[-1] < 65536 and all(_probe(probes, port) for port in block[1:]):
                return first


def _probe(probes: contextlib.ExitStack, port: int) -> int:
    """`port` (0: one the kernel picks) bound on a socket `probes` holds; 0 if taken."""
    sock = probes.enter_context(socket.socket())
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return 0
    return sock.getsockname()[1]


@dataclass(frozen=True, slots=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls) -> TritonPorts:
        """Three consecutive ports, free when chosen."""
        first = free_ports(3)
        return cls(first, first + 1, first + 2)


class TritonProcess:
    """A tritonserver serving `repository` on 127.0.0.1, its models loaded explicitly.

    `start` returns once every model in `models` is ready; `stop` and `start` again
    (same ports) is a restart: Triton comes back with the configs on disk."""

    def __init__(
        self,
        repository: Path,
        models: Sequence[str],
        ports: TritonPorts | None = None,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.install = bundled_triton()
        self.repository = Path(repository)
        self.models = tuple(models)
        self.ports = ports or TritonPorts.free()
        self.extra_args = tuple(extra_args)
        self._scratch = Path(tempfile.mkdtemp(prefix="tidal-triton-"))
        self.backends = backend_directory(self.install, self._scratch)
        self.log_path = log_path or self._scratch / "tritonserver.log"
        self.process: subprocess.Popen | None = None
        self.started_in_s: float | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def command(self) -> list[str]:
        return [
            str(self.install.binary),
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in self.models),
            f"--backend-directory={self.backends}",
            "--http-address=127.0.0.1",
            f"--http-port={self.ports.http}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.ports.grpc}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.ports.metrics}",
            "--allow-gpu-metrics=false",
            f"--metrics-config={SUMMARY_LATENCIES}",
            "--exit-on-error=true",
            # On SIGTERM Triton waits this long for its models to unload (30 s by
            # default; a python-backend model that has been reloaded can take all of it).
            "--exit-timeout-secs=5",
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 60.0) -> None:
        started = time.monotonic()
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=triton_environment(self.install),
            )
        self._wait_ready(timeout_s)
        self.started_in_s = time.monotonic() - started

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx  # the triton extra has it; only a started Triton needs it

        deadline = time.monotonic() + timeout_s
        urls = [f"{self.http_url}/v2/models/{name}/ready" for name in self.models]
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise TritonNotAvailable(
                    f"tritonserver exited with {self.process.returncode}: {self._log_tail()}"
                )
            try:
                if all(httpx.get(url, timeout=1.0).status_code == 200 for url in urls):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TritonNotAvailable(f"tritonserver not ready in {timeout_s:g} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-5:])

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._scratch, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request: when it was due (seconds after the replay's start), how long it
    took (None if it failed) and Triton's error, if any."""

    due_s: float
    latency_s: float | None
    error: str | None = None


async def replay(
    grpc_url: str,
    model: str,
    due_s: np.ndarray,
    *,
    input_name: str = "INPUT0",
    width: int = 4,
    timeout_s: float = 30.0,
    stop: asyncio.Event | None = None,
    record: list[Outcome] | None = None,
) -> list[Outcome]:
    """Send one single-item request at each instant of `due_s` (seconds from now,
    sorted), open loop: each in its own task, whatever the earlier ones are doing.
    Stops sending when `stop` is set; each outcome is also appended to `record` as it
    comes (for a caller that watches a replay under way)."""
    from tritonclient.grpc.aio import InferenceServerClient, InferInput

    client = InferenceServerClient(grpc_url)
    data = np.ones((1, width), dtype=np.float32)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(due: float) -> Outcome:
        request = InferInput(input_name, [1, width], "FP32")
        request.set_data_from_numpy(data)
        sent = loop.time()
        try:
            await client.infer(model, [request], client_timeout=timeout_s)
        except Exception as error:  # every failure is an outcome the caller counts
            outcome = Outcome(due, None, " ".join(str(error).split())[:300])
        else:
            outcome = Outcome(due, loop.time() - sent)
        if record is not None:
            record.append(outcome)
        return outcome

    tasks = []
    try:
        for due in np.asarray(due_s, dtype=np.float64):
            if stop is not None and stop.is_set():
                break
            delay = start + due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(float(due))))
        return list(await asyncio.gather(*tasks))
    finally:
        await client.close()


def steady_arrivals(rate_rps: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Poisson arrival instants at `rate_rps` for `duration_s`."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_rps, size=int(rate_rps * duration_s * 1.5) + 10)
    instants = np.cumsum(gaps)
    return instants[instants < duration_s]
