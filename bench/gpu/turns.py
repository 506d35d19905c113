"""What paired configurations share: rayeval's real request runner on a plan's replicas and one timed pass
through it, and the sides of a comparison as `--config` processes that take turns on engines that stay up
(bench/paired.py), each side's stdout in TURNS/<role>.out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from bench.gpu.placement import SidePlace, side_env
from bench.gpu.rows import dispatch_timeline
from bench.gpu.settings import SAFE_ENV, WORK, config_command

if TYPE_CHECKING:
    from collections.abc import Callable

    from bench.paired import Referee
    from cluster.plan import RunPlan
    from cluster.run import RequestRunner

TURNS = WORK / "turns"


def take_turns(sides: dict[str, tuple[str, SidePlace]], play: Callable[[Referee], dict]) -> dict:
    """Start one `--config` process per role (role: (config, its place)), let `play` hand out the turns once
    every engine is up, and stop them. A side whose GPUs hold another side's engines starts once those are up
    (bench.gpu.placement). Each child's stdout goes to TURNS/<role>.out, its stderr to ours."""
    import shutil

    from bench.paired import Referee

    shutil.rmtree(TURNS, ignore_errors=True)
    TURNS.mkdir(parents=True)
    children: dict[str, subprocess.Popen] = {}
    referee = Referee(TURNS, children)
    try:
        for role, (config, place) in sides.items():
            referee.wait_ready([r for r in children if sides[r][1].gpu == place.gpu])
            env = {**os.environ, **SAFE_ENV, **side_env(place), "RAYEVAL_TURN_ROLE": role}
            with (TURNS / f"{role}.out").open("w") as stdout:
                children[role] = (
                    subprocess.Popen(  # own process group: a kill reaches its engine processes too
                        config_command(config), env=env, stdout=stdout, start_new_session=True
                    )
                )
        referee.wait_ready()
        played = play(referee)
        referee.stop()
        for role, child in children.items():
            if child.wait(timeout=120) != 0:
                raise RuntimeError(f"{role} ({sides[role][0]}) exited with status {child.returncode}")
    finally:
        for role, child in children.items():
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
            sys.stderr.write(f"----- {role} ({sides[role][0]})\n{(TURNS / f'{role}.out').read_text()}\n")
    return played


@contextmanager
def rayeval_runner(plan: RunPlan) -> Iterator[RequestRunner]:
    """The plan's rayeval runner in a local Ray session, its engines up before the first pass (so no pass's
    window holds their start), closed on the way out; `runner.stats.engines` stays readable afterwards."""
    from cluster.run import RequestRunner
    from cluster.session import ray_session

    with ray_session(None, plan.replica, plan.config.cluster.replicas, verbose=False):
        runner = RequestRunner(plan, None, progress=False)
        try:
            runner._ensure_replicas()
            yield runner
        finally:
            runner.close()


def rayeval_generate(runner: RequestRunner, name: str, requests: list) -> dict:
    """One pass of `requests` through the runner's current dispatcher: when it began, how long it took,
    tokens and requests out, the dispatcher's timeline, and the failed requests (how many, the first one's
    error)."""
    done_before = runner.stats.generation_s
    dispatch = runner.dispatch
    sequences_before = {n: r.sequences for n, r in dispatch.per_replica.items()} if dispatch else {}
    began_at = time.time()
    results = runner.run(requests, label=name)
    errors = [c.error for c in results.values() if not c.ok]
    return {
        "began_at": began_at,
        "seconds": runner.stats.generation_s - done_before,
        "tokens": sum(c.output_tokens for c in results.values()),
        "requests": len(results),
        "dispatch": dispatch_timeline(runner.dispatch, began_at, sequences_before),
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
    }
