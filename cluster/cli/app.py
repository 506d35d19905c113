"""`rayeval`: evaluate models on benchmark tasks over vLLM engine replicas on a Ray cluster."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn

from cluster.config import COMMAND_LINE, RunConfig
from evaluators.errors import EvalInputError

EPILOG = """examples:
  rayeval run                                  # embedded SmolLM2-135M on IFEval (20 prompts), local CPU cluster
  rayeval run --model Qwen/Qwen2.5-7B-Instruct --tasks ifeval,gsm8k --limit 100 \\
              --num-samples 4 --temperature 0.7 --replicas 2 --output-dir runs --run-id my_run
  rayeval run --config run.yaml --replicas 4   # flags override the file
  rayeval run --dry-run --tasks gsm8k --data-path gsm8k=data/gsm8k/test.jsonl
  rayeval run --model M --tasks arc_easy,hellaswag,mmlu_abstract_algebra --num-fewshot 5 --limit 200
  rayeval run --tasks my_task --include-path my_tasks/   # an lm-eval task YAML folder
  rayeval run --tasks alpaca_eval,arena_hard --judge local:Qwen/Qwen2.5-7B-Instruct --judge-replicas 1
  OPENAI_API_KEY=... rayeval run --tasks healthbench --judge openai:gpt-4.1 --judge-rps 5 --run-id hb
  rayeval run --judge-only --run-id hb --judge openai:gpt-4o-mini   # re-judge stored outputs, no generation
Rerunning the same command with the same --output-dir and --run-id resumes: finished requests are reused."""


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in rayeval's one-paragraph style: what is wrong, then where the fix is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"rayeval: error: {message}. `{self.prog} --help` lists every flag and its values.\n")


def _run_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="evaluate a model on tasks",
        description="Evaluate a model on benchmark tasks with vLLM engine replicas on a Ray cluster.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="YAML run config; flags given here override its values")
    m = p.add_argument_group("model and engine")
    m.add_argument(
        "--model",
        dest="model.path",
        metavar="PATH_OR_HF_ID",
        help="model folder or HF hub id (default: the embedded SmolLM2-135M-Instruct)",
    )
    m.add_argument(
        "--revision",
        dest="model.revision",
        metavar="REV",
        help="model revision (branch, tag or commit) on the hub",
    )
    m.add_argument(
        "--dtype",
        dest="model.dtype",
        help="weights dtype: auto, bfloat16, float16, float32 (default auto: the model's own on GPU; on CPU bfloat16 where the CPU has native bfloat16, else float32)",
    )
    m.add_argument(
        "--max-model-len",
        dest="model.max_model_len",
        type=int,
        metavar="TOKENS",
        help="context length per sequence (default 2048); longer prompts fail and are counted",
    )
    m.add_argument(
        "--max-num-seqs",
        dest="model.max_num_seqs",
        type=int,
        metavar="N",
        help="sequences batched per engine step (default 64); the dispatcher keeps at least this many in flight per replica",
    )
    m.add_argument(
        "--max-num-batched-tokens",
        dest="model.max_num_batched_tokens",
        type=int,
        metavar="N",
        help="tokens per engine step (default: what vllm.LLM uses on that device, e.g. 16384 on an H100)",
    )
    m.add_argument(
        "--tensor-parallel-size",
        dest="model.tensor_parallel_size",
        type=int,
        metavar="N",
        help="GPUs (or CPU workers) a replica's layers are split over (default 1)",
    )
    m.add_argument(
        "--pipeline-parallel-size",
        dest="model.pipeline_parallel_size",
        type=int,
        metavar="N",
        help="pipeline stages per replica (default 1)",
    )
    m.add_argument(
        "--gpu-memory-utilization",
        dest="model.gpu_memory_utilization",
        type=float,
        metavar="F",
        help="fraction of each GPU vLLM may use (default 0.9)",
    )
    m.add_argument(
        "--kv-cache-gib",
        dest="model.cpu_kv_cache_gib",
        type=int,
        metavar="GIB",
        help="KV cache per replica on CPU (default 1)",
    )
    m.add_argument(
        "--pin-engine-core",
        dest="model.pin_engine_core",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on GPUs, give each replica's vLLM engine-core process two CPU cores of its own, disjoint on a node "
        "(default on; --no-pin-engine-core on nodes shared with other CPU-heavy work)",
    )
    m.add_argument(
        "--chat-template",
        dest="model.chat_template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply the tokenizer's chat template (default: when the tokenizer has one)",
    )
    m.add_argument(
        "--enforce-eager",
        dest="model.enforce_eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the model eagerly: no torch.compile and no CUDA graphs (default: eager on CPU, where compiling "
        "costs more at start than it saves below ~20 minutes of generation; compiled on GPU)",
    )
    t = p.add_argument_group("tasks and sampling")
    t.add_argument(
        "--tasks",
        metavar="NAMES",
        help="comma-separated task names (default ifeval; `rayeval tasks` lists them)",
    )
    t.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="evaluate the first N questions of each task (default: all; 20 for the embedded demo model)",
    )
    t.add_argument(
        "--num-fewshot", type=int, metavar="K", help="few-shot examples per prompt (default: each task's own)"
    )
    t.add_argument(
        "--data-path",
        action="append",
        metavar="[TASK=]PATH",
        help="local data file/folder or hf://org/name for a task; repeat per task",
    )
    t.add_argument(
        "--num-samples", type=int, metavar="N", help="samples per question: scores are mean@N (default 1)"
    )
    t.add_argument(
        "--temperature",
        dest="sampling.temperature",
        type=float,
        help="sampling temperature (default 0 = greedy)",
    )
    t.add_argument("--top-p", dest="sampling.top_p", type=float, help="nucleus sampling (default 1.0)")
    t.add_argument(
        "--max-tokens",
        dest="sampling.max_tokens",
        type=int,
        metavar="N",
        help="max new tokens (default: each task's own)",
    )
    t.add_argument(
        "--seed",
        dest="sampling.seed",
        type=int,
        help="base seed; sample i of a question uses seed+i (default 1234)",
    )
    le = p.add_argument_group(
        "lm-eval tasks",
        "Any lm-eval task, group or tag runs by its lm-eval name (rayeval's own tasks win a name clash; "
        "lm_eval:NAME forces lm-eval's). These options mean what lm_eval's flags of the same name mean.",
    )
    le.add_argument(
        "--include-path",
        dest="lm_eval.include_path",
        action="append",
        metavar="DIR",
        help="folder of extra lm-eval task YAMLs (repeatable)",
    )
    le.add_argument(
        "--apply-chat-template",
        dest="lm_eval.apply_chat_template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="render lm-eval prompts with the model's chat template (default off, as in lm-eval)",
    )
    le.add_argument(
        "--fewshot-as-multiturn",
        dest="lm_eval.fewshot_as_multiturn",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="few-shot examples as chat turns (default: on with --apply-chat-template)",
    )
    le.add_argument(
        "--system-instruction", dest="lm_eval.system_instruction", metavar="TEXT", help="system prompt"
    )
    le.add_argument(
        "--gen-kwargs",
        dest="lm_eval.gen_kwargs",
        metavar="K=V,...",
        help="override generate_until tasks' generation kwargs, e.g. temperature=0.7,do_sample=True",
    )
    le.add_argument(
        "--max-gen-toks",
        dest="lm_eval.max_gen_toks",
        type=int,
        metavar="N",
        help="generation length where a task sets none (default 256)",
    )
    j = p.add_argument_group(
        "judge",
        "Judged tasks (alpaca_eval, arena_hard, healthbench, writingbench) need a judge. Judging starts on the "
        "first finished outputs while the rest are generating. An API key is read from the environment "
        "variable --judge-api-key-env names, never from a flag.",
    )
    j.add_argument(
        "--judge",
        dest="judge.model",
        metavar="local:PATH_OR_ID | openai:MODEL",
        help="local:M hosts judge model M on its own engine replicas; openai:M calls an OpenAI-compatible API",
    )
    j.add_argument(
        "--judge-replicas",
        dest="judge.replicas",
        type=int,
        metavar="N",
        help="local judge engine replicas, or API judge actors (default 1)",
    )
    j.add_argument(
        "--judge-base-url", dest="judge.base_url", metavar="URL", help="OpenAI-compatible endpoint (/v1)"
    )
    j.add_argument(
        "--judge-api-key-env",
        dest="judge.api_key_env",
        metavar="VAR",
        help="environment variable with the API key (default OPENAI_API_KEY)",
    )
    j.add_argument(
        "--judge-rps",
        dest="judge.requests_per_second",
        type=float,
        metavar="R",
        help="API requests per second, for the whole cluster (default 5)",
    )
    j.add_argument(
        "--judge-max-concurrency",
        dest="judge.max_concurrency",
        type=int,
        metavar="N",
        help="API requests in flight, for the whole cluster (default 8)",
    )
    j.add_argument(
        "--judge-timeout",
        dest="judge.timeout_s",
        type=float,
        metavar="S",
        help="API judges: seconds per attempt before it counts as a timeout and is retried (default 60)",
    )
    j.add_argument(
        "--judge-max-attempts",
        dest="judge.max_attempts",
        type=int,
        metavar="N",
        help="API judges: attempts per request on 429, 5xx and timeouts (default 6)",
    )
    j.add_argument(
        "--judge-second-pass-pause",
        dest="judge.second_pass_pause_s",
        type=float,
        metavar="S",
        help="API judges: judgments that still failed after every retry are asked once more after S quiet "
        "seconds at the end of judging, so a short outage costs no sample (default 5)",
    )
    j.add_argument(
        "--judge-max-tokens",
        dest="judge.max_tokens",
        type=int,
        metavar="N",
        help="judge answer length (default: each task's own)",
    )
    mode = j.add_mutually_exclusive_group()
    mode.add_argument(
        "--inference-only",
        action="store_true",
        help="generate outputs and stop: judged tasks are left unjudged (judge later with --judge-only)",
    )
    mode.add_argument(
        "--judge-only",
        action="store_true",
        help="judge the stored outputs of run --run-id without generating; its config.yaml is the base config",
    )
    c = p.add_argument_group("cluster")
    c.add_argument(
        "--address",
        dest="cluster.address",
        metavar="ADDR",
        help="connect to an existing Ray cluster (e.g. auto or ray://head:10001) instead of starting a local one",
    )
    c.add_argument(
        "--replicas",
        dest="cluster.replicas",
        type=int,
        metavar="N",
        help="engine replicas, each a full copy of the model (default 1)",
    )
    c.add_argument(
        "--device",
        dest="cluster.device",
        choices=["auto", "cpu", "gpu"],
        help="where engines run (default auto: GPU if the cluster has any)",
    )
    c.add_argument(
        "--cpus-per-worker",
        dest="cluster.cpus_per_worker",
        type=float,
        metavar="N",
        help="logical Ray CPUs per engine worker (default 1)",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--output-dir", dest="output_dir", metavar="DIR", help="where run folders go (default runs)"
    )
    o.add_argument(
        "--run-id",
        dest="run_id",
        metavar="ID",
        help="run folder name; reuse it to resume (default MODEL-TIMESTAMP)",
    )
    o.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved plan (tasks, samples, requests, replicas) and exit without starting engines",
    )
    o.add_argument(
        "--retry-failed",
        action="store_true",
        help="on resume, generate again the requests that failed last time (default: keep them as failed)",
    )
    o.add_argument(
        "--verbose", action="store_true", help="show Ray and vLLM logs, with vLLM's periodic engine stats"
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rayeval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    tasks = sub.add_parser("tasks", help="list the tasks with their data sources and metrics")
    tasks.add_argument(
        "--lm-eval",
        nargs="?",
        const="",
        metavar="SUBSTRING",
        help="list lm-eval's tasks, groups and tags instead (those containing SUBSTRING)",
    )
    tasks.add_argument(
        "--include-path", action="append", metavar="DIR", help="with --lm-eval: extra task folders"
    )
    v = sub.add_parser("validate", help="check a YAML run config and name every bad field")
    v.add_argument("config", metavar="FILE")
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    skip = {
        "command",
        "config",
        "data_path",
        "dry_run",
        "verbose",
        "no_progress",
        "retry_failed",
        "inference_only",
        "judge_only",
    }
    values = {k: v for k, v in vars(args).items() if k not in skip and v is not None}
    if "tasks" in values:
        values["tasks"] = [n.strip() for n in values["tasks"].split(",") if n.strip()]
    return values


def _flag_names() -> dict[str, str]:
    """Each `run` flag by the dotted setting it fills (`sampling.temperature` → `--temperature`), for messages."""
    run = _run_parser(_Parser(prog="rayeval").add_subparsers())
    return {action.dest: action.option_strings[0] for action in run._actions if action.option_strings}


def _apply_data_paths(config: RunConfig, data_paths: list[str] | None) -> None:
    """`--data-path TASK=PATH` (or a bare PATH when the run has one task) sets that task's data_path."""
    tasks = config.enabled_tasks()
    given: dict[str, str] = {}
    for entry in data_paths or []:
        name, sep, path = entry.partition("=")
        if not sep:
            if len(tasks) != 1:
                raise EvalInputError(
                    f"--data-path {entry} does not say which task it is for, and the run has {len(tasks)} tasks. "
                    "Write it as TASK=PATH, e.g. --data-path gsm8k=data/gsm8k/test.jsonl."
                )
            name, path = tasks[0].name, entry
        match = next((t for t in tasks if t.name == name), None)
        if match is None:
            raise EvalInputError(
                f"--data-path {entry} names task '{name}', which is not among the run's tasks "
                f"({', '.join(t.name for t in tasks)}). Add it to --tasks, or fix the name before '='."
            )
        if not path.strip():
            raise EvalInputError(
                f"--data-path {entry} gives no path. Write TASK=PATH, e.g. --data-path gsm8k=data/gsm8k/test.jsonl, "
                "or leave it out to use the task's default data."
            )
        if name in given:
            raise EvalInputError(
                f"--data-path is given twice for task '{name}' ({given[name]} and {path}). Keep one per task."
            )
        given[name] = match.data_path = path


def cmd_run(args: argparse.Namespace) -> int:
    from cluster.config import build_config, load_config_file

    source = args.config or COMMAND_LINE
    file_data = load_config_file(args.config) if args.config else {}
    if args.judge_only and not args.config:
        file_data, source = _stored_run_config(args)
    config = build_config(file_data, _overrides(args), source, _flag_names())
    _apply_data_paths(config, args.data_path)

    from cluster.plan import build_plan
    from cluster.preflight import preflight

    plan = build_plan(config, materialise_model=not args.dry_run)
    mode = "judge_only" if args.judge_only else "inference_only" if args.inference_only else "full"
    preflight(plan, mode)
    if args.dry_run:
        print(plan.describe())
        return 0

    from cluster.api import evaluate_plan

    result = evaluate_plan(
        plan, verbose=args.verbose, progress=not args.no_progress, retry_failed=args.retry_failed, mode=mode
    )
    print(result.table)
    print(
        f"results in {result.run_dir} ({result.requests_reused} of {result.requests_total} requests reused, "
        f"{result.requests_failed} failed, {result.wall_s:.1f} s)"
    )
    if result.task_errors:
        names = ", ".join(sorted(result.task_errors))
        print(
            f"rayeval: error: {len(result.task_errors)} task(s) could not run: {names}. The other tasks' results "
            "are complete; summary.json has each reason. Fix it and rerun the same command: finished work is reused.",
            file=sys.stderr,
        )
        return 1
    return 0


def _stored_run_config(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """--judge-only re-judges a finished run: its saved config.yaml says which model, tasks and N it used."""
    from pathlib import Path

    from cluster.config import load_config_file

    if not args.run_id:
        raise EvalInputError(
            "--judge-only needs --run-id: the run whose stored outputs are to be judged (a folder under "
            "--output-dir, default runs/)."
        )
    folder = Path(args.output_dir or "runs").expanduser() / args.run_id
    saved = folder / "config.yaml"
    if not saved.is_file():
        raise EvalInputError(
            f"--judge-only --run-id {args.run_id}: {saved} does not exist. Give the --run-id (and --output-dir) "
            "of a run made before, e.g. with --inference-only."
        )
    data = load_config_file(str(saved))
    data.pop("resolved_model_path", None)
    return data, str(saved)


def cmd_tasks(args: argparse.Namespace) -> int:
    from evaluators.tasks.registry import all_tasks

    if args.lm_eval is not None:
        from evaluators.lm_eval_tasks import LmEvalCatalog

        names = [n for n in LmEvalCatalog(args.include_path or []).manager.all_tasks if args.lm_eval in n]
        print("\n".join(names))
        print(f"({len(names)} lm-eval tasks, groups and tags; run any with --tasks NAME)", file=sys.stderr)
        return 0

    for task in all_tasks():
        metrics = ", ".join(m.key for m in task.metrics)
        print(f"{task.name} (v{task.version}): {task.description}")
        print(f"    data:    {task.source.description}")
        print(f"    fields:  {', '.join(task.source.required_fields)}")
        print(f"    metrics: {metrics}")
        print(f"    defaults: max_tokens={task.defaults.max_tokens} num_fewshot={task.defaults.num_fewshot}")
    print("\nlm-eval's task zoo runs too: `rayeval tasks --lm-eval [SUBSTRING]` lists it.")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a config without loading data or starting anything: its fields, task names, the model, the
    judge model, and that local data paths and task folders exist."""
    from cluster.config import build_config, load_config_file
    from cluster.models import resolve_model
    from evaluators.data import check_source
    from evaluators.lm_eval_tasks import LmEvalCatalog, resolve_task_name
    from evaluators.tasks.registry import TASKS

    config = build_config(load_config_file(args.config), {}, args.config)
    catalog = LmEvalCatalog(config.lm_eval.include_path)
    for task in config.tasks:
        resolved = resolve_task_name(task.name, TASKS, catalog)
        for path in (task.data_path, task.fewshot_path):
            if path and resolved.source == "lm_eval":
                raise EvalInputError(
                    f"{args.config}: task '{task.name}' is an lm-eval task, so data_path / fewshot_path do not "
                    "apply (its task YAML names its data). Remove them, or give a task folder with --include-path."
                )
            if path:
                check_source(path, task.name)
    resolve_model(
        config.model.path, materialise=False, label=f"{args.config}: model.path {config.model.path}"
    )
    if config.judge.kind == "local":
        resolve_model(
            config.judge.target, materialise=False, label=f"{args.config}: judge.model {config.judge.model}"
        )
    names = ", ".join(t.name + ("" if t.enabled else " (disabled)") for t in config.tasks)
    print(
        f"{args.config} is valid: tasks {names}; {config.cluster.replicas} replica(s); N={config.num_samples}"
    )
    return 0


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr, force=True)
    for name in ("cluster", "sharding", "evaluators"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(getattr(args, "verbose", False))
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "tasks":
            return cmd_tasks(args)
        return cmd_validate(args)
    except EvalInputError as exc:
        print(f"rayeval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "rayeval: interrupted. Rerun the same command (same --output-dir and --run-id) to resume.",
            file=sys.stderr,
        )
        return 130
    except Exception as exc:  # noqa: BLE001 - runtime failures get one readable paragraph, not a traceback
        from cluster.errors import ClusterError

        if isinstance(exc, ClusterError):
            print(f"rayeval: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
