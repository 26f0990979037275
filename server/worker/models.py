"""Models a worker can serve: three built-in demos, TorchScript files and user factories.

A `ServedModel` is an `nn.Module` plus what the batcher needs around it: how to turn a
list of request inputs into one batch tensor (`collate`, which also pads the batch to
a bucket size), how to split the output back per request, how to validate one input,
an example input for warm-up and profiling, and whether warming a bucket compiles it by
default (`compile_buckets`). The demos are built in code with seeded weights, so nothing
is downloaded and every run serves the same function.

- `demo-cnn`: a small ResNet-style image classifier, input 3x32x32 floats, 10 classes.
- `demo-ranker`: a ranking model's shape, 256 dense features through four 2048-wide
  layers to one score; 52 MB of weights, so it is memory-bound at batch 1 and batching
  pays (on one CPU thread here, 360 items/s at batch 1 against 3,000 at 128: 8x). Its
  warm-up compiles each bucket by default (about 10 s the first on a cold cache, 1-2 s
  each after, on the 2-core CPU docs/worker.md measures).
- `demo-text`: a transformer encoder over token ids (1..1000, up to 128 long), padded
  to the batch's longest sequence with an attention mask, 4 classes.
- a path to a TorchScript file (`torch.jit.save`) or a `torch.export` program (`.pt2`,
  `torch.export.save`; exported with a fixed batch size, so every bucket is that size
  unless exported with a dynamic batch dimension), inputs as nested float lists;
- `module:factory`, a function returning an `nn.Module`, or `(module, collate)`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tidal_base.errors import InvalidInput

Collate = Callable[[Sequence[Any], int], tuple[Any, ...]]
"""(inputs, padded batch size) -> the model's positional arguments."""


@dataclass(frozen=True)
class ServedModel:
    name: str
    module: nn.Module
    collate: Collate
    validate: Callable[[Any], Any]
    example: Callable[[int], Any]  # seeded example input number i
    padding_waste: Callable[[Sequence[Any]], float] = lambda inputs: 0.0
    from_bytes: Callable[[bytes], Any] | None = None  # the compact binary body, if any
    to_bytes: Callable[[Any], bytes] | None = None
    length_group: Callable[[Any], int] | None = None  # for --group-by-length
    # Whether warming a bucket compiles it (torch.compile, static shapes) unless the
    # worker or the profile is told otherwise (`--compile/--no-compile`).
    compile_buckets: bool = False

    @property
    def codec(self) -> InputCodec:
        return InputCodec(self.name, self.validate, self.example, self.from_bytes)


@dataclass(frozen=True)
class InputCodec:
    """How a request's body becomes one model input: the part of a model a front-end
    process needs (no module, no weights). `validate` takes a decoded JSON value and
    `from_bytes` the compact binary body; both return a tensor or raise InvalidInput."""

    name: str
    validate: Callable[[Any], Any]
    example: Callable[[int], Any]
    from_bytes: Callable[[bytes], Any] | None = None


def load_codec(spec: str) -> InputCodec:
    """The input codec of the model `load_model(spec)` serves, without loading it."""
    if spec == "demo-cnn":
        return InputCodec(spec, _image, _example_image, _image_from_bytes)
    if spec == "demo-text":
        return InputCodec(spec, _tokens, _example_tokens, _tokens_from_bytes)
    if spec == "demo-ranker":
        return InputCodec(spec, _features, _example_features, _features_from_bytes)
    name = Path(spec).name if Path(spec).exists() else spec
    return InputCodec(name, _generic, lambda i: [0.0])


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class DemoCnn(nn.Module):
    """Stem, three residual stages (32, 64, 128 channels), global pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, padding=1), nn.ReLU()]
        channels = 32
        for width in (32, 64, 128):
            if width != channels:
                layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1), nn.ReLU()]
                channels = width
            layers.append(_Block(width))
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class DemoRanker(nn.Module):
    """Dense features through four 2048-wide ReLU layers to one score: the weights (52 MB)
    are read once a forward pass whatever the batch, which is what makes batching pay."""

    def __init__(self) -> None:
        super().__init__()
        width = 2048
        layers: list[nn.Module] = []
        for inputs in (RANKER_FEATURES, width, width, width):
            layers += [nn.Linear(inputs, width), nn.ReLU()]
        self.layers = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


IMAGE_SHAPE = (3, 32, 32)
RANKER_FEATURES = 256
DEMO_MODELS = ("demo-cnn", "demo-ranker", "demo-text")
VOCABULARY = 1000
MAX_TOKENS = 128


class DemoText(nn.Module):
    """Token embedding + positions, two encoder layers, masked mean pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY + 1, 64, padding_idx=0)
        self.position = nn.Embedding(MAX_TOKENS, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 4)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.encoder(
            self.embed(tokens) + self.position(positions), src_key_padding_mask=padding
        )
        keep = (~padding).unsqueeze(-1).float()
        return self.head((hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0))


def _seeded(module: nn.Module) -> nn.Module:
    return module.eval()


def _image(value: Any) -> torch.Tensor:
    return _dense(value, IMAGE_SHAPE)


def _features(value: Any) -> torch.Tensor:
    return _dense(value, (RANKER_FEATURES,))


def _dense(value: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """A float input of exactly `shape`, every value finite."""
    dims = "x".join(map(str, shape))
    try:
        tensor = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidInput(f"input must be a {dims} array of numbers") from None
    if tuple(tensor.shape) != shape:
        raise InvalidInput(f"input must have shape {dims}, got {'x'.join(map(str, tensor.shape))}")
    return _finite(tensor)


def _finite(tensor: torch.Tensor) -> torch.Tensor:
    """NaN and infinity would run, and answer null: refuse them instead. (numpy's check
    on the same memory costs 2.5 us a 3x32x32 input against torch's 12 us.)"""
    if not np.isfinite(tensor.numpy()).all():
        raise InvalidInput("input holds NaN or infinite values; every value must be finite")
    return tensor


def _collate_images(inputs: Sequence[torch.Tensor], padded_size: int) -> tuple[torch.Tensor]:
    return _collate_dense(inputs, padded_size, IMAGE_SHAPE)


def _collate_features(inputs: Sequence[torch.Tensor], padded_size: int) -> tuple[torch.Tensor]:
    return _collate_dense(inputs, padded_size, (RANKER_FEATURES,))


def _collate_dense(
    inputs: Sequence[torch.Tensor], padded_size: int, shape: tuple[int, ...]
) -> tuple[torch.Tensor]:
    batch = torch.zeros((padded_size, *shape))
    batch[: len(inputs)] = torch.stack(list(inputs))
    return (batch,)


def _tokens(value: Any) -> torch.Tensor:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) for t in value):
        raise InvalidInput("input must be a non-empty list of integer token ids")
    if len(value) > MAX_TOKENS:
        raise InvalidInput(f"input has {len(value)} tokens; at most {MAX_TOKENS}")
    if min(value) < 1 or max(value) > VOCABULARY:
        raise InvalidInput(f"token ids must be in 1..{VOCABULARY}")
    return torch.tensor(value, dtype=torch.long)


def _collate_tokens(inputs: Sequence[torch.Tensor], padded_size: int) -> tuple[torch.Tensor, ...]:
    longest = max(t.shape[0] for t in inputs)
    tokens = torch.zeros((padded_size, longest), dtype=torch.long)
    for row, t in enumerate(inputs):
        tokens[row, : t.shape[0]] = t
    tokens[len(inputs) :, 0] = 1  # padding rows hold one token, so no row is all mask
    return tokens, tokens == 0


def _token_waste(inputs: Sequence[torch.Tensor]) -> float:
    """Share of the batch's token slots that are padding."""
    longest = max(t.shape[0] for t in inputs)
    return 1.0 - sum(t.shape[0] for t in inputs) / (longest * len(inputs))


def _image_from_bytes(body: bytes) -> torch.Tensor:
    return _dense_from_bytes(body, IMAGE_SHAPE)


def _features_from_bytes(body: bytes) -> torch.Tensor:
    return _dense_from_bytes(body, (RANKER_FEATURES,))


def _dense_from_bytes(body: bytes, shape: tuple[int, ...]) -> torch.Tensor:
    expected = 4 * int(np.prod(shape))
    if len(body) != expected:
        dims = "x".join(map(str, shape))
        raise InvalidInput(
            f"binary input must be {expected} bytes of float32 ({dims}), got {len(body)}"
        )
    return _finite(torch.frombuffer(bytearray(body), dtype=torch.float32).reshape(shape))


def _float32_bytes(value: Any) -> bytes:
    return torch.as_tensor(value, dtype=torch.float32).numpy().tobytes()


def _tokens_from_bytes(body: bytes) -> torch.Tensor:
    if not body or len(body) % 4:
        raise InvalidInput("binary input must be int32 token ids (a multiple of 4 bytes)")
    return _tokens(torch.frombuffer(bytearray(body), dtype=torch.int32).tolist())


def _tokens_to_bytes(value: Any) -> bytes:
    return torch.as_tensor(value, dtype=torch.int32).numpy().tobytes()


def _length_bucket(tokens: torch.Tensor) -> int:
    """Sequences of 1-16 tokens, 17-32, 33-64, 65-128: each group pads within itself."""
    return max(16, 1 << (int(tokens.shape[0]) - 1).bit_length())


def _example_image(i: int) -> list:
    generator = torch.Generator().manual_seed(i)
    return torch.rand(IMAGE_SHAPE, generator=generator).tolist()


def _example_features(i: int) -> list[float]:
    generator = torch.Generator().manual_seed(i)
    return torch.rand(RANKER_FEATURES, generator=generator).tolist()


def _example_tokens(i: int) -> list[int]:
    generator = torch.Generator().manual_seed(i)
    length = int(torch.randint(8, MAX_TOKENS + 1, (1,), generator=generator))
    return torch.randint(1, VOCABULARY + 1, (length,), generator=generator).tolist()


def _demo(name: str) -> ServedModel:
    torch.manual_seed(0)  # the demos' weights are part of their definition
    if name == "demo-cnn":
        return ServedModel(
            name,
            _seeded(DemoCnn()),
            _collate_images,
            _image,
            _example_image,
            from_bytes=_image_from_bytes,
            to_bytes=_float32_bytes,
        )
    if name == "demo-ranker":
        return ServedModel(
            name,
            _seeded(DemoRanker()),
            _collate_features,
            _features,
            _example_features,
            from_bytes=_features_from_bytes,
            to_bytes=_float32_bytes,
            compile_buckets=True,
        )
    return ServedModel(
        name,
        _seeded(DemoText()),
        _collate_tokens,
        _tokens,
        _example_tokens,
        _token_waste,
        from_bytes=_tokens_from_bytes,
        to_bytes=_tokens_to_bytes,
        length_group=_length_bucket,
    )


def _generic(value: Any) -> torch.Tensor:
    try:
        return torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidInput("input must be a (nested) list of numbers") from None


def _collate_stack(inputs: Sequence[torch.Tensor], padded_size: int) -> tuple[torch.Tensor]:
    shapes = {tuple(t.shape) for t in inputs}
    if len(shapes) != 1:
        raise InvalidInput(f"inputs in one batch must share a shape, got {sorted(shapes)}")
    batch = torch.zeros((padded_size, *inputs[0].shape))
    batch[: len(inputs)] = torch.stack(list(inputs))
    return (batch,)


def load_model(spec: str) -> ServedModel:
    """`demo-cnn`, `demo-ranker`, `demo-text`, a TorchScript path, or `module:factory`."""
    if spec in DEMO_MODELS:
        return _demo(spec)
    if Path(spec).exists() and spec.endswith(".pt2"):
        return _exported(spec)
    if Path(spec).exists():
        try:
            module = torch.jit.load(spec, map_location="cpu").eval()
        except (RuntimeError, ValueError) as error:
            raise InvalidInput(
                f"{spec}: not a TorchScript file ({str(error).splitlines()[0]})"
            ) from None
        return ServedModel(Path(spec).name, module, _collate_stack, _generic, lambda i: [0.0])
    if ":" in spec:
        return _from_factory(spec)
    raise InvalidInput(
        f"unknown model {spec!r}: use {', '.join(DEMO_MODELS)}, a TorchScript path or "
        "module:factory"
    )


def _exported(spec: str) -> ServedModel:
    """A `torch.export` program (`torch.export.save`, `.pt2`): TorchScript's successor."""
    try:
        module = torch.export.load(spec).module()
    except (RuntimeError, ValueError, KeyError) as error:
        raise InvalidInput(
            f"{spec}: not a torch.export program ({str(error).splitlines()[0]})"
        ) from None
    return ServedModel(Path(spec).name, module, _collate_stack, _generic, lambda i: [0.0])


def _from_factory(spec: str) -> ServedModel:
    module_name, _, attribute = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise InvalidInput(f"model {spec!r}: cannot import ({error})") from None
    made = factory()
    module, collate = made if isinstance(made, tuple) else (made, _collate_stack)
    if not isinstance(module, nn.Module):
        raise InvalidInput(f"model {spec!r}: factory must return an nn.Module or (module, collate)")
    return ServedModel(spec, module.eval(), collate, _generic, lambda i: [0.0])
