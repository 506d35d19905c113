"""lm-eval's task index, kept on disk between processes.

lm-eval's `TaskManager` parses every task YAML it can find when it is built (about 14,000 files that lm-eval
ships, seconds of a run's start), although those files change only when lm-eval is upgraded or a user edits
an `--include-path` folder. The index is pickled under a key made of lm-eval's version and, for every YAML
file of every folder indexed, its path, size and modification time: an upgrade, an edited, added or removed
task file, or another set of folders builds and stores it again. A cache that cannot be read or written is
skipped (the index is then built as lm-eval builds it), never an error. The cache keeps the `KEEP` indexes
used last, one per set of folders.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PREFIX = "task-index-"
KEEP = 8  # indexes kept (about 16 MB each): one per set of folders, the least recently used dropped first


def task_manager(
    include_paths: Sequence[str], cache_dir: Path | None, *, include_defaults: bool = True
) -> Any:
    """lm-eval's `TaskManager` over its own tasks (unless `include_defaults` is False, as lm-eval's own
    argument) plus `include_paths`, read from `cache_dir` when the files it indexes are unchanged since it was
    stored there (built and stored otherwise; built when None)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folders = [str(Path(p).expanduser().resolve()) for p in include_paths]  # absolute: valid from any folder
    roots = [*([Path(lm_eval.tasks.__file__).parent] if include_defaults else []), *map(Path, folders)]
    path = None
    if cache_dir is not None:
        folders_key = _digest([str(root) for root in roots])
        path = cache_dir / f"{_PREFIX}{folders_key}-{_files_key(roots, lm_eval.__version__)}.pkl"
        stored = _read(path)
        if isinstance(stored, TaskManager):
            _touch(path)
            return stored
    manager = TaskManager(include_path=folders or None, include_defaults=include_defaults)
    if path is not None:
        _write(path, manager)
    return manager


def _files_key(roots: Sequence[Path], version: str) -> str:
    parts = [version]
    for root in roots:
        for yaml_path in sorted(root.rglob("*.yaml")):
            try:
                stat = yaml_path.stat()
                parts.append(f"{yaml_path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}")
            except OSError:  # a dangling link: lm-eval skips it too
                parts.append(f"{yaml_path.relative_to(root)}\0missing")
        parts.append("\n")  # a file moved from one folder to the next changes the key
    return _digest(parts)


def _digest(parts: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _read(path: Path) -> object | None:
    try:
        with path.open("rb") as stored:
            return pickle.load(stored)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: rebuild the index
        log.info("lm-eval task index at %s not usable (%s); building it again", path, type(exc).__name__)
        return None


def _write(path: Path, manager: Any) -> None:
    """Store atomically (runs may start at once), then drop the same folders' older indexes (the names
    that share `path`'s folders key) and all but the `KEEP` indexes used last."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(handle, "wb") as out:
                pickle.dump(manager, out, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        same_folders = path.name.rsplit("-", 1)[0] + "-*.pkl"
        for old in path.parent.glob(same_folders):
            if old != path:
                old.unlink(missing_ok=True)
        by_use = sorted(path.parent.glob(f"{_PREFIX}*.pkl"), key=lambda f: f.stat().st_mtime, reverse=True)
        for unused in by_use[KEEP:]:
            unused.unlink(missing_ok=True)
    except Exception as exc:  # noqa: BLE001 - a read-only cache or an index that does not pickle: go on
        log.info("lm-eval task index not stored in %s (%s)", path.parent, exc)


def _touch(path: Path) -> None:
    """Mark an index as used now, so that the cache drops others first."""
    try:
        os.utime(path)
    except OSError:
        pass
