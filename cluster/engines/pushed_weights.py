"""Weights handed to a running engine by a trainer, without a file on disk: packed into one buffer here,
unpacked into tensors on each of the engine's workers, which load them in place through vLLM's own reload.

A trainer's tensors travel as raw bytes (any dtype, bfloat16 included) with their name, dtype and shape:
`raw_tensor` gives a tensor that form, `pack` joins a group of them into one buffer (a push is a list of such
buffers, since a field of vLLM's messages holds at most 4 GiB). The replica's actor writes the buffers to its
node's shared memory (`stage_blobs`) and names the files in vLLM's `collective_rpc`; the worker extension
`PushedWeights` (named in every engine's `worker_extension_cls`, so it is importable in the engine's
processes) maps them, unpacks them as views and calls the model runner's `reload_weights`, which maps
checkpoint names onto vLLM's fused layers as a load from disk does. Where the workers are on other nodes
(a replica over nodes) or the node has no room, the buffers go in the message itself, which copies them on
both sides of the engine's socket. The names and shapes are checked before anything is sent
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
# a push's buffers on their way from the actor to its engine's worker (memory, no disk)
SHARED_MEMORY = "/dev/shm"


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


def raw_tensor(name: str, tensor: Any, dtype: str | None = None) -> RawTensor:
    """A torch tensor's contents as bytes on the CPU: a view where the tensor is a contiguous CPU one (a GPU
    tensor is copied here), so whoever keeps it past the caller's next optimizer step copies it (`ray.put`).
    `dtype`: the engines' dtype, where known; a floating-point tensor of a wider one is converted where it
    lies (on its GPU: half the bytes to copy to the host), as `in_dtype` would convert it later."""
    import torch

    source = tensor.detach()
    target = getattr(torch, dtype) if dtype is not None else source.dtype
    if narrows(source.dtype, target):
        source = source.to(dtype=target)
    flat = source.to("cpu").contiguous().reshape(-1)
    return RawTensor(
        name, str(flat.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy()
    )


def pack(tensors: Iterable[RawTensor]) -> Any:
    """One buffer, a flat uint8 numpy array (Ray's object store hands an array to its readers without a
    copy, where bytes would be copied on every read): the header's length, a JSON header of [name, dtype,
    shape, offset, nbytes], then each tensor's data at an offset aligned to ALIGN bytes (a view of another
    dtype needs its alignment)."""
    import numpy as np

    tensors = list(tensors)
    entries, offset = [], 0
    for t in tensors:
        entries.append([t.name, t.dtype, list(t.shape), offset, t.nbytes])
        offset += t.nbytes + (-t.nbytes % ALIGN)
    header = json.dumps(entries).encode()
    header += b" " * (-(_HEADER.size + len(header)) % ALIGN)
    start = _HEADER.size + len(header)
    buffer = np.zeros(start + offset, dtype=np.uint8)
    buffer[:start] = np.frombuffer(_HEADER.pack(len(header)) + header, dtype=np.uint8)
    for t, (_, _, _, at, nbytes) in zip(tensors, entries, strict=True):
        if nbytes:
            buffer[start + at : start + at + nbytes] = np.frombuffer(t.data, dtype=np.uint8)
    return buffer


def narrows(source: Any, target: Any) -> bool:
    """Whether a tensor of torch dtype `source` goes to the engine as `target`: floating point to a narrower
    floating point only (what the engine's loader would round it to anyway); never widened."""
    return source.is_floating_point and target.is_floating_point and target.itemsize < source.itemsize


def in_dtype(tensors: Iterable[RawTensor], dtype: str | None) -> list[RawTensor]:
    """Floating-point tensors of a wider dtype converted to the engine's `dtype` (None: all as they are),
    as the engine's loader rounds them into its parameters: a bfloat16 engine then gets half a float32
    push. Narrower ones are sent as they are, never widened."""
    import torch

    converted = []
    for t in tensors:
        source = getattr(torch, t.dtype)
        target = getattr(torch, dtype) if dtype is not None else source
        if not narrows(source, target):
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


def unpack(blob: Any) -> list[tuple[str, Any]]:
    """The (name, tensor) pairs of a packed buffer, as views of it (no copy)."""
    import torch

    (length,) = _HEADER.unpack_from(blob)
    start = _HEADER.size + length
    entries = json.loads(bytes(memoryview(blob)[_HEADER.size : start]))
    # Ray's objects and mapped files are read-only; the engine copies from them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        whole = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) > start else torch.empty(0)
    pairs = []
    for name, dtype, shape, offset, nbytes in entries:
        part = whole[start + offset : start + offset + nbytes]
        pairs.append((name, part.view(getattr(torch, dtype)).reshape(shape)))
    return pairs


class PushedWeights:
    """Mixed into vLLM's worker class (`worker_extension_cls`): what `collective_rpc` calls on each worker."""

    def load_pushed_weights(self, blobs: list[Any]) -> int:
        """Load the packed tensors into the model in place through the model runner's `reload_weights` (layer
        by layer, with the processing a load from disk applies; the model's `load_weights` maps checkpoint
        names onto vLLM's fused layers); returns how many there were. Several buffers, since one message
        field holds at most 4 GiB.

        That reload processes only the layers it loads: a module tied to one of them (an output projection
        sharing the embeddings) would answer with stale logits, so every parameter shared between modules
        before the reload is shared again after it and its holders' kernels are prepared again (`_retie`).
        """
        pairs = [pair for blob in blobs for pair in unpack(blob)]
        return self._load_pairs(pairs)

    def load_pushed_files(self, paths: list[str]) -> int:
        """`load_pushed_weights` on packed buffers that the actor wrote to files of its node's memory
        (`stage_blobs`): mapped here, not sent through the engine's message socket, which copies every byte
        once more on each side. The views hold the mappings until the reload has copied them in."""
        return self._load_pairs([pair for mapped in map_staged(paths) for pair in unpack(mapped)])

    def _load_pairs(self, pairs: list[tuple[str, Any]]) -> int:
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


def stage_blobs(blobs: list[Any], folder: str = SHARED_MEMORY) -> list[str] | None:
    """Each packed buffer written to a file of `folder` (the node's shared memory) for the engine's worker
    to map; None, with nothing left behind, where the folder is missing or has no room (the push then
    travels in the engine's message). The caller removes the files (`unstage`) once the load returns."""
    import os
    import tempfile

    if not os.path.isdir(folder):
        return None
    paths: list[str] = []
    try:
        for blob in blobs:
            handle, path = tempfile.mkstemp(dir=folder, prefix="rayeval-push-")
            paths.append(path)
            with os.fdopen(handle, "wb") as out:
                out.write(blob)
    except OSError:
        unstage(paths)
        return None
    return paths


def map_staged(paths: list[str]) -> list[Any]:
    """The staged buffers mapped read-only (no copy): what `unpack` reads on the worker."""
    import mmap

    maps = []
    for path in paths:
        with open(path, "rb") as file:
            maps.append(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))
    return maps


def unstage(paths: list[str]) -> None:
    import os

    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


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
