"""The run folder's layout, in one place. A run folder holds:

config.yaml                  the settings the outputs were generated with
cache/completions.jsonl      every finished request (the resume store)
samples/MODEL/TASK.jsonl     per-sample records, written live; TASK.parquet at the end
judges/JUDGE/                a judge's cache/judgments.jsonl, samples/ and summary.json
summary.json  results.json  results.txt
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from evaluators.errors import EvalInputError


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def of(cls, output_dir: str, run_id: str) -> RunPaths:
        return cls(Path(output_dir).expanduser() / run_id)

    @classmethod
    def new(cls, output_dir: str, run_id: str | None, model_name: str) -> RunPaths:
        """The run's folder: `run_id`, or MODEL-TIMESTAMP when none is given."""
        return cls.of(output_dir, run_id or f"{model_name}-{time.strftime('%Y%m%d-%H%M%S')}")

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def cache(self) -> Path:
        return self.root / "cache" / "completions.jsonl"

    def samples(self, model_name: str) -> Path:
        return self.root / "samples" / model_name

    @property
    def judges(self) -> Path:
        """Where each judge's folder goes (cluster.judging.pipeline.JudgePaths)."""
        return self.root / "judges"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def results_json(self) -> Path:
        return self.root / "results.json"

    @property
    def results_txt(self) -> Path:
        return self.root / "results.txt"

    def make(self) -> None:
        """Make the folder (its parents too); a path that cannot be a folder is the user's to fix."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise EvalInputError(
                f"The run folder {self.root} cannot be made: a file of that name is in the way. Pass another "
                "--run-id or --output-dir."
            ) from None
        except OSError as exc:
            raise EvalInputError(
                f"The run folder {self.root} cannot be made: {exc.strerror}. Pass an --output-dir you can write to."
            ) from None
