"""One evaluation run, end to end: plan → requests → resume → replicas → dispatch → score → report.

The CLI, a Ray job entrypoint and a Python session all call `run_evaluation`; it needs a connected Ray
session (see `cluster.session`). The pieces it drives: `requests` builds what to generate, `runner` runs it
on the replicas through the result store, `records` scores completions as they arrive, the judge pipeline
(cluster.judging) judges judged tasks beside generation, and `outputs` writes the files.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from cluster import timeline
from cluster.config import RunMode
from cluster.errors import ClusterError
from cluster.judging import JudgePipeline, core_slots, start_judging, wait_for_judging
from cluster.models import prompt_renderer
from cluster.plan import RunPlan
from cluster.run.adaptive import adapt_samples
from cluster.run.outputs import FinishedRun, output_written, write_outputs
from cluster.run.paths import RunPaths
from cluster.run.records import SampleWriter
from cluster.run.requests import PlannedSample, build_requests
from cluster.run.result import RunResult
from cluster.run.runner import RequestRunner
from evaluators.adaptive import AdaptiveReport
from evaluators.errors import EvalInputError
from sharding.store import ResultStore, StoreInUse

if TYPE_CHECKING:
    from cluster.lm_eval import LmEvalRunOutput
    from cluster.run.shared import SharedReplicas
    from cluster.storage import RunFolderSync

log = logging.getLogger(__name__)


@dataclass
class _Prepared:
    """A run ready to dispatch: its requests, and the judge pipeline when it judges."""

    planned: list[PlannedSample]
    judging: JudgePipeline | None
    prepare_s: float
    adaptive: dict[str, AdaptiveReport] = field(default_factory=dict)  # adaptive N's report per task


def run_evaluation(
    plan: RunPlan,
    verbose: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
    shared: SharedReplicas | None = None,
    warm_pool: str | None = None,
) -> RunResult:
    """Run the plan on the connected Ray cluster and write every output file; returns the summaries.
    `shared`: a sweep's warm replicas to run on instead of starting the run's own; `warm_pool`: the warm pool
    a sweep holds for its steps, the one this run must use."""
    started = time.perf_counter()
    paths = RunPaths.new(plan.config.output_dir, plan.config.run_id, plan.model_label)
    paths.make()
    with _folder_held(paths):  # before anything in it changes: a second run over it is refused untouched
        sync = _open_sync(plan, paths)  # a folder on a store: what it holds comes here first (a resume)
        _save_config(plan, paths)
        store = _open_store(paths)
        if sync is not None:
            sync.start(lambda: len(store.added_ids))
        complete = False
        try:
            result, runner = _run_in_folder(
                plan, paths, store, started, verbose, progress, retry_failed, shared, warm_pool
            )
            complete = True
        finally:
            if sync is not None:
                sync.finish(complete)
    _fail_if_every_replica_died(runner, result, paths)
    return result


@contextlib.contextmanager
def _folder_held(paths: RunPaths) -> Iterator[None]:
    from cluster.storage.folder_lock import FolderInUse, holding

    try:
        with holding(paths.root):
            yield
    except FolderInUse:
        raise _in_use(paths) from None


def _open_sync(plan: RunPlan, paths: RunPaths) -> RunFolderSync | None:
    if paths.remote is None:
        return None
    from cluster.storage import SyncPolicy, open_run_folder

    policy = SyncPolicy(plan.config.sync_every, plan.config.sync_interval_s)
    return open_run_folder(paths.remote, policy)


def _run_in_folder(
    plan: RunPlan,
    paths: RunPaths,
    store: ResultStore,
    started: float,
    verbose: bool,
    progress: bool,
    retry_failed: bool,
    shared: SharedReplicas | None,
    warm_pool: str | None,
) -> tuple[RunResult, RequestRunner]:
    runner = RequestRunner(
        plan,
        store,
        verbose=verbose,
        progress=progress,
        retry_failed=retry_failed,
        generate_missing=plan.config.mode is not RunMode.JUDGE_ONLY,
        core_slots=core_slots(plan, judge=False),
        shared=shared,
        warm_pool=warm_pool,
        run_id=paths.run_id,
    )
    try:
        prepared = _prepare(plan, paths, runner, store, verbose)
    except BaseException:
        runner.close()
        store.close()
        raise
    judging = prepared.judging
    writer = SampleWriter(
        plan,
        prepared.planned,
        paths.samples(plan.model_label),
        judging.samples.add_output if judging else None,
    )
    log.info("run %s: results cached in %s", paths.root, store.path)
    with output_written(paths.root):  # a full disk or a read-only folder: one clear error, nothing lost
        lm_eval_output = None
        completed = False
        try:
            lm_eval_output = _generate(plan, prepared, runner, writer, progress)
            completed = True
        finally:
            if judging is not None:
                judging.close(completed)
            runner.close()
            timeline.mark("engines released")  # stopped, or handed back to their warm pool
            writer.close()
            store.close()
        _note_reused_failures(runner)
        finished = FinishedRun(
            plan, paths, writer, runner, judging, lm_eval_output, started, prepared.prepare_s
        )
        finished.adaptive = prepared.adaptive
        result = write_outputs(finished)
    return result, runner


def _note_reused_failures(runner: RequestRunner) -> None:
    if runner.stats.reused_failed:
        log.info(
            "%d reused requests had failed last time; --retry-failed generates them again",
            runner.stats.reused_failed,
        )


def _save_config(plan: RunPlan, paths: RunPaths) -> None:
    """config.yaml: the settings the outputs are generated with (a re-judge keeps the one that generated)."""
    if plan.config.mode is RunMode.JUDGE_ONLY:
        return
    settings = {**plan.config.model_dump(mode="json"), "resolved_model_path": plan.model.path}
    with output_written(paths.root):
        paths.config.write_text(yaml.safe_dump(settings, sort_keys=False))


def _open_store(paths: RunPaths) -> ResultStore:
    try:
        return ResultStore(paths.cache)
    except StoreInUse:
        raise _in_use(paths) from None


def _in_use(paths: RunPaths) -> EvalInputError:
    return EvalInputError(
        f"The run folder {paths.root} is in use by another rayeval process. Wait for it to finish (it writes "
        "the same results), or pass another --run-id."
    )


def _prepare(
    plan: RunPlan, paths: RunPaths, runner: RequestRunner, store: ResultStore, verbose: bool
) -> _Prepared:
    """Render prompts and build requests while the engines start (a fresh run), and start judging."""
    began = time.perf_counter()
    config = plan.config
    make_renderer = functools.partial(
        prompt_renderer, plan.model, config.model.chat_template, config.model.revision
    )
    # The renderer (its tokenizer, where the rendered-prompt cache lacks a prompt) loads while the replicas
    # start. The scorers' imports go on until the first output is scored (`SampleWriter`); they begin while
    # a local Ray starts, and on an existing cluster once the requests are built: beside the engines' start,
    # or on a warm pool beside the first requests, which they would otherwise delay by about 0.4 s (one GIL).
    loading = None
    if plan.tasks:
        loader = ThreadPoolExecutor(1, thread_name_prefix="renderer")
        loading = loader.submit(make_renderer)
        loader.shutdown(wait=False)  # its thread ends with this one task; the result is awaited below
    renderer = None
    if loading is not None and config.model.chat_template:
        # an asked-for template the tokenizer may lack: fail before any engine starts
        renderer = loading.result()
    if len(store) == 0 and config.mode is not RunMode.JUDGE_ONLY:
        # A fresh run needs engines: start them while prompts are rendered (loading a tokenizer takes seconds)
        # and lm-eval builds its requests; not where a scorer's import (begun with Ray's start) already failed.
        for task_plan in plan.tasks:
            task_plan.task.raise_if_scorer_failed()
        runner.start_in_background()
    planned = build_requests(plan, renderer or loading.result()) if loading is not None else []
    timeline.mark("requests built")
    prepare_s = time.perf_counter() - began
    judging = None if config.mode is RunMode.INFERENCE_ONLY else start_judging(plan, paths.judges, verbose)
    return _Prepared(planned, judging, prepare_s)


def _generate(
    plan: RunPlan, prepared: _Prepared, runner: RequestRunner, writer: SampleWriter, progress: bool
) -> LmEvalRunOutput | None:
    """Generate and score every request, wait for judging, then run the lm-eval tasks on the same replicas."""
    if prepared.planned:
        requests = [p.request for p in prepared.planned]
        runner.run(
            requests, "generating", writer.add, on_handed_out=functools.partial(_preload_scorers, plan)
        )
    writer.drain()
    if prepared.planned and not runner.all_replicas_dead:
        prepared.adaptive = adapt_samples(plan, prepared.planned, runner, writer)
    if prepared.judging is not None:
        wait_for_judging(prepared.judging, progress)
    if plan.lm_eval_tasks and plan.lm_eval_catalog is not None and not runner.all_replicas_dead:
        from cluster.lm_eval import run_lm_eval_tasks

        return run_lm_eval_tasks(plan.config, plan.lm_eval_catalog, plan.lm_eval_tasks, runner)
    return None


def _preload_scorers(plan: RunPlan) -> None:
    """Start the scorers' imports (IFEval's checkers: nltk, NumPy, SciPy; 0.6 s on two cores, 1.1 s on a GPU
    host's Python) on a thread once the first requests are out: begun before, the import holds the interpreter
    while the run connects to its replicas and hands out. A run on a local Ray began it with Ray's start; a
    second call does nothing."""
    for task_plan in plan.tasks:
        task_plan.task.preload_scorer()


def _fail_if_every_replica_died(runner: RequestRunner, result: RunResult, paths: RunPaths) -> None:
    dispatch = runner.dispatch
    if dispatch is None or not dispatch.all_replicas_dead:
        return
    causes = "; ".join(f"{name}: {cause}" for name, cause in dispatch.death_causes().items())
    raise ClusterError(
        f"Every engine replica died ({causes}). {result.requests_failed} samples could not be generated; they "
        "are not cached, so rerunning the same command resumes them once the cause is fixed (--verbose shows "
        f"the engine logs). Partial results are in {paths.location}."
    )
