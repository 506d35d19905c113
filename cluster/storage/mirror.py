"""A local folder kept in step with a folder on an object store (or any filesystem pyarrow opens).

A run writes its folder on the coordinator's own disk, as it would locally; this mirror moves it to the store
and back. The resume stores (`*.jsonl` under a `cache/` folder: completions, a judge's judgments) are
append-only journals: while the run goes on, each push uploads only the lines added since the last one, as a
part object `NAME.parts/START-END` (byte offsets into the journal), so a crash loses at most what was added
since the last push. At the end every file is uploaded whole and a journal's parts are deleted. A pull
assembles each journal from its whole object and the parts after it (by offset, so a part that the whole
object already holds is skipped), and keeps a local journal that holds the store's and more (one that could
not be uploaded); a local journal that is not the store's journal or its start (another node's run went on
from the store since) gives way to the store's, with its own records the store lacks appended (nothing
computed is lost, and no request gets two records). Other files are taken from the store.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from cluster.storage.folder_lock import held_folders
from cluster.storage.location import RemoteFolder
from cluster.storage.probe import StorageError, explain
from sharding.store import record_key

if TYPE_CHECKING:
    import pyarrow.fs

log = logging.getLogger(__name__)

PARTS_SUFFIX = ".parts"
CHUNK = 8 << 20  # bytes read and written at a time when copying
COMPARED = 64 << 10  # the journal's last bytes compared with the store's before a local copy is kept


def is_journal(relative: str) -> bool:
    """An append-only resume store: a .jsonl file in a folder named cache."""
    path = PurePosixPath(relative)
    return path.suffix == ".jsonl" and "cache" in path.parts[:-1]


def is_local_only(relative: str) -> bool:
    """Files that stay on the node: locks, temporary files, probes."""
    name = PurePosixPath(relative).name
    return name.startswith(".") or name.endswith(".tmp")


@dataclass(frozen=True)
class _Part:
    start: int
    end: int
    path: str  # on the filesystem


class FolderMirror:
    """`local` mirrored to `remote`. Thread-safe: pushes and pulls hold one lock."""

    def __init__(self, local: Path, remote: RemoteFolder) -> None:
        self.local = local
        self.remote = remote
        self._filesystem, self._base = remote.open()
        self._journal_sent: dict[str, int] = {}  # journal -> its bytes on the store (whole object + parts)
        self._parts_sent: set[str] = set()  # journals with part objects on the store
        self._sent: dict[str, tuple[int, int]] = {}  # other file -> (size, mtime_ns) of the version sent
        self._lock = threading.Lock()

    # ---- from the store -------------------------------------------------------------------------------
    def pull(self, leave_held: bool = True) -> int:
        """Bring the store's files here; returns how many were fetched. A folder not on the store yet is
        empty, not an error. `leave_held`: files in a folder whose run lock is held (a run on this node
        writing them: cluster.storage.folder_lock) are left as they are; the run itself pulls with False."""
        import pyarrow.fs as pafs

        busy = (
            [folder.relative_to(self.local).as_posix() for folder in held_folders(self.local)]
            if leave_held
            else []
        )
        with self._lock:
            try:
                infos = self._filesystem.get_file_info(
                    pafs.FileSelector(self._base, recursive=True, allow_not_found=True)
                )
            except OSError as exc:
                raise StorageError(explain(self.remote, exc, "listing the run folder")) from None
            wholes: dict[str, pafs.FileInfo] = {}
            parts: dict[str, list[_Part]] = defaultdict(list)
            for info in infos:
                if not info.is_file:
                    continue
                relative = info.path[len(self._base) :].lstrip("/")
                journal, _, part = relative.partition(PARTS_SUFFIX + "/")
                if part and is_journal(journal):
                    start, _, end = part.partition("-")
                    if start.isdigit() and end.isdigit():
                        parts[journal].append(_Part(int(start), int(end), info.path))
                elif not is_local_only(relative):
                    wholes[relative] = info
            if busy:
                log.info(
                    "%s: leaving %s as the run writing it there has it", self.remote.uri, ", ".join(busy)
                )
            fetched = 0
            for relative in sorted(set(wholes) | set(parts)):
                if any(folder == "." or relative.startswith(folder + "/") for folder in busy):
                    continue
                try:
                    if is_journal(relative):
                        fetched += self._pull_journal(relative, wholes.get(relative), parts.get(relative, []))
                    else:
                        fetched += self._pull_file(relative, wholes[relative])
                except OSError as exc:
                    raise StorageError(explain(self.remote, exc, f"reading {relative}")) from None
            return fetched

    def _pull_journal(self, relative: str, whole: pyarrow.fs.FileInfo | None, parts: list[_Part]) -> int:
        size = whole.size if whole is not None else 0
        chain, end = [], size
        for part in sorted(parts, key=lambda p: (p.start, p.end)):
            if part.end <= end:
                continue  # already in the whole object or an earlier part
            if part.start > end:
                log.warning(
                    "%s/%s: a gap before the part at byte %d (the store lost a part); what follows it is "
                    "generated again",
                    self.remote.uri,
                    relative,
                    part.start,
                )
                break
            chain.append((part, end - part.start))
            end = part.end
        if chain:
            self._parts_sent.add(relative)
        target = self.local / relative
        self._journal_sent[relative] = end
        local_size = target.stat().st_size if target.exists() else None
        if local_size is not None and end == 0:
            return 0  # nothing of it on the store: this node's journal as it is
        segments = [(0, size, f"{self._base}/{relative}", 0)] if whole is not None else []
        segments += [(part.start + skip, part.end, part.path, skip) for part, skip in chain]
        if local_size is not None and local_size >= end and self._ends_alike(target, segments, end):
            return 0  # this node's journal holds the store's and more (an upload that failed): no download
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        with temporary.open("wb") as out:
            if whole is not None:
                self._copy_from(f"{self._base}/{relative}", out, 0)
            for part, skip in chain:
                self._copy_from(part.path, out, skip)
        if local_size is not None and _same_start(target, temporary, min(local_size, end)):
            if local_size >= end:  # this node's journal holds the store's and more (an upload that failed)
                temporary.unlink()
                return 0
        elif local_size is not None:  # another node's run went on from the store since this copy was made
            kept = _append_lines_it_lacks(temporary, target)
            log.warning(
                "%s/%s: this node's copy (%s) differs from the store's, where another run went on: the store's "
                "records are taken, with %d of this node's that it lacks",
                self.remote.uri,
                relative,
                target,
                kept,
            )
        temporary.replace(target)
        return 1

    def _pull_file(self, relative: str, info: pyarrow.fs.FileInfo) -> int:
        target = self.local / relative
        remote_size, remote_mtime = info.size, info.mtime_ns or 0
        if target.exists():
            stat = target.stat()
            if stat.st_size == remote_size and stat.st_mtime_ns >= remote_mtime:
                self._sent[relative] = (stat.st_size, stat.st_mtime_ns)
                return 0
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        with temporary.open("wb") as out:
            self._copy_from(f"{self._base}/{relative}", out, 0)
        temporary.replace(target)
        stat = target.stat()
        self._sent[relative] = (stat.st_size, stat.st_mtime_ns)
        return 1

    def _ends_alike(self, local: Path, segments: list[tuple[int, int, str, int]], end: int) -> bool:
        """Whether the store's journal (its objects' `segments`: journal start, end, path, offset in the
        object) and the local one hold the same bytes in the last COMPARED bytes before `end`. Journals only
        grow, so a local copy that another node's run went past differs there (its own records stand where
        the store has the other run's); equal there, the local copy is the store's and more."""
        window_start = max(0, end - COMPARED)
        stored = bytearray()
        for start, stop, path, offset in segments:
            low, high = max(start, window_start), min(stop, end)
            if low >= high:
                continue
            with self._filesystem.open_input_file(path) as source:
                stored += source.read_at(high - low, offset + (low - start))
        with local.open("rb") as handle:
            handle.seek(window_start)
            return handle.read(end - window_start) == bytes(stored)

    def _copy_from(self, path: str, out: BinaryIO, skip: int) -> None:
        with self._filesystem.open_input_stream(path) as source:
            if skip:
                source.read(skip)
            while chunk := source.read(CHUNK):
                out.write(chunk)

    # ---- to the store ---------------------------------------------------------------------------------
    def push(self, final: bool, only: tuple[str, ...] = ()) -> int:
        """Upload what changed; returns how many objects were written. Not final: the journals' new lines
        as parts, and config.yaml. Final: every file whole, and the journals' parts deleted. `only`: the
        files and folders (relative) to consider, every one when empty. Raises OSError from the store."""
        with self._lock:
            written = 0
            for relative in self._local_files(only):
                if is_journal(relative):
                    written += self._push_journal(relative, final)
                elif final or relative == "config.yaml":
                    written += self._push_file(relative)
            return written

    def _local_files(self, only: tuple[str, ...]) -> list[str]:
        found = []
        for directory, _, names in os.walk(self.local):
            for name in names:
                relative = Path(directory, name).relative_to(self.local).as_posix()
                if is_local_only(relative):
                    continue
                if only and not any(relative == o or relative.startswith(o.rstrip("/") + "/") for o in only):
                    continue
                found.append(relative)
        return sorted(found)

    def _push_journal(self, relative: str, final: bool) -> int:
        path = self.local / relative
        sent = self._journal_sent.get(relative, 0)
        with path.open("rb") as handle:
            data_end = _complete_lines_end(handle, path.stat().st_size)
            if data_end < sent or (final and (relative in self._parts_sent or data_end != sent)):
                handle.seek(0)  # rewritten, shrunk, or the end of the run: the journal whole
                self._write(f"{self._base}/{relative}", handle, data_end)
                self._journal_sent[relative] = data_end
                if relative in self._parts_sent:
                    self._delete_parts(relative)
                return 1
            if data_end == sent:
                return 0
            handle.seek(sent)
            self._write(
                f"{self._base}/{relative}{PARTS_SUFFIX}/{sent:015d}-{data_end:015d}", handle, data_end - sent
            )
        self._journal_sent[relative] = data_end
        self._parts_sent.add(relative)
        return 1

    def _push_file(self, relative: str) -> int:
        path = self.local / relative
        stat = path.stat()
        if self._sent.get(relative) == (stat.st_size, stat.st_mtime_ns):
            return 0
        with path.open("rb") as handle:
            self._write(f"{self._base}/{relative}", handle, stat.st_size)
        self._sent[relative] = (stat.st_size, stat.st_mtime_ns)
        return 1

    def _write(self, path: str, handle: BinaryIO, size: int) -> None:
        with self._filesystem.open_output_stream(path) as out:
            left = size
            while left > 0 and (chunk := handle.read(min(CHUNK, left))):
                out.write(chunk)
                left -= len(chunk)

    def _delete_parts(self, relative: str) -> None:
        try:
            self._filesystem.delete_dir(f"{self._base}/{relative}{PARTS_SUFFIX}")
        except (OSError, FileNotFoundError) as exc:
            # the whole journal is up: a part left behind is skipped by every pull (its bytes are in it)
            log.warning("could not delete %s%s on the store: %s", relative, PARTS_SUFFIX, exc)
        self._parts_sent.discard(relative)


def _same_start(first: Path, second: Path, size: int) -> bool:
    """Whether two files' first `size` bytes are equal."""
    with first.open("rb") as one, second.open("rb") as other:
        while size > 0:
            want = min(CHUNK, size)
            chunk = one.read(want)
            if chunk != other.read(want) or len(chunk) < want:
                return False
            size -= want
    return True


def _append_lines_it_lacks(journal: Path, other: Path) -> int:
    """Append to `journal` the complete lines of `other` whose record (its request id: the journals are
    result stores, `sharding.store`) `journal` lacks; returns how many. `journal`'s own bytes stay first,
    as they are on the store."""
    have = {key for line in journal.read_bytes().splitlines() if (key := record_key(line)) is not None}
    raw = other.read_bytes()
    lines = raw[: raw.rfind(b"\n") + 1].splitlines()
    extra = [line for line in lines if (key := record_key(line)) is not None and key not in have]
    if extra:
        with journal.open("ab") as out:  # the store's ends on a newline: only complete lines are pushed
            out.write(b"".join(line + b"\n" for line in extra))
    return len(extra)


def _complete_lines_end(handle: BinaryIO, size: int) -> int:
    """The byte offset after the journal's last newline: a line still being written is left for later."""
    if size == 0:
        return 0
    window = min(size, 1 << 16)
    while True:
        handle.seek(size - window)
        tail = handle.read(window)
        newline = tail.rfind(b"\n")
        if newline >= 0:
            return size - window + newline + 1
        if window == size:
            return 0
        window = min(size, window * 4)
