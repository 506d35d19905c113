"""The exporter interface, its registry, and what every exporter logs of a run folder."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunRecord:
    """What a tracker gets of one run folder: its settings, its numbers, its files."""

    name: str
    params: dict[str, str]
    metrics: dict[str, float]  # `metric_name` and its "_sem", "_ci95_low", "_ci95_high"
    files: list[Path]  # summary.json, results.json, the per-sample Parquet files

    @classmethod
    def of_folder(cls, run_dir: Path, name: str) -> RunRecord:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        metrics: dict[str, float] = {}
        for task, body in summary.get("tasks", {}).items():
            for key, metric in body.get("metrics", {}).items():
                base = metric_name(task, key)
                for suffix, value in (("", metric.get("mean")), ("_sem", metric.get("sem")),
                                      ("_ci95_low", (metric.get("ci95") or [None])[0]),
                                      ("_ci95_high", (metric.get("ci95") or [None, None])[1])):  # fmt: skip
                    if isinstance(value, int | float) and value == value:  # NaN is no number to log
                        metrics[base + suffix] = float(value)
        config = run_dir / "config.yaml"
        params = _flat(_yaml(config)) if config.is_file() else {}
        files = [p for p in (run_dir / "summary.json", run_dir / "results.json") if p.is_file()]
        files += sorted(run_dir.glob("samples/*/*.parquet"))
        return cls(name, params, metrics, files)


TRACKER_UNSAFE = re.compile(r"[^\w.\- :/]")


def metric_name(task: str, key: str) -> str:
    """A tracker's name for a task's "metric,filter": task/metric for lm-eval's `none` filter, else
    task/metric/filter, so two filters of one metric (GSM8K's strict and flexible match) stay apart."""
    metric, _, filt = key.partition(",")
    name = f"{task}/{metric}" if filt in ("", "none") else f"{task}/{metric}/{filt}"
    return TRACKER_UNSAFE.sub(
        "_", name
    )  # MLflow takes letters, digits and _ - . / : and spaces (maj@8: maj_8)


class Exporter(Protocol):
    """Logs run records to one tracker; `target` is what followed the kind in --log-to (a URI, a project)."""

    def log(self, record: RunRecord, step: int | None) -> None: ...


EXPORTERS: dict[str, Callable[[str | None], Exporter]] = {}


def exporter(kind: str) -> Callable[[Callable[[str | None], Exporter]], Callable[[str | None], Exporter]]:
    def register(build: Callable[[str | None], Exporter]) -> Callable[[str | None], Exporter]:
        EXPORTERS[kind] = build
        return build

    return register


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat |= _flat(value, name + ".")
        elif value is not None:
            flat[name] = str(value)[:500]  # MLflow's limit on a parameter's value
    return flat
