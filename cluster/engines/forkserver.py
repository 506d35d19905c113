"""vLLM's engine core forked from a server that imported it while the actor imported vLLM itself.

Inside a Ray actor vLLM starts its engine core with multiprocessing's `spawn`: a fresh interpreter that imports
vLLM, torch and transformers again after the actor has done the same, one import after the other (each 7 to
10 s on two cores, the largest part of a CPU engine's start). A forkserver started when the actor is created
imports the engine core's modules at the same time as the actor imports vLLM; the engine core is then forked
from it, already imported. The engine core still runs in a clean process: the server is a fresh interpreter
that imported Ray but never connected to it and never touched CUDA or threads, as `spawn`'s child.

What `spawn` gives that a forkserver child lacks, and this module gives back:
- the parent's environment at the moment the process starts (vLLM sets variables for its engine core just
  before starting it; a forkserver child would have the server's environment from when it started);
- vLLM's process title, which setproctitle could find no room for once that environment is swapped in;
- an end when the actor dies: the child is the server's, not the actor's, so Ray's clean-up of an actor's
  children does not reach it; it watches the actor's process and stops itself when that is gone.

The engine core's process groups start their threads with a timer slack that lets them sleep while the engine
idles (cluster.engines.idle_wakeups).

The server lives as long as the actor (vLLM reads its engine core's exit through it): a few hundred MB more
memory per replica (the server's proportional set size was 0.4 GB on the embedded model, before it preloaded
Ray).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from cluster.engines.idle_wakeups import quiet_process_groups

log = logging.getLogger(__name__)

# What the server imports before it forks an engine core (cluster.engines.core_preload: vLLM's engine core
# and what must come before it, with the collector paused)
ENGINE_CORE_PRELOAD = ("cluster.engines.core_preload",)


def start_engine_core_server(preload: tuple[str, ...] = ENGINE_CORE_PRELOAD) -> bool:
    """Start the forkserver and its imports in the background; call it once the actor's environment is set
    (the server keeps the environment it starts with for what its imports read, OpenMP's settings among
    them). False where it cannot start (the engine core is then spawned as vLLM would)."""
    try:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(preload))
        from multiprocessing import forkserver

        forkserver.ensure_running()
        return True
    except (OSError, ValueError) as error:
        log.warning("engine core server not started, vLLM spawns its engine core: %s", error)
        return False


class _EngineCoreProcess(multiprocessing.context.ForkServerProcess):
    """A forkserver process that runs with its parent's environment as it was at `start()`, and ends itself
    when its parent (the engine actor, not the server it was forked from) is gone."""

    def start(self) -> None:
        self._parent_env = dict(os.environ)
        self._parent_pid = os.getpid()
        super().start()

    def run(self) -> None:
        _take_title(f"{self._parent_env.get('VLLM_PROCESS_NAME_PREFIX', 'VLLM')}::{self.name}")
        os.environ.clear()
        os.environ.update(self._parent_env)
        _end_with(self._parent_pid)
        if "torch.distributed" in sys.modules:  # preloaded with vLLM's engine core (a test's child has none)
            quiet_process_groups()
        super().run()


def _take_title(title: str) -> None:
    """The process title vLLM gives its engine core (`VLLM::EngineCore`), set before the environment is
    replaced: setproctitle finds the space for a title in the memory of argv and the environment as the
    process started, and after the swap it may find none (the engine core would keep the server's command
    line, and `ps` or the GPU pinning could not find it by name). vLLM sets the same title again later."""
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(title)
    # the kernel's name (`comm`, 15 characters) is what the GPU pinning reads: set it even where setproctitle
    # found no room for the command line (cluster.engines.title_room)
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as comm:
            comm.write(title[:15])


def _end_with(pid: int) -> None:
    """SIGTERM this process (vLLM's engine core shuts down on it) once process `pid` has exited."""
    threading.Thread(target=_wait_then_stop, args=(pid,), name="rayeval-parent-watch", daemon=True).start()


def _wait_then_stop(pid: int) -> None:
    import select

    try:
        handle = os.pidfd_open(pid)  # Linux: readable once the process has exited
    except (AttributeError, OSError):  # another OS, or the parent already gone: ask every second
        while _alive(pid):
            time.sleep(1.0)
    else:
        select.select([handle], [], [])
    os.kill(os.getpid(), signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone (another user's process may have its number now)
        return False
    return True


class EngineCoreContext(multiprocessing.context.ForkServerContext):
    """multiprocessing's forkserver context whose processes are `_EngineCoreProcess`es."""

    Process = _EngineCoreProcess  # type: ignore[assignment]


@contextlib.contextmanager
def engine_core_forked() -> Iterator[None]:
    """While inside, vLLM starts its engine core from the forkserver (`start_engine_core_server`)."""
    from vllm.v1.engine import utils

    spawning = getattr(utils, "get_mp_context", None)
    if spawning is None:  # a vLLM that starts its engine core another way: it spawns it, as before
        yield
        return

    def forked() -> Any:
        spawning()  # what vLLM sets for its child on the way (RAY_ADDRESS in a Ray actor), which it inherits
        return EngineCoreContext()

    utils.get_mp_context = forked
    try:
        yield
    finally:
        utils.get_mp_context = spawning
