"""An engine actor's LoRA adapters on its node: where each one's very files are (the digest the run planned),
at the adapter's path or in the copy the run staged in this node's rayeval cache
(`models.checkpoints.staged_adapter_dir`) where its filesystem lacks them (hosts without shared storage). The
run's side, which makes those copies, is `pool.stage_adapter_on`."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from cluster.models.cache import mark_used
from cluster.models.checkpoints import (
    adapter_files_stamp,
    adapter_folder_here,
    staged_adapter_dir,
)
from sharding.requests import Adapter

MARK_EVERY_S = 3600.0


class AdapterFolders:
    """An engine actor's LoRA adapters on its node: the folder holding each one's very files (its path, or the
    copy staged here), by identity. Looked up in a thread (the digest reads every file), once per identity
    and again where the files at its path changed since (their sizes and times: the same path may be given
    other files while the engine keeps the adapter's id); a staged copy, named by its digest, stays as it is.
    Safe from the actor's several event loops (its concurrency groups each run one)."""

    def __init__(self) -> None:
        # (identity, path) -> (folder or None, the stamp of the files at the path when looked up)
        self.known: dict[tuple[str, str], tuple[str | None, tuple[Any, ...]]] = {}
        self._lock = threading.Lock()  # one lookup at a time: the others then find it done
        self._marked: dict[str, float] = {}  # staged copy -> when it was last marked used (monotonic)

    async def folder(self, adapter: Adapter) -> str | None:
        found = self._fresh(adapter)
        return found[0] if found is not None else await asyncio.to_thread(self._look, adapter)

    async def stage(self, adapter: Adapter, files: dict[str, bytes]) -> str:
        return await asyncio.to_thread(self._stage, adapter, files)

    def _stage(self, adapter: Adapter, files: dict[str, bytes]) -> str:
        from cluster.engines.pushed_weights import write_files

        folder = str(staged_adapter_dir(adapter))
        write_files(folder, files)
        with self._lock:  # after any lookup begun before the copy was there, which would say None
            self.known[adapter.identity, adapter.path] = (folder, ())
        return folder

    def _fresh(self, adapter: Adapter) -> tuple[str | None, tuple[Any, ...]] | None:
        entry = self.known.get((adapter.identity, adapter.path))
        if entry is None:
            return None
        if entry[0] == str(staged_adapter_dir(adapter)):  # the staged copy, named by its digest
            if not os.path.isdir(entry[0]):
                return None  # pruned from the node's cache since (`rayeval cache prune`): looked up again
            self._mark_used(entry[0])
            return entry
        return entry if entry[1] == adapter_files_stamp(Path(adapter.path)) else None

    def _mark_used(self, folder: str) -> None:
        """The staged copy marked used in the node's cache, at most hourly (requests come by the thousand)."""
        now = time.monotonic()
        if now - self._marked.get(folder, -MARK_EVERY_S) >= MARK_EVERY_S:
            self._marked[folder] = now
            mark_used(Path(folder))

    def _look(self, adapter: Adapter) -> str | None:
        with self._lock:
            found = self._fresh(adapter)
            if found is not None:
                return found[0]
            stamp = adapter_files_stamp(Path(adapter.path))  # before reading: a change meanwhile is seen next
            folder = adapter_folder_here(adapter)
            self.known[adapter.identity, adapter.path] = (folder, stamp)
            return folder
