"""A full checkpoint's tensors, whatever their file format and names: their names, dtypes and shapes, and a
digest of any one tensor's bytes. This is what an engine's move between checkpoints is decided on
(`checkpoints.swap_kind`), so that no file format or naming reads as "unchanged".

safetensors files are read through their JSON header (each tensor's dtype, shape and byte range), so nothing is
loaded but the bytes a digest asks for. Without safetensors files, `pytorch_model*.bin` files are read as
vLLM and transformers read them (safetensors first); torch maps them into memory (`mmap`) where their format
allows, so their tensors are not all copied.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

# safetensors' dtype names as torch names them, so the two formats compare
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                       "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}  # fmt: skip
_CHUNK = 1 << 24


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Stored:
    """Where one tensor's bytes are: a safetensors file and the byte range, or a .bin file."""

    file: Path
    begin: int = 0
    end: int = 0


def safetensors_header(handle: BinaryIO) -> dict[str, Any]:
    """A safetensors file's JSON header (tensor name -> dtype, shape, data_offsets), read from the start of
    `handle`, which is left at the first byte of the tensor data."""
    import json

    (length,) = struct.unpack("<Q", handle.read(8))
    return json.loads(handle.read(length))


class CheckpointTensors:
    """The tensors of the checkpoint folder `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._bin_cache: dict[Path, dict[str, Any]] = {}

    @property
    def index(self) -> dict[str, TensorInfo]:
        """Every tensor's name, dtype and shape (an OSError or ValueError where a weight file is unreadable)."""
        return self._table[0]

    @cached_property
    def _table(self) -> tuple[dict[str, TensorInfo], dict[str, _Stored]]:
        found: dict[str, TensorInfo] = {}
        where: dict[str, _Stored] = {}
        safetensors = sorted(self.folder.glob("*.safetensors"))
        for weights in safetensors:
            with weights.open("rb") as handle:
                header = safetensors_header(handle)
                start = handle.tell()
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                begin, end = entry["data_offsets"]
                where[name] = _Stored(weights, start + begin, start + end)
                found[name] = TensorInfo(
                    _SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"]), tuple(entry["shape"])
                )
        if safetensors:
            return found, where
        for weights in sorted(self.folder.glob("pytorch_model*.bin")):
            for name, tensor in self._bin(weights).items():
                where[name] = _Stored(weights)
                found[name] = TensorInfo(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        return found, where

    def digest(self, name: str) -> str:
        """sha256 of one tensor's bytes (little-endian, row-major: the same bytes in either format)."""
        stored = self._table[1][name]
        digest = hashlib.sha256()
        if stored.file.suffix == ".safetensors":
            with stored.file.open("rb") as handle:
                handle.seek(stored.begin)
                left = stored.end - stored.begin
                while left > 0:
                    chunk = handle.read(min(_CHUNK, left))
                    if not chunk:
                        raise ValueError(f"{stored.file} ends inside tensor {name}")
                    digest.update(chunk)
                    left -= len(chunk)
            return digest.hexdigest()
        import torch

        tensor = self._bin(stored.file)[name].contiguous()
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def _bin(self, weights: Path) -> dict[str, Any]:
        if weights not in self._bin_cache:
            import torch

            try:
                loaded = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # the legacy (non-zip) format cannot be mapped: read it whole
                loaded = torch.load(weights, map_location="cpu", weights_only=True)
            self._bin_cache[weights] = {k: v for k, v in loaded.items() if hasattr(v, "shape")}
        return self._bin_cache[weights]
