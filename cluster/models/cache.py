"""What rayeval keeps in its cache on one machine ($RAYEVAL_CACHE, else ~/.cache/rayeval), and removing what
has not been used for a while.

Every entry is rebuilt from the run's own inputs when a later run needs it again, except a staged run folder
of object storage, which may hold files a killed run never pushed: those are listed, never removed here. The
merged checkpoints are the large ones (a full model each: a sweep with `--lora-merge` or an RD-Agent round
with `lora_merge` makes one per adapter and node). An entry's last use is the newest modification time of
the entry and its files; loading a merged checkpoint, a staged adapter, the default model or a rendered-prompt
file marks it used (`mark_used`), so an entry loaded every day but built long ago is kept.

Plain Python: `cluster.node_caches` runs these functions on every node of a cluster, where each node's own
cache is read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


def cache_root() -> Path:
    """This machine's rayeval cache: $RAYEVAL_CACHE, else ~/.cache/rayeval."""
    return Path(os.environ.get("RAYEVAL_CACHE", Path.home() / ".cache" / "rayeval"))


def staging_root() -> Path:
    """Where this node stages folders of object storage: $RAYEVAL_STAGING_DIR, else the cache's storage
    folder. A pod whose home is small points it at a larger disk."""
    return Path(os.environ.get(STAGING_ENV) or cache_root() / CacheKind.STORAGE.value).expanduser()


class CacheKind(StrEnum):
    """A kind of entry: the folder of the cache that holds it."""

    MERGED = "merged"  # checkpoints merged from LoRA adapters (--lora-merge, RD-Agent's lora_merge)
    ADAPTERS = "adapters"  # adapters copied to an engine's node that lacked them
    MODELS = "models"  # the embedded default model, built from its package
    RENDERED = "rendered"  # prompts rendered with a tokenizer's chat template
    LM_EVAL = "lm_eval"  # lm-eval's task index, one per version and include paths
    STORAGE = "storage"  # run folders of object storage staged on this node

    @property
    def prunable(self) -> bool:
        return self is not CacheKind.STORAGE


# What `rayeval cache prune` removes unless told otherwise: all a later run rebuilds unasked, in seconds or in
# the time one merge takes; the default model only when named (the demo and the tests start from it).
DEFAULT_PRUNED = (CacheKind.MERGED, CacheKind.ADAPTERS, CacheKind.RENDERED, CacheKind.LM_EVAL)
STAGING_ENV = "RAYEVAL_STAGING_DIR"
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
_HIDDEN_PREFIX = "."  # a build in progress, a lock, an entry being removed


@dataclass(frozen=True)
class CacheEntry:
    """One entry of one machine's cache."""

    node: str  # the machine's host name (its IP where listed over a cluster)
    kind: CacheKind
    path: str
    size_bytes: int
    last_used: float  # Unix time


def kind_root(kind: CacheKind, root: Path | None = None) -> Path:
    """The folder that holds entries of `kind` on this machine; staged run folders follow
    $RAYEVAL_STAGING_DIR where it is set (cluster.storage)."""
    if kind is CacheKind.STORAGE and root is None:
        return staging_root()
    return (root or cache_root()) / kind.value


def mark_used(path: Path) -> None:
    """Record that `path` (an entry's folder or file) was used now. A cache shared read-only leaves it as is."""
    with contextlib.suppress(OSError):
        os.utime(path)


def list_entries(
    kinds: tuple[CacheKind, ...] = tuple(CacheKind), root: Path | None = None
) -> list[CacheEntry]:
    """The entries of this machine's cache (`root`, default its cache folder), largest first."""
    node = socket.gethostname()
    entries = [
        _entry(node, kind, path) for kind in kinds for path in _entry_paths(kind, kind_root(kind, root))
    ]
    return sorted(entries, key=lambda entry: (-entry.size_bytes, entry.path))


def prune(
    kinds: tuple[CacheKind, ...],
    unused_for_s: float,
    *,
    dry_run: bool = False,
    root: Path | None = None,
    now: float | None = None,
) -> list[CacheEntry]:
    """Remove this machine's entries of `kinds` not used for `unused_for_s` seconds; returns them (with
    `dry_run`, those it would remove). A staged run folder is never removed (it may hold unpushed files)."""
    check_prunable(kinds)
    cutoff = (time.time() if now is None else now) - unused_for_s
    chosen = [entry for entry in list_entries(kinds, root) if entry.last_used <= cutoff]
    if not dry_run:
        chosen = [entry for entry in chosen if _remove(Path(entry.path))]
    return chosen


def check_prunable(kinds: tuple[CacheKind, ...]) -> None:
    """ValueError naming the kinds that are never pruned: staged run folders (a killed run's files may not
    all be on the store yet)."""
    refused = [kind.value for kind in kinds if not kind.prunable]
    if refused:
        raise ValueError(
            f"--kind {' '.join(refused)}: staged run folders are never pruned (a killed run's files may not all be "
            "on the store yet); remove one by hand once its run is finished and on the store."
        )


def _entry_paths(kind: CacheKind, folder: Path) -> list[Path]:
    """The entries under a kind's folder: each file or folder in it; for staged run folders, the first
    folders down each path that hold a file (a run or sweep folder, at its URI's own path)."""
    if not folder.is_dir():
        return []
    children = [path for path in folder.iterdir() if not _is_lock(path)]
    if kind is not CacheKind.STORAGE:
        return sorted(path for path in children if _sidecar_of(path) is None)
    found: list[Path] = []
    for child in sorted(children):
        if child.is_dir() and not any(path.is_file() for path in child.iterdir()):
            found.extend(_entry_paths(kind, child))
        else:
            found.append(child)
    return found


def _is_lock(path: Path) -> bool:
    """A lock file beside an entry (cluster.models.once): never an entry itself. Other dot-names are (a build
    or a removal that was stopped half way leaves `.staging-*` or `.pruning-*`, as large as an entry)."""
    return path.name.startswith(_HIDDEN_PREFIX) and path.name.endswith(".lock")


def _sidecar_of(path: Path) -> Path | None:
    """The SQLite file whose write-ahead log or shared-memory file `path` is (one entry with it), else None."""
    for suffix in SQLITE_SIDECARS:
        if path.name.endswith(suffix) and path.with_name(path.name.removesuffix(suffix)).is_file():
            return path.with_name(path.name.removesuffix(suffix))
    return None


def _files(path: Path) -> list[str]:
    """The files an entry holds: a folder's, or a file with its SQLite sidecars."""
    if path.is_dir():
        return [os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names]
    return [str(path)] + [str(path) + suffix for suffix in SQLITE_SIDECARS]


def _entry(node: str, kind: CacheKind, path: Path) -> CacheEntry:
    size, newest = 0, _mtime(path)
    for file in _files(path):
        with contextlib.suppress(OSError):
            found = os.stat(file)
            size += found.st_size
            newest = max(newest, found.st_mtime)
    return CacheEntry(node, kind, str(path), size, newest)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _remove(path: Path) -> bool:
    """Remove an entry: renamed out of its name first, so a process that looks it up meanwhile builds it
    afresh instead of loading half-deleted files. False where it is gone or cannot be removed."""
    doomed = path.with_name(f"{_HIDDEN_PREFIX}pruning-{path.name}-{os.getpid()}")
    try:
        path.rename(doomed)
    except OSError:
        return False
    if doomed.is_dir():
        shutil.rmtree(doomed, ignore_errors=True)
    else:
        doomed.unlink(missing_ok=True)
        for suffix in SQLITE_SIDECARS:
            Path(str(path) + suffix).unlink(missing_ok=True)
    return True
