"""A finished run written in OpenCompass's folder layout, for tools that read OpenCompass's results (RD-Agent's
fine-tuning loop among them):

    <work_dir>/<YYYYmmdd_HHMMSS>/summary/summary_<timestamp>.csv    dataset, version, metric, mode, <abbr>
    <work_dir>/<timestamp>/results/<abbr>/<dataset>.json             metrics and per-question details
    <work_dir>/<timestamp>/predictions/<abbr>/<dataset>.json         {"0": {origin_prompt, prediction, gold}}

Scores are in OpenCompass's percent scale (rayeval's fraction x 100). With N samples a question, a metric is
mean@N (summary.json's: each question's mean over its scored samples, then over questions) and `pass@k` is
the unbiased estimator over the questions' scored samples, as summary.json's pass@k: a failed sample (an
engine error, a prompt over the context length) is in neither, and a k some question has fewer scored samples
than is not written; nor is pass@k of a metric that is not 0/1 per sample. A question's `correct` holds one
verdict per sample, a failed one counted not correct, so a reader that calls a question right only when every
sample is (RD-Agent's) lists exactly the questions some sample got wrong or failed.
"""

from __future__ import annotations

import csv
import json
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluators.passk import pass_at_k

MODE = "gen"
TIMESTAMP_FORMAT = "%Y%m%d_%H%M%S"  # OpenCompass's run folder name (readers glob "202*_*")


@dataclass(frozen=True)
class DatasetNames:
    """How one rayeval task appears in OpenCompass's layout: the dataset's name, its metrics' names, and the
    0/1 metric that decides whether a sample is correct."""

    dataset: str
    metrics: Mapping[str, str]  # rayeval metric key -> OpenCompass metric name
    correct_by: str


# OpenCompass's names for the tasks both have. GSM8K: OpenCompass takes the last number of the answer, as
# lm-eval's flexible-extract does. IFEval: OpenCompass's IFEvaluator names.
KNOWN: dict[str, DatasetNames] = {
    "gsm8k": DatasetNames(
        "gsm8k", {"exact_match,flexible-extract": "accuracy"}, "exact_match,flexible-extract"
    ),
    "ifeval": DatasetNames(
        "IFEval",
        {
            "prompt_level_strict_acc,none": "Prompt-level-strict-accuracy",
            "inst_level_strict_acc,none": "Inst-level-strict-accuracy",
            "prompt_level_loose_acc,none": "Prompt-level-loose-accuracy",
            "inst_level_loose_acc,none": "Inst-level-loose-accuracy",
        },
        "prompt_level_strict_acc,none",
    ),
}


def dataset_names(task: str, metric_keys: Iterable[str]) -> DatasetNames:
    """A task's OpenCompass names: the known ones, else its own name and its metrics without the filter."""
    if task in KNOWN:
        return KNOWN[task]
    keys = list(metric_keys)
    return DatasetNames(task, {key: key.partition(",")[0] for key in keys}, keys[0])


@dataclass
class DatasetResult:
    """One task's part of the layout, built from its summary and its sample records."""

    names: DatasetNames
    version: str
    metrics: dict[str, float]  # OpenCompass metric name -> percent
    details: list[dict[str, Any]] = field(default_factory=list)
    predictions: dict[str, dict[str, Any]] = field(default_factory=dict)


def dataset_result(
    task: str, summary: Mapping[str, Any], records: list[Mapping[str, Any]], pass_k: Iterable[int] = ()
) -> DatasetResult:
    """A task's OpenCompass results from rayeval's `summary.json` entry and its sample records (dicts as in the
    run's samples JSONL)."""
    names = dataset_names(task, summary["metrics"])
    metrics = {
        name: 100.0 * summary["metrics"][key]["mean"]
        for key, name in names.metrics.items()
        if key in summary["metrics"] and summary["metrics"][key]["mean"] is not None
    }
    by_question: dict[int, list[Mapping[str, Any]]] = {}
    for record in sorted(records, key=lambda r: (r["doc_id"], r["sample_index"])):
        by_question.setdefault(record["doc_id"], []).append(record)
    result = DatasetResult(names, str(summary.get("version", "")), metrics)
    for position, samples in enumerate(by_question.values()):
        verdicts = [_correct(s, names.correct_by) for s in samples]
        result.details.append({
            "doc_id": samples[0]["doc_id"],
            "pred": [s["output"] for s in samples],
            "answer": samples[0]["target"],
            "correct": verdicts,
        })  # fmt: skip
        result.predictions[str(position)] = {
            "origin_prompt": samples[0]["prompt"],
            "prediction": samples[0]["output"],
            "gold": samples[0]["target"],
        }
    scored = [
        [s["scores"][names.correct_by] for s in q if _scored(s, names.correct_by)]
        for q in by_question.values()
    ]
    for k in sorted(set(pass_k)):
        value = _pass_at(k, scored)
        if value is not None:
            metrics[f"pass@{k}"] = 100.0 * value
    return result


def aggregate_result(task: str, summary: Mapping[str, Any], percent: set[str]) -> DatasetResult:
    """A task whose numbers lm-eval aggregates itself (a group's accuracy, a perplexity): those numbers, in
    percent where the metric is one the run's tasks report in percent (a group's accuracy over its
    subtasks'), as they are otherwise; nothing where they were withheld or not computed."""
    values = {k: v[0] for k, v in (summary.get("aggregate_only") or {}).items() if v and v[0] is not None}
    names = DatasetNames(task, {key: key.partition(",")[0] for key in values}, next(iter(values), ""))
    metrics = {
        names.metrics[key]: (100.0 * value if names.metrics[key] in percent else value)
        for key, value in values.items()
    }
    return DatasetResult(names, str(summary.get("version", "")), metrics)


def write_layout(
    work_dir: Path, abbr: str, results: list[DatasetResult], timestamp: str | None = None
) -> Path:
    """Write the results as one OpenCompass run folder under `work_dir`; its path is returned."""
    stamp = timestamp or time.strftime(TIMESTAMP_FORMAT)
    root = work_dir / stamp
    summary = root / "summary" / f"summary_{stamp}.csv"
    summary.parent.mkdir(parents=True, exist_ok=True)
    with summary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["dataset", "version", "metric", "mode", abbr])
        for result in results:
            for metric, value in result.metrics.items():
                writer.writerow([result.names.dataset, result.version, metric, MODE, f"{value:.2f}"])
    for result in results:
        _write_json(
            root / "results" / abbr / f"{result.names.dataset}.json",
            {**result.metrics, "details": result.details},
        )
        _write_json(root / "predictions" / abbr / f"{result.names.dataset}.json", result.predictions)
    return root


def read_accuracy_summary(run_folder: Path) -> dict[str, dict[str, float]]:
    """{dataset: {metric: value}} from a run folder's newest summary CSV (the model's column)."""
    found = sorted((run_folder / "summary").rglob("*.csv"), reverse=True)
    if not found:
        raise FileNotFoundError(f"{run_folder / 'summary'} holds no summary CSV")
    summary: dict[str, dict[str, float]] = {}
    with found[0].open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            score = next(v for k, v in row.items() if k not in ("dataset", "version", "metric", "mode"))
            if score not in ("", "-"):
                summary.setdefault(row["dataset"], {}).setdefault(row["metric"], float(score))
    return summary


def wrong_answers(run_folder: Path, limit: int) -> list[dict[str, str]]:
    """The questions some sample got wrong, at most `limit`, in dataset order: question, gold, model_output.
    Where there are more, a sample of them over every dataset (RD-Agent samples at random; this one is
    seeded, so a call reads the same examples twice), not the first datasets' alone (MMLU's first subjects)."""
    errors: list[dict[str, str]] = []
    for path in sorted((run_folder / "results").rglob("*.json")):
        details = json.loads(path.read_text(encoding="utf-8")).get("details", [])
        predictions_file = run_folder / "predictions" / path.relative_to(run_folder / "results")
        predictions = (
            json.loads(predictions_file.read_text(encoding="utf-8")) if predictions_file.is_file() else {}
        )
        for index, detail in enumerate(details):
            if all(detail.get("correct") or [False]):
                continue
            entry = predictions.get(str(index), {})
            errors.append({
                "question": str(entry.get("origin_prompt", "")),
                "gold": str(entry.get("gold", detail.get("answer", ""))),
                "model_output": str(entry.get("prediction", (detail.get("pred") or [""])[0])),
            })  # fmt: skip
    if len(errors) <= limit:
        return errors
    return [errors[i] for i in sorted(random.Random(0).sample(range(len(errors)), limit))]


def _correct(record: Mapping[str, Any], metric: str) -> bool:
    return not record.get("error") and record.get("scores", {}).get(metric) == 1.0


def _scored(record: Mapping[str, Any], metric: str) -> bool:
    return not record.get("error") and isinstance(record.get("scores", {}).get(metric), int | float)


def _pass_at(k: int, scores: list[list[float]]) -> float | None:
    """The mean over questions of the unbiased pass@k from each question's scored samples, over the
    questions that have any (as summary.json's); None where one has fewer than k, or a score is not 0 or 1."""
    scores = [q for q in scores if q]
    if not scores or any(len(q) < k for q in scores) or any(x not in (0.0, 1.0) for q in scores for x in q):
        return None
    return sum(pass_at_k(len(q), int(sum(q)), k) for q in scores) / len(scores)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2), encoding="utf-8")


def layout_of_run(run_dir: Path, work_dir: Path, abbr: str, pass_k: Iterable[int] = ()) -> Path:
    """A finished rayeval run folder (summary.json and its samples' JSONL) written in OpenCompass's layout
    under `work_dir`; the new timestamped folder is returned."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    results = []
    percent = {
        key.partition(",")[0] for entry in summary["tasks"].values() for key in entry.get("metrics") or {}
    }
    for task, entry in summary["tasks"].items():
        if not entry.get("metrics"):  # a group's aggregate (MMLU's), a perplexity: lm-eval's own numbers
            aggregate = aggregate_result(task, entry, percent)
            results += [aggregate] if aggregate.metrics else []
            continue
        files = sorted((run_dir / "samples").glob(f"*/{task}.jsonl"))
        records = [
            json.loads(line) for path in files for line in path.read_text(encoding="utf-8").splitlines()
        ]
        results.append(dataset_result(task, entry, records, pass_k))
    return write_layout(work_dir, abbr, results)
