"""One inference request in two halves, so the CPU work and the batching can live in
different processes (docs/worker.md, "Front ends"):

- `parse_request` is the front half: headers and body in, a validated input tensor out
  (or the 4xx that refuses it). It is pure CPU work with no shared state, so it runs in
  whichever process took the connection: the worker itself, or one of its front ends.
- `answer` is the back half: the input into the one `DynamicBatcher`, the batch run, the
  outcome counted, and the answer (or the 429/503/504) as a status and a JSON body. It
  runs where the batcher is, so the batching rule sees every request of the worker.

The in-process handler (`server.worker.app`) and the front ends call the same two
functions, so a worker answers the same bytes whichever way it is deployed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from server.http_errors import first_invalid
from server.worker.batching import (
    DeadlineExceeded,
    DynamicBatcher,
    QueueFull,
    ShuttingDown,
    WorkerFailed,
)
from server.worker.metrics import WorkerMetrics
from server.worker.models import InputCodec
from tidal_base.errors import InvalidInput

BINARY = "application/octet-stream"


class InferRequest(BaseModel):
    """The JSON body of `POST /v1/infer`."""

    input: Any = Field(description="one model input: a 3x32x32 array, a list of token ids, ...")
    deadline_ms: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="give up after this long"
    )


@dataclass(frozen=True, slots=True)
class Answer:
    """What an HTTP client gets: a status, a JSON body and any extra headers."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


def refusal(status: int, message: str, field_name: str | None = None, **headers: str) -> Answer:
    """The error shape of every Tidal API (`server.http_errors`)."""
    return Answer(status, {"error": message, "field": field_name}, headers)


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request the model can take: its input, deadline, and when it reached the worker.

    `origin_wall_s` is the Unix time the request's ingress is measured from: the client's
    `X-Sent-At` when it stamped one, else when a handler first saw it."""

    item: Any
    deadline_ms: float | None
    origin_wall_s: float
    stamped: bool


def parse_request(
    codec: InputCodec,
    content_type: str,
    body: bytes,
    deadline_header: str | None,
    sent_at_header: str | None,
    handled_wall_s: float,
) -> Parsed | Answer:
    """The validated request, or the 4xx answer that refuses it (naming the field)."""
    sent_at = _header_number(sent_at_header, "X-Sent-At")
    if isinstance(sent_at, Answer):
        return sent_at
    if sent_at is not None and not math.isfinite(sent_at):
        return refusal(422, f"X-Sent-At must be finite, got {sent_at}", "x-sent-at")
    header_deadline = _header_number(deadline_header, "X-Deadline-Ms")
    if isinstance(header_deadline, Answer):
        return header_deadline
    if header_deadline is not None and not (math.isfinite(header_deadline) and header_deadline > 0):
        # As the body's deadline_ms: NaN would never expire, 0 or less always would.
        message = f"X-Deadline-Ms must be a finite number > 0, got {header_deadline}"
        return refusal(422, message, "x-deadline-ms")
    decoded = _decode(codec, content_type, body)
    if isinstance(decoded, Answer):
        return decoded
    item, body_deadline = decoded
    deadline_ms = body_deadline if body_deadline is not None else header_deadline
    origin = handled_wall_s if sent_at is None else sent_at
    return Parsed(item, deadline_ms, origin, sent_at is not None)


def _header_number(text: str | None, name: str) -> float | Answer | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return refusal(422, f"{name} must be a number, got {text!r}", name.lower())


def _decode(codec: InputCodec, content_type: str, body: bytes) -> tuple[Any, float | None] | Answer:
    """(validated input, the body's deadline ms) from a JSON or a binary body."""
    if content_type.startswith(BINARY):
        if codec.from_bytes is None:
            return refusal(415, f"{codec.name} takes JSON bodies only", "content-type")
        try:
            return codec.from_bytes(body), None
        except InvalidInput as error:
            return refusal(422, f"input: {error}", "input")
    try:
        request = InferRequest.model_validate_json(body)
    except ValidationError as error:
        invalid = first_invalid(error)  # the APIs' one wording of a validation error
        return Answer(invalid.status_code, json.loads(invalid.body))
    try:
        return codec.validate(request.input), request.deadline_ms
    except InvalidInput as error:
        return refusal(422, f"input: {error}", "input")


async def answer(
    batcher: DynamicBatcher, metrics: WorkerMetrics, parsed: Parsed, ingress_s: float
) -> Answer:
    """Queue the input, await its batch, and answer; every outcome is counted."""
    batcher.record_ingress(ingress_s)
    metrics.ingress.observe(ingress_s)
    deadline_ms = parsed.deadline_ms
    try:
        served = await batcher.submit(
            parsed.item, None if deadline_ms is None else deadline_ms / 1e3
        )
    except QueueFull as error:
        metrics.outcome("shed")
        return refusal(429, str(error), None, **{"Retry-After": "1"})
    except DeadlineExceeded as error:
        metrics.outcome("deadline")
        return refusal(504, f"{error} (deadline {deadline_ms:g} ms)", "deadline_ms")
    except ShuttingDown as error:
        metrics.outcome("draining")
        return refusal(503, str(error))
    except WorkerFailed as error:
        metrics.outcome("failed")
        return refusal(503, str(error))
    metrics.served(served)
    timing = {
        "ingress_ms": round(ingress_s * 1e3, 3),
        "queue_wait_ms": round(served.queue_wait_s * 1e3, 3),
        "batch_size": served.batch_size,
        "padded_size": served.padded_size,
        "execution_ms": round(served.execution_s * 1e3, 3),
    }
    return Answer(200, {"output": served.output, "timing": timing})
