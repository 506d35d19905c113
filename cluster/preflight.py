"""Checks made before Ray or any engine starts: whatever would fail minutes later fails now, with the numbers.

Each check raises `EvalInputError` naming the setting, the value and what would fix it. They read the plan
and this machine only (cores, memory, the output folder), so a `--dry-run` makes them too.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import psutil

from cluster.addresses import check_address_reachable
from cluster.config import RunMode
from cluster.judging import check_judge, judged_task_names, local_judge_replicas
from cluster.models import check_context_length, resolve_model
from cluster.plan import RunPlan
from evaluators.errors import EvalInputError
from evaluators.lm_eval_tasks import LOGLIKELIHOOD_OUTPUT_TYPES

GIB = 1 << 30

log = logging.getLogger(__name__)


def preflight(plan: RunPlan) -> None:
    """Every check of this module; the cluster address last, since it touches the network."""
    check_context_length(plan.model, plan.config.model.max_model_len)
    warn_replies_end_at_the_context(plan)
    warn_lm_eval_options_unused(plan)
    warn_keep_warm_on_a_local_cluster(plan)
    check_endpoint(plan)
    check_lora_loglikelihoods(plan)
    check_adaptive(plan)
    check_judge_inputs(plan)
    check_output_location(plan.config.output_dir)
    check_batched_tokens(plan)
    check_local_replicas(plan)
    check_local_gpus(plan)
    check_kv_cache_fits(plan)
    check_trackers(plan.config.log_to)
    check_address_reachable(plan.config.cluster.address, starts_local=True)


def warn_replies_end_at_the_context(plan: RunPlan) -> None:
    """A warning, not an error: vLLM ends a reply where prompt and reply fill --max-model-len, so a --max-tokens
    of at least that is never what stops a reply (the run is valid, its limit is not the one asked)."""
    max_tokens, context = plan.config.sampling.max_tokens, plan.config.model.max_model_len
    if plan.model.endpoint:
        return
    if max_tokens is not None and max_tokens >= context:
        log.warning(
            "--max-tokens %d is not below --max-model-len %d: each reply ends where its prompt and it fill the "
            "%d-token context, before %d tokens. Raise --max-model-len or lower --max-tokens to set the limit.",
            max_tokens, context, context, max_tokens,
        )  # fmt: skip
        return
    # a task's own reply length (arena_hard's and writingbench's 2,048) where --max-tokens leaves it
    own = [f"{t.task.name} {t.sampling.max_tokens}" for t in plan.tasks if t.sampling.max_tokens >= context]
    if own:
        log.warning(
            "the replies' own max_tokens (%s) is not below --max-model-len %d: each reply ends where its prompt "
            "and it fill the %d-token context, shorter than the task asks. Raise --max-model-len (to the prompt's "
            "length plus the reply's) or lower --max-tokens to set the limit.",
            ", ".join(own), context, context,
        )  # fmt: skip


def warn_lm_eval_options_unused(plan: RunPlan) -> None:
    """A warning: lm-eval's prompt and generation flags apply to lm-eval's tasks only, and the run has none."""
    options = plan.config.lm_eval
    given = [
        flag
        for flag, value in (
            ("--system-instruction", options.system_instruction),
            ("--gen-kwargs", options.gen_kwargs),
            ("--apply-chat-template", options.apply_chat_template),
            ("--fewshot-as-multiturn", options.fewshot_as_multiturn),
        )
        if value
    ]
    if given and not plan.lm_eval_tasks:
        log.warning(
            "lm-eval's prompt and generation flags (%s) apply to lm-eval's tasks only, and this run has none (%s: "
            "rayeval's own, prompted as their benchmarks are; their sampling flags are --temperature, "
            "--max-tokens, --top-p).",
            ", ".join(given), ", ".join(t.task.name for t in plan.tasks),
        )  # fmt: skip


def warn_keep_warm_on_a_local_cluster(plan: RunPlan) -> None:
    """A warning: --keep-warm leaves engines for the next run on the cluster, but the local cluster a command
    starts (no --address, no open Ray session) goes away when it exits, the engines with it."""
    cluster = plan.config.cluster
    ray = sys.modules.get("ray")
    in_session = ray is not None and ray.is_initialized()
    if cluster.keep_warm_s and not cluster.address and not in_session and not plan.model.endpoint:
        log.warning(
            "--keep-warm keeps engines on a cluster that outlives the command, but this run starts a local one "
            "that stops when it exits. Start a cluster (`ray start --head`) and pass --address auto, or use "
            "`rayeval up` there."
        )


def check_trackers(log_to: list[str]) -> None:
    """Each --log-to tracker that the run will reach over the network answers now, not at the run's end."""
    from cluster.exporters import tracker_problem

    for value in log_to:
        if problem := tracker_problem(value):
            raise EvalInputError(f"--log-to {value}: {problem}. Start it, fix the URI, or drop --log-to.")


def check_endpoint(plan: RunPlan) -> None:
    """A model behind an endpoint: its API key at hand; for lm-eval tasks, a tokenizer here (their prompts are
    tokenised before they are sent) and, where a task scores log-likelihoods, a server that returns prompt
    logprobs (one probe request)."""
    if not plan.model.endpoint:
        return
    from cluster.endpoints import ApiSettings, read_api_key

    settings = ApiSettings.from_endpoint_options(plan.config.model, plan.config.endpoint)
    api_key = read_api_key(settings)
    if not plan.lm_eval_tasks:
        return
    names = ", ".join(t.name for t in plan.lm_eval_tasks)
    token_ids = endpoint_tokenizer_ids(plan, names)
    scored = loglikelihood_task_names(plan)
    if scored:
        from cluster.endpoints import prompt_logprobs_problem

        problem = prompt_logprobs_problem(settings, api_key, token_ids)
        if problem:
            raise EvalInputError(
                f"lm-eval task(s) {', '.join(scored)} score answers by log-likelihood, which needs the endpoint "
                f"to return prompt logprobs (vLLM's server and `rayeval serve` do), but {settings.base_url} "
                f"does not for '{settings.model}': {problem}. Run only generate_until tasks against it, or run "
                "the model on rayeval's own engines (--model PATH)."
            )


def loglikelihood_task_names(plan: RunPlan) -> list[str]:
    """The run's lm-eval tasks that score answers by log-likelihood (any member that does, for a group), by
    lm-eval's index; a task of no known type counts as one."""
    catalog = plan.lm_eval_catalog
    return [
        t.name
        for t in plan.lm_eval_tasks
        if catalog is None or catalog.output_types(t.name) & (LOGLIKELIHOOD_OUTPUT_TYPES | {"unknown"})
    ]


def check_lora_loglikelihoods(plan: RunPlan) -> None:
    """vLLM cannot compute prompt log-probabilities on an engine with LoRA enabled: its LoRA logits layer
    fails on prompt positions and the engine dies (vllm-project/vllm#29955)."""
    if plan.adapter is None or not plan.lm_eval_tasks:
        return
    scored = loglikelihood_task_names(plan)
    if scored:
        raise EvalInputError(
            f"lm-eval task(s) {', '.join(scored)} score answers by log-likelihood, which vLLM cannot compute on "
            f"an engine with a LoRA adapter (--lora {plan.config.model.lora}): its LoRA logits layer fails on "
            "prompt positions and the engine dies. Merge the adapter into a full checkpoint (peft's "
            "merge_and_unload, or `rayeval sweep --lora-merge`) and evaluate that, or run only generate_until "
            "tasks with --lora."
        )


def endpoint_tokenizer_ids(plan: RunPlan, names: str) -> list[int]:
    """Load the tokenizer lm-eval tasks use for a model behind an endpoint; a few token ids of it to probe with."""
    path = plan.tokenizer_path
    if path is None:
        raise EvalInputError(
            f"lm-eval task(s) {names} tokenise their prompts here before sending them to the endpoint, and "
            f"'{plan.config.model.endpoint_model}' names no model folder here: pass --tokenizer with the served "
            "model's folder or hub id."
        )
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, hub errors: all mean "not a tokenizer"
        first = next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
        raise EvalInputError(
            f"--tokenizer {path}: no tokenizer could be loaded from it ({first[:300]}). Give the served model's "
            "folder (its tokenizer files) or hub id."
        ) from None
    return list(tokenizer("The capital of France is Paris.").input_ids)


def check_adaptive(plan: RunPlan) -> None:
    """Adaptive N draws more samples where answers vary: greedy tasks (temperature 0) never vary. A cap that
    leaves no sample to add is said (a warning: a saved run's config stays loadable)."""
    sampling = plan.config.sampling
    if sampling.target_sem is None:
        return
    if sampling.max_samples <= plan.config.num_samples:
        log.warning(
            "--max-samples %d is not above the %d samples a question gets first, so adaptive N (--target-sem %g) "
            "adds none: raise --max-samples.",
            sampling.max_samples, plan.config.num_samples, sampling.target_sem,
        )  # fmt: skip
    greedy = [t.task.name for t in plan.tasks if t.sampling.temperature == 0]
    if greedy:
        raise EvalInputError(
            f"--target-sem (adaptive N) needs sampled answers, but task(s) {', '.join(greedy)} decode greedily "
            "(temperature 0), so every sample of a question is the same. Pass --temperature, e.g. 0.7."
        )


def check_output_location(output_dir: str) -> None:
    """A local output folder can be made and written; a folder on a store takes a write (a probe object
    written, read back and deleted, with this node's credentials)."""
    from cluster.storage.location import RemoteFolder, is_remote, local_path

    if is_remote(output_dir):
        from cluster.storage import probe_writable

        probe_writable(RemoteFolder.parse(output_dir))
    else:
        check_output_dir(local_path(output_dir))


def check_output_dir(output_dir: Path) -> None:
    """The output folder is a folder, or can be made: no file on its path, its nearest existing parent a
    writable folder on a writable filesystem."""
    existing = output_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    fix = "Pass --output-dir a folder you can write to (it is made if missing)."
    if existing.exists() and not existing.is_dir():
        what = "is a file" if existing == output_dir else f"cannot be made: {existing} is a file"
        raise EvalInputError(f"--output-dir {output_dir} {what}. {fix}")
    if not os.access(existing, os.W_OK | os.X_OK) or _read_only(existing):
        what = "is not writable" if existing == output_dir else f"cannot be made: {existing} is not writable"
        raise EvalInputError(f"--output-dir {output_dir} {what}. {fix}")


def _read_only(path: Path) -> bool:
    """A read-only mount (root ignores permission bits, so os.access says yes to it)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_batched_tokens(plan: RunPlan) -> None:
    """On CPU every prompt is prefilled in one engine step (cluster.engines.actor: no chunked prefill there), so a
    step must hold the longest prompt."""
    model = plan.config.model
    if plan.device != "cpu" or model.max_num_batched_tokens is None:
        return
    if model.max_num_batched_tokens < model.max_model_len:
        raise EvalInputError(
            f"--max-num-batched-tokens {model.max_num_batched_tokens} is below --max-model-len "
            f"{model.max_model_len}: on CPU a prompt is prefilled in one engine step, so a step must hold "
            f"max_model_len tokens. Raise --max-num-batched-tokens to at least {model.max_model_len}, lower "
            "--max-model-len, or leave --max-num-batched-tokens out."
        )


def check_local_gpus(plan: RunPlan) -> None:
    """--device gpu on the local cluster rayeval starts needs a GPU here (Ray would wait for one that never
    comes: the replicas' placement timeout, minutes)."""
    if plan.config.cluster.address is not None or plan.device != "gpu" or plan.model.endpoint:
        return
    from cluster.engines.devices import local_gpus_visible, visible_gpu_count

    if not local_gpus_visible():
        raise EvalInputError(
            "--device gpu, but this machine has no GPU that torch can use (or a CPU build of torch), and without "
            "--address rayeval starts a local cluster of this machine. Leave --device out (auto: CPU here), or "
            "pass --address of a cluster with GPUs."
        )
    gpus, workers = visible_gpu_count(), _local_engines(plan) * plan.replica.workers
    if gpus is not None and workers > gpus:
        raise EvalInputError(
            f"{_engines_asked(plan, workers=True)} needs {workers} GPUs, one per engine worker, but this machine "
            f"has {gpus}. {_fewer(plan, gpus, plan.replica.workers)}, or pass --address of a Ray cluster with "
            "more GPUs."
        )


def _local_cpu_run(plan: RunPlan) -> bool:
    """Whether rayeval starts CPU engines of the model on this machine (none for a model behind an endpoint)."""
    return plan.config.cluster.address is None and plan.device == "cpu" and not plan.model.endpoint


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def check_local_replicas(plan: RunPlan) -> None:
    """A local cluster that rayeval starts holds one CPU replica per core at most: each replica's engine
    threads are bound to cores of their own (its tensor-parallel workers share them), and more replicas than
    cores only thrash (or crash Ray)."""
    if not _local_cpu_run(plan):
        return
    cores, engines = usable_cores(), _local_engines(plan)
    if engines > cores:  # a replica's tensor-parallel workers share its cores
        raise EvalInputError(
            f"{_engines_asked(plan, workers=False)} asks for {engines} CPU engine replicas, but this machine has "
            f"{cores} usable core(s) and a local cluster holds one CPU replica per core. "
            f"{_fewer(plan, cores, 1)}, or pass --address of a Ray cluster with more nodes."
        )


def _model_replicas(plan: RunPlan) -> int:
    """The model's engine replicas the run starts: none for a --judge-only run."""
    return 0 if plan.config.mode is RunMode.JUDGE_ONLY else plan.config.cluster.replicas


def _local_engines(plan: RunPlan) -> int:
    """Engine replicas the run starts here, the model's and a local judge's (built as the model's: as many
    tensor-parallel × pipeline-parallel workers each)."""
    return _model_replicas(plan) + local_judge_replicas(plan)


def _engines_asked(plan: RunPlan, workers: bool) -> str:
    """The replicas the command asks for, and (`workers`) how many engine workers each has."""
    judges = local_judge_replicas(plan)
    if plan.config.mode is RunMode.JUDGE_ONLY:
        asked = f"--judge-replicas {judges}"
    else:
        asked = f"--replicas {plan.config.cluster.replicas}" + (
            f" plus --judge-replicas {judges}" if judges else ""
        )
    model = plan.config.model
    if workers and plan.replica.workers > 1:
        asked += f" at {plan.replica.workers} workers each (TP {model.tensor_parallel_size} x PP {model.pipeline_parallel_size})"
    return asked


def _fewer(plan: RunPlan, units: int, per_replica: int) -> str:
    """What to lower so that the replicas, `per_replica` cores or GPUs each, fit `units`."""
    judges = local_judge_replicas(plan)
    most = units // per_replica - judges
    if most >= 1 and plan.config.mode is not RunMode.JUDGE_ONLY:
        return f"Lower --replicas to at most {most}"
    if per_replica == 1:  # the judge's replicas fill what the model's leave
        left = units - _model_replicas(plan)
        return f"Lower --judge-replicas to at most {left}" if judges and left >= 1 else "Lower --replicas"
    return "Lower --tensor-parallel-size or --pipeline-parallel-size" + (
        " or --judge-replicas" if judges else ""
    )


def check_kv_cache_fits(plan: RunPlan) -> None:
    """The CPU KV cache is allocated up front in each replica (--kv-cache-gib): all of it must fit
    this machine's free memory when rayeval starts the cluster here."""
    if not _local_cpu_run(plan):
        return
    engines = _local_engines(plan)
    gib = plan.config.model.cpu_kv_cache_gib
    memory = psutil.virtual_memory()
    available = memory.available
    if engines * gib * GIB > available:
        raise EvalInputError(
            f"--kv-cache-gib {gib:g} for {engines} engine replica(s) needs {engines * gib:g} GiB of memory for the "
            f"KV cache alone, but this machine has {available / GIB:.1f} GiB free "
            f"({memory.total / GIB:.1f} GiB in all). Lower --kv-cache-gib (0.5 to 4 GiB serves "
            "small models) or --replicas."
        )


def check_judge_inputs(plan: RunPlan) -> None:
    """A judge where judged tasks need one, its API key in the environment, a local judge model that exists."""
    check_judge(plan)
    judge = plan.config.judge
    if judge.kind == "local" and plan.config.mode is not RunMode.INFERENCE_ONLY and judged_task_names(plan):
        resolve_model(judge.target, materialise=False, label=f"--judge {judge.model}")
