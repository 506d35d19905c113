"""Append-only, content-addressed store of completions: the basis of resume.

A completion is keyed by its request id (a hash of model, adapter, prompt, sampling params, seed and sample
index), so a second run over the same folder reads back what is done and only generates what is missing.
Failed completions are stored too (except `retryable` ones, whose replicas died: those are simply missing
next time), so a resumed run reports the same failures without redoing them;
`retry_failed` makes them count as missing instead. A later success for the same id replaces a failure.
A request whose id changed between versions (greedy samples once keyed by seed and sample index) is found
under the id it had then.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sharding.requests import Completion

log = logging.getLogger(__name__)


class StoreInUse(Exception):
    """Another process holds the store: two writers would interleave and duplicate work."""


class StoreWriteError(OSError):
    """Completions could not be written (a full disk, a folder made read-only); the file holds every record
    written before, whole, so a later run resumes from it."""


class ResultStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._completions: dict[str, Completion] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = (self.path.parent / ".lock").open("w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise StoreInUse(str(self.path)) from None
        self._load()
        self._handle = self.path.open("ab", buffering=0)  # unbuffered: a failed write leaves nothing pending

    def _load(self) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        complete_until = raw.rfind(b"\n") + 1
        if complete_until < len(raw):
            # A run killed mid-write leaves half a line; drop it so appends start on a clean line.
            log.warning("dropping a partial last record in %s (the previous run was interrupted)", self.path)
            with self.path.open("r+b") as handle:
                handle.truncate(complete_until)
        for line in raw[:complete_until].decode("utf-8").splitlines():
            if not line.strip():
                continue
            try:
                completion = Completion.from_json(line)
            except (json.JSONDecodeError, TypeError):
                log.warning("skipping an unreadable record in %s", self.path)
                continue
            self._completions[completion.request_id] = completion

    def get(self, request_id: str, earlier_ids: Sequence[str] = ()) -> Completion | None:
        """The stored completion of a request, looked up by its id, then by the ids earlier versions gave the
        same work (`GenerationRequest.earlier_ids`); one found that way is returned under `request_id`."""
        completion = self._completions.get(request_id)
        if completion is not None:
            return completion
        for earlier in earlier_ids:
            if (found := self._completions.get(earlier)) is not None:
                self._completions[request_id] = replace(found, request_id=request_id)
                return self._completions[request_id]
        return None

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._completions

    def is_done(self, request_id: str, retry_failed: bool, earlier_ids: Sequence[str] = ()) -> bool:
        """Whether a request needs no generation: stored (under its id or an earlier one), and (with
        `retry_failed`) stored as a success."""
        completion = self.get(request_id, earlier_ids)
        return completion is not None and (completion.ok or not retry_failed)

    def __len__(self) -> int:
        return len(self._completions)

    def add(self, completions: list[Completion]) -> None:
        """Persist completions at once (flushed), so a kill loses at most the line being written."""
        fresh = [
            c for c in completions if not c.retryable and not self.is_done(c.request_id, retry_failed=True)
        ]
        if not fresh:
            return
        data = "".join(c.to_json() + "\n" for c in fresh).encode("utf-8")
        end = self._handle.seek(0, 2)
        try:
            written = 0
            while written < len(data):
                written += self._handle.write(data[written:]) or 0
        except OSError as exc:
            self._truncate(end)
            raise StoreWriteError(exc.errno, exc.strerror, str(self.path)) from exc
        for completion in fresh:
            self._completions[completion.request_id] = completion

    def _truncate(self, size: int) -> None:
        """Drop a partly written record, so the file ends on a whole line (best effort: a resume drops a
        partial last line anyway)."""
        try:
            self._handle.truncate(size)
        except OSError:
            log.warning("could not drop a partial record at the end of %s", self.path)

    def close(self) -> None:
        self._handle.close()
        self._lock.close()  # closing the file releases the lock
