"""`rayeval sweep CKPT_DIR`: every checkpoint of a training run on the same warm replicas, then the curves."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.cli.flags import overrides, set_help
from cluster.cli.run import add_run_arguments, print_timeline, run_config
from cluster.config import RunMode
from evaluators.errors import EvalInputError

if TYPE_CHECKING:
    from cluster.config import RunConfig
    from cluster.sweep import SweepResult

EPILOG = """examples:
  rayeval sweep runs/sft-lora --model Qwen/Qwen2.5-0.5B-Instruct --tasks ifeval,gsm8k --num-samples 4
  rayeval sweep /ckpt/rl-run --tasks gsm8k --limit 200 --steps 120,240,360 --replicas 2
Checkpoints are folders named like step_120, checkpoint-120 or global_step120 holding a full model
(config.json + weights) or a LoRA adapter (adapter_config.json + adapter weights; evaluated on --model).
Each step is a run folder under --output-dir/--run-id (default runs/sweep-<folder>/step_<N>); the same
command again evaluates only the steps (and requests) not done yet."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="evaluate every checkpoint / LoRA adapter of a training run on warm replicas; curves",
        description="Find the checkpoints under a training run's folder and evaluate each one on the same "
        "engine replicas: LoRA adapters all at once on the base model's multi-LoRA engines, full checkpoints "
        "one after another with each replica's engine moved to the next in its own process. Writes a run "
        "folder per step, sweep_summary.csv/.md and one PNG per task (score by step, with error bars).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(handler=cmd_sweep)
    p.add_argument("--steps", type=_steps, metavar="N[,N...]", help="only these steps (default: every one)")
    add_checkpoint_run_arguments(p)


def add_checkpoint_run_arguments(p: argparse.ArgumentParser) -> None:
    """What `sweep` and `watch` share: the training run's folder, the curves' error bars, --lora-merge and
    every setting of a run."""
    p.add_argument("checkpoint_dir", metavar="CKPT_DIR", type=Path, help="the training run's folder")
    p.add_argument("--errorbar", choices=["ci95", "sem", "std", "none"], default="ci95",
                   help="what the curves' error bars show (default ci95)")  # fmt: skip
    p.add_argument(
        "--lora-merge",
        action="store_true",
        help="merge each LoRA adapter into the base weights and run it as a full checkpoint (weight reload between "
        "steps) instead of through vLLM's LoRA layers: on CPU those run at a third of the base model's speed",
    )
    add_run_arguments(p)
    set_help(p, "--run-id", "the sweep's folder name under --output-dir, one run folder per step in it; reuse it "
             "to resume (default sweep-<CKPT_DIR's name>)")  # fmt: skip


def checkpoint_run_config(args: argparse.Namespace, command: str) -> RunConfig:
    """A sweep's or watch's run settings. Neither re-judges (--judge-only): each step is a run folder of its
    own, judged again as a run."""
    refusal = EvalInputError(
        f"rayeval {command} does not re-judge: each step is a run folder of its own. Judge one again with "
        "`rayeval run --judge-only --judge MODEL --output-dir SWEEP_FOLDER --run-id step_N`."
    )
    if overrides(args).get("mode") == RunMode.JUDGE_ONLY:  # before run_config, which would ask for --run-id
        raise refusal
    config = run_config(args)
    if config.mode is RunMode.JUDGE_ONLY:  # from a config file
        raise refusal
    _refuse_ray_client(config, command)
    if config.model.is_endpoint:
        raise EvalInputError(
            f"rayeval {command} evaluates the checkpoints it finds on engines it starts from them, and --model "
            f"{config.model.path} is a model behind an endpoint. Leave --model out (or name the base model of "
            "LoRA checkpoints); to score a served checkpoint, `rayeval run --model openai:NAME --base-url URL`."
        )
    return config


def _refuse_ray_client(config: RunConfig, command: str) -> None:
    """`sweep` and `watch` coordinate where they are started: through a Ray client they go as a job."""
    if (config.cluster.address or "").startswith("ray://"):
        raise EvalInputError(
            f"rayeval {command} runs its coordinator where it is started: submit it as a job instead of going "
            f"through a Ray client (rayeval submit --address http://HEAD:8265 -- {command} ...)."
        )


def _steps(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of steps, e.g. 120,240"
        ) from None
    if not steps:
        raise argparse.ArgumentTypeError("give at least one step, e.g. --steps 120,240")
    return steps


def cmd_sweep(args: argparse.Namespace) -> int:
    from cluster.sweep import build_sweep_plan

    config = checkpoint_run_config(args, "sweep")
    plan = build_sweep_plan(
        config,
        args.checkpoint_dir,
        args.steps,
        materialise_model=not args.dry_run,
        lora_merge=args.lora_merge,
    )
    if args.dry_run:
        print(plan.describe())
        return 0
    from cluster.sweep import run_sweep
    from evaluators.curves import ErrorBar

    result = run_sweep(
        plan,
        errorbar=ErrorBar(args.errorbar),
        verbose=args.verbose,
        progress=not args.no_progress,
        retry_failed=args.retry_failed,
    )
    code = report(result)
    print_timeline(args)
    return code


def report(result: SweepResult) -> int:
    """Each step's outcome, the summary table and the files; exit 1 when a step failed."""
    print_outcomes(result)
    print(f"sweep in {result.location or result.root} ({result.wall_s:.1f} s)")
    if result.failed:
        steps = ", ".join(str(o.step) for o in result.failed)
        print(
            f"rayeval: error: step(s) {steps} failed (reasons above and in sweep.json); rerun the same command to "
            "resume them: finished work is reused.",
            file=sys.stderr,
        )
        return 1
    return 0


def print_outcomes(result: SweepResult) -> None:
    """Each step's outcome line, the summary table (every finished step of the folder) and the files."""
    for o in result.outcomes:
        detail = (
            o.reason
            if o.reason
            else f"{o.requests_generated} of {o.requests} requests generated, {o.location or o.run_dir}"
        )
        print(f"step {o.step:<8} {o.kind:<5} {o.status:<8} {detail}", flush=True)
    table = result.root / "sweep_summary.md"
    if table.is_file():
        print(table.read_text(), end="")
    for path in result.files:
        print(path, flush=True)
