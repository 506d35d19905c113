"""How to lay one node's GPUs out for a model that fits one GPU: N replicas against 1, and R replicas of tensor
parallel T against another R x T, in paired turns of workload A (or B for `ifeval-N-vs-1`).

    rayeval-N-vs-1      one pool of N one-GPU replicas; each pair, one pass on one replica (which one rotates)
                        and one on all N through one dispatcher (rayeval-2-vs-1, rayeval-4-vs-1)
    ifeval-N-vs-1       the same on workload B's requests (IFEval x 8 samples); its ratio is in requests/s
    layout-RxT-vs-RxT   two sides, each its own process and local Ray cluster laying R replicas of tensor parallel
                        T over every visible GPU (layout-2x2-vs-1x4, layout-2x2-vs-4x1 on four GPUs); each side
                        holds half of each GPU's memory share and starts after the other's engines are up
                        (bench.gpu.placement.share_every_gpu); turns in ABBA pairs on the same prompts per pair
    rayeval-turns-RxT   a layout side's process (what `layout-` starts); rayeval-1-turns is 1x1

A layout needs at most the visible GPUs (R x T of them); `RAYEVAL_BENCH_SMOKE=1` runs any of them on CPU, where
tensor parallel workers share the cores. Where a layout takes fewer GPUs than are visible, Ray places it; rows
record the visible GPUs and each side's memory share.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.gpu.placement import share_every_gpu, visible_gpus
from bench.gpu.rows import paired_row
from bench.gpu.settings import A_DTYPE, A_REPEATS, DEADLINE, SMOKE
from bench.gpu.turns import TURNS, rayeval_generate, rayeval_runner, take_turns
from bench.gpu.workloads import ifeval_config, rayeval_a_plan, rayeval_a_requests

if TYPE_CHECKING:
    from collections.abc import Callable

    from bench.paired import Referee
    from cluster.plan import RunPlan

SCALING = re.compile(r"(rayeval|ifeval)-(\d+)-vs-1")
LAYOUTS = re.compile(r"layout-(\d+x\d+)-vs-(\d+x\d+)")
LAYOUT_SIDE = re.compile(r"rayeval-turns-(\d+x\d+)")


@dataclass(frozen=True)
class Layout:
    """R replicas of tensor parallel T: R x T GPUs."""

    replicas: int
    tensor_parallel: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        """`2x2` -> 2 replicas of tensor parallel 2."""
        replicas, _, tp = text.partition("x")
        if not (replicas.isdigit() and tp.isdigit() and int(replicas) > 0 and int(tp) > 0):
            raise ValueError(f"layout {text!r}: write REPLICASxTENSOR_PARALLEL, e.g. 2x2 or 4x1")
        return cls(int(replicas), int(tp))

    @property
    def gpus(self) -> int:
        return self.replicas * self.tensor_parallel

    def __str__(self) -> str:
        return f"{self.replicas}x{self.tensor_parallel}"


def is_layout_config(name: str) -> bool:
    return any(p.fullmatch(name) for p in (SCALING, LAYOUTS, LAYOUT_SIDE)) or name == "rayeval-1-turns"


def run_layout_config(name: str) -> dict:
    """The row of the layout configuration `name` (see the module's docstring for the names)."""
    if scaling := SCALING.fullmatch(name):
        kind, replicas = scaling.group(1), int(scaling.group(2))
        return (run_rayeval_scaling if kind == "rayeval" else run_ifeval_scaling)(replicas)
    if layouts := LAYOUTS.fullmatch(name):
        return run_layouts_paired(name, Layout.parse(layouts.group(1)), Layout.parse(layouts.group(2)))
    side = LAYOUT_SIDE.fullmatch(name)
    return serve_layout_turns(Layout.parse(side.group(1)) if side else Layout(1, 1), name)


def gpus_for(name: str, needed: int) -> list[str]:
    """The visible GPUs, refused where `name` needs more (a smoke run on CPU needs none)."""
    gpus = visible_gpus()
    if len(gpus) < needed and not SMOKE:
        raise RuntimeError(f"{name} needs {needed} GPUs and this machine shows {len(gpus)}: {gpus}")
    return gpus


def sides_apart(a: str, b: str) -> tuple[str, str]:
    """A paired configuration's two side names; where both would be the same (an A/A pair, which measures the
    noise floor), the second is `<name>-again`, so each side keeps its own turns."""
    return a, b if b != a else f"{b}-again"


def scaling_sides(kind: str, count: int) -> tuple[str, str]:
    """The two sides' names: one replica, then N (`<kind>-1-again` where N is 1)."""
    return sides_apart(f"{kind}-1", f"{kind}-{count}")


def scaling_paired(name: str, plan: RunPlan, requests: Callable[[int], list]) -> dict:
    """One rayeval pool of N replicas, in ABBA pairs of turns: one replica alone (which one rotates), then all
    N through one dispatcher, each turn on `requests(seed)` with a fresh seed."""
    from bench.paired import pairs_before
    from sharding.dispatcher import Dispatcher

    count = plan.config.cluster.replicas
    sides = scaling_sides(name.split("-")[0], count)
    turns: dict[str, list[dict]] = {side: [] for side in sides}
    with rayeval_runner(plan) as runner:
        every = runner._ensure_replicas()
        alone = [Dispatcher([replica]) for replica in every.replicas]
        for k, order in pairs_before(DEADLINE, A_REPEATS):
            for side in order:
                runner._dispatcher = alone[k % count] if side == "a" else every
                seed = 2 * k + (side == "b")
                turns[sides[side == "b"]].append(rayeval_generate(runner, name, requests(seed)))
    return paired_row(
        name, turns,
        engine_start_s=round(max(e.start_s for e in runner.stats.engines), 1),
        dtype=runner.stats.engines[0].dtype,
        gpus_visible=len(visible_gpus()),
        alone_on=[f"replica-{k % count}" for k in range(len(turns[sides[0]]))],
        engine_core_cpus=[list(e.engine_core_cpus) for e in runner.stats.engines],
        dispatch_per_turn={side: [t["dispatch"] for t in side_turns] for side, side_turns in turns.items()},
    )  # fmt: skip


def run_rayeval_scaling(replicas: int) -> dict:
    name = f"rayeval-{replicas}-vs-1"
    gpus_for(name, replicas)
    plan = rayeval_a_plan(replicas, 1)
    return scaling_paired(name, plan, lambda seed: rayeval_a_requests(plan.model.path, seed))


def run_ifeval_scaling(replicas: int) -> dict:
    """Workload B's generation (every IFEval request, as `evaluate` builds them, a fresh sampling seed each
    turn) on one replica against N; the ratio is in requests/s. Scoring and prompt rendering are outside the
    turns (they do not change with the replica count)."""
    from cluster.models import PromptRenderer
    from cluster.plan import build_plan
    from cluster.run import build_requests

    name = f"ifeval-{replicas}-vs-1"
    gpus_for(name, replicas)
    plan = build_plan(ifeval_config(replicas, name))
    renderer = PromptRenderer(plan.model, plan.config.model.chat_template, plan.config.model.revision)

    def requests(seed: int) -> list:
        return [p.request for p in build_requests(plan, renderer, sampling_seed=1000 * seed)]

    return scaling_paired(name, plan, requests)


def serve_layout_turns(layout: Layout, name: str) -> dict:
    """Child: rayeval's runner on `layout` (real dispatcher and engine actors); each turn generates `seed`'s
    prompts of workload A."""
    from bench.paired import serve_turns

    with rayeval_runner(rayeval_a_plan(layout.replicas, layout.tensor_parallel)) as runner:
        engines = runner.stats.engines

        def turn(order: dict) -> dict:
            return {
                **rayeval_generate(runner, name, rayeval_a_requests(runner.model_path, order["seed"])),
                "engine_start_s": max(e.start_s for e in engines),
                "engine_core_cpus": [list(e.engine_core_cpus) for e in engines],
            }

        served = serve_turns(TURNS, os.environ["RAYEVAL_TURN_ROLE"], turn)
    return {"config": name, "turns": served}


def run_layouts_paired(name: str, a: Layout, b: Layout) -> dict:
    """Layouts `a` and `b` over the same GPUs, one process each, in ABBA pairs of turns on the same prompts."""
    from bench.paired import pairs_before

    roles = list(sides_apart(str(a), str(b)))

    def play(referee: Referee) -> dict:
        turns: dict[str, list[dict]] = {role: [] for role in roles}
        for k, order in pairs_before(DEADLINE, A_REPEATS):
            for role in (roles[side == "b"] for side in order):
                turns[role].append(referee.turn({role: {"seed": k}})[role])
        return turns

    gpus = gpus_for(name, max(a.gpus, b.gpus))
    places = share_every_gpu(roles, gpus)
    sides = {
        role: (f"rayeval-turns-{layout}", places[role]) for role, layout in zip(roles, (a, b), strict=True)
    }
    turns = take_turns(sides, play)
    return paired_row(
        name, turns,
        dtype=A_DTYPE,
        gpus_visible=len(gpus),
        gpus=places[roles[0]].gpu,
        gpu_memory_utilization={role: place.gpu_memory_utilization for role, place in places.items()},
        engine_start_s={role: round(t[0]["engine_start_s"], 1) for role, t in turns.items()},
        engine_core_cpus={role: t[0]["engine_core_cpus"] for role, t in turns.items()},
        dispatch_per_turn={role: [t["dispatch"] for t in side] for role, side in turns.items()},
    )  # fmt: skip
