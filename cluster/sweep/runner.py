"""Run a sweep: every step's evaluation on one set of warm replicas, then the curves.

LoRA steps run at once through the base model's engines (each request carries its step's adapter, vLLM
serves them side by side): a warm pool's, where one of the cluster serves them, else the sweep's own; full
checkpoints run one after another, every replica's engine moving to the
next checkpoint in its own actor. Each step is an ordinary run folder, so a step that finished is read back
from its store when the same command runs again: only a new step (or an unfinished one) is generated, and
the engines start only if one is.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.errors import ClusterError
from cluster.models import CheckpointKind
from cluster.plan import RunPlan
from cluster.preflight import check_lora_loglikelihoods, preflight
from cluster.progress import progress_bar
from cluster.run import RunResult, SharedReplicas, run_evaluation
from cluster.run.paths import RunPaths, set_aside
from cluster.session import ray_session
from cluster.storage.folder_lock import is_held
from cluster.sweep.plan import SweepPlan, SweepStep
from cluster.sweep.step_records import (
    TRACKED_STEPS,
    WEIGHTS_RECORD,
    numbers_digest,
    settings_differences,
    step_settings,
    weights_changed,
    weights_state,
)
from evaluators.curves import (
    ErrorBar,
    mixed_versions,
    partial_because,
    plot_curves,
    points_from_run,
    write_tables,
)
from evaluators.errors import EvalInputError

if TYPE_CHECKING:
    from cluster.engines.warm import Lease

log = logging.getLogger(__name__)


class StepStatus(StrEnum):
    DONE = "done"
    SKIPPED = "skipped"  # a LoRA adapter that cannot run on the base model (the reason says why)
    FAILED = "failed"  # the step's run stopped with an error; the other steps went on


@dataclass
class StepOutcome:
    step: int
    kind: str
    checkpoint: str
    status: StepStatus
    run_dir: str = ""  # on this node (a store's run folder: its staging copy)
    location: str = ""  # the run folder as the user names it (its URI on object storage)
    reason: str = ""
    requests: int = 0
    requests_generated: int = 0
    wall_s: float = 0.0
    engine_pids: list[int] = field(default_factory=list)
    loaded_by: list[str] = field(default_factory=list)  # per replica: start, reload or rebuild
    load_notes: list[str] = field(default_factory=list)  # per replica: why (a reload that failed its check)


@dataclass
class SweepResult:
    root: Path
    outcomes: list[StepOutcome]
    files: list[Path]  # sweep_summary.csv / .md and one PNG per task
    wall_s: float
    engine_starts: int  # replica pools started (one per checkpoint kind that had work)
    swaps: int  # moves of the full-checkpoint engines to another checkpoint
    location: str = (
        ""  # the sweep's folder as the user names it (a URI on object storage); root: its copy here
    )

    @property
    def failed(self) -> list[StepOutcome]:
        return [o for o in self.outcomes if o.status is StepStatus.FAILED]


class SweepEngines:
    """The sweep's engines by checkpoint kind, started on first use: a sweep closes them at its end, a watch
    keeps them from one batch of new checkpoints to the next."""

    def __init__(self, verbose: bool, max_loras: int | None = None) -> None:
        self.verbose = verbose
        self.max_loras = max_loras  # LoRA slots; None: as many as the first batch's adapters
        self._by_kind: dict[CheckpointKind, SharedReplicas] = {}
        self._pool_leases: dict[CheckpointKind, Lease] = {}  # the warm pools the LoRA steps run on, held
        self.starts = 0  # replica pools started (one per checkpoint kind that had work)

    def for_kind(self, kind: CheckpointKind, first: RunPlan, plan: SweepPlan) -> SharedReplicas | None:
        """The engines `kind`'s steps share, or None where a warm pool of the cluster serves LoRA steps: each
        step then runs on the pool as a run of its own, and the sweep holds a lease on it until it closes (a
        watch keeps it between batches). Full checkpoints always get the sweep's own, which move between
        them."""
        if kind in self._pool_leases:
            return None
        shared = self._by_kind.get(kind)
        if shared is not None:
            return shared
        shared = SharedReplicas(first, verbose=self.verbose, max_loras=self.max_loras or plan.max_loras)
        lease = shared.hold_warm_pool(first.model.path) if kind is CheckpointKind.LORA else None
        if lease is not None:
            log.info("the LoRA steps run on warm pool %s (no engine of the sweep's own)", lease.pool)
            self._pool_leases[kind] = lease
            return None
        self._by_kind[kind] = shared
        return shared

    @property
    def swaps(self) -> int:
        return sum(shared.swaps for shared in self._by_kind.values())

    def held_pool(self, kind: CheckpointKind) -> str | None:
        """The warm pool `kind`'s steps run on (`for_kind` gave them no engines of the sweep's own)."""
        lease = self._pool_leases.get(kind)
        return None if lease is None else lease.pool

    def close(self) -> None:
        for lease in self._pool_leases.values():
            lease.release(served=0)  # the steps' own leases counted what the pool served them
        self._pool_leases.clear()
        for shared in self._by_kind.values():
            self.starts += int(shared.pool is not None)
            shared.close()
        self._by_kind.clear()


def run_sweep(
    plan: SweepPlan,
    *,
    errorbar: ErrorBar = ErrorBar.CI95,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
) -> SweepResult:
    """Evaluate every step of the plan on the connected (or a local) Ray cluster and draw the curves."""
    check_sweep(plan)
    if plan.remote is not None:
        # the steps finished before, wherever that sweep ran: its curves draw them too
        from cluster.storage import local_copy

        local_copy(plan.remote)
    first = plan.steps[0].plan
    with ray_session(first.config.cluster.address, first.replica, first.config.cluster.replicas, verbose):
        engines = SweepEngines(verbose)
        try:
            return sweep_steps(plan, engines, errorbar, progress, retry_failed, close_engines=True)
        finally:
            engines.close()


def check_sweep(plan: SweepPlan) -> None:
    """What fails before anything starts: no step that can run, the first step's checks, and log-likelihood
    tasks where any step is a LoRA adapter."""
    if not plan.steps:
        raise EvalInputError(
            f"No checkpoint under {plan.checkpoint_dir} can run: "
            + "; ".join(f"step {s.step}: {s.reason}" for s in plan.skipped)
        )
    preflight(plan.steps[0].plan)
    # a LoRA step's engines cannot score log-likelihoods, whatever the first step is
    for step in plan.steps[1:]:
        check_lora_loglikelihoods(step.plan)


def sweep_steps(
    plan: SweepPlan,
    engines: SweepEngines,
    errorbar: ErrorBar,
    progress: bool,
    retry_failed: bool,
    close_engines: bool = False,
) -> SweepResult:
    """The plan's steps on `engines` in an open Ray session, then the curves of every step in the sweep's
    folder, sweep.json and (on object storage) their upload. `close_engines`: stop them before drawing."""
    began = time.perf_counter()
    outcomes = [
        StepOutcome(s.step, "lora", str(s.path), StepStatus.SKIPPED, reason=s.reason) for s in plan.skipped
    ]
    groups = _groups(plan, outcomes)
    bar = progress_bar("checkpoints", enabled=progress)
    job = bar.add_task("checkpoints", total=sum(len(steps) for _, steps in groups))
    with bar:
        for kind, steps in groups:
            if steps:
                shared = engines.for_kind(kind, steps[0].plan, plan)
                pool = engines.held_pool(kind)
                outcomes += _run_steps(steps, shared, pool, kind, retry_failed, lambda: bar.advance(job))
    if close_engines:
        engines.close()
    outcomes.sort(key=lambda o: o.step)
    _log_steps(plan, outcomes)
    files = _curves(plan, errorbar)
    wall_s = time.perf_counter() - began
    result = SweepResult(plan.root, outcomes, files, wall_s, engines.starts, engines.swaps, plan.location)
    _write_sweep_json(plan, result)
    _upload_sweep_files(plan)
    return result


def _log_steps(plan: SweepPlan, outcomes: list[StepOutcome]) -> None:
    """Each finished step into the sweep's tracker run (`--log-to`), at its checkpoint's step, once per tracker
    and result: a rerun that reuses a step logs it again only to a tracker that has not had these numbers
    (MLflow would hold the point twice; W&B drops a step below its last); a step evaluated again (a changed
    checkpoint or adapter) is logged again. The sweep folder records what each tracker had (summary digests)."""
    if not plan.log_to:
        return
    from cluster.exporters import log_run

    record = plan.root / TRACKED_STEPS
    try:
        logged: dict[str, dict[str, str]] = json.loads(record.read_text()) if record.is_file() else {}
    except (OSError, ValueError):
        logged = {}
    for outcome in outcomes:
        if outcome.status is StepStatus.DONE and outcome.run_dir:
            numbers = numbers_digest(Path(outcome.run_dir))  # a step evaluated again: other numbers
            wanting = [t for t in plan.log_to if logged.get(t, {}).get(str(outcome.step)) != numbers]
            for tracker in log_run(wanting, Path(outcome.run_dir), plan.root.name, outcome.step):
                logged.setdefault(tracker, {})[str(outcome.step)] = numbers
    plan.root.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(logged, indent=2, sort_keys=True) + "\n")


def _upload_sweep_files(plan: SweepPlan) -> None:
    """A sweep on object storage: its own files (sweep.json, the tables, the curves) go up beside the steps'
    run folders, which each step's run uploads itself."""
    if plan.remote is None:
        return
    from cluster.storage import FolderMirror, explain

    own = tuple(path.name for path in plan.root.iterdir() if path.is_file())
    try:
        FolderMirror(plan.root, plan.remote).push(final=True, only=own)
    except OSError as exc:
        raise ClusterError(
            f"{explain(plan.remote, exc, 'uploading the sweep files')}. The steps' run folders are up; the "
            f"sweep's own files are in {plan.root}: rerun the sweep (it reuses every step) to upload them."
        ) from None


def _groups(plan: SweepPlan, outcomes: list[StepOutcome]) -> list[tuple[CheckpointKind, list[SweepStep]]]:
    """The steps run together: LoRA adapters at once, full checkpoints in turn; with --lora-merge every adapter
    becomes a full checkpoint of its own (merged into the base weights) and runs in turn before them, and
    one the merge refuses is skipped with the reason (added to `outcomes`)."""
    adapters, full = plan.of_kind(CheckpointKind.LORA), plan.of_kind(CheckpointKind.FULL)
    if not plan.lora_merge:
        return [(CheckpointKind.LORA, adapters), (CheckpointKind.FULL, full)]
    merged = []
    for step in adapters:
        try:
            merged.append(_merged(step))
        except EvalInputError as exc:
            log.error("step %d skipped: %s", step.step, exc)
            outcomes.append(StepOutcome(step.step, "lora", str(step.checkpoint.path), StepStatus.SKIPPED,
                                        reason=str(exc)))  # fmt: skip
    return [(CheckpointKind.FULL, merged + full)]


def _merged(step: SweepStep) -> SweepStep:
    """The step with its adapter merged into the base model: the engines load it as a full checkpoint."""
    from cluster.models import ResolvedModel, merged_checkpoint

    adapter = step.plan.adapter
    assert adapter is not None
    began = time.perf_counter()
    folder = merged_checkpoint(Path(adapter.path), Path(step.plan.model.path), adapter.digest)
    log.info(
        "step %d: %s merged into %s in %.1f s", step.step, adapter.name, folder, time.perf_counter() - began
    )
    model = ResolvedModel(step.plan.model_label, str(folder), False)
    return replace(step, plan=replace(step.plan, model=model, adapter=None))


def _run_steps(
    steps: list[SweepStep],
    shared: SharedReplicas | None,
    pool: str | None,
    kind: CheckpointKind,
    retry_failed: bool,
    advance: Callable[[], None],
) -> list[StepOutcome]:
    """LoRA steps at once (their requests meet in the same engines), full checkpoints one after another."""
    workers = len(steps) if kind is CheckpointKind.LORA else 1
    with ThreadPoolExecutor(workers, thread_name_prefix="sweep-step") as threads:
        futures = [threads.submit(_run_step, s, shared, pool, retry_failed) for s in steps]
        outcomes = []
        for future in futures:
            outcomes.append(future.result())
            advance()
    return outcomes


def _run_step(
    step: SweepStep, shared: SharedReplicas | None, pool: str | None, retry_failed: bool
) -> StepOutcome:
    outcome = StepOutcome(step.step, step.kind.value, str(step.checkpoint.path), StepStatus.DONE)
    began = time.perf_counter()
    log.info("step %d (%s): %s", step.step, step.kind, step.checkpoint.path)
    try:
        _answers_these_weights(step)
        result = run_evaluation(
            step.plan, progress=False, retry_failed=retry_failed, shared=shared, warm_pool=pool
        )
    except (ClusterError, EvalInputError, OSError) as exc:
        log.error("step %d failed: %s", step.step, exc)
        outcome.status, outcome.reason = StepStatus.FAILED, f"{type(exc).__name__}: {exc}"
        return outcome
    _fill(outcome, result, step.plan)
    outcome.wall_s = time.perf_counter() - began
    return outcome


def _answers_these_weights(step: SweepStep) -> None:
    """Where the checkpoint's files changed since the step's folder answered them (a trainer that restarted
    from an earlier step and saved this one again), that folder is set aside and the step evaluated afresh
    (a full checkpoint's requests are named by its folder, not its weights; an adapter's by its digest, but
    its old answers would stay in the folder beside the new); on object storage the store's folder is moved
    too (else the step's pull would bring the old answers back), the sweep having read the store's folder
    first. The record of the files (the checkpoint's own: an adapter's, not its merged copy's) is written
    for the next sweep and the watch. Not done where a run on this node holds the folder now (it is refused
    its turn there anyway)."""
    paths = RunPaths.of(step.plan.config.output_dir, step.plan.config.run_id or f"step_{step.step}")
    if is_held(paths.root):
        return
    current = weights_state(step.checkpoint.path)
    if weights_changed(paths.root, current):
        from cluster.storage import move_on_store

        aside = set_aside(paths.root)
        kept = move_on_store(paths.remote, aside).uri if paths.remote is not None else aside
        log.warning("step %d: %s changed since its folder was evaluated; that folder is kept as %s",
                    step.step, step.checkpoint.path, kept)  # fmt: skip
    paths.make()
    record = paths.root / WEIGHTS_RECORD
    partial = record.with_name(f".{record.name}.tmp")
    partial.write_text(json.dumps(current))
    partial.replace(record)


def _fill(outcome: StepOutcome, result: RunResult, plan: RunPlan) -> None:
    outcome.run_dir = str(result.run_dir)
    outcome.location = result.location
    outcome.requests = result.requests_total
    outcome.requests_generated = result.requests_total - result.requests_reused
    outcome.engine_pids = [e.pid for e in result.engines]
    outcome.loaded_by = [e.loaded_by for e in result.engines]
    outcome.load_notes = [e.load_note for e in result.engines]
    if result.task_errors:
        outcome.status = StepStatus.FAILED
        outcome.reason = "; ".join(f"{task}: {error}" for task, error in sorted(result.task_errors.items()))


def _curves(plan: SweepPlan, errorbar: ErrorBar) -> list[Path]:
    return draw_curves(plan.root, plan.series, errorbar)


def draw_curves(root: Path, series: str, errorbar: ErrorBar) -> list[Path]:
    """The curves of every complete step in a sweep's folder (this call's and earlier ones'), by step: the
    tables and one PNG per task, written in that folder. A finished step whose numbers stand on part of its
    samples (`complete_steps`) is left off, with a warning: a point drawn as any other would read as that
    checkpoint's score."""
    said = _said.setdefault(root, set())
    steps = complete_steps(root, said)
    _warn_of_mixed_settings(said, steps)
    points = [
        point for step, folder in steps for point in points_from_run(folder, series, step, latest_judge=True)
    ]
    if not points:
        return []
    for task, seen in mixed_versions(points):
        warn_once(said, f"{task}: the steps scored it with different versions of the task ({seen}): its curve "
                  "mixes scoring rules; run the sweep again over every step")  # fmt: skip
    csv_path, md_path = write_tables(points, root)
    return [csv_path, md_path, *plot_curves(points, root, errorbar)]


def finished_steps(root: Path) -> list[tuple[int, Path]]:
    """(step, run folder) of each step folder under the sweep's folder that holds a finished run."""
    found = []
    for summary in root.glob("step_*/summary.json"):
        number = summary.parent.name.removeprefix("step_")
        if number.isdigit():
            found.append((int(number), summary.parent))
    return sorted(found)


def _warn_of_mixed_settings(said: set[str], steps: list[tuple[int, Path]]) -> None:
    """A warning where the steps on the curves ran with other settings than the last one (a --limit or -n
    changed between sweeps of some steps): their points do not answer the same questions the same way."""
    ran = {step: step_settings(folder) for step, folder in steps}
    known = {step: settings for step, settings in ran.items() if settings is not None}
    if not known:
        return
    last = max(known)
    for step, settings in sorted(known.items()):
        if settings != known[last]:
            differences = "; ".join(settings_differences(settings, known[last]))
            warn_once(said, f"step {step} ran with other settings than step {last} ({differences}): its points "
                      "on the curves are not comparable; run the sweep again over every step")  # fmt: skip


# what the curves said of each sweep folder in this process: a watch draws them after every batch, and says
# each warning once (as Python's warnings do)
_said: dict[Path, set[str]] = {}


def warn_once(said: set[str], message: str) -> None:
    """Log `message` unless it is in `said` (a caller's record of what it said), and record it."""
    if message not in said:
        said.add(message)
        log.warning("%s", message)


def complete_steps(root: Path, said: set[str] | None = None) -> list[tuple[int, Path]]:
    """The finished steps whose every sample was answered and scored (`curves.partial_because`); the others
    are logged with why, for a later run of the sweep (or watch) to ask what failed again: once per step and
    reason where the caller keeps what it `said` (a watch, which looks every few seconds)."""
    complete = []
    for step, folder in finished_steps(root):
        partial = partial_because(folder)
        if partial is None:
            complete.append((step, folder))
        else:
            message = f"step {step} is left off the curves: {partial}; run the sweep again to ask them again"
            warn_once(set() if said is None else said, message)
    return complete


def _write_sweep_json(plan: SweepPlan, result: SweepResult) -> None:
    """sweep.json: every step's latest outcome, this call's over those an earlier call (a watch's earlier
    batch, a sweep of other --steps) wrote; the times and engine counts are this call's."""
    path = plan.root / "sweep.json"
    try:
        earlier = {int(o["step"]): o for o in json.loads(path.read_text()).get("steps", [])}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        earlier = {}
    steps = earlier | {o.step: asdict(o) for o in result.outcomes}
    summary = {
        "checkpoint_dir": str(plan.checkpoint_dir),
        "series": plan.series,
        "wall_s": round(result.wall_s, 3),
        "engine_starts": result.engine_starts,
        "checkpoint_swaps": result.swaps,
        "steps": [steps[step] for step in sorted(steps)],
        "files": [str(p) for p in result.files],
    }
    plan.root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
