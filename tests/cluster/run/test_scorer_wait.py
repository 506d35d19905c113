"""Requests go out before a task's scorer has imported; the scorer is waited for before the first output is
scored, and one that fails to import stops the run with its fix rather than failing samples."""

from __future__ import annotations

import pytest

from cluster.config import RunConfig
from cluster.models import prompt_renderer
from cluster.plan import build_plan
from cluster.run import build_requests
from cluster.run.records import SampleWriter
from evaluators.errors import EvalInputError
from sharding.requests import Completion


def _plan_and_requests():
    plan = build_plan(RunConfig(tasks=[{"name": "ifeval"}], limit=2))
    renderer = prompt_renderer(plan.model, plan.config.model.chat_template, plan.config.model.revision)
    return plan, build_requests(plan, renderer)


def test_a_scorer_that_does_not_import_stops_the_run_at_its_first_output(tmp_path):
    plan, planned = _plan_and_requests()
    task = plan.tasks[0].task

    def failed_import() -> None:  # a stand-in for a broken install, which this environment cannot have
        raise EvalInputError("Task 'ifeval' scores with lm-eval's IFEval checkers, which do not import here")

    task.wait_for_scorer = failed_import
    writer = SampleWriter(plan, planned, tmp_path)
    for item in planned:
        writer.add(Completion(item.request.request_id, text="An answer."))
    with pytest.raises(EvalInputError, match="do not import here"):
        writer.drain()
    assert writer.records == {}  # no sample was scored as failed
    assert (tmp_path / "ifeval.jsonl").read_text() == ""


def test_the_scorer_is_waited_for_once_per_task_before_its_first_score(tmp_path):
    plan, planned = _plan_and_requests()
    task = plan.tasks[0].task
    waited: list[int] = []
    real_wait = task.wait_for_scorer
    task.wait_for_scorer = lambda: (waited.append(len(writer.records)), real_wait())[1]
    writer = SampleWriter(plan, planned, tmp_path)
    for item in planned:
        writer.add(Completion(item.request.request_id, text="An answer."))
    writer.drain()
    assert waited == [0]  # once, before any record
    assert len(writer.records) == 2
    assert all(
        "prompt_level_strict_acc,none" in r.scores and r.error is None for r in writer.records.values()
    )
