"""Weights handed to a running engine by a trainer, without a file: packed into one buffer here, unpacked
into tensors on each of the engine's workers, which load them in place through vLLM's own reload.

A trainer's tensors travel as raw bytes (any dtype, bfloat16 included) with their name, dtype and shape:
`raw_tensor` gives a tensor that form, `pack` joins a group of them into one buffer (a push is a list of
such buffers, since a field of vLLM's messages holds at most 4 GiB) for vLLM's `collective_rpc`, and the worker extension `PushedWeights` (named in every
engine's `worker_extension_cls`, so it is importable in the engine's processes) unpacks them as views of
that message and calls the model runner's `reload_weights`, which maps checkpoint names onto vLLM's fused
layers as a load from disk does. The names and shapes are checked before anything is sent
(`cluster.training.weights`): an engine never gets a tensor its model does not have.
"""

from __future__ import annotations

import inspect
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


def in_dtype(tensors: Iterable[RawTensor], dtype: str | None) -> list[RawTensor]:
    """Floating-point tensors of a wider dtype converted to the engine's `dtype` (None: all as they are),
    as the engine's loader rounds them into its parameters: a bfloat16 engine then gets half a float32
    push. Narrower ones are sent as they are, never widened."""
    import torch

    converted = []
    for t in tensors:
        source = getattr(torch, t.dtype)
        target = getattr(torch, dtype) if dtype is not None else source
        narrower = target.is_floating_point and target.itemsize < source.itemsize
        if not (source.is_floating_point and narrower):
            converted.append(t)
            continue
        with warnings.catch_warnings():  # a read-only buffer (Ray's object store): read, never written
            warnings.simplefilter("ignore", UserWarning)
            flat = (
                torch.frombuffer(memoryview(t.data), dtype=torch.uint8)
                if t.nbytes
                else torch.empty(0, dtype=torch.uint8)
            )
        values = flat.view(source).to(target)
        converted.append(RawTensor(t.name, str(dtype), t.shape, values.view(torch.uint8).numpy()))
    return converted


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

    def load_pushed_weights(self, blobs: list[bytes]) -> int:
        """Load the packed tensors into the model in place through the model runner's `reload_weights` (layer
        by layer, with the processing a load from disk applies; the model's `load_weights` maps checkpoint
        names onto vLLM's fused layers); returns how many there were. Several buffers, since one message
        field holds at most 4 GiB.

        That reload processes only the layers it loads: a module tied to one of them (an output projection
        sharing the embeddings) would answer with stale logits, so every parameter shared between modules
        before the reload is shared again after it and its holders' kernels are prepared again (`_retie`).
        """
        pairs = [pair for blob in blobs for pair in unpack(blob)]
        runner = self.model_runner  # type: ignore[attr-defined]
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        shared = _shared_parameters(model)
        reload = getattr(runner, "reload_weights", None)
        if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
            reload(weights_iterator=iter(pairs), is_checkpoint_format=True)
        else:  # an older vLLM: the model's own loader, into the existing parameters
            model.load_weights(weights=iter(pairs))
        _retie(shared)
        return len(pairs)


def _shared_parameters(model: Any) -> list[list[tuple[Any, str, Any]]]:
    """Each parameter object held by more than one module: [(module, name, the object), ...]."""
    holders: dict[int, list[tuple[Any, str, Any]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, name, param))
    return [group for group in holders.values() if len(group) > 1]


def _retie(groups: list[list[tuple[Any, str, Any]]]) -> None:
    """Point every holder of a shared parameter at the object the reload gave one of them, and let each
    holder prepare its kernels from it again: the reload processes only the layers it loaded, and a tied
    output projection is not among them (on CPU its matmul keeps a packed copy of the old weights)."""
    for group in groups:
        old = group[0][2]
        fresh = [m._parameters[n] for m, n, _ in group if m._parameters.get(n) is not old]
        for module, name, _ in group:
            if fresh:
                module._parameters[name] = fresh[0]
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)


def write_files(folder: str, files: dict[str, bytes]) -> None:
    """`files` in `folder`, each written under a unique temporary name and renamed into place unless the
    folder holds it already: several replicas of one node may write the same folder at once."""
    import os
    import tempfile
    from pathlib import Path

    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = target / name
        if path.is_file() and path.read_bytes() == data:
            continue
        handle, partial = tempfile.mkstemp(dir=target, prefix=f".{name}.")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(partial, path)
