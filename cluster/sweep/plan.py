"""A sweep's plan: the checkpoints of one training run, each a run of the same tasks, settings and seeds.

Building it finds the checkpoints (`cluster.models.find_checkpoints`), checks every LoRA adapter against the
base model (a bad one is skipped with its reason, the rest go on) and gives each step a run plan whose
folder is `<sweep folder>/step_<N>`; it loads the tasks' data once and starts nothing, so `--dry-run`
prints it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster.config import RunConfig
from cluster.judging import judged_task_names
from cluster.models import (
    Checkpoint,
    CheckpointKind,
    adapter_problem,
    find_checkpoints,
    load_adapter,
    merge_problem,
    resolve_model,
)
from cluster.plan import RunPlan, build_plan
from cluster.storage.location import RemoteFolder, is_remote, local_path
from evaluators.errors import EvalInputError

MAX_LORAS = 16  # adapters one engine batch may mix (vLLM's max_loras); more wait for a free slot


@dataclass(frozen=True)
class SkippedCheckpoint:
    step: int
    path: Path
    reason: str


@dataclass(frozen=True)
class SweepStep:
    checkpoint: Checkpoint
    plan: RunPlan

    @property
    def step(self) -> int:
        return self.checkpoint.step

    @property
    def kind(self) -> CheckpointKind:
        return self.checkpoint.kind


@dataclass
class SweepPlan:
    checkpoint_dir: Path
    root: Path  # the sweep's folder: one run folder per step, sweep.json, sweep_summary.*, a PNG per task
    steps: list[SweepStep]
    skipped: list[SkippedCheckpoint]
    lora_merge: bool = False  # adapters merged into the base weights and run as full checkpoints
    remote: RemoteFolder | None = None  # the sweep's folder on object storage; root is its staging copy
    log_to: list[str] = field(default_factory=list)  # trackers the sweep logs its steps to (--log-to)

    @property
    def location(self) -> str:
        """The sweep's folder as the user names it: its URI on a store, else its path."""
        return self.remote.uri if self.remote is not None else str(self.root)

    @property
    def steps_output_dir(self) -> str:
        """Where each step's run folder goes: under the sweep's folder, on the store where it is there."""
        return self.remote.uri if self.remote is not None else str(self.root)

    @property
    def series(self) -> str:
        """The training run's name on curves: its checkpoint folder's."""
        return self.checkpoint_dir.resolve().name

    def of_kind(self, kind: CheckpointKind) -> list[SweepStep]:
        return [s for s in self.steps if s.kind is kind]

    @property
    def max_loras(self) -> int:
        return max(1, min(len(self.of_kind(CheckpointKind.LORA)), MAX_LORAS))

    def describe(self) -> str:
        lines = [f"sweep     {self.checkpoint_dir} -> {self.root}"]
        for s in self.steps:
            what = f"LoRA adapter on {s.plan.model.name}" if s.kind is CheckpointKind.LORA else "full model"
            what += " (merged into its weights)" if self.lora_merge and s.kind is CheckpointKind.LORA else ""
            lines.append(f"step      {s.step:<8} {what}: {s.checkpoint.path}")
        lines += [f"skipped   {s.step:<8} {s.path}: {s.reason}" for s in self.skipped]
        if self.steps:
            lines.append("each step:")
            lines += ["  " + line for line in self.steps[0].plan.describe().splitlines()[1:]]
        return "\n".join(lines)


def build_sweep_plan(
    config: RunConfig,
    checkpoint_dir: Path,
    steps: list[int] | None = None,
    materialise_model: bool = True,
    lora_merge: bool = False,
) -> SweepPlan:
    """Every checkpoint under `checkpoint_dir` (or those of `steps`) as a step of the sweep. LoRA adapters run
    on `--model` (the embedded default when none is given); full checkpoints are their own models."""
    if config.model.lora is not None:
        raise EvalInputError(
            "rayeval sweep finds the LoRA adapters under the checkpoint folder itself: drop --lora (use "
            "`rayeval run --lora PATH` for one adapter)."
        )
    checkpoints = find_checkpoints(checkpoint_dir, steps)
    root, remote = sweep_folder(config, checkpoint_dir)
    adapters = [c for c in checkpoints if c.kind is CheckpointKind.LORA]
    full = [c for c in checkpoints if c.kind is CheckpointKind.FULL]
    base_config = config if adapters else _with_model(config, str(full[0].path))
    base = build_plan(base_config, materialise_model=materialise_model)
    check_sweep_judge(base)
    plan = SweepPlan(checkpoint_dir, root, [], [], lora_merge, remote, list(config.log_to))
    # a merged adapter runs as a full checkpoint: the engines' LoRA rank does not limit it, the merge's does
    max_lora_rank = None if lora_merge else config.model.max_lora_rank
    for checkpoint in checkpoints:
        if checkpoint.kind is CheckpointKind.LORA:
            problem = adapter_problem(checkpoint.path, Path(base.model.path), max_lora_rank)
            if problem is None and lora_merge:
                problem = merge_problem(json.loads((checkpoint.path / "adapter_config.json").read_text()))
            if problem is not None:
                plan.skipped.append(SkippedCheckpoint(checkpoint.step, checkpoint.path, problem))
                continue
        plan.steps.append(
            SweepStep(checkpoint, _step_plan(base, checkpoint, plan.steps_output_dir, max_lora_rank))
        )
    return plan


def sweep_folder(config: RunConfig, checkpoint_dir: Path) -> tuple[Path, RemoteFolder | None]:
    """The sweep's folder here (--output-dir/--run-id, default sweep-<training run>), and on object storage
    where --output-dir is there (the local one is then its staging copy)."""
    name = config.run_id or f"sweep-{checkpoint_dir.resolve().name}"
    remote = RemoteFolder.parse(config.output_dir).child(name) if is_remote(config.output_dir) else None
    return (remote.staging if remote is not None else local_path(config.output_dir) / name), remote


def _step_plan(base: RunPlan, checkpoint: Checkpoint, output_dir: str, max_lora_rank: int | None) -> RunPlan:
    """The base plan with this step's model (a full checkpoint) or adapter, run in its own folder."""
    config = base.config.model_copy(deep=True)
    config.output_dir = output_dir
    config.run_id = f"step_{checkpoint.step}"
    config.log_to = []  # the sweep logs its steps as one tracker run, by step
    if checkpoint.kind is CheckpointKind.LORA:
        config.model.lora = str(checkpoint.path)
        adapter = load_adapter(str(checkpoint.path), Path(base.model.path), max_lora_rank)
        return replace(base, config=config, adapter=adapter)
    config.model.path = str(checkpoint.path)
    return replace(base, config=config, model=resolve_model(str(checkpoint.path)))


def _with_model(config: RunConfig, path: str) -> RunConfig:
    changed = config.model_copy(deep=True)
    changed.model.path = path
    return changed


def check_sweep_judge(plan: RunPlan, command: str = "sweep") -> None:
    """Judged tasks need an API judge: a sweep (or watch) runs no local judge beside its engines."""
    if judged_task_names(plan) and plan.config.judge.kind == "local":
        raise EvalInputError(
            f"rayeval {command} does not run a local judge beside its engines: each step would start its own. "
            f"Judge through an API (--judge openai:MODEL, or a served judge's --judge-base-url), or {command} with "
            "--inference-only and judge each step folder later with rayeval run --judge-only."
        )
