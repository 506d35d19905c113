"""Where a command writes what the user asked for (`compare --output FILE`, `plot --output DIR`, `view --out
DIR`): checked before the work, so a path that cannot be written is one line naming the flag and the fix,
not a traceback after the numbers are computed. Nothing is made until there is something to write."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evaluators.errors import EvalInputError


def output_file(path: Path, flag: str) -> Path:
    """A file that can be written: not a folder, under a folder that exists or can be made."""
    if path.is_dir():
        raise EvalInputError(f"{flag} {path} is a folder: give a file path, e.g. {path / 'comparison.json'}")
    _check_place(path.parent, flag, path)
    return path


def output_folder(path: Path, flag: str) -> Path:
    """A folder that can be written into: one that exists, or can be made."""
    _check_place(path, flag, path)
    return path


def _check_place(folder: Path, flag: str, asked: Path) -> None:
    """`folder`, or the nearest of its parents that exists, is a folder this process may write in."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise EvalInputError(f"{flag} {asked}: {existing} is a file, not a folder. Give another path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EvalInputError(
            f"{flag} {asked}: {existing} is not writable here. Give a path you can write to."
        )


@contextmanager
def written(path: Path, flag: str) -> Iterator[None]:
    """An OSError while writing `path` as the user's input error: what failed, and the flag to change."""
    try:
        yield
    except OSError as exc:
        raise EvalInputError(
            f"{flag} {path} cannot be written ({exc.strerror or exc}): give a path you can write to."
        ) from None
