"""A model folder built once per machine: into a temporary folder beside it, then renamed into place."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def built_once(target: Path, build: Callable[[Path], None], what: str) -> Path:
    """`target` (a model folder: done once it has config.json), made by `build(staging)` and renamed into
    place. Processes of one machine build it one at a time (a lock file beside it): the others wait, then
    find it built; where a machine sharing the folder renamed its own first, that one is as good."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = -1
    with contextlib.suppress(OSError):  # read-only (another user's, in a shared cache) is enough to lock it
        lock = os.open(target.parent / f".{target.name}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        # no lock file, or a filesystem without locks: the rename below still settles it
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # built by the process that held the lock before
            return target
        log.info("%s into %s (once)", what, target)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        try:
            build(staging)
            try:
                staging.rename(target)
            except OSError:
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        if lock >= 0:
            os.close(lock)
    return target
