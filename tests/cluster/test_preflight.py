"""Settings that would fail minutes into a run fail before Ray or any engine starts, with the numbers.

Each case runs the CLI as a user does; none of them may start a Ray cluster (the checks run first).
"""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from cluster.models.default import default_model_dir
from tests.runs import rayeval


def refused(*argv: str) -> str:
    done = rayeval("run", "--limit", "2", *argv, timeout=120, local=True)  # the checks of a local cluster
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "started a local Ray cluster" not in done.stderr
    return done.stderr


def test_more_local_cpu_replicas_than_cores_is_refused_at_once():
    cores = len(os.sched_getaffinity(0))
    err = refused("--replicas", str(cores + 62), "--output-dir", "/tmp/rayeval-preflight")
    assert f"--replicas {cores + 62} asks for {cores + 62} CPU engine replicas" in err
    assert f"this machine has {cores} usable core(s)" in err and f"Lower --replicas to at most {cores}" in err


def test_a_kv_cache_larger_than_memory_is_refused_with_both_numbers():
    free_gib = psutil.virtual_memory().available / (1 << 30)
    err = refused("--kv-cache-gib", "4000", "--output-dir", "/tmp/rayeval-preflight")
    assert "--kv-cache-gib 4000 for 1 engine replica(s) needs 4000 GiB" in err
    assert f"this machine has {free_gib:.0f}" in err or "GiB free" in err
    assert "Lower --kv-cache-gib" in err


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    file = tmp_path / "results.txt"
    file.write_text("keep me")
    err = refused("--output-dir", str(file))
    assert f"--output-dir {file} is a file" in err and "Pass --output-dir a folder" in err
    assert file.read_text() == "keep me"


def test_an_output_dir_under_a_file_is_refused(tmp_path):
    file = tmp_path / "results.txt"
    file.write_text("keep me")
    err = refused("--output-dir", str(file / "runs"))
    assert f"cannot be made: {file} is a file" in err


def test_an_output_dir_on_a_read_only_filesystem_is_refused(tmp_path):
    disk = tmp_path / "ro"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            "mounting a read-only tmpfs needs root (root ignores permission bits, so this is the test)"
        )
    try:
        err = refused("--output-dir", str(disk / "runs"))
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert f"--output-dir {disk / 'runs'} cannot be made: {disk} is not writable" in err


def test_a_cpu_step_smaller_than_the_context_is_refused():
    err = refused("--max-num-batched-tokens", "128", "--output-dir", "/tmp/rayeval-preflight")
    assert "--max-num-batched-tokens 128 is below --max-model-len 2048" in err
    assert "Raise --max-num-batched-tokens to at least 2048" in err


def test_a_dry_run_warns_that_max_tokens_past_the_context_is_not_the_limit():
    done = rayeval("run", "--limit", "2", "--max-tokens", "4096", "--max-model-len", "1024", "--dry-run",
                   timeout=120, local=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]  # valid: vLLM ends each reply where the context is full
    assert "--max-tokens 4096 is not below --max-model-len 1024" in done.stderr
    assert "Raise --max-model-len or lower --max-tokens" in done.stderr
    quiet = rayeval("run", "--limit", "2", "--max-tokens", "64", "--dry-run", timeout=120, local=True)
    assert quiet.returncode == 0 and "is not below --max-model-len" not in quiet.stderr
    own = rayeval("run", "--tasks", "arena_hard,ifeval", "--limit", "30", "--inference-only", "--dry-run",
                  timeout=120, local=True)  # fmt: skip  # arena_hard's own 2,048 tokens, the default context
    assert own.returncode == 0, own.stderr[-3000:]
    assert "the replies' own max_tokens (arena_hard 2048) is not below --max-model-len 2048" in own.stderr


def test_lm_evals_prompt_flags_on_a_run_without_lm_eval_tasks_are_warned_about():
    done = rayeval("run", "--limit", "2", "--tasks", "ifeval", "--system-instruction", "Be brief.",
                   "--fewshot-as-multiturn", "--dry-run", timeout=120, local=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "lm-eval's prompt and generation flags (--system-instruction, --fewshot-as-multiturn) apply to lm-eval's "
        "tasks only, and this run has none (ifeval" in done.stderr
    )


def test_a_judge_only_run_counts_only_its_judges_engines(tmp_path):
    """--judge-only starts no engine of the model: `--replicas` (which a config may hold) does not count."""
    cores = len(os.sched_getaffinity(0))
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "config.yaml").write_text("tasks: [alpaca_eval]\nrun_id: r1\nlimit: 2\n")
    base = ["run", "--judge-only", "--output-dir", str(tmp_path), "--run-id", "r1", "--judge",
            f"local:{default_model_dir()}", "--replicas", str(cores), "--dry-run"]  # fmt: skip
    done = rayeval(*base, "--judge-replicas", str(cores), timeout=120, local=True)
    assert done.returncode == 0, done.stderr[-3000:]
    over = rayeval(*base, "--judge-replicas", str(cores + 1), timeout=120, local=True)
    assert (
        over.returncode == 2
        and f"--judge-replicas {cores + 1} asks for {cores + 1} CPU engine replicas" in over.stderr
    )
