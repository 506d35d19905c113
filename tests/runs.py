"""Running `rayeval` as a user runs it, for the integration tests: the CLI in a subprocess, its records, and
the engine actors it starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MODEL_DIR = "SmolLM2-135M-Instruct"
# A quarter of the default KV cache: the tests' prompts are short, and each CPU engine's cache is allocated whole
# when it starts, so memory (24 GiB in CI) bounds how many engines the suite holds at once (tests/warm_cluster.py).
ENGINE_FLAGS = ["--enforce-eager", "--max-tokens", "48", "--max-model-len", "1024", "--kv-cache-gib", "0.5",
                "--no-progress"]  # fmt: skip
# The base model's greedy IFEval answers that adapter, sweep and endpoint tests compare against (the
# `base_ifeval_records` fixture): one replica, float32, whose CPU kernels are batch-invariant, so a prompt's
# answer does not depend on what it was batched with.
BASE_IFEVAL_ARGS = ["--tasks", "ifeval", "--dtype", "float32", *ENGINE_FLAGS]
BASE_IFEVAL_LIMIT = 6
BASE_IFEVAL_SAMPLES = 4  # greedy: N = 4 asked is one draw, one request per question


def rayeval(
    *args: str,
    timeout: int = 900,
    env: dict[str, str] | None = None,
    local: bool = False,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`rayeval ARGS` in a subprocess. A `run` that names no cluster goes to the test run's shared cluster and
    its warm pools (tests/warm_cluster.py), unless `local` asks for the local cluster the command starts."""
    base = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # as a user's shell: the same
    if args[:1] == ("run",) and not local and _shared_cluster_serves(args):
        from tests.warm_cluster import warm_cluster

        shared = warm_cluster()
        args, base = (*args, *shared.run_args()), shared.env()
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**base, **(env or {})},
        cwd=cwd,
    )


def _shared_cluster_serves(args: tuple[str, ...]) -> bool:
    """A run that names no cluster of its own, and starts something (a dry run starts nothing)."""
    from tests.warm_cluster import enabled

    return (
        enabled()
        and not {"--address", "--dry-run", "--help"} & set(args)
        and not os.environ.get("RAY_ADDRESS")
    )


def without_max_num_seqs(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command that asked for `--max-num-seqs N` (a few sequences at a time, so a fault lands mid-run), as
    resumed on the engine settings of the tests' warm pool: what a run resumes is keyed by its requests, not by
    how many sequences an engine batches, and the pool saves the resume an engine start."""
    at = list(argv).index("--max-num-seqs")
    return [*argv[:at], *argv[at + 2 :]]


def ray_cli() -> str:
    """The `ray` command of this interpreter's environment (a venv need not be on PATH)."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else "ray"


def start_in_background(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, ignore: tuple[int, ...] = ()
) -> subprocess.Popen[str]:
    """`rayeval ARGV` in a session of its own, with Ctrl-C and a hangup as a user's terminal sends them (a test
    suite started in the background, `cmd &` in a script, inherits SIGINT as ignored, and Python then installs
    no KeyboardInterrupt handler; one started under `nohup` inherits SIGHUP ignored), and the signals in
    `ignore` ignored (as under `nohup`)."""

    def signals() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        for signum in ignore:
            signal.signal(signum, signal.SIG_IGN)

    return subprocess.Popen([sys.executable, "-m", "cluster.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=signals, env=env, cwd=cwd)  # fmt: skip


def wait_for_records(proc: subprocess.Popen[str], store: Path, count: int) -> None:
    deadline = time.time() + 600
    while time.time() < deadline and (not store.exists() or len(store.read_text().splitlines()) < count):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)


def engine_actor_pids() -> list[int]:
    """The engine actors of this test process's own Ray clusters (its in-process ones, and the local ones the
    commands it runs start): its descendants, less the test run's shared cluster. Engines another process
    started on the machine (another test run's) are not counted."""
    import psutil

    from tests.ray_head import is_engine_actor
    from tests.warm_cluster import shared_pids

    mine = {child.pid for child in psutil.Process().children(recursive=True)}
    return sorted(pid for pid in mine - shared_pids() if is_engine_actor(pid))


def every_core_binding() -> dict[str, str]:
    """For a vLLM the tests start outside rayeval (lm-eval's reference, `vllm serve`): its CPU worker computes on
    every core this process may use. vLLM's CPU default keeps one core for its front end, which on a 2-core
    machine leaves the worker one core; float32 outputs do not depend on it (every response and log-likelihood
    of the lm-eval module's reference runs equal on one core and on two)."""
    from cluster.engines import BINDING_ENV, cpu_thread_binding

    return {BINDING_ENV: cpu_thread_binding(0, 1, 1, sorted(os.sched_getaffinity(0)))}


# For a vLLM the tests start outside rayeval: its CPU worker inside the engine core's process, as in a rayeval CPU
# engine (and `LLM`'s engine core inside its caller's process). By default vLLM spawns each apart, one more import
# of vLLM and torch apiece; the answers are the same (bench/peer_engine_processes.py).
ENGINE_IN_ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def wait_until_answering(
    url: str, server: subprocess.Popen, timeout_s: float = 600, poll_s: float = 0.5
) -> None:
    """Returns once the server started as `server` answers GET `url`; RuntimeError with its last error output
    if it exits first, or if it stays silent for `timeout_s`."""
    import urllib.request

    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if server.poll() is not None:
            tail = server.stderr.read()[-3000:] if server.stderr else ""
            raise RuntimeError(f"{server.args[:4]} exited with {server.returncode} before answering: {tail}")
        try:
            urllib.request.urlopen(url, timeout=2)  # noqa: S310 - a server the tests started here
            return
        except OSError:
            time.sleep(poll_s)
    raise RuntimeError(f"{server.args[:4]} did not answer {url} within {timeout_s:g} s")


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
