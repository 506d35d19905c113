"""`rayeval watch` on a training run that is still being written: a thread here saves LoRA adapters (made
with peft for the embedded model) into the run's folder one after another, one of them slowly, in pieces.
Every complete checkpoint is evaluated once, the one being written only once it is whole, and a watch
killed after its first step and started again evaluates only the steps it had not finished. Both watches
run on the test run's shared cluster, whose warm LoRA pool serves their engine settings: every step runs on
that pool, and neither watch starts an engine (tests/cluster/sweep/test_lora_sweep.py's sweep, asking more
replicas than the pool has, starts its own)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.run.test_lora import make_adapter
from tests.runs import BASE_IFEVAL_ARGS, rayeval, start_in_background
from tests.warm_cluster import enabled, warm_cluster

pytestmark = pytest.mark.skipif(not enabled(), reason="runs on the test run's shared cluster")

ARGS = [*BASE_IFEVAL_ARGS, "--limit", "2", "--max-tokens", "16", "--settle", "3s", "--poll-interval", "0.5s"]


def save_slowly(source: Path, target: Path, pieces: int = 6, pause_s: float = 0.5) -> None:
    """An adapter saved as a trainer saves one: the config, then the weights written in pieces."""
    target.mkdir(parents=True)
    shutil.copy(source / "adapter_config.json", target / "adapter_config.json")
    data = (source / "adapter_model.safetensors").read_bytes()
    with (target / "adapter_model.safetensors").open("wb") as out:
        for i in range(pieces):
            out.write(data[i * len(data) // pieces : (i + 1) * len(data) // pieces])
            out.flush()
            time.sleep(pause_s)


def test_watch_evaluates_each_checkpoint_once_as_it_completes_and_resumes_after_a_kill(tmp_path: Path):
    made = {step: make_adapter(tmp_path / "made" / f"a{step}", random_init=step != 1) for step in (1, 2, 3)}
    run, out = tmp_path / "training", tmp_path / "evals"
    save_slowly(made[1], run / "step_1", pieces=1, pause_s=0)
    cluster = warm_cluster()
    base = ["watch", str(run), *ARGS, "--output-dir", str(out), "--run-id", "w", *cluster.run_args()]
    first = start_in_background([*base, "--until-idle", "60s"], env=cluster.env())
    deadline = time.time() + 900
    while time.time() < deadline and not (out / "w" / "step_1" / "summary.json").exists():
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # killed after its first step
    first.communicate()

    # the trainer goes on: step 2 written in pieces over 3 s (the watch must not take it halfway), then step 3
    def trainer() -> None:
        save_slowly(made[2], run / "step_2")
        time.sleep(1)
        save_slowly(made[3], run / "step_3", pieces=1, pause_s=0)

    writing = threading.Thread(target=trainer)
    writing.start()
    again = rayeval(*base, "--until-idle", "10s", env=cluster.env())
    writing.join()
    assert again.returncode == 0, again.stderr[-3000:]
    lines = [line for line in again.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2", "3"], again.stdout  # not step 1 again, each once
    assert all(" done " in line and "2 of 2 requests generated" in line for line in lines), lines
    assert "watch ended: 2 step(s) evaluated" in again.stdout
    assert "the LoRA steps run on warm pool tests-lora" in again.stderr
    for step in (1, 2, 3):  # every step's run finished, on the whole adapter
        summary = json.loads((out / "w" / f"step_{step}" / "summary.json").read_text())
        metrics = summary["tasks"]["ifeval"]["metrics"]
        assert metrics and all(m["questions"] == 2 for m in metrics.values())
        assert summary["run"]["engines_source"]["pool"] == "tests-lora"
    curve = (out / "w" / "sweep_summary.csv").read_text().splitlines()
    assert {row.split(",")[1] for row in curve[1:]} == {"1", "2", "3"}  # the curve holds every step so far
    assert (out / "w" / "ifeval.png").stat().st_size > 0
