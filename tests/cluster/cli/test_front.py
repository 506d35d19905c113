"""The warm CLI server (cluster.cli.front_server) and its client (cluster.cli.front, the `rayeval` entry): a
command it forks for prints, writes and exits as the same command run in its own process; a client whose
environment or import path differs is refused (by the variables' names) and runs the command itself; Ctrl-C
reaches the command's process, and a killed client interrupts it; `stop_server` ends it. The real-run test uses
the test run's shared cluster, whose `rayeval up` started its server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.cli.front_paths import DISABLE_ENV, SOCKET_DIR_ENV
from cluster.cli.front_server import CodeState
from tests.runs import BASE_IFEVAL_ARGS, BASE_IFEVAL_LIMIT, MODEL_DIR, rayeval, records, start_in_background
from tests.warm_cluster import warm_cluster

SERVED = re.compile(r"command \d+: pid (\d+) runs `rayeval run`")


def state(tmp_path: Path, **changes) -> CodeState:
    module = tmp_path / "site" / "pkg" / "__init__.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.touch()
    stat = module.stat()
    base = CodeState(
        files={str(module): (stat.st_mtime_ns, stat.st_size)},
        packages={"pkg": str(module.parent)},
        env={"HOME": "/root", "PWD": "/a"},
        set_by_imports={},
        path=["/first", str(tmp_path / "site")],
        path_after=["/first", str(tmp_path / "site")],
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_the_code_state_finds_changed_files_and_other_copies_of_its_packages(tmp_path):
    code = state(tmp_path)
    assert code.changed() == []
    (module,) = code.files
    Path(module).write_text("x = 1\n")
    assert code.changed() == [module]
    other = tmp_path / "checkout"
    (other / "pkg").mkdir(parents=True)
    assert code.shadowed_by(str(other)) == []  # a folder without __init__ shadows nothing found later
    (other / "pkg" / "__init__.py").touch()
    assert code.shadowed_by(str(other)) == ["pkg"]
    assert code.shadowed_by(str(tmp_path / "site")) == []  # the server's own copy
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pkg").touch()  # a console script of that name is not a module
    assert code.shadowed_by(str(bin_dir)) == []


def test_a_client_unlike_the_server_is_refused_by_what_differs_never_by_a_value(tmp_path):
    code = state(tmp_path)
    alike = {"executable": sys.executable, "env": {"HOME": "/root", "PWD": "/b"}, "path": code.path}
    assert code.refusal(alike) is None  # PWD is the shell's bookkeeping
    secret = {**alike, "env": {**alike["env"], "OPENAI_API_KEY": "sk-not-a-real-key"}}
    refused = code.refusal(secret)
    assert refused == "the environment differs in OPENAI_API_KEY" and "sk-not" not in refused
    assert "another interpreter" in code.refusal({**alike, "executable": "/usr/bin/python3"})
    assert code.refusal({**alike, "path": ["/first", "/elsewhere"]}) == "another import path (sys.path)"
    checkout = tmp_path / "checkout"
    (checkout / "pkg").mkdir(parents=True)
    (checkout / "pkg" / "__init__.py").touch()
    assert (
        code.refusal({**alike, "path": [str(checkout), *code.path[1:]]})
        == f"{checkout} holds other copies of pkg"
    )
    view = state(tmp_path, set_by_imports={"RAY_CLIENT_MODE": "0"}, path_after=["/ray/thirdparty", "/first"])
    taken = view.command_view({**alike, "path": ["/client-first", *code.path[1:]]})
    assert taken["env"]["RAY_CLIENT_MODE"] == "0" and taken["path"] == ["/ray/thirdparty", "/client-first"]


def served(log: Path) -> list[int]:
    return [int(pid) for pid in SERVED.findall(log.read_text())] if log.exists() else []


def log_of(env: dict[str, str]) -> Path:
    (log,) = Path(env[SOCKET_DIR_ENV]).glob("cli-*.log")
    return log


@pytest.fixture
def server_env(tmp_path) -> dict[str, str]:
    """A server of this checkout in a folder of the test's, with a client environment as a shell keeps it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env[SOCKET_DIR_ENV] = str(tmp_path / "cli")
    started = subprocess.run(
        [sys.executable, "-c", "from cluster.cli.front_control import start_server; print(start_server(600))"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert started.stdout.strip().isdigit(), started.stderr[-2000:]
    yield env
    subprocess.run([sys.executable, "-c", "from cluster.cli.front_control import stop_server; stop_server()"],
                   env=env, timeout=60, check=False)  # fmt: skip


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


def test_commands_through_the_server_print_and_exit_as_in_their_own_process(server_env, tmp_path):
    log = log_of(server_env)
    here = {**server_env, DISABLE_ENV: "0"}
    commands = (
        ("run", "--dry-run", "--tasks", "ifeval", "--limit", "3", "--output-dir", str(tmp_path)),
        ("run", "--dry-run", "--tasks", "no_such_task"),
        ("run", "--no-such-flag"),
    )
    for args in commands:
        before = len(served(log))
        through, alone = cli(*args, env=server_env), cli(*args, env=here)
        assert len(served(log)) == before + 1, log.read_text()[-2000:]
        assert (through.returncode, through.stdout, through.stderr) == (
            alone.returncode,
            alone.stdout,
            alone.stderr,
        )
    assert [cli(*c, env=server_env).returncode for c in commands] == [0, 2, 2]
    # another environment: refused by the variable's name, and the command runs in its own process
    before = len(served(log))
    other = cli(*commands[0], "--verbose", env={**server_env, "SOME_TOKEN": "value-123"})
    assert other.returncode == 0 and "the environment differs in SOME_TOKEN" in other.stderr
    assert (
        len(served(log)) == before and "SOME_TOKEN" in log.read_text() and "value-123" not in log.read_text()
    )
    # stopped: its socket goes, and commands run in their own processes
    stop = "from cluster.cli.front_paths import socket_path; from cluster.cli.front_control import stop_server; print(stop_server(), socket_path())"
    pid, socket_file = cli_python(stop, server_env).split()
    deadline = time.time() + 30
    while time.time() < deadline and Path(socket_file).exists():
        time.sleep(0.1)
    assert pid.isdigit() and not Path(socket_file).exists()
    assert cli(*commands[0], env=server_env).returncode == 0 and len(served(log)) == before


def cli_python(code: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=True).stdout  # fmt: skip


@pytest.mark.slow
def test_a_warm_run_through_the_server_answers_as_one_run_here_and_is_interrupted_by_its_client(
    tmp_path, base_ifeval_records
):
    shared = warm_cluster()
    env, log = shared.env(), log_of(shared.env())
    common = [*BASE_IFEVAL_ARGS, "--output-dir", str(tmp_path)]
    first = len(served(log))
    through = rayeval("run", *common, "--limit", str(BASE_IFEVAL_LIMIT), "--run-id", "through")
    alone = rayeval(
        "run", *common, "--limit", str(BASE_IFEVAL_LIMIT), "--run-id", "alone", env={DISABLE_ENV: "0"}
    )
    assert through.returncode == 0 and alone.returncode == 0, through.stderr[-3000:] + alone.stderr[-3000:]
    assert len(served(log)) == first + 1, log.read_text()[-2000:]  # the first only
    for run_id in ("through", "alone"):
        rows = records(tmp_path / run_id / "samples" / MODEL_DIR / "ifeval.jsonl")
        assert [r["output"] for r in rows] == [r["output"] for r in base_ifeval_records]  # float32 greedy
    # Ctrl-C reaches the command's process: it stops as a run here does, and the same command resumes it
    cut = ["run", *common, "--limit", "40", "--run-id", "cut"]
    proc = start_in_background([*cut, *shared.run_args()], env=env)
    pid = _command_pid(log, first + 2)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "rayeval: interrupted" in err, err[-3000:]
    assert _gone(pid, 30)
    resumed = rayeval(*cut)
    assert resumed.returncode == 0 and "40 requests," in resumed.stderr, resumed.stderr[-3000:]
    rows = records(tmp_path / "cut" / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert sorted(r["doc_id"] for r in rows) == list(range(40))
    # a client killed outright: its command's process is interrupted as by Ctrl-C, and ends
    count = len(served(log))
    proc = start_in_background(
        ["run", *common, "--limit", "40", "--run-id", "killed", *shared.run_args()], env=env
    )
    pid = _command_pid(log, count + 1)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(pid, 60), f"the command's process {pid} outlived its client"


def _command_pid(log: Path, count: int, timeout_s: float = 60) -> int:
    """The process the server forked for its `count`-th command, once it has."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        pids = served(log)
        if len(pids) >= count:
            return pids[count - 1]
        time.sleep(0.05)
    raise AssertionError(f"the server took no command {count}: {log.read_text()[-2000:]}")


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
