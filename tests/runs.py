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
ENGINE_FLAGS = ["--enforce-eager", "--max-tokens", "48", "--max-model-len", "1024", "--no-progress"]
# The base model's greedy IFEval answers that adapter, sweep and endpoint tests compare against (the
# `base_ifeval_records` fixture): one replica, float32, whose CPU kernels are batch-invariant, so a prompt's
# answer does not depend on what it was batched with.
BASE_IFEVAL_ARGS = ["--tasks", "ifeval", "--dtype", "float32", *ENGINE_FLAGS]
BASE_IFEVAL_LIMIT = 6
BASE_IFEVAL_SAMPLES = 4  # greedy: N = 4 asked is one draw, one request per question


def rayeval(
    *args: str, timeout: int = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def ray_cli() -> str:
    """The `ray` command of this interpreter's environment (a venv need not be on PATH)."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else "ray"


def _default_sigint() -> None:
    # A test suite started in the background (`cmd &` in a script) inherits SIGINT as ignored, and Python
    # then installs no KeyboardInterrupt handler; the child must see Ctrl-C as a user's terminal sends it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_in_background(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cluster.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)  # fmt: skip


def wait_for_records(proc: subprocess.Popen[str], store: Path, count: int) -> None:
    deadline = time.time() + 600
    while time.time() < deadline and (not store.exists() or len(store.read_text().splitlines()) < count):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)


def engine_actor_pids() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "ray::EngineActor"], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
