"""One evaluation run, end to end: plan → requests → resume → replicas → dispatch → score → report.

The CLI, a Ray job entrypoint and a Python session all call `run_evaluation`; it needs a connected Ray
session (see `cluster.session`).
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cluster.engines import EngineInfo
from cluster.errors import ClusterError, OutputWriteError
from cluster.judging import JudgedSamples, JudgeRunner, JudgeStats, build_judge_backend, task_statistics
from cluster.models import PromptRenderer
from cluster.plan import RunMode, RunPlan, TaskPlan, core_slots
from cluster.run.runner import RequestRunner, progress_bar
from evaluators.errors import EvalInputError
from evaluators.judging.base import JudgeTask
from evaluators.records import SampleRecord
from evaluators.report import (
    TaskSummary,
    render_table,
    results_json,
    summarize_task,
    summary_json,
    write_samples,
)
from evaluators.tasks.base import Sample
from sharding.dispatcher import DispatchStats
from sharding.requests import Completion, GenerationRequest, make_request
from sharding.store import ResultStore, StoreInUse

if TYPE_CHECKING:
    from cluster.lm_eval import LmEvalRunOutput

log = logging.getLogger(__name__)

FAILURE_HINTS = {
    "VLLMValidationError": "Usually a prompt longer than max_model_len: raise --max-model-len (up to what the model "
    "supports) or lower --num-fewshot",
    "ScoringError": "The scorer raised on these outputs; the traceback summary is in the record",
    "JudgeParseError": "The judge's answer held no verdict in the format the task asks for (a stronger judge, or "
    "a larger --judge-max-tokens when answers were cut off, helps); the raw answers are in judge_outputs",
    "JudgeAPIError": "The judge API kept failing after every retry; these are not cached, so rerunning the same "
    "command (or --judge-only --run-id) asks again",
}


@dataclass
class PlannedSample:
    """One (question, sample index) of one task, with the request that produces it."""

    task_plan: TaskPlan
    doc_index: int
    request: GenerationRequest


@dataclass
class RunResult:
    run_dir: Path
    summaries: list[TaskSummary]
    table: str
    wall_s: float
    generation_s: float
    requests_total: int
    requests_reused: int
    requests_generated: int
    requests_failed: int
    output_tokens: int
    engines: list[EngineInfo] = field(default_factory=list)
    dispatch: DispatchStats | None = None
    task_errors: dict[str, str] = field(default_factory=dict)  # tasks that could not run at all
    prepare_s: float = 0.0  # rendering prompts and building requests
    scoring_s: float = 0.0  # scoring and writing records, on the dispatch loop


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


def make_run_dir(plan: RunPlan) -> Path:
    """The run folder, made (its parents too); a path that cannot be a folder is the user's to fix."""
    run_dir = run_dir_for(plan)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise EvalInputError(
            f"The run folder {run_dir} cannot be made: a file of that name is in the way. Pass another "
            "--run-id or --output-dir."
        ) from None
    except OSError as exc:
        raise EvalInputError(
            f"The run folder {run_dir} cannot be made: {exc.strerror}. Pass an --output-dir you can write to."
        ) from None
    return run_dir


def run_dir_for(plan: RunPlan) -> Path:
    run_id = plan.config.run_id or f"{plan.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(plan.config.output_dir).expanduser() / run_id


def build_requests(
    plan: RunPlan, renderer: PromptRenderer, sampling_seed: int | None = None
) -> list[PlannedSample]:
    """Every task's requests, `num_samples` per question; sample i is seeded `sampling_seed + i` (the config's
    seed unless given: the GPU bench draws fresh samples of the same prompts this way)."""
    n = plan.config.num_samples
    seed = plan.config.sampling.seed
    first_sample_seed = seed if sampling_seed is None else sampling_seed
    planned: list[PlannedSample] = []
    for task_plan in plan.tasks:
        for doc_index, sample in enumerate(task_plan.samples):
            prompt = renderer.render(task_plan.task.build_prompt(sample, task_plan.fewshot_for(sample, seed)))
            for index in range(n):
                request = make_request(
                    plan.model.path, prompt, task_plan.sampling, first_sample_seed + index, index
                )
                planned.append(PlannedSample(task_plan, doc_index, request))
    return planned


JudgedOutput = Callable[[JudgeTask, Sample, SampleRecord], None]


class SampleWriter:
    """Scores completions as they arrive and appends their records to the task's live JSONL file.

    Scoring runs in its own thread: on the dispatch loop it would hold up the next requests (IFEval's
    checkers take milliseconds per sample, thousands of samples are seconds). Outputs of judged tasks are
    recorded unscored and handed to `on_judged_output` (the judge pipeline).
    """

    def __init__(
        self,
        plan: RunPlan,
        planned: list[PlannedSample],
        directory: Path,
        on_judged_output: JudgedOutput | None = None,
    ) -> None:
        self.directory = directory
        self.on_judged_output = on_judged_output
        self.scoring_s = 0.0  # driver time spent scoring and writing records, in the scoring thread
        self.by_request: dict[str, list[PlannedSample]] = {}
        for item in planned:
            self.by_request.setdefault(item.request.request_id, []).append(item)
        self.records: dict[tuple[str, int, int], SampleRecord] = {}
        directory.mkdir(parents=True, exist_ok=True)
        self.handles = {
            t.task.name: (directory / f"{t.task.name}.jsonl").open("w", encoding="utf-8") for t in plan.tasks
        }
        self._queue: queue.Queue[Completion | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="scoring", daemon=True)
        self._thread.start()

    def add(self, completion: Completion) -> None:
        """Hand in a completion (from the dispatch loop); it is scored and written in the scoring thread."""
        self._queue.put(completion)

    def drain(self) -> None:
        """Wait until every completion handed in is scored and written."""
        self._queue.join()
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while (completion := self._queue.get()) is not None:
            began = time.perf_counter()
            try:
                if self._error is None:
                    self._add(completion)
            except BaseException as exc:  # noqa: BLE001 - kept and raised by drain(), on the caller's thread
                self._error = exc
            finally:
                self.scoring_s += time.perf_counter() - began
                self._queue.task_done()

    def _add(self, completion: Completion) -> None:
        for item in self.by_request.get(completion.request_id, []):
            record = self._record(item, completion)
            self.records[(record.task, record.doc_id, record.sample_index)] = record
            handle = self.handles[record.task]
            handle.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            handle.flush()
            task = item.task_plan.task
            if isinstance(task, JudgeTask) and self.on_judged_output is not None:
                self.on_judged_output(task, item.task_plan.samples[item.doc_index], record)

    def _record(self, item: PlannedSample, completion: Completion) -> SampleRecord:
        task = item.task_plan.task
        sample = item.task_plan.samples[item.doc_index]
        record = SampleRecord(
            task=task.name,
            doc_id=sample.doc_id,
            sample_index=item.request.sample_index,
            request_id=completion.request_id,
            prompt=item.request.prompt,
            output=completion.text,
            target=task.target(sample),
            replica=completion.replica,
            latency_s=round(completion.latency_s, 4),
            prompt_tokens=completion.prompt_tokens,
            output_tokens=completion.output_tokens,
            finish_reason=completion.finish_reason,
            error=completion.error,
        )
        if completion.ok and not isinstance(task, JudgeTask):
            try:
                for key, metric in task.score(sample, completion.text).items():
                    record.scores[key] = metric.value / metric.weight if metric.weight else 0.0
                    record.weights[key] = metric.weight
            except Exception as exc:  # noqa: BLE001 - a scorer crash is a failed sample, not a failed run
                record.error = f"ScoringError: {type(exc).__name__}: {exc}"
        return record

    def task_records(self, task: str) -> list[SampleRecord]:
        return [r for (name, _, _), r in self.records.items() if name == task]

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        for handle in self.handles.values():
            try:
                handle.close()
            except OSError:  # a write that failed (a full disk) fails again here; drain() reported it
                pass


@dataclass
class JudgePipeline:
    """The judging half of a run with judged tasks: bookkeeping, the judge loop and its cache."""

    samples: JudgedSamples
    runner: JudgeRunner
    store: ResultStore
    directory: Path


def _start_judging(plan: RunPlan, run_dir: Path, verbose: bool, mode: RunMode) -> JudgePipeline | None:
    judged = [t for t in plan.tasks if isinstance(t.task, JudgeTask)]
    if not judged:
        return None
    config = plan.config
    backend = build_judge_backend(
        config, plan.device, plan.replica, verbose, core_slots(plan, judge=True, mode=mode)
    )
    directory = run_dir / "judges" / backend.identity.slug
    try:
        store = ResultStore(directory / "cache" / "judgments.jsonl")
    except StoreInUse:
        raise EvalInputError(
            f"The judge folder {directory} is in use by another rayeval process; wait for it or use another judge."
        ) from None
    samples = JudgedSamples(
        backend, config.judge.max_tokens, config.judge.temperature, directory / "samples", judged
    )
    runner = JudgeRunner(
        backend, store, samples.on_answer, second_pass_pause_s=config.judge.second_pass_pause_s
    )
    samples.submit = runner.submit
    runner.start(eager=len(store) == 0)
    log.info(
        "judge %s: judging starts with the first finished outputs (cache %s)",
        backend.identity.name,
        store.path,
    )
    return JudgePipeline(samples, runner, store, directory)


def _wait_for_judging(pipeline: JudgePipeline, progress: bool) -> None:
    if pipeline.samples.unfinished and progress:
        _, total = pipeline.runner.progress()
        bar = progress_bar("judging", enabled=True)
        with bar:
            job = bar.add_task("judging", total=total)
            while pipeline.samples.unfinished:
                answered, total = pipeline.runner.progress()
                bar.update(job, completed=answered, total=total)
                time.sleep(0.2)
            bar.update(job, completed=total, total=total)
    pipeline.runner.finish()
    pipeline.samples.fail_unanswered(
        "JudgeUnanswered: judging stopped before this sample's verdicts came back"
    )
    if pipeline.runner.write_error is not None:
        raise pipeline.runner.write_error


def run_evaluation(
    plan: RunPlan,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
    mode: RunMode = "full",
) -> RunResult:
    """Run the plan on the connected Ray cluster and write every output file; returns the summaries."""
    started = time.perf_counter()
    config = plan.config
    run_dir = make_run_dir(plan)
    with output_written(run_dir):
        if mode != "judge_only":  # a re-judge keeps the config that generated the outputs
            (run_dir / "config.yaml").write_text(
                yaml.safe_dump(
                    {**config.model_dump(mode="json"), "resolved_model_path": plan.model.path},
                    sort_keys=False,
                )
            )
    try:
        store = ResultStore(run_dir / "cache" / "completions.jsonl")
    except StoreInUse:
        raise EvalInputError(
            f"The run folder {run_dir} is in use by another rayeval process. Wait for it to finish (it writes the "
            "same results), or pass another --run-id."
        ) from None
    runner = RequestRunner(
        plan,
        store,
        verbose=verbose,
        progress=progress,
        retry_failed=retry_failed,
        generate_missing=mode != "judge_only",
        core_slots=core_slots(plan, judge=False, mode=mode),
    )
    prepare_began = time.perf_counter()
    make_renderer = functools.partial(
        PromptRenderer, plan.model, config.model.chat_template, config.model.revision
    )
    try:
        renderer = None
        if plan.tasks and config.model.chat_template:
            # an asked-for template the tokenizer may lack: fail before any engine starts
            renderer = make_renderer()
        if len(store) == 0 and mode != "judge_only":
            # A fresh run needs engines: start them while prompts are rendered (loading the tokenizer took 12 s
            # of a 171 s IFEval run on 2 x H100, docs/BENCHMARKS.md round 5) and lm-eval builds its requests.
            runner.start_in_background()
        planned: list[PlannedSample] = []
        if plan.tasks:
            planned = build_requests(plan, renderer or make_renderer())
        prepare_s = time.perf_counter() - prepare_began
        judging = None if mode == "inference_only" else _start_judging(plan, run_dir, verbose, mode)
    except BaseException:
        runner.close()
        store.close()
        raise
    writer = SampleWriter(
        plan, planned, run_dir / "samples" / plan.model.name, judging.samples.add_output if judging else None
    )
    log.info("run %s: results cached in %s", run_dir, store.path)
    lm_eval_output = None
    completed = False
    with output_written(run_dir):  # a full disk or a read-only folder: one clear error, nothing lost
        try:
            if planned:
                runner.run([p.request for p in planned], label="generating", on_completion=writer.add)
            writer.drain()
            if judging is not None:
                _wait_for_judging(judging, progress)
            if plan.lm_eval_tasks and plan.lm_eval_catalog is not None and not runner.all_replicas_dead:
                from cluster.lm_eval import run_lm_eval_tasks

                lm_eval_output = run_lm_eval_tasks(config, plan.lm_eval_catalog, plan.lm_eval_tasks, runner)
            completed = True
        finally:
            if judging is not None:  # interrupted: stop at once; answers already cached stay cached
                judging.runner.finish(timeout_s=None if completed else 0)
                judging.samples.close()
                judging.store.close()
            runner.close()
            writer.close()
            store.close()
        if runner.stats.reused_failed:
            log.info(
                "%d reused requests had failed last time; --retry-failed generates them again",
                runner.stats.reused_failed,
            )
        result = _finish(plan, run_dir, writer, started, runner, lm_eval_output, judging, mode, prepare_s)
    dispatch = runner.dispatch
    if dispatch is not None and dispatch.all_replicas_dead:
        causes = "; ".join(f"{name}: {cause}" for name, cause in dispatch.death_causes().items())
        raise ClusterError(
            f"Every engine replica died ({causes}). {result.requests_failed} samples could not be generated; they "
            "are not cached, so rerunning the same command resumes them once the cause is fixed (--verbose shows "
            f"the engine logs). Partial results are in {run_dir}."
        )
    return result


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


def _finish(
    plan: RunPlan,
    run_dir: Path,
    writer: SampleWriter,
    started: float,
    runner: RequestRunner,
    lm_eval_output: LmEvalRunOutput | None,
    judging: JudgePipeline | None,
    mode: RunMode,
    prepare_s: float,
) -> RunResult:
    config = plan.config
    summaries = []
    all_records: list[SampleRecord] = []
    judged_summaries: list[TaskSummary] = []
    for task_plan in plan.tasks:
        task = task_plan.task
        records = writer.task_records(task.name)
        write_samples(writer.directory, task.name, records)
        all_records += records
        if isinstance(task, JudgeTask):
            summary = _judged_summary(task_plan, records, judging, config.num_samples, config.sampling.seed)
            judged_summaries.append(summary)
        else:
            summary = summarize_task(
                task, records, config.num_samples, task_plan.num_fewshot, task_plan.available
            )
        summaries.append(summary)
    if lm_eval_output is not None:
        for name, records in lm_eval_output.records.items():
            write_samples(writer.directory, name, records)
            all_records += records
        summaries += lm_eval_output.summaries
    failed = sum(s.failed for s in summaries)  # judged tasks count judge failures too
    output_tokens = sum(r.output_tokens for r in all_records)
    judged_dir = judging.samples.directory if judging is not None else writer.directory
    _warn_failures(summaries, {s.task: judged_dir for s in judged_summaries}, writer.directory)
    wall = time.perf_counter() - started
    stats, dispatch = runner.stats, runner.dispatch
    task_errors = {s.task: s.error for s in summaries if s.error is not None}
    run_info: dict[str, Any] = {
        "run_id": run_dir.name,
        "model": plan.model.name,
        "model_path": plan.model.path,
        "device": plan.device,
        "replicas": config.cluster.replicas,
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
        "prepare_s": round(prepare_s, 3),
        "scoring_s": round(writer.scoring_s, 3),
        "engines": [asdict(e) for e in stats.engines],
        "dispatch": asdict(dispatch) if dispatch else None,
        "task_errors": task_errors,
    }
    if any(t.task.name == "ifeval" for t in plan.tasks):
        from evaluators.sentence_splitting import sentence_backend

        run_info["ifeval_sentence_splitter"] = sentence_backend()
    if plan.lm_eval_tasks:
        import lm_eval

        run_info["lm_eval_version"] = getattr(lm_eval, "__version__", "unknown")
    run_info["mode"] = mode
    if judging is not None:
        judge_stats = judging.runner.stats
        timeline = judging_timeline(runner, judge_stats)
        run_info["judge"] = {
            "judge": judging.runner.backend.identity.name,
            "spec": judging.runner.backend.identity.spec,
            "folder": str(judging.directory),
            "requests": judge_stats.requests,
            "reused_from_cache": judge_stats.reused,
            "asked": judge_stats.asked,
            "failed": judge_stats.failed,
            "second_pass": judge_stats.second_pass,  # judgments asked again after failing on API errors
            "second_pass_recovered": judge_stats.second_pass_recovered,
            "start_s": round(judge_stats.start_s, 3),
            "start_error": judge_stats.start_error,
            "backend": judging.runner.backend_stats,
            "dispatch": asdict(judging.runner.dispatch) if judging.runner.dispatch else None,
            **timeline,
        }
        log.info(
            "generation %s s, judging %s s (seconds from the start of generation), overlapped %.1f s",
            timeline["generation_s"],
            timeline["judging_s"],
            timeline["overlap_s"],
        )
        judge_summary = summary_json(judged_summaries, run_info)
        _write_json(judging.directory / "summary.json", judge_summary)
    _write_json(run_dir / "summary.json", summary_json(summaries, run_info))
    _write_json(
        run_dir / "results.json",
        results_json(summaries, config.model_dump(mode="json"), plan.model.name, time.time()),
    )
    table = render_table(summaries)
    (run_dir / "results.txt").write_text(table)
    return RunResult(
        run_dir=run_dir,
        summaries=summaries,
        table=table,
        wall_s=wall,
        generation_s=stats.generation_s,
        requests_total=stats.requests,
        requests_reused=stats.reused,
        requests_generated=stats.generated,
        requests_failed=failed,
        output_tokens=output_tokens,
        engines=stats.engines,
        dispatch=dispatch,
        task_errors=task_errors,
        prepare_s=prepare_s,
        scoring_s=writer.scoring_s,
    )


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
