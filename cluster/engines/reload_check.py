"""The check after an engine reloads a checkpoint's weights in place: does it now compute what the checkpoint
computes? `models.swap_kind` allows a reload only where it should give the new weights exactly, but the
reload is vLLM's, and a parameter it leaves stale (its layerwise reload cannot refresh a tied output
projection) would score every later request with old weights and no error. So after each reload the engine
decodes one short prompt greedily and its tokens and their log-probabilities are compared with a reference
computed the safe way: transformers loads the checkpoint afresh and decodes the same prompt.

The two implementations agree only up to their kernels' rounding, so the first time an engine reloads within
a model family (`models.model_family`), while it still serves weights it loaded the safe way (a start or a
rebuild), both compute the probe on those weights: how far apart they are there sets the tolerance for the
family. Where even they pick other tokens, the probe cannot judge that family, and every move within it
rebuilds the engine; so does a move where the reference would not fit in half the memory free (a large model
on a GPU node), since an unchecked reload is what the check is there to prevent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PROBE_TEXT = "The capital of France is Paris. The capital of Italy is"
PROBE_TOKENS = 6
# The least tolerance on a log-probability: rounding between two float32 implementations stays far below it,
# a stale output projection moves log-probabilities by far more.
MIN_TOLERANCE = 1e-3
TOLERANCE_FACTOR = 10.0  # times the gap between the two implementations on weights loaded the safe way


@dataclass(frozen=True)
class Probe:
    """A greedy decoding of the probe: each token and its log-probability."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]

    def gap(self, other: Probe) -> float:
        """The largest log-probability difference (infinite where the tokens differ)."""
        if self.tokens != other.tokens:
            return math.inf
        return max((abs(a - b) for a, b in zip(self.logprobs, other.logprobs, strict=True)), default=0.0)


@dataclass(frozen=True)
class Calibration:
    """How far the engine and the reference are apart on weights the engine loaded the safe way."""

    gap: float

    @property
    def usable(self) -> bool:
        return math.isfinite(self.gap)

    @property
    def tolerance(self) -> float:
        return max(MIN_TOLERANCE, TOLERANCE_FACTOR * self.gap)


def reference_room(path: str, dtype: str) -> str | None:
    """Why the reference cannot be computed here (the checkpoint in `dtype` would take more than half the
    memory free: a large model on a GPU node); None when it can. Without a reference the engine is rebuilt."""
    from pathlib import Path

    import psutil

    from cluster.models import CheckpointTensors

    size = {"float64": 8, "float32": 4}.get(dtype, 2)
    needed = sum(math.prod(info.shape) for info in CheckpointTensors(Path(path)).index.values()) * size
    free = psutil.virtual_memory().available
    if needed <= free / 2:
        return None
    return f"its reference needs {needed / 2**30:.1f} GiB of memory and {free / 2**30:.1f} GiB is free"


def reference_probe(path: str, prompt: list[int], dtype: str) -> Probe:
    """The probe decoded by transformers from the checkpoint at `path`, loaded afresh on CPU in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the actor's log is the engine's: no loading bars in it
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    model.eval()
    tokens, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(PROBE_TOKENS):
            logits = model(torch.tensor([tokens])).logits[0, -1].float()
            scores = torch.log_softmax(logits, dim=-1)
            token = int(torch.argmax(scores))
            tokens.append(token)
            logprobs.append(float(scores[token]))
    del model
    return Probe(tuple(tokens[len(prompt) :]), tuple(logprobs))


async def engine_probe(engine: Any, prompt: list[int]) -> Probe:
    """The probe decoded greedily by a live vLLM engine, with each token's raw log-probability."""
    import uuid

    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0, max_tokens=PROBE_TOKENS, logprobs=1, ignore_eos=True, detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )  # fmt: skip
    final = None
    async for output in engine.generate(
        TokensPrompt(prompt_token_ids=prompt), params, f"reload-check-{uuid.uuid4().hex}"
    ):
        final = output
    assert final is not None and final.outputs
    out = final.outputs[0]
    tokens = tuple(int(t) for t in out.token_ids)
    return Probe(tokens, tuple(float(step[t].logprob) for step, t in zip(out.logprobs, tokens, strict=True)))


class ReloadCheck:
    """One engine's reload check: the probe prompt and each model family's calibration."""

    def __init__(self) -> None:
        self.calibrations: dict[str, Calibration] = {}

    @staticmethod
    def prompt(tokenizer: Any) -> list[int]:
        return list(tokenizer.encode(PROBE_TEXT))

    async def calibrate(self, family: str, engine: Any, tokenizer: Any, path: str, dtype: str) -> Calibration:
        """The family's calibration, measured now (on the weights the engine loaded the safe way) the first
        time it is asked for; unusable where the reference does not fit in memory."""
        if family not in self.calibrations and reference_room(path, dtype) is not None:
            return Calibration(math.inf)
        if family not in self.calibrations:
            prompt = self.prompt(tokenizer)
            served = await engine_probe(engine, prompt)
            self.calibrations[family] = Calibration(served.gap(reference_probe(path, prompt, dtype)))
        return self.calibrations[family]

    async def problem(
        self, calibration: Calibration, engine: Any, tokenizer: Any, path: str, dtype: str
    ) -> str | None:
        """Why the engine does not compute what the checkpoint at `path` computes; None when it does."""
        if (no_room := reference_room(path, dtype)) is not None:
            return f"the check could not run: {no_room}"
        if not calibration.usable:
            return (
                "the probe cannot judge this model family (a fresh engine and transformers pick other tokens)"
            )
        prompt = self.prompt(tokenizer)
        served, reference = await engine_probe(engine, prompt), reference_probe(path, prompt, dtype)
        gap = served.gap(reference)
        if gap <= calibration.tolerance:
            return None
        if served.tokens != reference.tokens:
            return f"greedy tokens {list(served.tokens)} where the checkpoint gives {list(reference.tokens)}"
        return (
            f"log-probabilities {gap:.3g} away from the checkpoint's (tolerance {calibration.tolerance:.3g})"
        )
