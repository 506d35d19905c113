"""What a run returns to its caller: the summaries, the printed table and the run's figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    records: dict[str, Any] = field(default_factory=dict)  # task -> per-sample DataFrame, when asked for
    engines_source: dict[str, Any] = field(
        default_factory=dict
    )  # where generations came from (cluster.sources)
    location: str = (
        ""  # the run folder as the user named it (a URI on object storage); run_dir is its copy here
    )

    def __post_init__(self) -> None:
        self.location = self.location or str(self.run_dir)


def load_records(run_dir: Path | str) -> dict[str, Any]:
    """A run folder's per-sample records, one pandas DataFrame per task (its Parquet file). `run_dir` may be
    a URI on object storage (`cluster.load_records("s3://bucket/runs/r1")`): read into its staging folder."""
    import pandas as pd

    from cluster.storage import readable_folder

    folder = readable_folder(run_dir)
    return {path.stem: pd.read_parquet(path) for path in sorted(Path(folder, "samples").glob("*/*.parquet"))}
