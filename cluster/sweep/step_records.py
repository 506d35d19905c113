"""What a sweep records in its folders to know later what it did: the files a checkpoint's step answered
(a checkpoint or adapter saved again is evaluated afresh) and which tracker had which step's numbers (a rerun logs none
twice)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

# in the sweep folder: the numbers each --log-to tracker had, by step
TRACKED_STEPS = "tracker-steps.json"
# in a checkpoint's step folder: the files its answers came from
WEIGHTS_RECORD = "checkpoint-files.json"
CONFIG_FILES = ("config.json", "adapter_config.json")  # a model's, an adapter's


def weights_changed(run_dir: Path, current: list[list[str | int]]) -> bool:
    """Whether a checkpoint's step folder answered other files than `current` (`weights_state` of the
    checkpoint now); a folder without a record (none yet, or made before records were kept) did not. An
    unreadable record did: which weights answered is unknown."""
    record = run_dir / WEIGHTS_RECORD
    try:
        return record.is_file() and json.loads(record.read_text()) != current
    except (OSError, ValueError):
        return True


def weights_state(folder: Path) -> list[list[str | int]]:
    """(name, size, modification time) of the files an engine loads from a model or adapter folder: weights
    and config."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in (".safetensors", ".bin") or path.name in CONFIG_FILES):
            stat = path.stat()
            found.append([path.name, stat.st_size, stat.st_mtime_ns])
    return found


def numbers_digest(run_dir: Path) -> str:
    """A digest of a run's task numbers (summary.json's `tasks`; its `run` part holds times, new each run)."""
    try:
        tasks = json.loads((run_dir / "summary.json").read_text())["tasks"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()[:16]
