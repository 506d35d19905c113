"""A finished run's files: the final per-sample files (JSONL and Parquet), summary.json, results.json
(lm-eval's shape), results.txt, and the judge's own summary; and the one error a failed write becomes."""

from __future__ import annotations

import errno
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster import timeline
from cluster.config import OutputLayout
from cluster.errors import OutputWriteError
from cluster.judging import JudgePipeline, task_statistics
from cluster.plan import RunPlan, TaskPlan
from cluster.run.paths import RunPaths
from cluster.run.records import SampleWriter
from cluster.run.result import RunResult
from cluster.run.runner import RequestRunner
from evaluators.adaptive import AdaptiveReport
from evaluators.failures import FailureKind
from evaluators.judging.base import JudgeTask
from evaluators.records import SampleRecord
from evaluators.report import (
    TaskSummary,
    greedy_note,
    render_table,
    results_json,
    summarize_task,
    summary_json,
    write_samples,
)
from evaluators.tokens import RunTokens, TokenCounts, run_tokens

if TYPE_CHECKING:
    from cluster.judging import JudgeStats
    from cluster.lm_eval import LmEvalRunOutput

log = logging.getLogger(__name__)

# What to do about the failures a run counts, by kind (engine exceptions by their type name).
FAILURE_HINTS = {
    "VLLMValidationError": "Usually a prompt longer than max_model_len: raise --max-model-len (up to what the model "
    "supports) or lower --num-fewshot",
    FailureKind.SCORING: "The scorer raised on these outputs; the traceback summary is in the record",
    FailureKind.JUDGE_PARSE: "The judge's answer held no verdict in the format the task asks for (a stronger judge, "
    "or a larger --judge-max-tokens when answers were cut off, helps); the raw answers are in judge_outputs",
    FailureKind.JUDGE_TRUNCATED: "The judge's answer was cut at --judge-max-tokens before its verdict: raise "
    "--judge-max-tokens (and, for a local judge, --judge-max-model-len to hold it)",
    FailureKind.JUDGE_API: "The judge API kept failing after every retry; these are not cached, so rerunning the "
    "same command (or --judge-only --run-id) asks again",
}

# What a failed write of the run's own files looks like: the disk, the quota or the folder, not the network.
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


@contextmanager
def output_written(run_dir: Path) -> Iterator[None]:
    """A failed write of the run's files becomes one `OutputWriteError` saying what is kept and how to go on."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        raise OutputWriteError(
            f"Writing the run's files in {run_dir} failed: {exc.strerror or exc} ({exc.filename or exc}). "
            "Every result finished before that is kept in its cache folder. Free disk space (or make the "
            "folder writable again) and rerun the same command: it resumes and generates only what is missing."
        ) from None


@dataclass
class FinishedRun:
    """Everything a run produced, as the coordinator hands it over for the files."""

    plan: RunPlan
    paths: RunPaths
    writer: SampleWriter
    runner: RequestRunner
    judging: JudgePipeline | None
    lm_eval_output: LmEvalRunOutput | None
    started: float  # time.perf_counter() at the start of the run
    prepare_s: float
    adaptive: dict[str, AdaptiveReport] = field(default_factory=dict)  # adaptive N, per native task


@dataclass
class _Summaries:
    every: list[TaskSummary]
    judged: list[TaskSummary]
    records: list[SampleRecord]


def write_outputs(run: FinishedRun) -> RunResult:
    """Write the final files of a run and return its result."""
    summaries = _summarize(run)
    failed = sum(s.failed for s in summaries.every)  # judged tasks count judge failures too
    judged_dir = run.judging.samples.directory if run.judging is not None else run.writer.directory
    _warn_failures(summaries.every, {s.task: judged_dir for s in summaries.judged}, run.writer.directory)
    wall = time.perf_counter() - run.started
    tokens = _tokens(run, summaries)
    info = run_info(run, summaries.every, failed, wall)
    info["tokens"] = tokens.to_json()
    if run.judging is not None:
        info["judge"] = judge_info(run.judging, run.runner)
        _write_json(run.judging.paths.summary, summary_json(summaries.judged, info))
    config = run.plan.config
    _write_json(run.paths.summary, summary_json(summaries.every, info))
    _write_json(
        run.paths.results_json,
        results_json(summaries.every, config.model_dump(mode="json"), run.plan.model_label, time.time()),
    )
    table = render_table(summaries.every, tokens.footer())
    run.paths.results_txt.write_text(table)
    if writer := OTHER_LAYOUTS.get(config.output_layout):
        with output_written(run.paths.root):
            where = writer(run)
        log.info("%s layout written to %s", config.output_layout.value, where)
    if config.report:
        from evaluators.view import write_run_report

        with output_written(run.paths.root):
            log.info("report page: %s", write_run_report(run.paths.root))
    if config.log_to:  # a sweep's steps have none: the sweep logs them, by step (cluster.sweep.runner)
        from cluster.exporters import log_run

        log_run(config.log_to, run.paths.root, config.run_id or run.paths.root.name)
    stats = run.runner.stats
    return RunResult(
        run_dir=run.paths.root,
        location=run.paths.location,
        summaries=summaries.every,
        table=table,
        wall_s=wall,
        generation_s=stats.generation_s,
        requests_total=stats.requests,
        requests_reused=stats.reused,
        requests_generated=stats.generated,
        requests_failed=failed,
        output_tokens=sum(r.output_tokens for r in summaries.records),
        engines=stats.engines,
        engines_source=stats.source,
        dispatch=run.runner.dispatch,
        task_errors=info["task_errors"],
        prepare_s=run.prepare_s,
        scoring_s=run.writer.scoring_s,
    )


def _opencompass_layout(run: FinishedRun) -> Path:
    """The run in OpenCompass's layout (`evaluators.opencompass_layout`), from the files just written."""
    from evaluators.opencompass_layout import layout_of_run

    config = run.plan.config
    work_dir = Path(config.work_dir) if config.work_dir else run.paths.root / "opencompass"
    return layout_of_run(run.paths.root, work_dir, config.model_abbr or run.plan.model_label, config.pass_k)


# Layouts written beside rayeval's own, by `output_layout`.
OTHER_LAYOUTS: dict[OutputLayout, Callable[[FinishedRun], Path]] = {
    OutputLayout.OPENCOMPASS: _opencompass_layout
}


def _summarize(run: FinishedRun) -> _Summaries:
    """Each task's final sample files and summary: native tasks, judged tasks, then lm-eval's."""
    config = run.plan.config
    result = _Summaries([], [], [])
    for task_plan in run.plan.tasks:
        task = task_plan.task
        records = run.writer.task_records(task.name)
        write_samples(run.writer.directory, task.name, records)
        result.records += records
        draws = task_plan.draws(config.num_samples)
        if isinstance(task, JudgeTask):
            summary = _judged_summary(task_plan, records, run.judging, draws, config.sampling.seed)
            result.judged.append(summary)
        else:
            summary = _native_summary(task_plan, records, draws, run.adaptive.get(task.name))
        if draws < config.num_samples:
            summary.one_draw = greedy_note(config.num_samples)
        result.every.append(summary)
    if run.lm_eval_output is not None:
        for name, records in run.lm_eval_output.records.items():
            write_samples(run.writer.directory, name, records)
            result.records += records
        result.every += run.lm_eval_output.summaries
    return result


def _tokens(run: FinishedRun, summaries: _Summaries) -> RunTokens:
    """The run's token counts from its records (generated now: what its store took in during this run), each
    task's set on its summary."""
    store = run.runner.store
    generated: dict[str, TokenCounts] = {}
    for request_id in store.added_ids if store is not None else ():
        if (completion := store.get(request_id)) is not None:
            generated[request_id] = TokenCounts(completion.prompt_tokens, completion.output_tokens)
    tokens = run_tokens(summaries.records, generated, run.runner.stats.generation_s)
    for summary in summaries.every:
        summary.tokens = tokens.per_task.get(summary.task)
    return tokens


def run_info(run: FinishedRun, summaries: list[TaskSummary], failed: int, wall: float) -> dict[str, Any]:
    """summary.json's `run` section: what ran where, the counts, and where the driver's time went."""
    plan, config, stats, dispatch = run.plan, run.plan.config, run.runner.stats, run.runner.dispatch
    info: dict[str, Any] = {
        "run_id": run.paths.run_id,
        "model": plan.model_label,
        "adapter": asdict(plan.adapter) if plan.adapter else None,
        "model_path": plan.model.path,
        "device": plan.device,
        "replicas": stats.replicas or config.cluster.replicas,  # engines as the run began
        "replica_resources": plan.replica.bundle,
        "tensor_parallel_size": config.model.tensor_parallel_size,
        "pipeline_parallel_size": config.model.pipeline_parallel_size,
        "num_samples": config.num_samples,
        "requests": stats.requests,
        "requests_reused": stats.reused,
        "requests_generated": stats.generated,
        "samples_failed": failed,
        "wall_s": round(wall, 3),
        "generation_s": round(stats.generation_s, 3),
        # where the driver's time goes: prompts rendered and tokenised before dispatch, scoring during it
        "prepare_s": round(run.prepare_s, 3),
        "scoring_s": round(run.writer.scoring_s, 3),
        "engines": [asdict(e) for e in stats.engines],
        "engines_source": stats.source,  # own, warm (which pool, the start it saved), sweep or endpoint
        # wall clock (epoch seconds) of the first request handed out and the last result: runs side by side
        "generation_window": [stats.first_dispatch_at, stats.last_completion_at],
        "replica_restarts": run.runner.replica_restarts,  # allowed and used; dispatch.replacements says which
        "dispatch": asdict(dispatch) if dispatch else None,
        "task_errors": {s.task: s.error for s in summaries if s.error is not None},
    }
    if any(t.task.name == "ifeval" for t in plan.tasks):
        from evaluators.sentence_splitting import sentence_backend

        info["ifeval_sentence_splitter"] = sentence_backend()
    if plan.lm_eval_tasks:
        import lm_eval

        info["lm_eval_version"] = getattr(lm_eval, "__version__", "unknown")
    if plan.model.endpoint:
        calls = run.runner.endpoint_stats()
        info["endpoint"] = {
            "base_url": config.endpoint.base_url,
            "max_concurrency": config.endpoint.max_concurrency,
            "calls": asdict(calls) if calls is not None else None,
        }
    info["mode"] = config.mode.value
    # seconds since the driver process started, up to this summary (rayeval run --profile-startup: to exit)
    info["timeline"] = timeline.moments()
    return info


def judge_info(judging: JudgePipeline, runner: RequestRunner) -> dict[str, Any]:
    """summary.json's `run.judge` section: the judge, its counts, and how judging overlapped generation."""
    stats = judging.runner.stats
    timeline = judging_timeline(runner, stats)
    log.info(
        "generation %s s, judging %s s (seconds from the start of generation), overlapped %.1f s",
        timeline["generation_s"],
        timeline["judging_s"],
        timeline["overlap_s"],
    )
    return {
        "judge": judging.runner.backend.identity.name,
        "spec": judging.runner.backend.identity.spec,
        "folder": str(judging.directory),
        "requests": stats.requests,
        "reused_from_cache": stats.reused,
        "asked": stats.asked,
        "failed": stats.failed,
        "second_pass": stats.second_pass,  # judgments asked again after failing on API errors
        "second_pass_recovered": stats.second_pass_recovered,
        "start_s": round(stats.start_s, 3),
        "start_error": stats.start_error,
        "backend": judging.runner.backend_stats,
        "dispatch": asdict(judging.runner.dispatch) if judging.runner.dispatch else None,
        **timeline,
    }


def judging_timeline(runner: RequestRunner, judge: JudgeStats) -> dict[str, Any]:
    """When generation and judging ran (seconds from the first generation), and how long they overlapped."""
    gen_start, gen_end = runner.stats.first_dispatch_at, runner.stats.last_completion_at
    judge_start, judge_end = judge.first_submit_at, judge.last_answer_at
    origin = min(t for t in (gen_start, judge_start) if t is not None) if (gen_start or judge_start) else 0.0

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - origin, 3)

    overlap = 0.0
    if None not in (gen_start, gen_end, judge_start, judge_end):
        overlap = max(0.0, min(gen_end, judge_end) - max(gen_start, judge_start))  # type: ignore[type-var,operator]
    return {
        "generation_s": [rel(gen_start), rel(gen_end)],
        "judging_s": [rel(judge_start), rel(judge_end)],  # first judge request handed in, last answer
        "first_judge_answer_s": rel(judge.first_answer_at),
        "overlap_s": round(overlap, 3),
    }


def _native_summary(
    task_plan: TaskPlan, records: list[SampleRecord], num_samples: int, adaptive: AdaptiveReport | None
) -> TaskSummary:
    """A rule-scored task's summary; with adaptive N, N is the most samples a question got, and the std
    across runs uses the first `num_samples` runs, the ones every question has."""
    task = task_plan.task
    if adaptive is None:
        return summarize_task(task, records, num_samples, task_plan.num_fewshot, task_plan.available)
    most = max(adaptive.samples_per_question.values(), default=num_samples)
    summary = summarize_task(task, records, most, task_plan.num_fewshot, task_plan.available, num_samples)
    summary.adaptive = adaptive
    return summary


def _judged_summary(
    task_plan: TaskPlan,
    generated: list[SampleRecord],
    judging: JudgePipeline | None,
    num_runs: int,
    seed: int,
) -> TaskSummary:
    task = task_plan.task
    assert isinstance(task, JudgeTask)
    if judging is None:  # --inference-only: outputs are stored, judging comes later with --judge-only
        summary = summarize_task(task, generated, num_runs, task_plan.num_fewshot, task_plan.available)
        summary.metrics = {}  # counts and generation failures stand; nothing is scored yet
        summary.judge = "not judged (--inference-only); judge later with --judge-only --run-id"
        return summary
    records = judging.samples.task_records(task.name)
    write_samples(judging.samples.directory, task.name, records)
    summary = summarize_task(task, records, num_runs, task_plan.num_fewshot, task_plan.available)
    summary.judge = judging.runner.backend.identity.name
    summary.statistics = task_statistics(task, records, seed)
    return summary


def _warn_failures(summaries: list[TaskSummary], folders: dict[str, Path], samples_dir: Path) -> None:
    for summary in summaries:
        for reason, count in summary.failure_reasons.items():
            hint = FAILURE_HINTS.get(reason, "see the `error` field of those records")
            log.warning(
                "%s: %d of %d samples failed with %s; they are counted as failed in summary.json, not scored. "
                "%s (%s/%s.jsonl).",
                summary.task,
                count,
                summary.num_samples,
                reason,
                hint,
                folders.get(summary.task, samples_dir),
                summary.task,
            )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    tmp.replace(path)
