"""lm-eval tasks against a model behind an endpoint: a real `vllm serve` of the default model (vLLM's own
server, which returns prompt logprobs; `rayeval serve` does too, tests/cluster/serve/test_serve.py runs it
with LoRA adapters, where vLLM cannot) against `rayeval run` on its own replica, same engine settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.models import default_model_dir
from tests.ports import free_port
from tests.runs import (
    ENGINE_IN_ONE_PROCESS,
    MODEL_DIR,
    every_core_binding,
    rayeval,
    records,
    wait_until_answering,
)

pytestmark = pytest.mark.slow

SERVED_NAME = "smol"
TASKS = ("gsm8k_local", "gsm8k_mc_local", "gsm8k_rolling_local")
# float32, eager, no chunked prefill, 1 GiB of KV cache, 64 sequences: what a run gives its CPU engine
ENGINE = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]
SERVER = [*ENGINE, "--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048", "--max-num-seqs", "64"]


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[Callable[[], str]]:
    """`vllm serve` started; the fixture's value waits until it answers and returns its URL (a test does its
    local work while the server starts)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(default_model_dir()),
        "--served-model-name", SERVED_NAME, "--port", str(port), *SERVER,
    ]  # fmt: skip
    # the worker inside the engine core's process answers 8 to 10 s sooner on two cores
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **ENGINE_IN_ONE_PROCESS, **every_core_binding()}
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # fmt: skip
    try:
        yield lambda: _wait_until_serving(url, server)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def _wait_until_serving(url: str, server: subprocess.Popen) -> str:
    try:
        wait_until_answering(f"{url}/models", server)
    except RuntimeError as error:
        pytest.fail(str(error))
    return url


def test_lm_eval_tasks_through_the_endpoint_score_as_on_local_replicas_and_resume_asking_nothing(
    vllm_server: Callable[[], str], tmp_path: Path, local_lm_eval_tasks: Path
) -> None:
    """GSM8K generated, multiple choice and rolling log-likelihood: prompts tokenised here with --tokenizer,
    log-likelihoods read from the server's prompt logprobs."""
    tasks = local_lm_eval_tasks
    common = [
        "--tasks", ",".join(TASKS), "--include-path", str(tasks), "--limit", "5", "--gen-kwargs", "max_gen_toks=32",
        "--no-progress", "--output-dir", str(tmp_path),
    ]  # fmt: skip
    local = rayeval("run", *ENGINE, *common, "--run-id", "local")  # while the server starts
    assert local.returncode == 0, local.stderr[-3000:]
    endpoint = [
        "--model",
        f"openai:{SERVED_NAME}",
        "--base-url",
        vllm_server(),
        "--tokenizer",
        str(default_model_dir()),
    ]
    first = rayeval("run", *endpoint, *common, "--run-id", "endpoint")
    assert first.returncode == 0, first.stderr[-3000:]
    for task in TASKS:
        assert_same_records(
            task, tmp_path / "endpoint" / "samples" / SERVED_NAME, tmp_path / "local" / "samples" / MODEL_DIR
        )
    ours = json.loads((tmp_path / "endpoint" / "results.json").read_text())["results"]
    theirs = json.loads((tmp_path / "local" / "results.json").read_text())["results"]
    assert (
        ours.keys() == theirs.keys()
        and ours["gsm8k_mc_local"]["acc,none"] == theirs["gsm8k_mc_local"]["acc,none"]
    )
    calls = json.loads((tmp_path / "endpoint" / "summary.json").read_text())["run"]["endpoint"]["calls"]
    assert calls["failures"] == 0 and calls["requests"] >= 5 + 5 * 4 + 5, calls

    again = rayeval("run", *endpoint, *common, "--run-id", "endpoint")
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads((tmp_path / "endpoint" / "summary.json").read_text())["run"]
    assert resumed["endpoint"]["calls"] is None, (
        resumed
    )  # every answer came from the store: no client started


def assert_same_records(task: str, by_endpoint: Path, by_local: Path) -> None:
    """Per question: the same scores, the same generated text, log-likelihoods within 1e-4 (the server and
    the local engine batch the same prompts differently)."""
    mine = records(by_endpoint / f"{task}.jsonl")
    theirs = records(by_local / f"{task}.jsonl")
    assert len(mine) == len(theirs) == 5, task
    for ours, local in zip(mine, theirs, strict=True):
        assert ours["doc_id"] == local["doc_id"] and ours["error"] is None, (task, ours["error"])
        assert ours["scores"] == local["scores"], task
        if task == "gsm8k_local":
            assert ours["output"] == local["output"], task
        else:
            gaps = [abs(a - b) for a, b in zip(_logprobs(ours), _logprobs(local), strict=True)]
            assert max(gaps) <= 1e-4, (task, ours["output"], local["output"])


def _logprobs(record: dict) -> list[float]:
    return [float(a[0]) if isinstance(a, list) else float(a) for a in json.loads(record["output"])]
