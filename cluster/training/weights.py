"""What a trainer may push: the base model's tensor names and shapes, read from its safetensors headers, and
the check of a pushed state dict against them, made in the trainer's process before anything is sent.

A state dict from the trainer's model (`model.state_dict()`, `named_parameters()`) uses the checkpoint's
names; a tied output layer (`lm_head.weight` where `tie_word_embeddings` is set) is accepted and ignored by
vLLM's loader, as it is in a saved checkpoint that carries it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluators.errors import EvalInputError

TIED_OUTPUT = "lm_head.weight"
EMBEDDINGS = "model.embed_tokens.weight"
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.module.")  # DDP, torch.compile


@dataclass(frozen=True)
class ModelTensors:
    """The model's tensors: name -> shape, and which of them may be left out of a push."""

    model: str  # for messages
    shapes: dict[str, tuple[int, ...]]
    optional: frozenset[str] = frozenset()

    @classmethod
    def of_checkpoint(cls, folder: Path, label: str | None = None) -> ModelTensors:
        """The tensors in the checkpoint's safetensors files (headers only: nothing is loaded)."""
        from safetensors import safe_open

        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise EvalInputError(
                f"{folder} has no *.safetensors file: pushing weights checks them against the base model's "
                "safetensors checkpoint (save it with safe_serialization=True)."
            )
        shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        optional: set[str] = set()
        config = folder / "config.json"
        tied = config.is_file() and json.loads(config.read_text()).get("tie_word_embeddings", False)
        if tied and EMBEDDINGS in shapes and TIED_OUTPUT not in shapes:
            shapes[TIED_OUTPUT] = shapes[EMBEDDINGS]
            optional.add(TIED_OUTPUT)
        return cls(label or folder.name, shapes, frozenset(optional))

    def check(self, tensors: Mapping[str, Any], partial: bool = False) -> None:
        """Refuse `tensors` naming the first problem: a name the model has not, a shape that differs, a value
        that is not a tensor, or (unless `partial`) a tensor of the model that is missing."""
        for name, tensor in tensors.items():
            if name not in self.shapes:
                raise EvalInputError(self._unknown(name))
            shape = tuple(getattr(tensor, "shape", ()))
            if not hasattr(tensor, "detach"):
                raise EvalInputError(
                    f"push_weights: '{name}' is a {type(tensor).__name__}, not a torch tensor."
                )
            if shape != self.shapes[name]:
                raise EvalInputError(
                    f"push_weights: tensor '{name}' has shape {list(shape)}; {self.model}'s is "
                    f"{list(self.shapes[name])}. The engines keep their weights."
                )
        missing = [n for n in self.shapes if n not in tensors and n not in self.optional]
        if missing and not partial:
            raise EvalInputError(
                f"push_weights: {len(missing)} of {self.model}'s {len(self.shapes)} tensors are missing, "
                f"first '{missing[0]}'. Push the whole state dict, or pass partial=True to update only the "
                "tensors given. The engines keep their weights."
            )

    def _unknown(self, name: str) -> str:
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix) and name.removeprefix(prefix) in self.shapes:
                return (
                    f"push_weights: tensor '{name}' is not a weight of {self.model}; without the wrapper's "
                    f"prefix '{prefix}' it is. Push the unwrapped model's state dict. The engines keep their "
                    "weights."
                )
        example = next(iter(self.shapes))
        return (
            f"push_weights: tensor '{name}' is not a weight of {self.model} (its names look like '{example}'). "
            "The engines keep their weights."
        )


def named_tensors(weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A state dict, or (name, tensor) pairs such as `model.named_parameters()`, as a dict."""
    pairs = weights.items() if isinstance(weights, Mapping) else weights
    return dict(pairs)
