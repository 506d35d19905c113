"""The plain parts of reaching a cluster from outside: where Ray's token is found, which job server is meant,
and the command after `rayeval submit --` checked before anything is submitted."""

from __future__ import annotations

import pytest

from cluster.cli.submit import _env_vars, job_command
from cluster.jobs.auth import enable_token_auth, token_source
from cluster.jobs.client import DEFAULT_DASHBOARD, JobSpec, dashboard_address
from evaluators.errors import EvalInputError


@pytest.fixture
def no_ray_variables(monkeypatch, tmp_path):
    for name in (
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
        "RAY_ADDRESS",
        "RAY_API_SERVER_ADDRESS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return monkeypatch


def test_token_mode_is_turned_on_only_when_a_token_is_at_hand(no_ray_variables, tmp_path):
    assert token_source() is None
    assert enable_token_auth() is None
    no_ray_variables.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "absent"))
    assert enable_token_auth() is None
    token = tmp_path / "token"
    token.write_text("abc")
    no_ray_variables.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    assert enable_token_auth() == str(token)
    import os

    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_an_explicit_auth_mode_is_left_as_it_is(no_ray_variables, tmp_path):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc")
    assert token_source() == str(tmp_path / ".ray" / "auth_token")
    no_ray_variables.setenv("RAY_AUTH_MODE", "disabled")
    assert enable_token_auth() is None
    no_ray_variables.setenv("RAY_AUTH_TOKEN", "xyz")
    assert token_source() == "$RAY_AUTH_TOKEN"


def test_the_flag_wins_then_the_variables_then_this_machine(no_ray_variables):
    assert dashboard_address(None) == DEFAULT_DASHBOARD
    no_ray_variables.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert dashboard_address(None) == "10.0.0.5:6379"  # Ray resolves a GCS address to its dashboard
    no_ray_variables.setenv("RAY_API_SERVER_ADDRESS", "http://head:8265")
    assert dashboard_address(None) == "http://head:8265"
    assert dashboard_address("http://other:8265") == "http://other:8265"


def test_the_submitted_command_is_a_rayeval_command_checked_here():
    assert job_command(["--", "run", "--tasks", "gsm8k"]) == ["run", "--tasks", "gsm8k"]
    assert job_command(["rayeval", "validate", "x.yaml"]) == ["validate", "x.yaml"]
    with pytest.raises(
        EvalInputError, match="needs the command to run after `--`, one of run, tasks, validate"
    ):
        job_command(["--", "python", "x.py"])
    with pytest.raises(SystemExit) as exited:
        job_command(["run", "--replicas", "two"])
    assert exited.value.code == 2
    spec = JobSpec(["run", "--run-id", "a b"], env={"HF_HOME": "/x"}, working_dir="w")
    assert spec.entrypoint == "rayeval run --run-id 'a b'"
    assert spec.runtime_env() == {"env_vars": {"HF_HOME": "/x"}, "working_dir": "w"}


def test_env_entries_need_a_key_and_an_equals_sign():
    assert _env_vars(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(EvalInputError, match="--env NOVALUE: write it as KEY=VALUE"):
        _env_vars(["NOVALUE"])


def test_a_ray_job_command_joins_the_cluster_in_ray_address(no_ray_variables):
    from cluster.config import build_config

    no_ray_variables.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert build_config({}, {}, "t").cluster.address == "10.0.0.5:6379"
    assert build_config({}, {"cluster.address": "auto"}, "t").cluster.address == "auto"
    no_ray_variables.setenv("RAY_ADDRESS", "http://head:8265")  # exported for `ray job submit`: not a cluster
    assert build_config({}, {}, "t").cluster.address is None
