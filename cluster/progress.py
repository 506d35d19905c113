"""The progress bars of long work (generation, judging, lm-eval requests), drawn with rich, and what they
stand at (`snapshot`), for a run whose bars nobody sees: one that runs inside the cluster and reports to a
Ray client."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress

_BARS: weakref.WeakSet[Progress] = weakref.WeakSet()


@dataclass(frozen=True)
class Stage:
    """One bar: its label, how far it is and its total."""

    label: str
    completed: int
    total: int


def progress_bar(label: str, enabled: bool) -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=False,
    )
    _BARS.add(bar)
    return bar


def snapshot() -> list[Stage]:
    """Every bar of this process that is not finished yet (drawn or not)."""
    return [
        Stage(str(task.description), int(task.completed), int(task.total or 0))
        for bar in list(_BARS)
        for task in bar.tasks
        if not task.finished
    ]
