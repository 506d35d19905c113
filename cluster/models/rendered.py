"""Prompts a model folder's chat template rendered, remembered across runs.

Rendering needs the tokenizer, and loading it imports transformers: about 2 s of a two-core machine's time
before the first request of a run on warm engines can leave. A run that asks what an earlier run asked (the
same prompts on the same tokenizer files) reads the text rendered then instead. The cache file is named by
a digest of the folder's tokenizer files (every file but the weights) and the transformers version, so an
edited template or another transformers starts another file; each prompt is keyed by its digest
(`Prompt.digest`). It is a cache: any failure to open, read or write it leaves the run rendering as it would
without one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import sqlite3
import threading
from pathlib import Path

from cluster.models.cache import mark_used

log = logging.getLogger(__name__)

# Files that hold weights or training state, not the tokenizer: left out of the digest (and never read).
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".h5",
    ".msgpack",
    ".ckpt",
    ".onnx",
    ".npz",
)
LARGEST_TOKENIZER_FILE = 256 * 1024 * 1024  # a file beyond this is data, not a tokenizer's


def tokenizer_digest(folder: Path, revision: str | None = None) -> str | None:
    """A digest of everything that decides how `folder`'s tokenizer renders a chat; None where `folder` is
    not a local model folder (a hub id: nothing to read without loading it)."""
    if not folder.is_dir():
        return None
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        version = "none"
    digest = hashlib.sha256(f"transformers {version}\nrevision {revision or ''}\n".encode())
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.endswith(WEIGHT_SUFFIXES):
            continue
        if path.stat().st_size > LARGEST_TOKENIZER_FILE:
            continue
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:32]


class RenderedPrompts:
    """One tokenizer's rendered prompts (an SQLite file), and whether that tokenizer has a chat template.

    Safe to share between threads. Once an operation fails, the cache answers "not cached" from then on and
    writes nothing: the run renders every prompt itself."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, timeout=5, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")  # a cache: a crash may lose the last rows, never a run
            db.execute("CREATE TABLE IF NOT EXISTS rendered (prompt TEXT PRIMARY KEY, text TEXT NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS facts (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._db = db
            mark_used(path)
        except (OSError, sqlite3.Error) as exc:
            self._give_up(exc)

    @classmethod
    def of_folder(cls, folder: Path, revision: str | None, cache_dir: Path) -> RenderedPrompts | None:
        """The cache of `folder`'s tokenizer under `cache_dir`; None for a folder that is not local."""
        try:
            digest = tokenizer_digest(folder, revision)
        except OSError as exc:
            log.debug("rendered-prompt cache off: %s", exc)
            return None
        return None if digest is None else cls(cache_dir / f"{digest}.sqlite")

    def get(self, prompt_digest: str) -> str | None:
        row = self._query("SELECT text FROM rendered WHERE prompt = ?", (prompt_digest,))
        return None if row is None else str(row[0])

    def put(self, prompt_digest: str, text: str) -> None:
        self._query("INSERT OR REPLACE INTO rendered VALUES (?, ?)", (prompt_digest, text))

    def has_template(self) -> bool | None:
        """Whether the tokenizer has a chat template, as found when it was last loaded; None if unknown."""
        row = self._query("SELECT value FROM facts WHERE name = 'has_template'", ())
        return None if row is None else row[0] == "1"

    def set_has_template(self, has_template: bool) -> None:
        self._query(
            "INSERT OR REPLACE INTO facts VALUES ('has_template', ?)", ("1" if has_template else "0",)
        )

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _query(self, sql: str, values: tuple[str, ...]) -> tuple[str, ...] | None:
        with self._lock:
            if self._db is None:
                return None
            try:
                return self._db.execute(sql, values).fetchone()
            except sqlite3.Error as exc:
                self._give_up(exc)
                return None

    def _give_up(self, exc: BaseException) -> None:
        log.debug("rendered-prompt cache %s off for this run: %s", self.path, exc)
        if self._db is not None:
            self._db.close()
        self._db = None
