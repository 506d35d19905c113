"""Sampled mean@N on real CPU engines, with more prompt tokens waiting than one engine step holds.

vLLM rewinds a seeded request's generator when a prompt is prefilled in chunks, which CPU generators cannot
do: such a run killed every engine. These runs are big enough that chunking would happen, and check that
every sample is generated, that sample i of a question is drawn with seed + i, and that the same command
gives the same outputs again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs import MODEL_DIR, rayeval, records

pytestmark = pytest.mark.slow

STEP_TOKENS = 1024  # one engine step's token budget, and the longest prompt (max_model_len)


def sampled_run(out: Path, gsm8k: Path, run_id: str, seed: int = 1234, small_steps: bool = True):
    """`small_steps`: one engine step holds STEP_TOKENS; without it, the engine settings of the tests' float32
    pool, which serves the run (another engine process than the first run's)."""
    steps = ["--max-num-batched-tokens", str(STEP_TOKENS)] if small_steps else []
    argv = ["run", "--tasks", "gsm8k", "--data-path", f"gsm8k={gsm8k}", "--limit", "12", "--num-samples", "3",
            "--temperature", "0.8", "--seed", str(seed), "--max-tokens", "24", "--max-model-len", str(STEP_TOKENS),
            *steps, "--dtype", "float32", "--enforce-eager",
            "--no-progress", "--output-dir", str(out), "--run-id", run_id]  # fmt: skip
    done = rayeval(*argv)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / run_id


def outputs(run_dir: Path) -> dict[tuple[int, int], str]:
    rows = records(run_dir / "samples" / MODEL_DIR / "gsm8k.jsonl")
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows if r["error"]][:3]
    return {(r["doc_id"], r["sample_index"]): r["output"] for r in rows}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, shared_gsm8k) -> Path:
    return sampled_run(tmp_path_factory.mktemp("sampled"), shared_gsm8k, "first")


def test_a_sampled_run_larger_than_one_engine_step_generates_every_sample(first_run):
    summary = json.loads((first_run / "summary.json").read_text())
    (engine,) = summary["run"]["engines"]
    rows = records(first_run / "samples" / MODEL_DIR / "gsm8k.jsonl")
    # the prompts waiting at the start could not all be prefilled in one step
    assert sum(r["prompt_tokens"] for r in rows if r["sample_index"] == 0) > engine["max_num_batched_tokens"]
    assert engine["max_num_batched_tokens"] == STEP_TOKENS and engine["chunked_prefill"] is False
    assert summary["tasks"]["gsm8k"]["failed"] == 0
    assert len(outputs(first_run)) == 12 * 3
    assert summary["run"]["dispatch"]["per_replica"]["replica-0"]["dead"] is False


def test_samples_differ_and_sample_i_is_drawn_with_seed_plus_i_in_any_run(first_run, tmp_path, shared_gsm8k):
    """A run seeded one higher draws, in another process, as its sample 0 what the first run drew as its
    sample 1 (and 1 as 2): sample i is seeded seed + i, and the same seed gives the same text again."""
    first = outputs(first_run)
    per_question = [{first[(doc, i)] for i in range(3)} for doc in range(12)]
    assert sum(len(texts) > 1 for texts in per_question) >= 6  # seed + i draws different samples
    shifted = outputs(sampled_run(tmp_path, shared_gsm8k, "shifted", seed=1235, small_steps=False))
    assert all(shifted[(doc, 0)] == first[(doc, 1)] for doc in range(12))
    assert all(shifted[(doc, 1)] == first[(doc, 2)] for doc in range(12))
