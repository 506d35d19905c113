"""RD-Agent's benchmark step on rayeval: `run_benchmark` has the signature and return value of RD-Agent 1.0.0's
`rdagent.scenarios.finetune.benchmark.run_benchmark` (which runs OpenCompass in a container) and writes the
folder that function reads: `<workspace>/benchmark_results[/<result_subdir>]/<timestamp>/` in OpenCompass's
layout (`evaluators.opencompass_layout`), with rayeval's own run folder beside it (`.../rayeval/`).

As RD-Agent does, an existing timestamped folder means the benchmark already ran: it is read, nothing runs.
The model is a full model folder, or a LoRA adapter (found by its files) on the base model `model_name` names:
that folder itself, or `models/<model_name>` under RD-Agent's file_path (`$FT_FILE_PATH`, else
`git_ignore_folder/finetune_files` where it runs), or the adapter's own `base_model_name_or_path` where that
is a folder (one under RD-Agent's container mount /assets/models is looked up in that models folder). An
adapter that trains whole modules (`modules_to_save`, which vLLM cannot serve) is merged into the base model
first, as RD-Agent merges it; with `lora_merge` every adapter is (base-model speed, where vLLM's LoRA layers
are slow). Sampling is RD-Agent's for the base model (`rdagent_sampling`); a test_range applies to each
dataset, as OpenCompass applies it (to each subtask of an lm-eval group). The run goes to the Ray cluster `address`
names (or RAY_ADDRESS; else a local one), on a warm pool whose settings match where one is up.

`install(**settings)` puts this `run_benchmark` where RD-Agent's callers look it up, so an RD-Agent launch
script switches with one call and no edit of RD-Agent's files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cluster.errors import ClusterError
from evaluators.errors import EvalInputError
from evaluators.opencompass_layout import read_accuracy_summary, wrong_answers
from evaluators.ranges import DatasetRange

# RD-Agent's benchmark names rayeval runs, and the task each runs as (rayeval's own, or lm-eval's).
SUPPORTED_BENCHMARKS: dict[str, str] = {
    "gsm8k": "gsm8k",
    "ifeval": "ifeval",
    "math": "minerva_math",
    "mmlu": "mmlu",
}
RDAGENT_DOCKER_MODELS = "/assets/models"  # the models' mount in RD-Agent's container (FT_MODEL_PATH)
# RD-Agent's inference settings (its configs/models.yaml `default`) where its own lookup is not at hand
RDAGENT_DEFAULT_INFERENCE = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "max_seq_len": 32768,
    "max_out_len": 8192,
    "repetition_penalty": 1.0,
    "enable_thinking": False,
    "use_cot_postprocessor": True,
}
RDAGENT_BENCHMARK_MODULE = "rdagent.scenarios.finetune.benchmark.benchmark"
RDAGENT_SETTINGS_MODULE = "rdagent.app.finetune.llm.conf"  # FT_RD_SETTING, its file_path fixed at import
# where the thinking of an output ends, for OpenCompass's extract-non-reasoning-content that RD-Agent applies
THINK_END_TOKEN = "</think>"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
# Where RD-Agent's callers find run_benchmark (each imports it by name at its own import).
RDAGENT_MODULES = (
    "rdagent.scenarios.finetune.benchmark",
    "rdagent.scenarios.finetune.benchmark.benchmark",
    "rdagent.scenarios.finetune.train.eval",
    "rdagent.scenarios.finetune.scen.scenario",
)

# the settings run_benchmark, run_benchmarks and install take beside RD-Agent's own arguments
SETTINGS = ("address", "data_paths", "config", "lora_merge")

log = logging.getLogger(__name__)
_installed_settings: dict[str, Any] = {}
# RD-Agent's own run_benchmark, kept by `install` for the benchmarks rayeval does not run (aime25, humaneval...)
_rdagent_own: dict[str, Any] = {}


def run_benchmark(
    workspace_path: str,
    model_path: str,
    model_name: str,
    benchmark_name: str,
    gpu_count: int,
    test_range: str | None = "[:100]",
    num_runs: int = 1,
    pass_k: list[int] | None = None,
    max_error_samples: int = 10,
    result_subdir: str = "",
    **settings: Any,
) -> dict[str, Any]:
    """Benchmark `model_path` on `benchmark_name` as RD-Agent's function does; returns
    `{"accuracy_summary": {dataset: {metric: percent}}, "error_samples": [{question, gold, model_output}]}`.

    `settings` (or `install`'s): `address` (the Ray cluster), `data_paths` ({benchmark: local data file}),
    `config` (more RunConfig settings, e.g. {"sampling": {"max_tokens": 512}}), `lora_merge` (True: a LoRA
    adapter is merged into its base model and run as a full model, `cluster.models.merge`; on CPU vLLM's LoRA
    layers run at about a third of the base model's speed; outputs equal up to the merge's rounding). Bad input
    raises RuntimeError
    in RD-Agent's shape ("Benchmark execution failed ...") before anything is written."""
    settings = {**_installed_settings, **settings}
    with _as_rdagent_failure():
        check_settings(settings)
    own = _rdagents_own_for(benchmark_name)
    if own is not None:
        log.info("RD-Agent's own run_benchmark (OpenCompass) runs %s: rayeval runs %s", benchmark_name,
                 ", ".join(sorted(SUPPORTED_BENCHMARKS)))  # fmt: skip
        return own(workspace_path, model_path, model_name, benchmark_name, gpu_count, test_range, num_runs,
                   pass_k, max_error_samples, result_subdir)  # fmt: skip
    results_base = _results_base(workspace_path, result_subdir)
    with _as_rdagent_failure():
        done = _finished_runs(results_base)
        if not done:
            config = benchmark_config(
                model_path, model_name, benchmark_name, gpu_count, test_range, num_runs, pass_k, results_base,
                settings,
            )  # fmt: skip
            _run(config)
            done = _finished_runs(results_base)
        return {
            "accuracy_summary": read_accuracy_summary(done[0]),
            "error_samples": wrong_answers(done[0], max_error_samples),
        }


def run_benchmarks(calls: list[Mapping[str, Any]], **settings: Any) -> list[dict[str, Any]]:
    """Several `run_benchmark` calls of one round (the agent's candidate adapters of one base model, each
    with its workspace) at once: their requests meet in the same base-model replicas, each adapter served by
    vLLM's multi-LoRA engine beside the others (a LoRA sweep's way); with `lora_merge`, each adapter merged
    into the base model and the candidates run one after another on the same replicas, each moving to the next
    merged model in place (a full-checkpoint sweep's way). Each call's folder and return value are those of
    `run_benchmark(**call)`; calls whose folder is already there run nothing."""
    settings = {**_installed_settings, **settings}
    with _as_rdagent_failure():
        check_settings(settings)
    pending = []
    for call in calls:
        arguments = {**call, **settings}
        base = _results_base(str(call["workspace_path"]), str(call.get("result_subdir", "")))
        if _rdagents_own_for(call["benchmark_name"]) is None and not _finished_runs(base):
            pending.append(_call_config(arguments, base))
    if pending:
        with _as_rdagent_failure():
            _run_together(pending, in_turn=bool(settings.get("lora_merge")))
    return [run_benchmark(**call, **settings) for call in calls]


@contextmanager
def _as_rdagent_failure() -> Iterator[None]:
    """Bad input or a cluster failure inside, raised in RD-Agent's shape (its run_benchmark's RuntimeError)."""
    try:
        yield
    except (EvalInputError, ClusterError) as exc:
        raise RuntimeError(f"Benchmark execution failed (exit_code=2)\n{exc}") from exc


def _rdagents_own_for(benchmark_name: str) -> Any:
    """RD-Agent's own run_benchmark where it runs this benchmark instead (one rayeval does not run, once
    `install` kept RD-Agent's function); None where rayeval runs it."""
    return None if benchmark_name in SUPPORTED_BENCHMARKS else _rdagent_own.get("run_benchmark")


def benchmark_config(
    model_path: str,
    model_name: str,
    benchmark_name: str,
    gpu_count: int,
    test_range: str | None,
    num_runs: int,
    pass_k: list[int] | None,
    results_base: Path,
    settings: Mapping[str, Any],
) -> Any:
    """The RunConfig of one RD-Agent benchmark call (checked; nothing written)."""
    from cluster.config import TaskOptions, build_config

    task = SUPPORTED_BENCHMARKS.get(benchmark_name)
    if task is None:
        raise EvalInputError(
            f"rayeval has no benchmark named {benchmark_name!r}: it runs {', '.join(sorted(SUPPORTED_BENCHMARKS))}. "
            "Use RD-Agent's own run_benchmark (OpenCompass) for the others: after `install()` a call naming one "
            "goes to it."
        )
    model, lora = _model_and_adapter(Path(model_path), model_name)
    if lora is not None and settings.get("lora_merge"):
        model, lora = _merged(Path(lora), model), None
    entry: dict[str, Any] = {"name": task}
    if data := (settings.get("data_paths") or {}).get(benchmark_name):
        entry["data_path"] = str(data)
    if test_range:  # rayeval's tasks take it over their dataset; lm-eval's (math, mmlu) over each subtask's
        DatasetRange.parse(test_range)  # a bad range is refused before anything runs
        entry["test_range"] = test_range
    # RD-Agent's sampling as the task's own options, which lm-eval's generating tasks take too (they read no
    # run-wide sampling); a `config` of the caller that sets a sampling field wins over RD-Agent's for it
    inference = rdagent_inference(model_name, gpu_count)
    chosen = (settings.get("config") or {}).get("sampling") or {}
    per_task = {key: value for key, value in chosen.items() if key in TaskOptions.model_fields}
    engine = rdagent_model(inference, model)
    asked = ((settings.get("config") or {}).get("model") or {}).get("max_model_len")  # the caller's wins
    entry |= rdagent_sampling(inference, int(asked or engine["max_model_len"])) | per_task
    values: dict[str, Any] = {
        "model": {"path": model, "lora": lora, "tensor_parallel_size": 1} | engine,
        "tasks": [entry],
        "num_samples": num_runs,
        "output_dir": str(results_base / "rayeval"),
        "run_id": f"ft-{benchmark_name}",
        "output_layout": "opencompass",
        "work_dir": str(results_base),
        "model_abbr": f"ft-{benchmark_name}",
        "pass_k": list(pass_k or []),
        "cluster": {"address": settings.get("address") or os.environ.get("RAY_ADDRESS") or None},
    }
    if gpu_count > 1:  # RD-Agent's tensor parallel size: the largest power of two that fits the GPUs
        values["model"]["tensor_parallel_size"] = 1 << (gpu_count.bit_length() - 1)
    merged = _merge(values, dict(settings.get("config") or {}))
    return build_config(merged, source="RD-Agent's call with config=")


def check_settings(settings: Mapping[str, Any]) -> None:
    """Settings are those SETTINGS names: a misspelt one (`adress`) would otherwise be dropped unseen."""
    import difflib

    for key in settings:
        if key not in SETTINGS:
            close = difflib.get_close_matches(key, SETTINGS, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EvalInputError(
                f"rayeval's RD-Agent settings have no {key!r}{hint}: they are {', '.join(SETTINGS)}; other run "
                "settings go in config={...} (e.g. config={'cluster': {'replicas': 4}})."
            )


def install(**settings: Any) -> None:
    """Make RD-Agent's benchmark step call rayeval's `run_benchmark` (with these settings, as `run_benchmark`
    takes them), in every RD-Agent module that holds it, imported now or later. RD-Agent's own function is
    kept for the benchmarks rayeval does not run: a call naming one goes to it (OpenCompass, as before)."""
    import importlib

    check_settings(settings)
    _installed_settings.clear()
    _installed_settings.update(settings)
    for name in RDAGENT_MODULES:
        try:
            module = sys.modules.get(name) or importlib.import_module(name)
        except ImportError as exc:
            if name == RDAGENT_MODULES[0]:
                raise EvalInputError(
                    f"install() patches RD-Agent, which does not import here ({exc}). Install rdagent in this "
                    "environment, or call cluster.integrations.rdagent.run_benchmark directly."
                ) from exc
            continue  # a caller module that needs more of RD-Agent than is installed is not a caller here
        own = getattr(module, "run_benchmark", None)
        if own is not None and own is not run_benchmark:
            _rdagent_own.setdefault("run_benchmark", own)
        module.run_benchmark = run_benchmark  # type: ignore[attr-defined]


def _run(config: Any) -> None:
    from cluster.api import evaluate

    result = evaluate(config, progress=False)
    _check_every_task_ran(config, result)
    if result.requests_failed:
        log.warning(
            "%d samples failed: left out of accuracy and pass@k, listed among the wrong answers (reasons: "
            "%s/summary.json)", result.requests_failed, result.run_dir,
        )  # fmt: skip


def _results_base(workspace_path: str, result_subdir: str) -> Path:
    """Where RD-Agent looks for a call's results: benchmark_results[/<result_subdir>] of its workspace."""
    base = Path(workspace_path) / "benchmark_results"
    return base / result_subdir if result_subdir else base


def _call_config(arguments: Mapping[str, Any], results_base: Path) -> Any:
    """The RunConfig of one call given as run_benchmark's keyword arguments."""
    names = ("model_path", "model_name", "benchmark_name", "gpu_count")
    options = {"test_range": "[:100]", "num_runs": 1, "pass_k": None} | {
        k: arguments[k] for k in ("test_range", "num_runs", "pass_k") if k in arguments
    }
    settings = {k: v for k, v in arguments.items() if k in SETTINGS}
    return benchmark_config(
        *(arguments[n] for n in names), **options, results_base=results_base, settings=settings
    )


def _run_together(configs: list[Any], in_turn: bool) -> None:
    """Runs on one set of replicas: at once, of one base model (each adapter a LoRA slot), or `in_turn`, each
    run's model (merged adapters) loaded into the replicas in place before it runs."""
    from concurrent.futures import ThreadPoolExecutor, wait

    from cluster.plan import build_plan
    from cluster.preflight import preflight
    from cluster.run import SharedReplicas, run_evaluation
    from cluster.session import ray_session

    plans = [build_plan(config) for config in configs]
    models = {plan.model.path for plan in plans}
    if len(models) > 1 and not in_turn:
        raise EvalInputError(
            f"one round's candidates share one base model; these calls name {sorted(models)}"
        )
    for plan in plans:
        preflight(plan)
    first = plans[0]
    with ray_session(first.config.cluster.address, first.replica, first.config.cluster.replicas, False):
        lora = any(p.adapter for p in plans)
        shared = SharedReplicas(first, max_loras=1 if in_turn else len(plans), lora=lora)
        try:
            # in turn, the first failure stops the round (the replicas would fail the next run the same way)
            if in_turn:
                for plan in plans:
                    _check_every_task_ran(plan.config, run_evaluation(plan, progress=False, shared=shared))
                return
            with ThreadPoolExecutor(len(plans), thread_name_prefix="candidate") as threads:
                runs = [threads.submit(run_evaluation, plan, progress=False, shared=shared) for plan in plans]
                wait(runs)
        finally:
            shared.close()
        # every candidate that ran with a task that could not run loses its folder before the round fails
        failures = [
            _unfinished(p.config, r.result()) for p, r in zip(plans, runs, strict=True) if not r.exception()
        ]
        for run in runs:
            if run.exception() is not None:
                raise run.exception()  # type: ignore[misc]
        if any(failures):
            raise ClusterError("; ".join(failure for failure in failures if failure))


def _check_every_task_ran(config: Any, result: Any) -> None:
    """A benchmark whose task could not run at all (lm-eval failed to load or score it) is a failed call, as
    RD-Agent's own run_benchmark makes it: the results folder its layout wrote holds no numbers for it and
    is removed, so the next call runs it again instead of reading that folder as done."""
    failure = _unfinished(config, result)
    if failure:
        raise ClusterError(failure)


def _unfinished(config: Any, result: Any) -> str:
    """Why a call's benchmark could not run ("" where it ran), its results folder removed where so."""
    if not result.task_errors:
        return ""
    for folder in _finished_runs(Path(config.work_dir)):
        shutil.rmtree(folder, ignore_errors=True)
    return (
        "; ".join(f"{task} could not run: {error}" for task, error in sorted(result.task_errors.items()))
        + f" (the run's folder, kept for a rerun: {result.run_dir})"
    )


def _finished_runs(results_base: Path) -> list[Path]:
    """RD-Agent's rule: timestamped folders of an earlier call, newest first."""
    return sorted((d for d in results_base.glob("202*_*") if d.is_dir()), reverse=True)


def _model_and_adapter(model_path: Path, model_name: str) -> tuple[str, str | None]:
    """(model folder, adapter folder or None) for RD-Agent's model_path and model_name."""
    if not model_path.is_dir():
        raise EvalInputError(
            f"model_path {model_path} is not a folder: pass the trained model or adapter folder"
        )
    if not any((model_path / name).is_file() for name in ADAPTER_FILES):
        return str(model_path), None
    config_file = model_path / "adapter_config.json"
    if not config_file.is_file():
        raise EvalInputError(
            f"{model_path} holds adapter weights but no adapter_config.json (peft writes both)"
        )
    config = json.loads(config_file.read_text())
    models = rdagent_models_folder()
    candidates = [Path(model_name), models / model_name]
    if base := config.get("base_model_name_or_path"):
        candidates.append(Path(base))
        if Path(base).is_relative_to(RDAGENT_DOCKER_MODELS):  # trained in RD-Agent's container
            candidates.append(models / Path(base).relative_to(RDAGENT_DOCKER_MODELS))
    found = next((str(c) for c in candidates if (c / "config.json").is_file()), model_name)  # else a hub id
    if config.get("modules_to_save"):
        return _merged(model_path, found), None
    return found, str(model_path)


def rdagent_inference(model_name: str, gpu_count: int) -> dict[str, Any]:
    """RD-Agent's inference settings for this base model: read by RD-Agent's own get_model_inference_config
    (its models.yaml: exact name, then longest prefix, over its `default`) where RD-Agent is imported in this
    process, as it is once `install` ran; its `default` otherwise."""
    module = sys.modules.get(RDAGENT_BENCHMARK_MODULE)
    found = module.get_model_inference_config(model_name, gpu_count) if module is not None else {}
    return RDAGENT_DEFAULT_INFERENCE | found


def rdagent_sampling(inference: Mapping[str, Any], context: int) -> dict[str, Any]:
    """RD-Agent's inference settings as rayeval's sampling (temperature, top_p, top_k, repetition_penalty,
    and max_out_len as max_tokens; top_k and the penalty where they change sampling). Where the engines'
    `context` is cut below RD-Agent's max_seq_len (`rdagent_model`) and max_out_len would fill it, replies
    get half of it: lm-eval's tasks keep a prompt's last max_model_len - max_tokens tokens, none at all
    otherwise."""
    top_k = inference.get("top_k")
    penalty = inference.get("repetition_penalty")
    max_tokens = int(inference["max_out_len"])
    if max_tokens >= context:
        log.warning(
            "RD-Agent's max_out_len %d fills the engines' %d-token context: replies get up to %d tokens",
            max_tokens, context, context // 2,
        )  # fmt: skip
        max_tokens = context // 2
    return {
        "temperature": float(inference["temperature"]),
        "top_p": float(inference["top_p"]),
        "max_tokens": max_tokens,
        **({"top_k": int(top_k)} if top_k is not None and int(top_k) > 0 else {}),
        **({"repetition_penalty": float(penalty)} if penalty is not None and float(penalty) != 1.0 else {}),
    }


def rdagent_model(inference: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The engine context and the thinking rule RD-Agent's OpenCompass config gives the model: vLLM's
    max_model_len is its max_seq_len (cut to what a local model declares, where less: vLLM would refuse more,
    as it refuses RD-Agent's own run), and where RD-Agent strips the thinking from outputs before scoring
    (`enable_thinking`, or `use_cot_postprocessor` with its force_think_token setting) they are scored on what
    follows `</think>`."""
    from cluster.models import declared_context_length

    context = int(inference["max_seq_len"])
    declared = declared_context_length(Path(model))
    if declared is not None and declared[1] < context:
        log.warning(
            "RD-Agent's max_seq_len %d is longer than %s declares (%s = %d): the engines use %d",
            context, model, declared[0], declared[1], declared[1],
        )  # fmt: skip
        context = declared[1]
    thinking = inference.get("enable_thinking") or (
        inference.get("use_cot_postprocessor") and rdagent_forces_think_token()
    )
    return {"max_model_len": context, **({"think_end_token": THINK_END_TOKEN} if thinking else {})}


def rdagent_forces_think_token() -> bool:
    """RD-Agent's force_think_token setting (FT_FORCE_THINK_TOKEN): its settings as imported here, else the
    variable read as pydantic-settings reads a bool."""
    settings = getattr(sys.modules.get(RDAGENT_SETTINGS_MODULE), "FT_RD_SETTING", None)
    if settings is not None:
        return bool(getattr(settings, "force_think_token", False))
    return os.environ.get("FT_FORCE_THINK_TOKEN", "").strip().lower() in {"1", "true", "yes", "on", "y", "t"}


def rdagent_models_folder() -> Path:
    """Where RD-Agent keeps its base models outside its container: its settings' file_path (as RD-Agent,
    imported here, holds it; else FT_FILE_PATH, else `git_ignore_folder/finetune_files` under the folder it
    runs from), then `models`."""
    settings = getattr(sys.modules.get(RDAGENT_SETTINGS_MODULE), "FT_RD_SETTING", None)
    if settings is not None:
        return Path(settings.file_path) / "models"
    return (
        Path(os.environ.get("FT_FILE_PATH") or Path.cwd() / "git_ignore_folder" / "finetune_files") / "models"
    )


def _merged(adapter: Path, base: str) -> str:
    """The adapter merged into its base model (`cluster.models.merge`; made once, then reused): one that trains
    whole modules beside its LoRA (vLLM cannot serve those, RD-Agent merges it first), or any with
    `lora_merge`."""
    from cluster.models import load_adapter, merged_checkpoint, resolve_model

    base_folder = Path(resolve_model(base).path)
    digest = load_adapter(str(adapter), base_folder, None).digest
    log.info("merging the adapter %s into %s", adapter, base_folder)
    return str(merged_checkpoint(adapter, base_folder, digest))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = (
            _merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged
