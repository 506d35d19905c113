"""Which checkpoints of a training run still being written are complete. Plain Python.

A trainer writes a checkpoint's files one after another; evaluating it halfway would read a truncated
tensor or an adapter without its weights. A checkpoint is complete when its trainer says so, where the
layout has a marker: HF Trainer (and TRL and LLaMA-Factory, which save through it) writes
`trainer_state.json` into the checkpoint folder last; verl records the last step it finished saving in
`latest_checkpointed_iteration.txt` at the run's root. Without a marker (a plain `save_pretrained` loop)
a checkpoint is complete once none of its files changed for `settle_s` seconds. A marker counts where it is
at least as new as every file an engine loads from the checkpoint (its weights and config: other ranks'
files, as each rank's RNG state, may come after HF Trainer's marker); one older than such a file (the
checkpoint saved again in place over its old marker, or copied in another order) counts once the files have
settled as well.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster.models.checkpoints import Checkpoint, check_run_dir, scan_checkpoints, two_checkpoints
from cluster.sweep.step_records import weights_state

log = logging.getLogger(__name__)

HF_TRAINER_MARKER = "trainer_state.json"  # written last by transformers' Trainer._save_checkpoint
VERL_TRACKER = "latest_checkpointed_iteration.txt"  # verl: the last step whose save finished
FilesState = tuple[tuple[str, int, int], ...]  # every file's (path, size, mtime)


def verl_saved_step(run_dir: Path) -> int | None:
    tracker = run_dir / VERL_TRACKER
    try:
        text = tracker.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def files_state(folder: Path) -> FilesState:
    """Every file's (path, size, mtime): two equal states some seconds apart mean nothing is being written."""
    state = []
    for path in sorted(folder.rglob("*")):
        try:
            if path.is_file():
                stat = path.stat()
                state.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError:  # removed between the listing and the stat (a trainer's temporary file)
            continue
    return tuple(state)


@dataclass
class ArrivalWatcher:
    """The complete checkpoints under `run_dir`, polled; each is reported once it is complete."""

    run_dir: Path
    settle_s: float
    every: int | None = None  # only steps that are multiples of this
    _seen: dict[Path, tuple[float, FilesState]] = field(default_factory=dict)
    _doubled_said: set[int] = field(default_factory=set)

    def found(self) -> list[Checkpoint]:
        """The checkpoints there now, complete or not, by step (of `every`'s multiples)."""
        return [c for c in self._all() if not self.every or c.step % self.every == 0]

    def _all(self) -> list[Checkpoint]:
        """Every checkpoint there now; a step with two checkpoints is left out (once said, as an error) and
        the others go on."""
        check_run_dir(self.run_dir)
        found, doubled = scan_checkpoints(self.run_dir)
        for step, paths in doubled.items():
            if step not in self._doubled_said:
                self._doubled_said.add(step)
                log.error("%s; the watch leaves it out until one is left", two_checkpoints(step, paths))
        return [found[step] for step in sorted(found)]

    def complete(self, now: float | None = None) -> list[Checkpoint]:
        """The checkpoints complete now, by step (a folder not yet a checkpoint is simply not there yet). A
        trainer that marks any of its checkpoints (of every step, not only `every`'s) marks them all."""
        now = time.monotonic() if now is None else now
        everything = self._all()
        verl_step = verl_saved_step(self.run_dir)
        marked = verl_step is not None or any((c.path / HF_TRAINER_MARKER).is_file() for c in everything)
        ready = []
        for checkpoint in (c for c in everything if not self.every or c.step % self.every == 0):
            if marked:
                done = self._marked(checkpoint, verl_step, now)
            else:
                done = self._settled(checkpoint.path, now)
            if done:
                ready.append(checkpoint)
        return ready

    def _marked(self, checkpoint: Checkpoint, verl_step: int | None, now: float) -> bool:
        """Marked complete by its trainer after the weights and config were written, or marked and settled."""
        marks = (
            [checkpoint.path / HF_TRAINER_MARKER] if (checkpoint.path / HF_TRAINER_MARKER).is_file() else []
        )
        if verl_step is not None and checkpoint.step <= verl_step:
            marks.append(self.run_dir / VERL_TRACKER)
        if not marks:
            return False
        try:
            marked_at = max(mark.stat().st_mtime_ns for mark in marks)
            newest = max((int(mtime) for _, _, mtime in weights_state(checkpoint.path)), default=0)
        except FileNotFoundError:  # removed since it was listed (a checkpoint the trainer's rotation deleted)
            return False
        return newest <= marked_at or self._settled(checkpoint.path, now)

    def _settled(self, folder: Path, now: float) -> bool:
        state = files_state(folder)
        since, seen = self._seen.get(folder, (now, ()))
        if state != seen:
            self._seen[folder] = (now, state)
            return self.settle_s <= 0 and bool(state)
        return now - since >= self.settle_s
