"""`rayeval watch`: a training run's checkpoints evaluated as they appear, on engines kept warm between them.

Each poll finds the complete checkpoints (cluster.sweep.arrivals) that the sweep's folder has no finished
run of, and evaluates them as a sweep batch in step order on the same `SweepEngines` (a full checkpoint's
engines reload in place, adapters load live), then redraws the curves over every step so far. A watch that
is killed and started again finds the finished steps in the folder and evaluates nothing twice; a step it
was in the middle of resumes from its store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.addresses import check_address_reachable
from cluster.config import RunConfig
from cluster.models.checkpoints import Checkpoint
from cluster.plan import RunPlan, build_plan
from cluster.preflight import check_lora_loglikelihoods
from cluster.session import ray_session
from cluster.sweep.arrivals import ArrivalWatcher, FilesState, files_state
from cluster.sweep.plan import MAX_LORAS, SweepPlan, build_sweep_plan, check_sweep_judge, sweep_folder
from cluster.sweep.runner import (
    SweepEngines,
    SweepResult,
    check_sweep,
    complete_steps,
    sweep_steps,
    warn_once,
)
from cluster.sweep.step_records import (
    scoring_settings,
    settings_differences,
    step_settings,
    weights_changed,
    weights_state,
)
from evaluators.curves import ErrorBar

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchOptions:
    every: int | None = None  # only steps that are multiples of this
    until_idle_s: float | None = None  # stop after this long without a new checkpoint; None: until stopped
    poll_s: float = 5.0
    settle_s: float = 30.0  # a checkpoint without a trainer's marker is complete once unchanged this long
    lora_merge: bool = False


@dataclass
class WatchResult:
    root: Path
    batches: list[SweepResult] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [o.step for batch in self.batches for o in batch.outcomes]


def watch_checkpoints(
    config: RunConfig,
    checkpoint_dir: Path,
    options: WatchOptions,
    *,
    errorbar: ErrorBar = ErrorBar.CI95,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
    on_batch: Callable[[SweepResult], None] = lambda _: None,
) -> WatchResult:
    """Evaluate checkpoints under `checkpoint_dir` as they complete until idle for `options.until_idle_s`."""
    settings = scoring_settings(check_watch(config).config.model_dump(mode="json"))
    root, remote = sweep_folder(config, checkpoint_dir)
    if remote is not None:  # the steps finished before, wherever the watch ran then
        from cluster.storage import local_copy

        local_copy(remote)
    watcher = ArrivalWatcher(checkpoint_dir, options.settle_s, options.every)
    attempted: dict[
        int, FilesState
    ] = {}  # step -> its files when planned (a skipped one is retried once changed)
    result = WatchResult(root)
    said: set[str] = set()  # what it warned of (partial steps, other settings): once each, not every poll
    idle_since = time.monotonic()
    with ExitStack() as stack:
        engines: SweepEngines | None = None
        while True:
            complete = watcher.complete()
            finished = {step for step, _ in complete_steps(root, said)}
            finished -= _saved_again(complete, finished, root) | _ran_otherwise(
                finished, root, settings, said
            )
            states = {c.step: files_state(c.path) for c in complete if c.step not in finished}
            new = sorted(step for step, state in states.items() if attempted.get(step) != state)
            if new:
                plan = build_sweep_plan(config, checkpoint_dir, new, lora_merge=options.lora_merge)
                attempted.update({step: states[step] for step in new})
                # every new one skipped (an adapter that cannot run): said, and tried again once changed
                if not plan.steps:
                    log.warning(
                        "watch: %s", "; ".join(f"step {s.step} skipped: {s.reason}" for s in plan.skipped)
                    )
                    continue
                if engines is None:
                    check_sweep(plan)  # once: the first batch's checks stand for the command
                    engines = _start_engines(stack, plan, verbose)
                else:
                    for step in plan.steps:
                        check_lora_loglikelihoods(step.plan)
                log.info("watch: evaluating step(s) %s", ", ".join(map(str, new)))
                batch = sweep_steps(plan, engines, errorbar, progress, retry_failed)
                result.batches.append(batch)
                on_batch(batch)
                idle_since = time.monotonic()
                continue  # more may have completed meanwhile
            if options.until_idle_s is not None and time.monotonic() - idle_since >= options.until_idle_s:
                return result
            time.sleep(options.poll_s)


def _saved_again(complete: list[Checkpoint], finished: set[int], root: Path) -> set[int]:
    """The finished checkpoints (full or adapters) whose files changed since their step was evaluated (a
    trainer restarted from an earlier step saved them again): evaluated again, their old folders set aside
    by the sweep."""
    return {
        c.step
        for c in complete
        if c.step in finished and weights_changed(root / f"step_{c.step}", weights_state(c.path))
    }


def _ran_otherwise(finished: set[int], root: Path, settings: dict[str, Any], said: set[str]) -> set[int]:
    """The finished steps whose run had other settings than the watch's (another --limit, --tasks, -n...):
    evaluated again with these, so that every point of the curves answers the same questions the same way
    (said once per step)."""
    otherwise = set()
    for step in sorted(finished):
        ran = step_settings(root / f"step_{step}")
        if ran is not None and ran != settings:
            otherwise.add(step)
            differences = "; ".join(settings_differences(ran, settings))
            warn_once(
                said, f"watch: step {step} ran with other settings ({differences}): it is evaluated again"
            )
    return otherwise


def check_watch(config: RunConfig) -> RunPlan:
    """What a watch can check before any checkpoint completes, so a mistyped task, a missing dataset or a
    judge a sweep cannot run fails now rather than at the first checkpoint, hours into training: the run as
    planned on --model (the embedded default where none is given; each step's own plan comes later)."""
    plan = build_plan(config, materialise_model=False)
    check_sweep_judge(plan, "watch")
    return plan


def describe_watch(config: RunConfig, checkpoint_dir: Path, options: WatchOptions) -> str:
    """The dry run: the checks above, then the sweep of the checkpoints there now (each evaluated once
    complete), or that none is there yet, and how the watch polls."""
    check_watch(config)
    check_address_reachable(config.cluster.address)  # the watch itself joins it when it starts
    found = ArrivalWatcher(checkpoint_dir, options.settle_s, options.every).found()
    until = "until stopped" if options.until_idle_s is None else f"until idle for {options.until_idle_s:g} s"
    polling = f"rayeval watch: polls {checkpoint_dir} every {options.poll_s:g} s, {until}"
    if not found:
        return f"{polling}; no checkpoint there yet: the tasks, data and judge check out.\n"
    steps = [c.step for c in found]
    plan = build_sweep_plan(
        config, checkpoint_dir, steps, materialise_model=False, lora_merge=options.lora_merge
    )
    return f"{polling}; the checkpoints there now, each evaluated once complete:\n{plan.describe()}"


def _start_engines(stack: ExitStack, plan: SweepPlan, verbose: bool) -> SweepEngines:
    """The watch's Ray session and engines, open until the watch ends (`stack`)."""
    first = plan.steps[0].plan
    stack.enter_context(ray_session(first.config.cluster.address, first.replica,
                                    first.config.cluster.replicas, verbose))  # fmt: skip
    engines = SweepEngines(verbose, max_loras=MAX_LORAS)
    stack.callback(engines.close)
    return engines
