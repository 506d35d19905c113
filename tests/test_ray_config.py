"""The cluster-launcher file, `ray-config.yaml`: Ray's own validation of it (the schema check `ray up` runs on
the prepared config before it contacts the cloud), and what it must keep safe: token authentication on every
node without the token in the file, the dashboard (and its Jobs API) on the head's localhost, Ray started
from a Python environment rayeval supports, and no local environment or run folder copied to the nodes."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from cluster.head_env import CLIENT_SERVER_HEAD_ENV

REPO = Path(__file__).resolve().parents[1]
CONFIG_TEXT = (REPO / "ray-config.yaml").read_text()
RAY_COMMAND = re.compile(r"(?:^|\s)(\S*/)?ray\s+(\w[\w-]*)")


@pytest.fixture(scope="module")
def config() -> dict:
    """The config as `ray up` prepares it (node type defaults, setup commands merged) and validates it."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(yaml.safe_load(CONFIG_TEXT))
    validate_config(prepared)
    return prepared


def start_commands(config: dict) -> list[str]:
    return [*config["head_start_ray_commands"], *config["worker_start_ray_commands"]]


def head_start(config: dict) -> str:
    """The head's `ray start` command (its other start commands stop Ray first)."""
    [command] = [c for c in config["head_start_ray_commands"] if " start " in c]
    return command


def every_command(config: dict) -> list[str]:
    keys = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands")
    return [c for key in keys for c in config.get(key, [])] + start_commands(config)


def environment(config: dict) -> tuple[str, str]:
    """The folder of the environment the setup makes with uv, and the Python version it asks for."""
    for command in config["setup_commands"]:
        words = shlex.split(command.split("||")[-1])
        if "uv" in words[0] and words[1] == "venv":
            return words[-1], words[words.index("--python") + 1]
    raise AssertionError("no `uv venv` in setup_commands")


def test_ray_accepts_the_config_and_it_keeps_its_node_types(config: dict) -> None:
    assert set(config["available_node_types"]) == {"head", "gpu_worker"}
    assert config["head_node_type"] == "head"


def test_every_node_gets_a_python_environment_rayeval_supports(config: dict) -> None:
    folder, version = environment(config)
    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required.startswith(">=")
    assert tuple(map(int, version.split("."))) >= tuple(map(int, required[2:].split(".")))
    installs = [c for c in config["setup_commands"] if "pip install" in c]
    assert any("/home/ubuntu/rayeval[gpu]" in c for c in installs)
    assert all(f"--python {folder}/bin/python" in c for c in installs if "uv pip" in c)
    assert not any(c.startswith(("python3 -m pip install -e", "pip install -e")) for c in installs)


def test_ray_is_started_and_stopped_from_that_environment_with_its_commands_first_on_path(
    config: dict,
) -> None:
    folder, _ = environment(config)
    calls = [(command, RAY_COMMAND.search(command)) for command in every_command(config)]
    calls = [(command, match) for command, match in calls if match]
    assert {match[2] for _, match in calls} == {"start", "stop"}
    assert all(match for match in map(RAY_COMMAND.search, start_commands(config)))
    for command, match in calls:
        assert match[1] == f"{folder}/bin/", command
        if match[2] == "start":
            assert f"PATH={folder.replace('~', '$HOME')}/bin:$PATH" in command, command
    assert sum("ray start --head" in c for c in config["head_start_ray_commands"]) == 1
    assert sum("ray start --address=" in c for c in config["worker_start_ray_commands"]) == 1


def test_token_authentication_is_on_for_every_node_and_the_token_is_not_in_the_file(config: dict) -> None:
    for command in start_commands(config):
        if " start " in command:
            assert "RAY_AUTH_MODE=token" in command, command
    assert not re.search(r"RAY_AUTH_MODE\s*[=:]\s*['\"]?disabled", CONFIG_TEXT, re.IGNORECASE)
    assert "RAY_AUTH_TOKEN=" not in CONFIG_TEXT and "auth_token=" not in CONFIG_TEXT.lower()
    # the token file of the machine running `ray up`, copied to the head (and by the head to every worker)
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"


def test_the_dashboard_listens_on_the_heads_localhost_only(config: dict) -> None:
    assert "--dashboard-host=127.0.0.1" in head_start(config)
    assert "0.0.0.0" not in CONFIG_TEXT  # no command or setting listens on every interface
    assert all("--dashboard-host" not in c for c in config["worker_start_ray_commands"])


def test_the_head_starts_with_what_ray_clients_need(config: dict) -> None:
    command = head_start(config)
    assignments = command[: RAY_COMMAND.search(command).start()].split()  # the words before `ray start`
    for name, value in CLIENT_SERVER_HEAD_ENV.items():
        assert f"{name}={value}" in assignments, command


def test_local_environments_run_folders_and_caches_are_not_copied_to_the_nodes(config: dict) -> None:
    assert config["file_mounts"]["/home/ubuntu/rayeval"] == "."
    excluded = set(config["rsync_exclude"])
    assert {".venv/", "runs/", ".git/", "**/__pycache__", ".pytest_cache/", ".ruff_cache/"} <= excluded
    assert config["rsync_filter"] == [".gitignore"]
    ignored = (REPO / ".gitignore").read_text().split()
    assert ".venv/" in ignored and "runs/" in ignored
