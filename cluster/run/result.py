"""What a run returns to its caller: the summaries, the printed table and the run's figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster.engines import EngineInfo
from evaluators.report import TaskSummary
from sharding.dispatcher import DispatchStats


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
