"""`--log-to`: a real run's numbers and files logged to a real MLflow tracking server (`mlflow server` on
loopback, SQLite store) and to W&B in offline mode, read back through each tracker's own client and checked
against the run's summary.json. The run is the shared base IFEval run's command again on a copy of its folder
(everything reused from its store: the logging at the run's end is the subject)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.mlflow_server import mlflow_server as tracking_server
from tests.ports import free_port
from tests.runs import BASE_IFEVAL_ARGS, BASE_IFEVAL_LIMIT, BASE_IFEVAL_SAMPLES, rayeval


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    with tracking_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def _rerun(base_ifeval_run: Path, tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> Path:
    out = tmp_path / "runs"
    shutil.copytree(base_ifeval_run, out / "base")
    done = rayeval("run", *BASE_IFEVAL_ARGS, "--limit", str(BASE_IFEVAL_LIMIT), "--num-samples",
                   str(BASE_IFEVAL_SAMPLES), "--output-dir", str(out), "--run-id", "base", *flags, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 to generate" in done.stderr
    return out / "base"


def test_a_run_logs_its_numbers_and_files_to_an_mlflow_server(base_ifeval_run, tmp_path, mlflow_server):
    import mlflow

    run_dir = _rerun(base_ifeval_run, tmp_path, "--log-to", f"mlflow:{mlflow_server}")
    summary = json.loads((run_dir / "summary.json").read_text())["tasks"]["ifeval"]["metrics"]
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("rayeval")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`rayeval.name` = 'base'")
    assert len(runs) == 1
    logged = runs[0].data
    for key, metric in summary.items():
        name = f"ifeval/{key.partition(',')[0]}"
        assert logged.metrics[name] == pytest.approx(metric["mean"], abs=1e-12)
        assert logged.metrics[f"{name}_sem"] == pytest.approx(metric["sem"], abs=1e-12)
    assert logged.params["num_samples"] == str(BASE_IFEVAL_SAMPLES)
    artifacts = {a.path for a in client.list_artifacts(runs[0].info.run_id, "summary")}
    assert artifacts == {"summary/summary.json", "summary/results.json"}
    samples = [a.path for a in client.list_artifacts(runs[0].info.run_id, "samples")]
    assert samples == ["samples/ifeval.parquet"]


def test_a_run_logs_to_wandb_offline(base_ifeval_run, tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-dir"), "WANDB_SILENT": "true"}
    (tmp_path / "wandb-dir").mkdir()
    run_dir = _rerun(base_ifeval_run, tmp_path, "--log-to", "wandb:rayeval-tests", env=env)
    summary = json.loads((run_dir / "summary.json").read_text())["tasks"]["ifeval"]["metrics"]
    offline = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    logged = _history_items(next(offline[0].glob("run-*.wandb")).read_bytes())
    for key, metric in summary.items():
        assert logged[f"ifeval/{key.partition(',')[0]}"] == pytest.approx(metric["mean"], abs=1e-12)
    assert json.loads((offline[0] / "files" / "summary.json").read_text()) == json.loads(
        (run_dir / "summary.json").read_text()
    )
    assert (offline[0] / "files" / "ifeval.parquet").is_file()


def _history_items(log: bytes) -> dict[str, float]:
    """The metrics W&B's offline run file holds: its records are protobuf, each logged value a HistoryItem
    (field 2 the key, field 16 the value as JSON text). wandb 0.31 ships no Python reader of the file (its
    core reads it), so the items are found by their wire format."""
    import re

    items = {}
    for found in re.finditer(rb"\x12(.)(ifeval/[A-Za-z_]+)\x82\x01(.)", log, flags=re.S):
        size, key, value_size = found.group(1)[0], found.group(2), found.group(3)[0]
        if size == len(key):
            items[key.decode()] = json.loads(log[found.end() : found.end() + value_size])
    return items


def test_an_unknown_tracker_is_refused_before_anything_runs(tmp_path):
    done = rayeval("run", "--log-to", "tensorboard", "--output-dir", str(tmp_path), "--dry-run")
    assert (
        done.returncode == 2
        and "names no tracker: log to mlflow[:TRACKING_URI] or wandb[:PROJECT]" in done.stderr
    )


def test_an_unreachable_tracking_server_is_refused_before_anything_runs(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = rayeval("run", "--log-to", f"mlflow:{uri}", "--output-dir", str(tmp_path / "runs"), "--dry-run")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"the tracking server at {uri} does not answer" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_two_filters_of_one_metric_are_logged_apart(tmp_path):
    # GSM8K's exact_match under its strict and flexible filters: one name each (plain; no tracker)
    from cluster.exporters import RunRecord

    metrics = {"exact_match,strict-match": 0.2, "exact_match,flexible-extract": 0.45, "acc,none": 0.5,
               "exact_match,maj@8": 0.3}  # fmt: skip
    body = {
        key: {"mean": mean, "sem": 0.01, "ci95": [mean - 0.02, mean + 0.02]} for key, mean in metrics.items()
    }
    (tmp_path / "summary.json").write_text(json.dumps({"tasks": {"gsm8k": {"metrics": body}}}))
    logged = RunRecord.of_folder(tmp_path, "run").metrics
    assert logged["gsm8k/exact_match/strict-match"] == 0.2
    assert logged["gsm8k/exact_match/flexible-extract"] == 0.45
    assert logged["gsm8k/acc"] == 0.5 and logged["gsm8k/acc_sem"] == 0.01 and len(logged) == 16
    assert logged["gsm8k/exact_match/maj_8"] == 0.3  # MLflow refuses "@" in a metric's name
