"""The run folder's layout, in one place. A run folder holds:

config.yaml                  the settings the outputs were generated with
cache/completions.jsonl      every finished request (the resume store)
samples/MODEL/TASK.jsonl     per-sample records, written live; TASK.parquet at the end
judges/JUDGE/                a judge's cache/judgments.jsonl, samples/ and summary.json
summary.json  results.json  results.txt
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.storage.location import RemoteFolder, is_remote, local_path
from evaluators.errors import EvalInputError


@dataclass(frozen=True)
class RunPaths:
    """`root` is where the run's files are written on this node; for an --output-dir on object storage it
    is the local staging folder of `remote` (cluster.storage), which the run's sync keeps in step with it."""

    root: Path
    remote: RemoteFolder | None = None

    @classmethod
    def of(cls, output_dir: str, run_id: str) -> RunPaths:
        if is_remote(output_dir):
            remote = RemoteFolder.parse(output_dir).child(run_id)
            return cls(remote.staging, remote)
        return cls(local_path(output_dir) / run_id)

    @property
    def location(self) -> str:
        """The run folder as the user names it: its URI on a store, else its path."""
        return self.remote.uri if self.remote is not None else str(self.root)

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


def set_aside(folder: Path) -> Path:
    """Move a run folder whose answers came from other weights out of the way, beside it under a name that
    says so (nothing computed is deleted); returns where it went."""
    target = folder.with_name(f"{folder.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(target)
    return target


def stored_run_config(output_dir: str, run_id: str | None) -> tuple[dict[str, Any], str]:
    """A finished run's saved config.yaml and its path: --judge-only re-judges that run, with its model,
    tasks and N. Read on the machine that writes the run (for a Ray-client run, the coordinator's node)."""
    from cluster.config import load_config_file

    if not run_id:
        raise EvalInputError(
            "--judge-only needs --run-id: the run whose stored outputs are to be judged (a folder under "
            "--output-dir, default runs/)."
        )
    paths = RunPaths.of(output_dir, run_id)
    if paths.remote is not None:
        from cluster.storage import local_copy

        local_copy(paths.remote)
    saved = paths.config
    if not saved.is_file():
        raise EvalInputError(
            f"--judge-only --run-id {run_id}: {paths.location}/config.yaml does not exist. Give the --run-id (and --output-dir) "
            "of a run made before, e.g. with --inference-only."
        )
    data = load_config_file(str(saved))
    data.pop("resolved_model_path", None)
    return data, str(saved)


@dataclass(frozen=True)
class StoredConfigOverrides:
    """The settings a command gave (dotted paths) for a --judge-only run whose saved config.yaml is on the
    cluster: the run's coordinator merges them into that file there. `flags` names each setting's flag."""

    overrides: dict[str, Any]
    flags: dict[str, str] = field(default_factory=dict)

    def config(self, output_dir: str, run_id: str | None) -> Any:
        from cluster.config import build_config

        data, source = stored_run_config(output_dir, run_id)
        return build_config(data, self.overrides, source, self.flags)
