"""A run folder on a store, while the run goes on: pulled at the start (what a resume reuses), its journals
pushed every `every` completions or `interval_s` seconds, everything pushed at the end.

A store that stops answering mid-run does not stop the run: the local journal keeps every result, the push is
tried again at the next interval, and the end says where the folder is and how to resume if it still fails.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import ClusterError
from cluster.storage.location import RemoteFolder, is_remote, local_path
from cluster.storage.mirror import FolderMirror
from cluster.storage.probe import StorageError, explain

log = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass(frozen=True)
class SyncPolicy:
    """When a run's journal goes to the store: after `every` new completions, or `interval_s` seconds."""

    every: int
    interval_s: float


class RunFolderSync:
    """The run folder's mirror and the thread that pushes it while the run goes on."""

    def __init__(self, mirror: FolderMirror, policy: SyncPolicy) -> None:
        self.mirror = mirror
        self.policy = policy
        self._count: Callable[[], int] = lambda: 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing_since: float | None = None

    @property
    def uri(self) -> str:
        return self.mirror.remote.uri

    def start(self, count: Callable[[], int]) -> None:
        """Push in the background; `count` gives the completions added so far."""
        self._count = count
        self._thread = threading.Thread(target=self._loop, name="rayeval-store-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        pushed_at, pushed_count = time.monotonic(), 0
        while not self._stop.wait(POLL_S):
            count = self._count()
            due = count - pushed_count >= self.policy.every
            if not due and time.monotonic() - pushed_at < self.policy.interval_s:
                continue
            if self._push(final=False):
                pushed_count = count
            pushed_at = time.monotonic()

    def _push(self, final: bool) -> bool:
        try:
            self.mirror.push(final)
        except OSError as exc:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning(
                    "%s; the run goes on: every result is kept in %s on node %s and the upload is tried "
                    "again every %.0f s",
                    explain(self.mirror.remote, exc, "uploading the journal"),
                    self.mirror.local,
                    socket.gethostname(),
                    self.policy.interval_s,
                )
            return False
        if self._failing_since is not None:
            log.warning(
                "the store %s answers again (after %.0f s); the journal is uploaded",
                self.uri,
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None
        return True

    def finish(self, complete: bool) -> None:
        """Stop the thread and push: everything when the run `complete`d (a store that fails then raises a
        ClusterError saying where the folder is), else the journal (best effort: the run's own error is
        the one to report)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.mirror.push(final=complete)
        except OSError as exc:
            if not complete:
                log.warning(
                    "%s; the results so far are in %s on node %s",
                    explain(self.mirror.remote, exc, "uploading the journal"),
                    self.mirror.local,
                    socket.gethostname(),
                )
                return
            raise ClusterError(
                f"{explain(self.mirror.remote, exc, 'uploading the finished run folder')}. Nothing is lost: the "
                f"whole folder is in {self.mirror.local} on node {socket.gethostname()}. Rerun the same command "
                "(same --run-id and --output-dir) on that node once the store is back: nothing is generated "
                "again and the folder is uploaded. On another node the run resumes from what reached the "
                "store and generates the rest."
            ) from None


def open_run_folder(remote: RemoteFolder, policy: SyncPolicy) -> RunFolderSync:
    """The run folder's sync, its store's files pulled into the local staging folder first."""
    mirror = FolderMirror(remote.staging, remote)
    fetched = mirror.pull(leave_held=False)  # the run holds its folder's lock: its own pull
    if fetched:
        log.info("fetched %d files of %s into %s (resuming)", fetched, remote.uri, remote.staging)
    return RunFolderSync(mirror, policy)


def local_copy(remote: RemoteFolder) -> FolderMirror:
    """A folder on a store, read into its local staging folder (compare, plot, --judge-only read it there)."""
    mirror = FolderMirror(remote.staging, remote)
    mirror.pull()
    return mirror


def move_on_store(remote: RemoteFolder, moved_here: Path) -> RemoteFolder:
    """Give a folder on the store the name its staging copy was moved to here (`moved_here`, beside the staging
    folder): the copy goes up under that name, then the store's folder is deleted. Object stores have no
    rename of folders. Raises StorageError naming what failed; the copy is up before anything is deleted."""
    target = remote.sibling(moved_here.name)
    try:
        FolderMirror(moved_here, target).push(final=True)
        filesystem, path = remote.open()
        filesystem.delete_dir(path)
    except OSError as exc:
        raise StorageError(explain(remote, exc, f"moving it to {target.uri}")) from None
    return target


def readable_folder(value: str | Path) -> Path:
    """A folder a command reads (compare's runs, plot's runs, a sweep): a local path as it is, a URI read
    into its staging folder first."""
    if not is_remote(str(value)):
        return local_path(str(value))
    remote = RemoteFolder.parse(str(value), "the folder")
    mirror = local_copy(remote)
    if not mirror.local.is_dir() or not any(mirror.local.iterdir()):
        raise StorageError(f"{remote.uri} holds no files: is it a run folder, and is the URI right?")
    return mirror.local
