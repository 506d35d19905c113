"""Ray Jobs and Ray client against a real `ray start --head` cluster with token authentication on (the test
run's shared cluster, whose warm pool serves the jobs' runs): the user's side has the token in a file and no
RAY_AUTH_MODE, as after copying the head's token."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_head import HeadNode
from tests.runs import ENGINE_FLAGS, rayeval
from tests.warm_cluster import warm_cluster

SMALL_RUN = ["--limit", "4", *ENGINE_FLAGS, "--max-tokens", "24"]


@pytest.fixture(scope="module")
def head() -> HeadNode:
    return warm_cluster().head


def test_submit_runs_the_job_on_the_cluster_and_follows_it_to_its_results(head: HeadNode, tmp_path: Path):
    out = tmp_path / "runs"
    done = rayeval(
        "submit", "--address", head.dashboard, "--job-id", "small-run",
        "--", "run", *SMALL_RUN, "--output-dir", str(out), "--run-id", "via-job",
        env=head.client_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "submitted job small-run" in done.stderr
    assert "job small-run SUCCEEDED" in done.stderr
    assert "rayeval results" in done.stdout  # the job's own log, followed to its end
    summary = json.loads((out / "via-job" / "summary.json").read_text())
    assert summary["run"]["requests"] == 4 and summary["run"]["samples_failed"] == 0
    assert summary["tasks"]["ifeval"]["metrics"]["prompt_level_strict_acc,none"]["questions"] == 4

    again = rayeval(
        "submit", "--address", head.dashboard,
        "--", "run", *SMALL_RUN, "--output-dir", str(out), "--run-id", "via-job",
        env=head.client_env(),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 requests, 4 reused from the store, 0 to generate" in again.stdout  # resumed: nothing asked

    listed = rayeval("jobs", "list", "--address", head.dashboard, env=head.client_env())
    assert listed.returncode == 0, listed.stderr
    row = next(line.split("\t") for line in listed.stdout.splitlines() if line.startswith("small-run\t"))
    assert row[1] == "SUCCEEDED" and "rayeval run" in row[4]


def test_jobs_logs_and_stop_on_a_running_job(head: HeadNode, tmp_path: Path):
    env = head.client_env()
    submitted = rayeval(
        "submit", "--address", head.dashboard, "--no-wait", "--job-id", "to-stop",
        "--", "run", "--limit", "200", *ENGINE_FLAGS, "--output-dir", str(tmp_path), "--run-id", "long",
        env=env,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == "to-stop"
    deadline = time.time() + 300
    logs = ""
    while time.time() < deadline and "generating:" not in logs:
        logs = rayeval("jobs", "logs", "to-stop", "--address", head.dashboard, env=env).stdout
        time.sleep(2)
    assert "generating: 200 requests" in logs

    stopped = rayeval("jobs", "stop", "to-stop", "--address", head.dashboard, env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "job to-stop STOPPED"
    status = rayeval("jobs", "status", "to-stop", "--address", head.dashboard, env=env)
    assert status.stdout.startswith("to-stop: STOPPED")
    again = rayeval("jobs", "stop", "to-stop", "--address", head.dashboard, env=env)
    assert "had already ended (STOPPED)" in again.stdout


def test_a_missing_token_or_job_is_named_with_the_fix(head: HeadNode, tmp_path: Path):
    no_token = {**head.client_env(), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "absent"), "HOME": str(tmp_path)}
    refused = rayeval("jobs", "list", "--address", head.dashboard, env=no_token)
    assert refused.returncode == 1
    assert f"The Ray cluster at {head.dashboard} refused the request" in refused.stderr
    assert "~/.ray/auth_token" in refused.stderr and "Traceback" not in refused.stderr

    unknown = rayeval("jobs", "status", "no-such-job", "--address", head.dashboard, env=head.client_env())
    assert unknown.returncode == 1
    assert "has no job 'no-such-job'" in unknown.stderr


NOTEBOOK = """
import json, sys, cluster
cluster.connect(sys.argv[1])
result = cluster.evaluate({{"tasks": ["ifeval"], "limit": 4, "output_dir": sys.argv[2], "run_id": "notebook",
                           "model": {{"enforce_eager": True, "max_model_len": 1024}},
                           "sampling": {{"max_tokens": 24}}}}, progress=False, records=True)
frame = result.records["ifeval"]
print(json.dumps({{"rows": len(frame), "columns": sorted(frame.columns), "run_dir": str(result.run_dir),
                  "table": result.table}}))
"""


def test_a_notebook_on_ray_client_runs_the_coordinator_inside_the_cluster(head: HeadNode, tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-c", NOTEBOOK.format(), head.client_address, str(tmp_path)],
        capture_output=True, text=True, timeout=900,
        env=head.client_env(),  # the token in a file, no RAY_AUTH_MODE: cluster.connect turns it on
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["rows"] == 4 and {"output", "prompt", "error"} <= set(shown["columns"])
    assert shown["run_dir"] == str(tmp_path / "notebook") and "ifeval" in shown["table"]
    assert "coordinated inside the cluster" in done.stderr
