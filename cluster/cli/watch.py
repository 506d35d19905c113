"""`rayeval watch CKPT_DIR`: a training run's checkpoints evaluated as they appear, on warm engines."""

from __future__ import annotations

import argparse

from cluster.cli.run import print_timeline
from cluster.cli.sweep import add_checkpoint_run_arguments, checkpoint_run_config, print_outcomes
from cluster.config import parse_duration

EPILOG = """examples:
  rayeval watch runs/sft --model Qwen/Qwen2.5-0.5B-Instruct --tasks ifeval --limit 200 --until-idle 2h
  rayeval submit --address http://HEAD:8265 -- watch /shared/ckpts/rl --tasks gsm8k --every 100 \\
          --output-dir s3://my-bucket/sweeps
A checkpoint is evaluated once it is complete: where the trainer marks it (HF Trainer, TRL, LLaMA-Factory:
trainer_state.json in the folder; verl: latest_checkpointed_iteration.txt), once marked; otherwise once its
files stopped changing for --settle. The folder is the sweep's (runs/sweep-<folder>/step_<N>, the curves and
sweep_summary.*), redrawn after each step; `rayeval plot` and `compare` read it. Started again, the watch
evaluates only the steps it has no finished run of."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="evaluate a training run's checkpoints as they appear, on engines kept warm; curves after each",
        description="Poll a training run's folder for new complete checkpoints (full or LoRA, found as "
        "`rayeval sweep` finds them) and evaluate each in step order on the same engines (full checkpoints "
        "reloaded in place, adapters loaded live), redrawing the curves after each batch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(handler=cmd_watch)
    p.add_argument("--every", type=_positive_int, metavar="N", help="only steps that are multiples of N")
    p.add_argument("--until-idle", type=_duration("--until-idle", off_is_none=True), metavar="DURATION",
                   help="stop once no new checkpoint completed for this long, e.g. 30m; 0: as soon as none is "
                   "waiting (default off: until stopped)")  # fmt: skip
    p.add_argument("--poll-interval", type=_duration("--poll-interval", positive=True), default=5.0,
                   metavar="DURATION", help="how often to look for new checkpoints (default 5s)")  # fmt: skip
    p.add_argument("--settle", type=_duration("--settle"), default=30.0, metavar="DURATION",
                   help="a checkpoint without a trainer's marker is complete once its files have not changed "
                   "for this long (default 30s)")  # fmt: skip
    add_checkpoint_run_arguments(p)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive whole number of steps, e.g. 100")
    return int(text)


def _duration(flag: str, off_is_none: bool = False, positive: bool = False):  # noqa: ANN202 - an argparse type
    """Seconds (0 allowed); with `off_is_none`, None for `off` (no limit), while 0 stays 0 s; with `positive`,
    above 0 (and no `off`)."""

    def parse(text: str) -> float | None:
        if off_is_none and text.strip().lower() in ("off", "no", "none"):
            return None
        try:
            seconds = parse_duration(text, flag, off=not positive)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if positive and seconds <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be above 0 (got {text!r}), e.g. {flag} 5s")
        return seconds

    return parse


def cmd_watch(args: argparse.Namespace) -> int:
    from cluster.sweep import WatchOptions, watch_checkpoints
    from evaluators.curves import ErrorBar

    config = checkpoint_run_config(args, "watch")
    options = WatchOptions(args.every, args.until_idle, args.poll_interval, args.settle, args.lora_merge)
    if args.dry_run:
        from cluster.sweep import describe_watch

        print(describe_watch(config, args.checkpoint_dir, options), end="")
        return 0
    result = watch_checkpoints(config, args.checkpoint_dir, options, errorbar=ErrorBar(args.errorbar), verbose=args.verbose,
                   progress=not args.no_progress, retry_failed=args.retry_failed, on_batch=print_outcomes)  # fmt: skip
    print(f"watch ended: {len(result.steps)} step(s) evaluated in {result.root}")
    print_timeline(args)
    return 0
