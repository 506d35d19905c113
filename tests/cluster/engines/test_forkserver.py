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


def report_title(path: str) -> None:
    """The child's title as `ps` shows it (its command line) and as the kernel names it (comm)."""
    cmdline = Path(f"/proc/{os.getpid()}/cmdline").read_text().split("\0")[0]
    Path(path).write_text(f"{cmdline},{Path(f'/proc/{os.getpid()}/comm').read_text().strip()}")


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


def test_the_title_holds_when_a_preloaded_import_changes_the_first_environment_variable(tmp_path):
    """setproctitle finds room for a title through the process's first environment variable; OpenCV's import
    (vLLM's engine core imports it) prepends to LD_LIBRARY_PATH, so a server whose environment starts with that
    variable would give its children no title in `ps` unless title_room claims the room first. Both preloads
    run, so the test shows the failure it guards against."""
    env = {
        "LD_LIBRARY_PATH": "/usr/local/lib",
        **{k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"},
    }
    titles = {}
    for preload in (("cluster.engines.title_room", "cv2"), ("cv2",)):
        out = tmp_path / f"{len(preload)}.txt"
        script = f"""
            from cluster.engines.forkserver import EngineCoreContext, start_engine_core_server
            from tests.cluster.engines.test_forkserver import report_title
            if __name__ == "__main__":
                start_engine_core_server(preload={preload!r})
                child = EngineCoreContext().Process(target=report_title, args=({str(out)!r},), name="EngineCore")
                child.start()
                child.join(timeout=60)
            """
        run = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, timeout=120,
                             cwd=Path(__file__).parents[3], capture_output=True, text=True)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        titles[preload[0]] = tuple(out.read_text().split(","))
    # without title_room the command line stays the server's; the kernel's name is set either way (what the
    # GPU pinning reads), by the fallback in cluster.engines.forkserver._take_title
    assert titles == {
        "cluster.engines.title_room": ("VLLM::EngineCore", "VLLM::EngineCor"),
        "cv2": (sys.executable, "VLLM::EngineCor"),
    }


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
