"""`rayeval rdagent-entrypoint`: RD-Agent's lm-eval benchmark contract (job in environment variables, lm-eval's
results and samples files out), as a drop-in for the entrypoint of its benchmark container."""

from __future__ import annotations

import argparse
import os

EPILOG = """environment (RD-Agent sets these for its benchmark container):
  BENCHMARK_TASKS  comma list of tasks, rayeval's or lm-eval's names (gsm8k,ifeval,arc_easy)   required
  BASE_MODEL       the model folder or hub id                                                   required
  ADAPTER_PATH     a LoRA adapter folder on BASE_MODEL                                          optional
  LIMIT            the first N questions of each task                                           optional
  NUM_GPUS         GPUs per replica (tensor parallel)                                           optional
  OUTPUT_DIR       lm-eval's files go to OUTPUT_DIR/<model>/results_<time>.json and samples_<task>_<time>.jsonl
The prompts use the model's chat template (lm-eval's --apply_chat_template). RAY_ADDRESS (or --address)
names the Ray cluster; without it a local one starts. rayeval's own run folder is OUTPUT_DIR/rayeval/: the
same job run again resumes it."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rdagent-entrypoint",
        help="RD-Agent's lm-eval benchmark step: job from environment variables, lm-eval's files out",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--address", metavar="ADDR", help="the Ray cluster (default: RAY_ADDRESS, else a local one)"
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a rayeval config YAML for what the variables do not say (engine settings, sampling, data paths); "
        "the variables win where both speak",
    )
    p.set_defaults(handler=cmd_rdagent_entrypoint)


def cmd_rdagent_entrypoint(args: argparse.Namespace) -> int:
    from cluster.integrations.lm_eval_contract import EntrypointJob, run_entrypoint

    results = run_entrypoint(EntrypointJob.from_env(os.environ), args.address, args.config)
    print(results)
    return 0
