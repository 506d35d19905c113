"""One clear error for a store that cannot take the run folder, before any engine starts: a write-and-delete
probe, and readable words for what pyarrow and the AWS SDK report."""

from __future__ import annotations

import socket
import uuid

from cluster.storage.location import RemoteFolder
from evaluators.errors import EvalInputError

PROBE_PREFIX = ".rayeval-probe-"


class StorageError(EvalInputError):
    """The store named by --output-dir cannot be reached, read or written."""


def explain(folder: RemoteFolder, exc: BaseException, doing: str) -> str:
    """What went wrong with `folder` while `doing`, in words that say what would fix it."""
    text = str(exc)
    bucket = folder.uri.split("://", 1)[-1].split("/", 1)[0]
    on = f"on node {socket.gethostname()}"
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return (
            f"--output-dir {folder.uri}: the bucket '{bucket}' does not exist ({doing}). Create it first (e.g. "
            f"`aws s3 mb s3://{bucket}`) or name a bucket that exists."
        )
    if "ACCESS_DENIED" in text or "AccessDenied" in text or "Forbidden" in text or "403" in text:
        return (
            f"--output-dir {folder.uri}: access denied while {doing}, with the credentials found {on} (its "
            "environment, ~/.aws or its instance role). Give that node credentials that may write there, or "
            "choose another prefix."
        )
    if "NETWORK_CONNECTION" in text or "curlCode" in text or "Could not connect" in text:
        return (
            f"--output-dir {folder.uri}: the store cannot be reached from {on.removeprefix('on ')} while {doing} "
            f"({_first_line(text)}). Check its address (AWS_ENDPOINT_URL for an S3-compatible store) and that "
            "it is up."
        )
    return f"--output-dir {folder.uri}: {doing} failed: {_first_line(text)}"


def probe_writable(folder: RemoteFolder) -> None:
    """Write a small object under the folder, read its size back and delete it; a store that refuses any of
    it raises StorageError with the reason."""
    filesystem, path = folder.open()
    name = f"{path}/{PROBE_PREFIX}{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    payload = b"rayeval write probe\n"
    try:
        with filesystem.open_output_stream(name) as handle:
            handle.write(payload)
    except OSError as exc:
        raise StorageError(explain(folder, exc, "writing a probe object")) from None
    try:
        size = filesystem.get_file_info(name).size
        filesystem.delete_file(name)
    except OSError as exc:
        raise StorageError(explain(folder, exc, "reading back and deleting a probe object")) from None
    if size != len(payload):
        raise StorageError(
            f"--output-dir {folder.uri}: a probe object of {len(payload)} bytes read back as {size} bytes; the "
            "store does not keep what is written."
        )


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
