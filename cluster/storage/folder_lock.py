"""A run folder's lock: held by the run that writes it, from before its store's files are pulled in and its
config.yaml is written until it ends, so a second run over the same folder on this node is refused before it
changes anything, and a command that reads a store's folder on this node (compare, plot, view, a re-judge)
leaves the files of a run that is writing them as they are instead of pulling older ones over them."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".run.lock"  # a dot-name: never synced to the store (cluster.storage.mirror.is_local_only)


class FolderInUse(Exception):
    """Another process (or another run of this one) holds the folder's lock."""


@contextmanager
def holding(folder: Path) -> Iterator[None]:
    """The folder's lock, held for the block; FolderInUse at once where it is held already."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / LOCK_NAME).open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise FolderInUse(str(folder)) from None
    try:
        yield
    finally:
        handle.close()  # releases the lock


def is_held(folder: Path) -> bool:
    """Whether a run holds the folder's lock now (this process's own runs included)."""
    try:
        handle = (folder / LOCK_NAME).open("r")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def held_folders(root: Path) -> list[Path]:
    """The folders under `root` (itself included) whose lock a run holds now."""
    found = []
    for folder, _, names in os.walk(root):
        if LOCK_NAME in names and is_held(Path(folder)):
            found.append(Path(folder))
    return found
