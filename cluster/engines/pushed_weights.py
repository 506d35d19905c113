"""Weights handed to a running engine by a trainer, without a file: packed into one buffer here, unpacked
into tensors on each of the engine's workers, which load them in place through vLLM's own reload.

A trainer's tensors travel as raw bytes (any dtype, bfloat16 included) with their name, dtype and shape:
`raw_tensors` turns a state dict into that form (one copy, into the caller's buffers), `pack` joins them
into one message for vLLM's `collective_rpc`, and the worker extension `PushedWeights` (named in every
engine's `worker_extension_cls`, so it is importable in the engine's processes) unpacks them as views of
that message and calls the model runner's `reload_weights`, which maps checkpoint names onto vLLM's fused
layers as a load from disk does. The names and shapes are checked before anything is sent
(`cluster.training.weights`): an engine never gets a tensor its model does not have.
"""

from __future__ import annotations

import json
import struct
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

WEIGHTS_EXTENSION = "cluster.engines.pushed_weights.PushedWeights"
_HEADER = struct.Struct("<Q")  # the JSON header's length in bytes
ALIGN = 64


@dataclass(frozen=True)
class RawTensor:
    """One tensor as bytes: `data` is a flat uint8 array (or any buffer) of its contents in C order."""

    name: str
    dtype: str  # torch's name without the prefix: float32, bfloat16, ...
    shape: tuple[int, ...]
    data: Any

    @property
    def nbytes(self) -> int:
        return memoryview(self.data).nbytes


def raw_tensor(name: str, tensor: Any) -> RawTensor:
    """A torch tensor's contents as bytes on the CPU: a view where the tensor is a contiguous CPU one (a GPU
    tensor is copied here), so whoever keeps it past the caller's next optimizer step copies it (`ray.put`)."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return RawTensor(
        name, str(flat.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy()
    )


def pack(tensors: Iterable[RawTensor]) -> bytes:
    """One buffer: the header's length, a JSON header of [name, dtype, shape, offset, nbytes], then each
    tensor's data at an offset aligned to ALIGN bytes (a view of another dtype needs its alignment)."""
    tensors = list(tensors)
    entries, parts, offset = [], [], 0
    for t in tensors:
        entries.append([t.name, t.dtype, list(t.shape), offset, t.nbytes])
        padding = -t.nbytes % ALIGN
        parts += [t.data, bytes(padding)]
        offset += t.nbytes + padding
    header = json.dumps(entries).encode()
    header += b" " * (-(_HEADER.size + len(header)) % ALIGN)
    return b"".join([_HEADER.pack(len(header)), header, *parts])


def unpack(blob: bytes) -> list[tuple[str, Any]]:
    """The (name, tensor) pairs of a packed buffer, as views of it (no copy)."""
    import torch

    (length,) = _HEADER.unpack_from(blob)
    start = _HEADER.size + length
    entries = json.loads(bytes(memoryview(blob)[_HEADER.size : start]))
    with warnings.catch_warnings():  # a bytes object is read-only; the engine copies each tensor into its own
        warnings.simplefilter("ignore", UserWarning)
        whole = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) > start else torch.empty(0)
    pairs = []
    for name, dtype, shape, offset, nbytes in entries:
        part = whole[start + offset : start + offset + nbytes]
        pairs.append((name, part.view(getattr(torch, dtype)).reshape(shape)))
    return pairs


class PushedWeights:
    """Mixed into vLLM's worker class (`worker_extension_cls`): what `collective_rpc` calls on each worker."""

    def load_pushed_weights(self, blob: bytes) -> int:
        """Load the packed tensors into the model in place; returns how many there were."""
        pairs = unpack(blob)
        self.model_runner.reload_weights(weights_iterator=iter(pairs), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(pairs)
