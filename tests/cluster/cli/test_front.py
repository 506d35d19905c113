"""The warm CLI server (cluster.cli.front_server) and its client (cluster.cli.front, the `rayeval` entry): a
command it forks for prints, writes and exits as the same command run in its own process; a client whose
environment, import path or process differs is refused (by the variables' names) and runs the command itself;
a request too big for one send arrives whole, and no descriptor of a refused client stays in the server;
Ctrl-C reaches the command's process, an ignored SIGHUP stays ignored, a killed client interrupts the command,
and a command killed outright ends its client the same way; `stop_server` ends the server. The real-run test
uses the test run's shared cluster, whose `rayeval up` started its server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.cli.front_paths import SOCKET_DIR_ENV, WARM_CLI_ENV, command_request
from cluster.cli.front_state import CodeState
from tests.runs import (
    BASE_IFEVAL_ARGS,
    BASE_IFEVAL_LIMIT,
    MODEL_DIR,
    rayeval,
    records,
    start_in_background,
    wait_for_records,
)
from tests.warm_cluster import warm_cluster

SERVED = re.compile(r"command \d+: pid (\d+) runs `rayeval run` in (.*)")


def state(tmp_path: Path) -> CodeState:
    module = tmp_path / "site" / "pkg" / "__init__.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.touch()
    info = module.stat()
    here = command_request([])
    return CodeState(
        files={str(module): (info.st_mtime_ns, info.st_size)},
        packages={"pkg": str(module.parent)},
        env={"HOME": "/root", "PWD": "/a"},
        set_by_imports={"RAY_CLIENT_MODE": "0"},
        path=["/first", str(tmp_path / "site")],
        path_after=["/ray/thirdparty", "/first", str(tmp_path / "site")],
        traits=json.loads(json.dumps(here["process"])),
    )


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
    here = json.loads(json.dumps(command_request([])))  # as the server reads it
    alike = {**here, "env": {"HOME": "/root", "PWD": "/b", "SSH_TTY": "/dev/pts/3"}, "path": code.path}
    assert code.refusal(alike) is None  # PWD and SSH_TTY are the shell's and terminal's bookkeeping
    # a client that imported Ray already has what the server's imports set
    assert code.refusal({**alike, "env": {**alike["env"], "RAY_CLIENT_MODE": "0"}}) is None
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
    # `python -c` puts "" first: the client's working directory, not the server's
    assert code.refusal({**alike, "cwd": str(checkout), "path": ["", *code.path[1:]]}).endswith(
        "copies of pkg"
    )
    unlike = {**alike["process"], "flags": "sys.flags(optimize=2)", "nice": 19}
    assert code.refusal({**alike, "process": unlike}) == "the process differs in its flags, nice"
    assert "working directory" in code.refusal({**alike, "cwd": str(tmp_path / "gone")})
    view = code.command_view({**alike, "path": ["/client-first", *code.path[1:]]})
    assert view["env"]["RAY_CLIENT_MODE"] == "0"
    assert view["path"] == ["/ray/thirdparty", "/client-first", str(tmp_path / "site")]


def served(log: Path, cwd: Path | None = None) -> list[int]:
    """The processes the server forked for `rayeval run` commands, in order; those run in `cwd` where given
    (a server that other tests' commands reach too: the shared cluster's, beside another xdist worker)."""
    found = SERVED.findall(log.read_text()) if log.exists() else []
    return [int(pid) for pid, where in found if cwd is None or where == str(cwd)]


def log_of(env: dict[str, str]) -> Path:
    (log,) = Path(env[SOCKET_DIR_ENV]).glob("cli-*.log")
    return log


def python(code: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout  # fmt: skip


@pytest.fixture
def server_env(tmp_path) -> Iterator[dict[str, str]]:
    """A server of this checkout in a folder of the test's, with a client environment as a shell keeps it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env[SOCKET_DIR_ENV] = str(tmp_path / "cli")
    started = python("from cluster.cli.front_control import start_server; print(start_server(600))", env)
    assert started.strip().isdigit(), started
    yield env
    python("from cluster.cli.front_control import stop_server; stop_server()", env)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


def test_commands_through_the_server_print_and_exit_as_in_their_own_process(server_env, tmp_path):
    log = log_of(server_env)
    here = {**server_env, WARM_CLI_ENV: "0"}
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
    # the default task's scorer was loaded before the first command, and its loading thread has ended: the
    # server forked for every command above (one with a thread left would refuse them all)
    assert re.search(r"loaded the ifeval scorer in [0-9.]+ s\n[^\n]* serving on", log.read_text())
    assert "starting again" not in log.read_text()
    # another environment, in a request too big for one send: refused by the variable's name, and the
    # command runs in its own process; the server keeps none of the client's descriptors
    server_pid = int(python("from cluster.cli.front_control import _answers, socket_path; "
                            "print(_answers(socket_path())['pid'])", server_env))  # fmt: skip
    descriptors = len(os.listdir(f"/proc/{server_pid}/fd"))
    before = len(served(log))
    big = {f"SOME_TOKEN_{i}": "v" * 100_000 for i in range(3)}  # one variable may hold 128 KiB
    other = cli(*commands[0], "--verbose", env={**server_env, **big})
    assert other.returncode == 0
    assert "the environment differs in SOME_TOKEN_0, SOME_TOKEN_1, SOME_TOKEN_2" in other.stderr
    assert len(served(log)) == before and "SOME_TOKEN" in log.read_text() and "vvv" not in log.read_text()
    assert len(os.listdir(f"/proc/{server_pid}/fd")) == descriptors
    # stopped: its socket goes at once, and commands run in their own processes
    stop = (
        "from cluster.cli.front_paths import socket_path; from cluster.cli.front_control import stop_server; "
    )
    pid, socket_file = python(stop + "print(stop_server(), socket_path())", server_env).split()
    assert int(pid) == server_pid and not Path(socket_file).exists()
    assert cli(*commands[0], env=server_env).returncode == 0 and len(served(log)) == before


def test_a_scorer_load_that_fails_is_reported_and_leaves_the_environment_as_it_was(tmp_path):
    # the same stand-in as below; here the load itself, in a process of its own
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "langdetect.py").write_text("raise ImportError('a stand-in langdetect that fails to import')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake), env.get("PYTHONPATH")]))
    env["OPENBLAS_NUM_THREADS"] = "3"  # a user's own, which the load sets to 1 for itself and restores
    code = (
        "import os\n"
        "from cluster.cli.front_server import ScorerLoad, ScorersNotLoaded\n"
        "from cluster.cli.front_state import CodeState\n"
        "before = dict(os.environ)\n"
        "load = ScorerLoad()\n"
        "try:\n"
        "    CodeState.after_imports((), then=load)\n"
        "except ScorersNotLoaded as exc:\n"
        "    print('not loaded:', exc)\n"
        "print('environment as before:', dict(os.environ) == before, load.facts)\n"
        "try:\n"  # the load by itself (again: its failure is kept) restores the user's own BLAS threads
        "    load()\n"
        "except ScorersNotLoaded:\n"
        "    print('OPENBLAS_NUM_THREADS after the load:', os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    out = python(code, env)
    assert re.search(r"not loaded: the ifeval scorer did not load here \(\w+: .*stand-in langdetect", out), (
        out
    )
    assert "environment as before: True None" in out
    assert "OPENBLAS_NUM_THREADS after the load: 3" in out
    # nltk's data on a relative path would be found from each run's own directory: not loaded, said why
    out = python(code, {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "NLTK_DATA": "nltk_data"})
    assert "not loaded: NLTK_DATA names a relative folder" in out and "as before: True None" in out, out


def test_a_server_whose_scorer_fails_to_load_starts_again_without_it_and_takes_commands(tmp_path):
    # A stand-in langdetect that fails to import, first on the path: the checkers' import cannot be made to
    # fail otherwise here (the real one is installed). A forked run would inherit the failed load.
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "langdetect.py").write_text("raise ImportError('a stand-in langdetect that fails to import')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env[SOCKET_DIR_ENV] = str(tmp_path / "cli")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake), env.get("PYTHONPATH")]))
    started = python("from cluster.cli.front_control import start_server; print(start_server(600))", env)
    try:
        assert started.strip().isdigit(), started
        log = log_of(env)
        text = log.read_text()
        assert (
            "the ifeval scorer did not load here (" in text and "starting again without the scorers" in text
        )
        assert "loaded the ifeval scorer" not in log.read_text()
        args = ("run", "--dry-run", "--tasks", "ifeval", "--limit", "3", "--output-dir", str(tmp_path))
        through, alone = cli(*args, env=env), cli(*args, env={**env, WARM_CLI_ENV: "0"})
        assert len(served(log)) == 1, log.read_text()[-2000:]  # the server started again takes it
        assert (through.returncode, through.stdout, through.stderr) == (
            alone.returncode,
            alone.stdout,
            alone.stderr,
        )
    finally:
        python("from cluster.cli.front_control import stop_server; stop_server()", env)


@pytest.mark.slow
def test_a_warm_run_through_the_server_answers_as_one_run_here_and_ends_as_its_client_is_told(
    tmp_path, base_ifeval_records
):
    shared = warm_cluster()
    log = log_of(shared.env())
    (tmp_path / "work").mkdir()
    common = [*BASE_IFEVAL_ARGS, "--output-dir", "out"]  # relative: the client's working directory's
    first = len(served(log, tmp_path / "work"))
    through = rayeval(
        "run", *common, "--limit", str(BASE_IFEVAL_LIMIT), "--run-id", "through", cwd=tmp_path / "work"
    )
    alone = rayeval("run", *common, "--limit", str(BASE_IFEVAL_LIMIT), "--run-id", "alone",
                    env={WARM_CLI_ENV: "0"}, cwd=tmp_path / "work")  # fmt: skip
    assert through.returncode == 0 and alone.returncode == 0, through.stderr[-3000:] + alone.stderr[-3000:]
    assert len(served(log, tmp_path / "work")) == first + 1, log.read_text()[-2000:]  # the first only
    for run_id in ("through", "alone"):
        rows = records(tmp_path / "work" / "out" / run_id / "samples" / MODEL_DIR / "ifeval.jsonl")
        assert [r["output"] for r in rows] == [r["output"] for r in base_ifeval_records]  # float32 greedy
    _interrupts(shared, tmp_path, log)


def _interrupts(shared, tmp_path: Path, log: Path) -> None:  # noqa: ANN001 - tests.warm_cluster.WarmCluster
    """Ctrl-C and a killed client interrupt the command; an ignored SIGHUP does not; a command killed outright
    ends its client by the same signal."""
    env, common = shared.env(), [*BASE_IFEVAL_ARGS, "--output-dir", str(tmp_path), "--limit", "40"]

    def start(run_id: str, ignore: tuple[int, ...] = (), *more: str) -> tuple[subprocess.Popen[str], int]:
        count = len(served(log, tmp_path))
        argv = ["run", *common, "--run-id", run_id, *more, *shared.run_args()]
        proc = start_in_background(argv, env=env, ignore=ignore, cwd=tmp_path)
        return proc, _command_pid(log, tmp_path, count + 1)

    # four requests in flight (a setting of the run: the pool serves it), so at its first result most of the
    # run is still to come on any CPU, and the interrupt lands mid-run
    proc, pid = start("cut", (), "--max-in-flight", "4")
    wait_for_records(proc, tmp_path / "cut" / "cache" / "completions.jsonl", 1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "rayeval: interrupted" in err, err[-3000:]
    assert _gone(pid, 30)
    resumed = rayeval(
        "run", *BASE_IFEVAL_ARGS, "--output-dir", str(tmp_path), "--limit", "40", "--run-id", "cut"
    )
    assert resumed.returncode == 0 and "40 requests," in resumed.stderr, resumed.stderr[-3000:]
    assert sorted(
        r["doc_id"] for r in records(tmp_path / "cut" / "samples" / MODEL_DIR / "ifeval.jsonl")
    ) == list(range(40))
    proc, pid = start("killed-client")
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(pid, 60), f"the command's process {pid} outlived its client"
    assert not (tmp_path / "killed-client" / "summary.json").exists()  # interrupted, not finished
    proc, pid = start("killed-command")
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL  # the client ends as its command did
    proc, pid = start("nohup", ignore=(signal.SIGHUP,))
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]  # as under `nohup`: the ignored SIGHUP stays ignored


def _command_pid(log: Path, cwd: Path, count: int, timeout_s: float = 60) -> int:
    """The process the server forked for its `count`-th command run in `cwd`, once it has."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        pids = served(log, cwd)
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
