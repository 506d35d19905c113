"""Which judge's verdicts a judged task's numbers come from, in a finished run folder.

A run may be judged more than once (`--judge-only` with another judge): each judge's scored samples and summary
live under `judges/<judge>/`, while `samples/<model>/<task>.jsonl` holds the unjudged outputs. Whatever reads
a judged task's scores back (compare, plot, a sweep's curves) names the judge: the one the user asks for
(`--judge NAME`, its name such as `openai:gpt-4.1` or its folder name), else the run's only judge; a run with
several and no choice is refused, since silently picking one would pair one judge's verdicts with another's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluators.errors import EvalInputError


@dataclass(frozen=True)
class JudgeVerdicts:
    """One judge's verdicts on one task of a run folder."""

    name: str  # as records and summaries give it: `openai:gpt-4.1`, `local:Qwen2.5-7B-Instruct`
    folder: Path  # judges/<slug>

    @property
    def slug(self) -> str:
        return self.folder.name

    def samples(self, task: str) -> Path:
        return self.folder / "samples" / f"{task}.jsonl"

    def task_summary(self, task: str) -> dict[str, Any]:
        """The judge's own summary.json entry for the task ({} where it is missing or unreadable)."""
        try:
            return json.loads((self.folder / "summary.json").read_text())["tasks"][task]
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            return {}

    @property
    def spec(self) -> str:
        """What the judge was (its kind, model and endpoint), as its folder records it; "" where it does not
        (a folder an early version wrote)."""
        return recorded_spec(self.folder) or ""

    def answers_to(self, asked: str) -> bool:
        return asked in (self.name, self.slug)


# in a judge's folder: its name and spec, so that another judge of that name is told apart
JUDGE_FILE = "judge.json"


def recorded_spec(folder: Path) -> str | None:
    """The spec of the judge whose verdicts a judge folder holds: its judge.json, else (a folder an earlier
    version wrote) its summary.json's run.judge.spec; None for a new folder or one that says nothing."""
    for file, path in ((JUDGE_FILE, ("spec",)), ("summary.json", ("run", "judge", "spec"))):
        try:
            found: Any = json.loads((folder / file).read_text())
            for key in path:
                found = found[key]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(found, str):
            return found
    return None


def judges_of(run_dir: Path, task: str) -> list[JudgeVerdicts]:
    """Every judge that scored `task` in the run folder, by folder name."""
    found = []
    for samples in sorted(run_dir.glob(f"judges/*/samples/{task}.jsonl")):
        folder = samples.parent.parent
        verdicts = JudgeVerdicts(folder.name, folder)
        name = verdicts.task_summary(task).get("judge") or _judge_in_records(samples) or folder.name
        found.append(JudgeVerdicts(str(name), folder))
    return found


def _judge_in_records(samples: Path) -> str | None:
    with samples.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                return json.loads(line).get("judge") or None
    return None


def choose_judge(run_dir: Path, task: str, asked: str | None) -> JudgeVerdicts | None:
    """The judge whose verdicts stand for `task` in this run (None: the task was never judged here)."""
    found = judges_of(run_dir, task)
    if not found:
        return None
    names = ", ".join(j.name for j in found)
    if asked is not None:
        for judge in found:
            if judge.answers_to(asked):
                return judge
        raise EvalInputError(
            f"'{run_dir}' has no verdicts of judge {asked} on {task} (it was judged by {names}). Pass one of "
            f"those to --judge, or judge the run with it first: rayeval run --judge-only --run-id "
            f"{run_dir.name} --judge {asked}."
        )
    if len(found) > 1:
        raise EvalInputError(
            f"'{run_dir}': {task} was judged by {len(found)} judges ({names}). Say whose verdicts to use with "
            "--judge NAME."
        )
    return found[0]
