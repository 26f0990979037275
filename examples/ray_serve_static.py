"""The example's model behind plain `@serve.batch(16, 10 ms)`: the deployment before Tidal.

Same model, same batch handler on a thread, same `max_concurrent_batches` and the same
`POST /v1/infer` as examples/ray_serve_app.py, with the config fixed where Ray's docs put
it; benchmarks/ray_serve_engine.py serves both to compare a static config with Tidal's.
"""

from __future__ import annotations

import asyncio
import time

import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from examples.ray_serve_app import MAX_CONCURRENT_BATCHES, MAX_ONGOING_REQUESTS, forward, read_image
from server.worker.models import load_model
from tidal_base.errors import InvalidInput

STATIC_MAX_BATCH = 16
STATIC_TIMEOUT_S = 0.010


@serve.deployment(num_replicas=1, max_ongoing_requests=MAX_ONGOING_REQUESTS)
class StaticDemoCnn:
    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.model = load_model("demo-cnn")

    def _forward(self, images: list[torch.Tensor]) -> list[tuple[list[float], int, float]]:
        started = time.perf_counter()
        outputs = forward(self.model, images)
        execution_s = time.perf_counter() - started
        return [(output, len(images), execution_s) for output in outputs]

    @serve.batch(
        max_batch_size=STATIC_MAX_BATCH,
        batch_wait_timeout_s=STATIC_TIMEOUT_S,
        max_concurrent_batches=MAX_CONCURRENT_BATCHES,
    )
    async def predict(self, images: list[torch.Tensor]) -> list[tuple[list[float], int, float]]:
        return await asyncio.to_thread(self._forward, images)

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            image = await read_image(self.model, request)
        except InvalidInput as error:
            return JSONResponse({"error": str(error), "field": "input"}, status_code=422)
        output, batch_size, execution_s = await self.predict(image)
        timing = {"batch_size": batch_size, "execution_ms": round(execution_s * 1e3, 3)}
        return JSONResponse({"output": output, "timing": timing})


def build(replicas: int = 1, max_ongoing_requests: int = MAX_ONGOING_REQUESTS, num_cpus=1.0):
    return StaticDemoCnn.options(
        num_replicas=replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": num_cpus},
    ).bind()
