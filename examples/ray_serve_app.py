"""A Ray Serve deployment whose replicas are members of a Tidal pool: copy this.

Each replica serves the repository's demo CNN (server/worker/models.py: a small
ResNet-style classifier, 3x32x32 floats in, 10 logits out; about 2 ms + 3 ms per image on
one CPU thread, so a batch's time grows with its size) behind `@tidal_batch`, Tidal's
wrapper around `@serve.batch`. Every replica joins the pool at construction, reports what
its batch handler served each second and applies the pool's batch cap and timeout as the
controller publishes them. Serve's HTTP proxy answers `POST /v1/infer` as `tidal worker`
does (a JSON body `{"input": [[[...]]]}` or 12,288 bytes of float32), with the output and
how the request was served, so `tidal loadgen --target http://127.0.0.1:8000` drives it.

    TIDAL_REDIS_URL=redis://127.0.0.1:6379/0 TIDAL_POOL=cnn PYTHONPATH=$PWD \\
        serve run examples.ray_serve_app:app
    tidal controller --redis redis://127.0.0.1:6379/0 --pool cnn --workers 2 \\
        --policy predictive --guard max_batch=16 --port 8100

`build()` is the same deployment with the pool, replicas and limits given in code (the
tests and the benchmark use it). A cap above max_ongoing_requests / max_concurrent_batches
(here 32 / 2 = 16) is refused by the replicas; `--guard max_batch=16` keeps a policy
inside it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from server.engines.ray_serve import (
    POOL_ENV,
    REDIS_PREFIX_ENV,
    REDIS_URL_ENV,
    join_pool,
    leave_pool,
    tidal_batch,
    timed_call,
)
from server.engines.ray_serve_replicas import tidal_autoscaling_config
from server.worker.models import ServedModel, load_model
from tidal_base.errors import InvalidInput

MAX_ONGOING_REQUESTS = 32
MAX_CONCURRENT_BATCHES = 2  # a batch forms while the last one runs on its thread
ROUTE = "/v1/infer"


def forward(model: ServedModel, images: list[torch.Tensor]) -> list[list[float]]:
    """One batch through the model: its time grows with the batch."""
    with torch.inference_mode():
        (batch,) = model.collate(images, len(images))
        return model.module(batch).tolist()


async def read_image(model: ServedModel, request: Request) -> torch.Tensor:
    """12,288 bytes of float32, or JSON {"input": [[[...]]]}: a 3x32x32 image."""
    body = await request.body()
    if request.headers.get("content-type", "").startswith("application/octet-stream"):
        return model.from_bytes(body)
    try:
        value: Any = json.loads(body)["input"]
    except (ValueError, KeyError, TypeError):
        raise InvalidInput('body must be JSON {"input": [...]}') from None
    return model.validate(value)


@serve.deployment(num_replicas=2, max_ongoing_requests=MAX_ONGOING_REQUESTS)
class DemoCnn:
    def __init__(self) -> None:
        torch.set_num_threads(1)  # one core per replica: batches, not threads, share it
        self.model = load_model("demo-cnn")
        join_pool(self.predict)  # in the pool, and warming, before the first request

    def _forward(self, images: list[torch.Tensor]) -> list[list[float]]:
        return forward(self.model, images)

    def warm(self, bucket: int) -> None:
        """One run at the bucket's size (Tidal runs it on a thread: the old cap serves)."""
        self._forward([self.model.validate(self.model.example(i)) for i in range(bucket)])

    @tidal_batch(
        max_batch_size=4,
        batch_wait_timeout_s=0.005,
        max_concurrent_batches=MAX_CONCURRENT_BATCHES,
        warmup=warm,
    )
    async def predict(self, images: list[torch.Tensor]) -> list[list[float]]:
        # On a thread, so the replica's loop keeps taking requests and configs meanwhile.
        return await asyncio.to_thread(self._forward, images)

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            image = await read_image(self.model, request)
        except InvalidInput as error:
            return JSONResponse({"error": str(error), "field": "input"}, status_code=422)
        output, timing = await timed_call(self.predict, image)
        return JSONResponse(
            {
                "output": output,
                "timing": {
                    "queue_wait_ms": round(timing.queue_wait_s * 1e3, 3),
                    "execution_ms": round(timing.execution_s * 1e3, 3),
                    "batch_size": timing.batch_size,
                    "max_batch_size": timing.max_batch_size,
                    "config_version": timing.config_version,
                },
            }
        )

    async def __del__(self) -> None:
        await leave_pool(self.predict)  # the last window reaches the pool


app = DemoCnn.bind()  # the pool and Redis from $TIDAL_POOL, $TIDAL_REDIS_URL


def build(
    pool: str,
    redis_url: str,
    redis_prefix: str = "tidal",
    replicas: int = 2,
    max_ongoing_requests: int = MAX_ONGOING_REQUESTS,
    num_cpus: float = 1.0,
    max_replicas: int | None = None,
):
    """The deployment for `pool` on `redis_url`, bound: what `serve.run` takes. With
    `max_replicas`, Tidal's controller sets the replica count (from `replicas` up to
    `max_replicas`) through Serve's autoscaler; otherwise `replicas` is fixed."""
    env = {POOL_ENV: pool, REDIS_URL_ENV: redis_url, REDIS_PREFIX_ENV: redis_prefix}
    count: dict[str, Any] = {"num_replicas": replicas}
    if max_replicas is not None:
        scaling = tidal_autoscaling_config(
            pool, redis_url, replicas, max_replicas, redis_prefix=redis_prefix
        )
        count = {"autoscaling_config": scaling}
    return DemoCnn.options(
        **count,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": num_cpus, "runtime_env": {"env_vars": env}},
    ).bind()
