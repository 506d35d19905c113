"""Reading lm-eval's results back (records, summaries) and resolving task names across both registries."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from evaluators.errors import EvalInputError
from evaluators.lm_eval_tasks import (
    ExecutionInfo,
    LmEvalCatalog,
    LmEvalTaskResult,
    records_from_round,
    resolve_task_name,
    summarize_lm_eval_group,
    summarize_lm_eval_task,
)
from evaluators.report import render_table, results_json, summary_json


def _gsm8k_entry(doc_id: int, filt: str, hit: float) -> dict:
    # The shape lm-eval's evaluator logs: one entry per document and filter, values stringified in resps.
    return {
        "doc_id": doc_id,
        "arguments": [["Question: 2+2?\nAnswer:", {"until": ["Question:"]}]],
        "resps": [["The answer is 4."]],
        "filtered_resps": ["4"],
        "filter": filt,
        "target": "#### 4",
        "metrics": ["exact_match"],
        "exact_match": hit,
    }


def _execution(error: str | None = None) -> ExecutionInfo:
    return ExecutionInfo(("r1",), ("replica-0",), 0.5, 12, 5, "stop", error)


def test_records_merge_filters_per_document_and_keep_execution_details():
    entries = [_gsm8k_entry(0, "strict-match", 0.0), _gsm8k_entry(0, "flexible-extract", 1.0)]
    [record] = records_from_round("gsm8k_local", entries, 1, {0: _execution()})
    assert record.scores == {"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 1.0}
    assert record.sample_index == 1
    assert record.output == "The answer is 4."
    assert record.prompt.startswith("Question: 2+2?")
    assert (record.replica, record.prompt_tokens, record.output_tokens) == ("replica-0", 12, 5)


def test_a_failed_generation_is_counted_failed_not_scored_as_wrong():
    entries = [_gsm8k_entry(3, "strict-match", 0.0)]
    [record] = records_from_round("gsm8k_local", entries, 0, {3: _execution("VLLMValidationError: too long")})
    assert record.error == "VLLMValidationError: too long"
    assert record.scores == {}


def test_loglikelihood_answers_are_recorded_as_json_and_bool_metrics_as_numbers():
    entry = {
        "doc_id": 0,
        "arguments": [["Q?\nAnswer:", " 4"], ["Q?\nAnswer:", " 5"]],
        "resps": [[["-1.5", "True"]], [["-3.25", "False"]]],
        "filter": "none",
        "target": 0,
        "metrics": ["acc", "acc_norm"],
        "acc": True,
        "acc_norm": 1.0,
    }
    [record] = records_from_round("mc", [entry], 0, {})
    assert json.loads(record.output) == [["-1.5", "True"], ["-3.25", "False"]]
    assert record.scores == {"acc,none": 1.0, "acc_norm,none": 1.0}


def test_summary_uses_lm_eval_numbers_once_and_our_mean_at_n_with_rounds():
    result = LmEvalTaskResult(
        name="gsm8k_local",
        version="3.0",
        num_fewshot=0,
        num_available=1319,
        output_type="generate_until",
        mean_metrics=["exact_match,flexible-extract"],
        higher_is_better={"exact_match,flexible-extract": True},
        rounds=[{"alias": "gsm8k_local", "exact_match,flexible-extract": 0.5}],
    )
    records = []
    for run in (0, 1):
        for doc, hit in ((0, 1.0), (1, float(run))):
            entries = [_gsm8k_entry(doc, "flexible-extract", hit)]
            records += records_from_round("gsm8k_local", entries, run, {doc: _execution()})
    single = summarize_lm_eval_task(result, [r for r in records if r.sample_index == 0], num_runs=1)
    assert single.lm_eval_results == {"alias": "gsm8k_local", "exact_match,flexible-extract": 0.5}
    assert single.source == "lm-eval"

    result.rounds.append({"alias": "gsm8k_local", "exact_match,flexible-extract": 1.0})
    both = summarize_lm_eval_task(result, records, num_runs=2)
    assert both.lm_eval_results is None  # mean@2 is ours: lm-eval has no single entry for it
    metric = both.metrics["exact_match,flexible-extract"]
    assert metric.mean == pytest.approx(0.75)
    assert metric.run_means == (0.5, 1.0)
    assert metric.num_questions == 2


def test_metrics_lm_eval_aggregates_otherwise_are_reported_as_lm_eval_computed_them():
    result = LmEvalTaskResult(
        name="wiki",
        version="1",
        num_fewshot=0,
        num_available=10,
        output_type="loglikelihood_rolling",
        mean_metrics=[],
        higher_is_better={"word_perplexity,none": False},
        rounds=[{"alias": "wiki", "word_perplexity,none": 94.6, "word_perplexity_stderr,none": "N/A"}],
    )
    assert result.aggregate_only() == {"word_perplexity,none": (94.6, None)}


def test_lm_evals_own_numbers_that_counted_a_failed_sample_are_withheld_with_why():
    # lm-eval saw the failed document as an empty answer (or a log-likelihood of -inf): perplexity inf
    result = LmEvalTaskResult(
        name="wiki",
        version="1",
        num_fewshot=0,
        num_available=2,
        output_type="loglikelihood_rolling",
        mean_metrics=["exact_match,none"],
        higher_is_better={"word_perplexity,none": False},
        rounds=[{"alias": "wiki", "word_perplexity,none": float("inf"), "exact_match,none": 0.0}],
    )
    entries = [_gsm8k_entry(0, "none", 1.0), _gsm8k_entry(1, "none", 0.0)]
    executions = {0: _execution(), 1: _execution("VLLMValidationError: too long")}
    summary = summarize_lm_eval_task(result, records_from_round("wiki", entries, 0, executions), num_runs=1)
    assert summary.failed == 1 and summary.lm_eval_results is None and summary.aggregate_only == {}
    assert "1 failed sample(s)" in summary.withheld["word_perplexity,none"]
    assert summary.metrics["exact_match,none"].mean == 1.0  # ours: the scored document only
    group = summarize_lm_eval_group(
        "all", [{"acc,none": 0.4, "acc_stderr,none": 0.1}], ["wiki"], {"wiki": summary}
    )
    assert group.lm_eval_results is None and set(group.withheld) == {"acc,none"}
    # results.json: the withheld as null, lm-eval's entry not copied; strict JSON (no Infinity, no NaN)
    text = json.dumps(results_json([summary, group], {}, "m", 0.0), allow_nan=False)
    written = json.loads(text)["results"]
    assert written["wiki"]["word_perplexity,none"] is None and written["all"]["acc,none"] is None
    assert written["wiki"]["exact_match,none"] == 1.0
    json.dumps(summary_json([summary, group], {}), allow_nan=False)
    assert "withheld" in render_table([summary, group])


@dataclass
class _Index:
    """lm-eval's task index, reduced to the names (the real one takes seconds to build; the CLI tests use it)."""

    all_tasks: list[str] = field(default_factory=lambda: ["arc_easy", "arc_challenge", "gsm8k", "ifeval"])


@dataclass
class _Catalog:
    manager: _Index = field(default_factory=_Index)

    def knows(self, name: str) -> bool:
        return name in self.manager.all_tasks

    def close_matches(self, name: str, n: int = 3) -> list[str]:
        import difflib

        return difflib.get_close_matches(name, self.manager.all_tasks, n=n, cutoff=0.6)


NATIVE = {"ifeval": object(), "gsm8k": object()}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gsm8k", ("gsm8k", "native")),  # native wins a clash
        ("lm_eval:gsm8k", ("gsm8k", "lm_eval")),  # unless forced
        ("arc_easy", ("arc_easy", "lm_eval")),
    ],
)
def test_task_names_resolve_native_first(name, expected):
    resolved = resolve_task_name(name, NATIVE, _Catalog())
    assert (resolved.name, resolved.source) == expected


def test_unknown_names_list_close_matches_from_both_registries():
    with pytest.raises(EvalInputError) as error:
        resolve_task_name("ifevl", NATIVE, _Catalog())
    assert "rayeval tasks: ifeval" in str(error.value)
    assert "lm-eval tasks: ifeval" in str(error.value)
    with pytest.raises(EvalInputError, match="Unknown lm-eval task 'arc_eassy'.*arc_easy"):
        resolve_task_name("lm_eval:arc_eassy", NATIVE, _Catalog())


class _IndexedCatalog(LmEvalCatalog):
    """lm-eval's task index in its own shape (entries with a kind, a config and tags), without lm-eval."""

    def __init__(self) -> None:
        super().__init__([])

    @property
    def manager(self) -> SimpleNamespace:
        def entry(kind: str, cfg: dict | None = None, tags: set[str] | None = None) -> SimpleNamespace:
            return SimpleNamespace(kind=SimpleNamespace(name=kind), cfg=cfg, tags=tags or set())

        return SimpleNamespace(
            task_index={
                "gen": entry("TASK", {"task": "gen", "output_type": "generate_until"}),
                "mc": entry("TASK", {"task": "mc", "output_type": "multiple_choice"}, {"mc_tag"}),
                "ppl": entry("TASK", {"task": "ppl", "output_type": "loglikelihood_rolling"}),
                "mc_tag": entry("TAG", None, {"mc"}),
                "group": entry("GROUP", {"group": "group", "task": ["gen", "mc_tag", {"task": "ppl"}]}),
                "outer": entry("GROUP", {"group": "outer", "task": ["group", "gen"]}),
                "typeless": entry("TASK", {"task": "typeless"}),
            }
        )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gen", {"generate_until"}),
        ("mc_tag", {"multiple_choice"}),  # a tag stands for its members
        (
            "outer",
            {"generate_until", "multiple_choice", "loglikelihood_rolling"},
        ),  # groups of groups and tags
        ("typeless", {"unknown"}),
        ("missing", {"unknown"}),
    ],
)
def test_output_types_walk_groups_and_tags_from_the_index(name, expected):
    assert _IndexedCatalog().output_types(name) == expected
