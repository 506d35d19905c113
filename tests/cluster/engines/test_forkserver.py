"""The engine core's forkserver (cluster.engines.forkserver), with plain Python functions for the engine core:
a forked child runs with its parent's environment as it was when it started, can take a process title, and
ends when its parent dies. The real engine core started this way is checked in test_actor.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from cluster.engines.forkserver import EngineCoreContext, start_engine_core_server


def report(path: str) -> None:
    """The child's view, written where the test reads it: its environment's two variables and its title."""
    comm = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    Path(path).write_text(f"{os.environ.get('RAYEVAL_T_KEPT')},{os.environ.get('RAYEVAL_T_LATER')},{comm}")


def wait_for_sigterm(path: str) -> None:
    """Block until SIGTERM, then write that it came (vLLM's engine core shuts down on SIGTERM likewise)."""

    def stopped(*_: object) -> None:
        Path(path).write_text("sigterm")
        os._exit(0)

    signal.signal(signal.SIGTERM, stopped)
    Path(path).write_text("waiting")
    while True:
        time.sleep(0.1)


def test_a_forked_child_has_the_environment_at_its_start_and_vllms_title(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYEVAL_T_KEPT", "server")
    assert start_engine_core_server(preload=())
    # after the server started: a plain forkserver child would see neither
    monkeypatch.setenv("RAYEVAL_T_KEPT", "changed")
    monkeypatch.setenv("RAYEVAL_T_LATER", "set")
    out = tmp_path / "child.txt"
    child = EngineCoreContext().Process(target=report, args=(str(out),), name="EngineCore")
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert out.read_text() == "changed,set,VLLM::EngineCor"  # comm keeps 15 characters


def test_a_forked_child_is_stopped_when_its_parent_dies(tmp_path):
    """The parent (the engine actor's stand-in) is killed with SIGKILL: the child was forked by the server,
    not by it, so only its own watch ends it."""
    marker = tmp_path / "stopped.txt"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from cluster.engines.forkserver import EngineCoreContext, start_engine_core_server
            from tests.cluster.engines.test_forkserver import wait_for_sigterm
            if __name__ == "__main__":
                start_engine_core_server(preload=())
                child = EngineCoreContext().Process(target=wait_for_sigterm, args=({str(marker)!r},))
                child.start()
                print(child.pid, flush=True)
                time.sleep(600)
            """),
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    child_pid = int(parent.stdout.readline())
    _wait_for_text(marker, "waiting", timeout_s=60)  # its SIGTERM handler is in place
    assert psutil.pid_exists(child_pid) and child_pid not in [
        c.pid for c in psutil.Process(parent.pid).children()
    ]
    parent.kill()
    parent.wait()
    _wait_for_text(marker, "sigterm", timeout_s=20)
    assert marker.read_text() == "sigterm"


def _wait_for_text(path: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (path.exists() and path.read_text() == text):
        time.sleep(0.1)


def test_the_watch_stops_a_child_whose_parent_is_already_gone():
    """A parent that died before the child's watch began: the child is stopped at once."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import signal, sys, time
            from cluster.engines.forkserver import _end_with
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
            _end_with({gone.pid})
            time.sleep(20)
            """),
        ],  # fmt: skip
        cwd=Path(__file__).parents[3],
        timeout=60,
    )
    assert probe.returncode == 7
