"""Where a command writes what the user asked for (`compare --output FILE`, `plot --output DIR`, `view --out
DIR`): checked before the work, so a path that cannot be written is one line naming the flag and the fix,
not a traceback after the numbers are computed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evaluators.errors import EvalInputError


def output_file(path: Path, flag: str) -> Path:
    """A file to write: not a folder, in a folder that exists (made where missing)."""
    if path.is_dir():
        raise EvalInputError(f"{flag} {path} is a folder: give a file path, e.g. {path / 'comparison.json'}")
    return output_folder(path.parent, flag, path) / path.name


def output_folder(path: Path, flag: str, asked: Path | None = None) -> Path:
    """A folder to write into, made where missing."""
    asked = asked or path
    if path.exists() and not path.is_dir():
        raise EvalInputError(f"{flag} {asked}: {path} is a file, not a folder. Give another path.")
    with written(asked, flag):
        path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def written(path: Path, flag: str) -> Iterator[None]:
    """An OSError while writing `path` as the user's input error: what failed, and the flag to change."""
    try:
        yield
    except OSError as exc:
        raise EvalInputError(
            f"{flag} {path} cannot be written ({exc.strerror or exc}): give a path you can write to."
        ) from None
