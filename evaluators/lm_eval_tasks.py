"""lm-eval's task zoo beside our native tasks: finding tasks, loading them, and reading their results back.

Pure Python (lm-eval and the standard library): the model side lives in `cluster.lm_eval.backend`.
lm-eval computes every metric itself; from its per-sample logs we build our records, so mean@N, the
question-clustered SEM and the per-sample files work for lm-eval tasks as for native ones.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluators.data import offline_if_hub_unreachable
from evaluators.errors import EvalInputError
from evaluators.lm_eval_index import task_manager
from evaluators.records import SampleRecord

if TYPE_CHECKING:  # the report module loads pyarrow and scipy: planning a run (and --dry-run) needs neither
    from evaluators.report import TaskSummary

log = logging.getLogger(__name__)

FORCE_PREFIX = "lm_eval:"
# lm-eval output types answered by log-likelihoods of given text (prompt logprobs), not by generated text
LOGLIKELIHOOD_OUTPUT_TYPES = frozenset({"loglikelihood", "multiple_choice", "loglikelihood_rolling"})


class LmEvalTaskUnavailable(Exception):
    """An lm-eval task that cannot be built here (its dataset is unreachable, its YAML is broken)."""


@dataclass(frozen=True)
class ExecutionInfo:
    """How one document's answer was produced in one sample round (from the engine completions behind it)."""

    request_ids: tuple[str, ...]
    replicas: tuple[str, ...]
    latency_s: float
    prompt_tokens: int
    output_tokens: int
    finish_reason: str | None
    error: str | None


class LmEvalCatalog:
    """lm-eval's task index (its bundled tasks plus `--include-path` folders), built on first use (seconds) or
    read from `index_cache` (a folder) where an earlier process stored it for the same files."""

    def __init__(self, include_paths: Sequence[str] = (), index_cache: Path | None = None) -> None:
        for folder in include_paths:
            check_include_path(folder)
        self.include_paths = list(include_paths)
        self.index_cache = index_cache

    @property
    def manager(self) -> Any:
        return _task_manager(tuple(self.include_paths), self.index_cache)

    def knows(self, name: str) -> bool:
        return name in self.manager.task_index

    def close_matches(self, name: str, n: int = 3) -> list[str]:
        return difflib.get_close_matches(name, self.manager.all_tasks, n=n, cutoff=0.6)

    def dataset_of(self, name: str) -> str:
        entry = self.manager.task_index.get(name)
        cfg = (entry.cfg or {}) if entry is not None else {}
        path, subset = cfg.get("dataset_path"), cfg.get("dataset_name")
        if not path:
            return "its dataset"
        return f"dataset {path}" + (f" (subset {subset})" if subset else "")

    def output_types(self, name: str) -> set[str]:
        """The output types of every task a name stands for (a task, or a group's or tag's members), read from
        the index without loading any data; "unknown" for a name the index holds no type for."""
        index = self.manager.task_index
        found: set[str] = set()
        pending, seen = [name], set()
        while pending:
            entry = index.get(current := pending.pop())
            if current in seen:
                continue
            seen.add(current)
            kind = getattr(getattr(entry, "kind", None), "name", "")
            cfg = (entry.cfg or {}) if entry is not None else {}
            if kind == "GROUP":
                pending += [
                    m if isinstance(m, str) else str(m.get("task", "")) for m in cfg.get("task") or []
                ]
            elif kind == "TAG":
                pending += sorted(entry.tags or ())
            else:
                found.add(str(cfg.get("output_type") or "unknown"))
        return found

    def load(self, name: str) -> LoadedLmEvalTask:
        """The task's (or group's) lm-eval objects; raises LmEvalTaskUnavailable with what to do about it."""
        offline_if_hub_unreachable()  # a missing hub dataset then fails at once instead of after ~20 s of retries
        try:
            loaded = self.manager.load(name)
        except Exception as exc:  # noqa: BLE001 - datasets, jinja and YAML errors all mean "cannot run here"
            first_line = next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
            raise LmEvalTaskUnavailable(
                f"lm-eval task '{name}' needs {self.dataset_of(name)}, which could not be loaded "
                f"({type(exc).__name__}: {first_line}). If this machine cannot reach the Hugging Face hub, give a "
                "local copy: put the dataset in the HF datasets cache (HF_DATASETS_CACHE) on every node, or write "
                "a task YAML with `dataset_path: json` and `dataset_kwargs: {data_files: {test: PATH}}` and pass "
                "its folder with --include-path."
            ) from exc
        top = list(loaded["groups"].values()) if loaded["groups"] else list(loaded["tasks"].values())
        return LoadedLmEvalTask(name, top, dict(loaded["tasks"]))


@dataclass
class LoadedLmEvalTask:
    """What `--tasks NAME` named in lm-eval: the objects to evaluate (a task, or a group) and its leaf tasks."""

    name: str
    objects: list[Any]
    leaves: dict[str, Any]


def check_include_path(folder: str) -> None:
    """An --include-path must be a folder: lm-eval walks it for task YAMLs and silently finds none otherwise."""
    path = Path(folder).expanduser()
    if path.is_dir():
        return
    state = "is a file, not a folder" if path.exists() else "does not exist"
    raise EvalInputError(
        f"--include-path {folder} {state}. Give the folder that holds your lm-eval task YAMLs "
        "(lm_eval.include_path in a config file), or leave it out to use lm-eval's own tasks."
    )


@lru_cache(maxsize=4)
def _task_manager(include_paths: tuple[str, ...], index_cache: Path | None) -> Any:
    """One index per set of task folders and process: building it reads every task YAML (seconds)."""
    return task_manager(include_paths, index_cache)


@dataclass(frozen=True)
class ResolvedTaskName:
    name: str
    source: str  # "native" | "lm_eval"


def resolve_task_name(name: str, native: Mapping[str, object], catalog: LmEvalCatalog) -> ResolvedTaskName:
    """Native tasks keep priority; `lm_eval:NAME` forces lm-eval's; unknown names list close matches of both."""
    if not name.strip() or any(c.isspace() for c in name):
        raise EvalInputError(_malformed_name(name, native))
    if name.startswith(FORCE_PREFIX):
        forced = name.removeprefix(FORCE_PREFIX)
        if not forced:
            raise EvalInputError(
                f"--tasks {name} names no task after '{FORCE_PREFIX}'. Write {FORCE_PREFIX}NAME with an lm-eval "
                "task name (`rayeval tasks --lm-eval SUBSTRING` lists them)."
            )
        if catalog.knows(forced):
            return ResolvedTaskName(forced, "lm_eval")
        close = catalog.close_matches(forced)
        hint = f" Closest lm-eval tasks: {', '.join(close)}." if close else ""
        raise EvalInputError(
            f"Unknown lm-eval task '{forced}' (from --tasks {name}).{hint} Task folders of your own are added "
            "with --include-path."
        )
    if name in native:
        return ResolvedTaskName(name, "native")
    if catalog.knows(name):
        return ResolvedTaskName(name, "lm_eval")
    native_close = difflib.get_close_matches(name, list(native), n=3, cutoff=0.5)
    lm_close = catalog.close_matches(name)
    parts = []
    if native_close:
        parts.append(f"rayeval tasks: {', '.join(native_close)}")
    if lm_close:
        parts.append(f"lm-eval tasks: {', '.join(lm_close)}")
    hint = f" Closest matches — {'; '.join(parts)}." if parts else ""
    raise EvalInputError(
        f"Unknown task '{name}' (--tasks, or `tasks:` in a config file).{hint} `rayeval tasks` lists "
        f"rayeval's own tasks; any of lm-eval's {len(catalog.manager.all_tasks)} tasks, groups and tags can be "
        "named too (prefix lm_eval: to force lm-eval's version), and --include-path adds task folders."
    )


def _malformed_name(name: str, native: Mapping[str, object]) -> str:
    """An empty task name, or several names run together with spaces instead of commas."""
    if not name.strip():
        return "A task name is empty. Give task names separated by commas, e.g. --tasks ifeval,gsm8k."
    parts = name.split()
    return (
        f"Task name '{name}' holds spaces. Separate task names with commas, without spaces: "
        f"--tasks {','.join(parts)} (`rayeval tasks` lists the names; {', '.join(sorted(native))} are rayeval's)."
    )


# --- reading lm-eval's results back ---------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # bools included: lm-eval's acc can be True/False


def records_from_round(
    task: str,
    logged_samples: list[dict[str, Any]],
    sample_index: int,
    executions: Mapping[int, ExecutionInfo],
) -> list[SampleRecord]:
    """One record per document from lm-eval's per-sample log (one entry per document and filter)."""
    by_doc: dict[int, SampleRecord] = {}
    for entry in logged_samples:
        doc_id = int(entry["doc_id"])
        record = by_doc.get(doc_id)
        if record is None:
            execution = executions.get(doc_id)
            record = SampleRecord(
                task=task,
                doc_id=doc_id,
                sample_index=sample_index,
                request_id=",".join(execution.request_ids) if execution else "",
                prompt=str(entry["arguments"][0][0]) if entry.get("arguments") else "",
                output=_output_text(entry.get("resps", [])),
                target=str(entry.get("target", "")),
                replica=",".join(execution.replicas) if execution else "",
                latency_s=round(execution.latency_s, 4) if execution else 0.0,
                prompt_tokens=execution.prompt_tokens if execution else 0,
                output_tokens=execution.output_tokens if execution else 0,
                finish_reason=execution.finish_reason if execution else None,
                error=execution.error if execution else None,
            )
            by_doc[doc_id] = record
        if record.error is not None:
            continue  # a failed generation is counted as failed, not scored as a wrong answer
        for metric in entry.get("metrics", []):
            value = entry.get(metric)
            if _is_number(value) and math.isfinite(float(value)):
                key = f"{metric},{entry.get('filter', 'none')}"
                record.scores[key] = float(value)
                record.weights[key] = 1.0
    return list(by_doc.values())


def _output_text(resps: list[Any]) -> str:
    """Generated text as is; log-likelihood answers as JSON [[logprob, is_greedy], ...] one per choice."""
    flat = [r[0] if isinstance(r, list) and r else r for r in resps]
    if len(flat) == 1 and isinstance(flat[0], str):
        return flat[0]
    return json.dumps(flat, default=str)


@dataclass
class LmEvalTaskResult:
    """lm-eval's own numbers for one leaf task over the sample rounds, beside our per-sample records."""

    name: str
    version: str
    num_fewshot: int
    num_available: int
    output_type: str
    mean_metrics: list[str]  # "metric,filter" keys whose lm-eval aggregation is the mean of per-sample values
    higher_is_better: dict[str, bool]
    rounds: list[dict[str, Any]] = field(default_factory=list)  # results[task] of each round

    def aggregate_only(self) -> dict[str, tuple[float, float | None]]:
        """Metrics lm-eval aggregates other than by a mean (perplexities, corpus BLEU): value, stderr."""
        out: dict[str, tuple[float, float | None]] = {}
        for key in self.rounds[0] if self.rounds else {}:
            name, _, filt = key.partition(",")
            if not filt or name.endswith("_stderr") or key in self.mean_metrics or name == "alias":
                continue
            values = [float(r[key]) for r in self.rounds if _is_number(r.get(key))]
            if not values:
                continue
            stderr = self.rounds[0].get(f"{name}_stderr,{filt}") if len(self.rounds) == 1 else None
            out[key] = (sum(values) / len(values), float(stderr) if _is_number(stderr) else None)
        return out


def describe_leaf(name: str, task: Any, results: Mapping[str, Any]) -> LmEvalTaskResult:
    """lm-eval's numbers for one leaf task from one `simple_evaluate` return."""
    from lm_eval.api.metrics import mean

    entry = dict(results["results"][name])
    aggregation = task.aggregation()
    higher = task.higher_is_better()
    keys = [k for k in entry if "," in k and not k.partition(",")[0].endswith("_stderr")]
    return LmEvalTaskResult(
        name=name,
        version=str(results.get("versions", {}).get(name, "")),
        num_fewshot=int(results.get("n-shot", {}).get(name, 0) or 0),
        num_available=int(results.get("n-samples", {}).get(name, {}).get("original", 0)),
        output_type=str(task.get_config("output_type")),
        mean_metrics=[k for k in keys if aggregation.get(k.partition(",")[0]) is mean],
        higher_is_better={k: bool(higher.get(k.partition(",")[0], True)) for k in keys},
        rounds=[entry],
    )


def summarize_lm_eval_task(
    result: LmEvalTaskResult, records: list[SampleRecord], num_runs: int
) -> TaskSummary:
    from evaluators.report import summarize_records

    summary = summarize_records(
        result.name,
        result.version,
        result.mean_metrics,
        records,
        num_runs,
        result.num_fewshot,
        result.num_available,
    )
    summary.source = "lm-eval"
    summary.higher_is_better = result.higher_is_better
    if summary.failed:
        _withhold_lm_evals_numbers(summary, result, f"{summary.failed} failed sample(s) of this task")
    else:
        summary.aggregate_only = result.aggregate_only()
        summary.lm_eval_results = result.rounds[0] if len(result.rounds) == 1 else None
    return summary


def _withhold_lm_evals_numbers(summary: TaskSummary, result: LmEvalTaskResult, failed: str) -> None:
    """lm-eval aggregated over every document, the failed ones too (an empty output, a log-likelihood of
    -inf): its own entry and the aggregates only it computes (perplexity, corpus BLEU, a group's) are not
    reported; the mean metrics are our own over the scored samples. A rerun with --retry-failed asks the
    failed samples again."""
    summary.withheld = {
        key: f"lm-eval counted the {failed} as answers; rerun with --retry-failed"
        for key in result.aggregate_only()
    }
    summary.lm_eval_results = None


def summarize_lm_eval_group(
    name: str, rounds: list[dict[str, Any]], subtasks: list[str], leaves: Mapping[str, TaskSummary]
) -> TaskSummary:
    """A group's aggregate as lm-eval computed it (MMLU's overall accuracy, say), beside its subtasks' rows;
    `subtasks`: the leaf tasks under it, through any subgroups."""
    result = LmEvalTaskResult(
        name=name,
        version="",
        num_fewshot=0,
        num_available=sum(leaves[t].num_available for t in subtasks if t in leaves),
        output_type="group",
        mean_metrics=[],
        higher_is_better={},
        rounds=rounds,
    )
    from evaluators.report import unavailable_task

    summary = unavailable_task(name, "lm-eval", "")
    summary.error = None
    summary.num_available = result.num_available
    summary.num_questions = sum(leaves[t].num_questions for t in subtasks if t in leaves)
    summary.num_runs = len(rounds)
    failed = sum(leaves[t].failed for t in subtasks if t in leaves)  # counted in the subtasks' rows
    if failed:
        _withhold_lm_evals_numbers(summary, result, f"{failed} failed sample(s) of its tasks")
    else:
        summary.aggregate_only = result.aggregate_only()
        summary.lm_eval_results = rounds[0] if len(rounds) == 1 else None
    return summary
