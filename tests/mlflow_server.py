"""A real MLflow tracking server on a loopback port (`mlflow server`, SQLite store, local artifacts), for the
tests of `--log-to mlflow`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port

# The server's job runner (MLflow's GenAI jobs: eight Huey consumer processes, ~12 CPU-s and ~1.8 GB each
# server) off: `--log-to mlflow` uses the tracking API alone, which this leaves as it is.
JOBS_OFF = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """The server's URI while the block runs."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder}/mlflow.db", "--default-artifact-root", str(folder / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **JOBS_OFF},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("mlflow server did not listen within 120 s") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
