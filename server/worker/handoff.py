"""How a front-end process hands a parsed input to the model process, and gets its answer.

Two channels per front end:

- `SlotArena`: one shared-memory block of fixed-size slots. The front end writes an
  input tensor into a free slot; the model process reads it in place as a tensor view
  (no pickling, no copy until the batch's collate stacks it, which it does anyway). The
  model process creates the arena, so a front end killed with -9 leaks nothing; the
  front end alone picks slots, and takes a slot back only when its answer has come, so
  a slot is never rewritten while a batch may read it. A front end that dies leaves
  its requests queued in the model process, still reading their slots, and its restart
  shares the arena: so the model process answers each `HELLO` with the slots that
  requests of earlier processes still hold (`WELCOME`), which the new process leaves
  alone, and gives each back (`RELEASE`) once it is done with the request in it.
- Frames on a Unix stream socket, little-endian, each `u32 length` then `u8 kind`:
  `HELLO` (the front end's index), `WELCOME` (the slots still held, in reply),
  `REQUEST` (an id, the slot, dtype, shape, deadline and ingress origin; an input too
  large for a slot travels inline after the shape), `ANSWER` (the id, the HTTP status
  and the JSON body), `RELEASE` (a held slot, free again) and `STATS` (the front end's
  CPU seconds and requests so far, for the metrics).

Frames travel in bulk both ways: `FrameWriter` sends the frames written in one turn of
the event loop in one write (a batch's answers, which complete together, leave in one
system call rather than one each), and `read_frames` takes whatever has arrived and
splits it into frames (`FrameSplitter`), rather than two reads a frame.

Everything else here is plain data and bytes; the rest of the asyncio on either side
lives with its process (`server.worker.frontend`, `server.worker.frontends`).
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import torch

SLOT_ALIGN = 4096
INLINE = -1  # the slot of an input that travels inside its frame

HELLO, REQUEST, ANSWER, STATS, WELCOME, RELEASE = 0, 1, 2, 3, 4, 5
_LENGTH = struct.Struct("<I")
_HELLO = struct.Struct("<BI")
_WELCOME = struct.Struct("<BI")
_RELEASE = struct.Struct("<Bi")
_REQUEST = struct.Struct("<BQiBBddB")
_ANSWER = struct.Struct("<BQH")
_STATS = struct.Struct("<BdQ")

DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(DTYPES)}


def slot_bytes_for(example: torch.Tensor) -> int:
    """A slot holds the model's example input, rounded up to whole pages (at least one)."""
    size = example.numel() * example.element_size()
    return max(SLOT_ALIGN, -(-size // SLOT_ALIGN) * SLOT_ALIGN)


class SlotArena:
    """`slots` slots of `slot_bytes` each in one shared-memory block."""

    def __init__(self, memory: SharedMemory, slots: int, slot_bytes: int, owner: bool) -> None:
        self.memory, self.slots, self.slot_bytes, self.owner = memory, slots, slot_bytes, owner
        # One export of the buffer for the arena's life; every slot is a slice of it.
        self._bytes = torch.frombuffer(memory.buf, dtype=torch.uint8, count=slots * slot_bytes)

    @classmethod
    def create(cls, slots: int, slot_bytes: int) -> SlotArena:
        return cls(SharedMemory(create=True, size=slots * slot_bytes), slots, slot_bytes, True)

    @classmethod
    def attach(cls, name: str, slots: int, slot_bytes: int) -> SlotArena:
        memory = SharedMemory(name=name)
        # Python 3.11 registers an attached block with this process's resource tracker,
        # which would unlink it when this process exits; the creator owns it.
        resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]
        return cls(memory, slots, slot_bytes, False)

    @property
    def name(self) -> str:
        return self.memory.name

    def fits(self, tensor: torch.Tensor) -> bool:
        return tensor.numel() * tensor.element_size() <= self.slot_bytes

    def write(self, slot: int, tensor: torch.Tensor) -> None:
        """Copy `tensor` into `slot` (the caller checked that it `fits`)."""
        flat = tensor.contiguous().view(-1).view(torch.uint8)
        start = slot * self.slot_bytes
        self._bytes[start : start + flat.numel()].copy_(flat)

    def view(self, slot: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor in `slot`, in place."""
        start = slot * self.slot_bytes
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return self._bytes[start : start + size].view(dtype).view(shape)

    def close(self) -> None:
        del self._bytes
        self.memory.close()
        if self.owner:
            self.memory.unlink()


@dataclass(frozen=True, slots=True)
class RequestFrame:
    """One parsed request on its way to the batcher."""

    request_id: int
    slot: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    deadline_ms: float | None
    origin_wall_s: float
    stamped: bool
    inline: bytes = b""


class FrameSplitter:
    """Whole frames out of a byte stream, whatever pieces it arrives in."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the frames `data` completes, in order (the rest is kept)."""
        buffer = self._buffer
        buffer += data
        payloads, at = [], 0
        while len(buffer) - at >= _LENGTH.size:
            end = at + _LENGTH.size + _LENGTH.unpack_from(buffer, at)[0]
            if end > len(buffer):
                break
            payloads.append(bytes(buffer[at + _LENGTH.size : end]))
            at = end
        del buffer[:at]
        return payloads


READ_BYTES = 1 << 18


async def read_frames(reader: asyncio.StreamReader, splitter: FrameSplitter) -> list[bytes]:
    """The next frames from `reader` (at least one); `IncompleteReadError` at its end."""
    while True:
        data = await reader.read(READ_BYTES)
        if not data:
            raise asyncio.IncompleteReadError(b"", None)
        if payloads := splitter.feed(data):
            return payloads


class FrameWriter:
    """A connection's frames, those written in one turn of the event loop sent in one
    write (at the end of the turn). `close` sends what is pending first."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self.writer.is_closing():
                self.writer.write(data)

    def is_closing(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        self.flush()
        self.writer.close()

    async def wait_closed(self) -> None:
        await self.writer.wait_closed()


def frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


def encode_hello(index: int) -> bytes:
    return frame(_HELLO.pack(HELLO, index))


def encode_welcome(held: Iterable[int]) -> bytes:
    slots = sorted(held)
    return frame(_WELCOME.pack(WELCOME, len(slots)) + struct.pack(f"<{len(slots)}i", *slots))


def encode_release(slot: int) -> bytes:
    return frame(_RELEASE.pack(RELEASE, slot))


def encode_request(request: RequestFrame) -> bytes:
    deadline = math.nan if request.deadline_ms is None else request.deadline_ms
    head = _REQUEST.pack(
        REQUEST,
        request.request_id,
        request.slot,
        _DTYPE_CODES[request.dtype],
        len(request.shape),
        deadline,
        request.origin_wall_s,
        request.stamped,
    )
    shape = struct.pack(f"<{len(request.shape)}q", *request.shape)
    return frame(head + shape + request.inline)


def encode_answer(request_id: int, status: int, body: bytes) -> bytes:
    return frame(_ANSWER.pack(ANSWER, request_id, status) + body)


def encode_stats(cpu_s: float, requests: int) -> bytes:
    return frame(_STATS.pack(STATS, cpu_s, requests))


def frame_length(head: bytes) -> int:
    return _LENGTH.unpack(head)[0]


def kind_of(payload: bytes) -> int:
    return payload[0]


def decode_hello(payload: bytes) -> int:
    return _HELLO.unpack(payload)[1]


def decode_welcome(payload: bytes) -> tuple[int, ...]:
    """The slots requests of this front end's earlier processes still hold."""
    _, count = _WELCOME.unpack_from(payload)
    return struct.unpack_from(f"<{count}i", payload, _WELCOME.size)


def decode_release(payload: bytes) -> int:
    return _RELEASE.unpack(payload)[1]


def decode_request(payload: bytes) -> RequestFrame:
    _, request_id, slot, dtype, ndim, deadline, origin, stamped = _REQUEST.unpack_from(payload)
    end = _REQUEST.size + 8 * ndim
    shape = struct.unpack_from(f"<{ndim}q", payload, _REQUEST.size)
    return RequestFrame(
        request_id,
        slot,
        DTYPES[dtype],
        shape,
        None if math.isnan(deadline) else deadline,
        origin,
        bool(stamped),
        payload[end:] if slot == INLINE else b"",
    )


def decode_answer(payload: bytes) -> tuple[int, int, bytes]:
    """(request id, status, JSON body)."""
    _, request_id, status = _ANSWER.unpack_from(payload)
    return request_id, status, payload[_ANSWER.size :]


def decode_stats(payload: bytes) -> tuple[float, int]:
    """(CPU seconds, requests) of the front end so far."""
    _, cpu_s, requests = _STATS.unpack(payload)
    return cpu_s, requests


def inline_tensor(request: RequestFrame) -> torch.Tensor:
    """An input that travelled inside its frame (larger than a slot)."""
    return torch.frombuffer(bytearray(request.inline), dtype=request.dtype).view(request.shape)


def inline_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
