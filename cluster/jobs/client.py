"""A Ray cluster's jobs through its Job Submission API (the dashboard's HTTP address, port 8265 by default):
submit a `rayeval` command, follow its log, list, inspect, read and stop jobs, with one readable error for
each way the connection fails."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from ray.exceptions import AuthenticationError
from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient

from cluster.addresses import check_address_reachable
from cluster.errors import ClusterError, first_line
from cluster.jobs.auth import TOKEN_HELP, enable_token_auth

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
ADDRESS_ENV = "RAY_API_SERVER_ADDRESS"  # what `ray job submit` reads too


def dashboard_address(given: str | None) -> str:
    """The Job Submission API's address: the flag, else $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS (a GCS
    address is resolved to its dashboard by Ray), else this machine's dashboard. Ray's client would let the
    variables override a given address; here a flag wins."""
    return given or os.environ.get(ADDRESS_ENV) or os.environ.get("RAY_ADDRESS") or DEFAULT_DASHBOARD


@dataclass(frozen=True)
class JobSpec:
    """One `rayeval` command to run on the cluster as a Ray Job. `command` is what follows `rayeval`
    (e.g. ["run", "--tasks", "gsm8k"]); `env` and `working_dir` become the job's runtime_env."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    job_id: str | None = None
    executable: str = "rayeval"

    @property
    def entrypoint(self) -> str:
        return shlex.join([self.executable, *self.command])

    def runtime_env(self) -> dict[str, Any]:
        env: dict[str, Any] = {}
        if self.env:
            env["env_vars"] = dict(self.env)
        if self.working_dir:
            env["working_dir"] = self.working_dir
        return env


@dataclass(frozen=True)
class JobRow:
    """What `rayeval jobs list|status` shows of one job."""

    job_id: str
    status: str
    started: str
    ended: str
    entrypoint: str
    message: str

    @classmethod
    def of(cls, job: JobDetails) -> JobRow:
        return cls(
            job_id=job.submission_id or job.job_id or "?",
            status=str(job.status),
            started=_clock(job.start_time),
            ended=_clock(job.end_time),
            entrypoint=job.entrypoint,
            message=job.message or "",
        )


def _clock(epoch_ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_ms / 1000)) if epoch_ms else "-"


class JobsClient:
    """The jobs of one cluster. Connecting enables Ray's token mode when a token is available (`auth`)."""

    def __init__(self, address: str | None) -> None:
        self.address = dashboard_address(address)
        self.token_source = enable_token_auth()
        if "://" not in self.address:  # a GCS address: Ray asks it for the dashboard, retrying for a minute
            check_address_reachable(self.address)
        with self._reported(), _address_variables_unset():
            self.client = JobSubmissionClient(self.address)

    def submit(self, spec: JobSpec, agent_wait_s: float = 60.0) -> str:
        """Submit the job. A head that started moments ago may have no job agent registered yet (Ray answers
        "No available agent to submit job, please try again later"): asked again, seconds apart, for
        `agent_wait_s`."""
        deadline = time.monotonic() + agent_wait_s
        with self._reported():
            while True:
                try:
                    return self.client.submit_job(
                        entrypoint=spec.entrypoint,
                        submission_id=spec.job_id,
                        runtime_env=spec.runtime_env() or None,
                        metadata={"submitted_by": "rayeval"},
                    )
                except RuntimeError as exc:
                    if "No available agent" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(2.0)

    def follow(self, job_id: str, out: TextIO = sys.stdout) -> JobDetails:
        """Print the job's log as it is written until the job ends; returns its final details."""

        async def tail() -> None:
            async for chunk in self.client.tail_job_logs(job_id):
                out.write(chunk)
                out.flush()

        logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)  # "WebSocket closed"
        with self._reported(job_id):
            asyncio.run(tail())
            return self.wait(job_id)

    def wait(self, job_id: str, poll_s: float = 0.5) -> JobDetails:
        """The job's details once its status is terminal (the log stream can end a moment before)."""
        with self._reported(job_id):
            while True:
                details = self.client.get_job_info(job_id)
                if JobStatus(details.status).is_terminal():
                    return details
                time.sleep(poll_s)

    def rows(self) -> list[JobRow]:
        with self._reported():
            jobs = [j for j in self.client.list_jobs() if j.submission_id]  # drivers not submitted as jobs
        return sorted((JobRow.of(j) for j in jobs), key=lambda row: row.started)

    def row(self, job_id: str) -> JobRow:
        with self._reported(job_id):
            return JobRow.of(self.client.get_job_info(job_id))

    def logs(self, job_id: str) -> str:
        with self._reported(job_id):
            return self.client.get_job_logs(job_id)

    def stop(self, job_id: str) -> bool:
        with self._reported(job_id):
            return self.client.stop_job(job_id)

    @contextmanager
    def _reported(self, job_id: str | None = None) -> Iterator[None]:
        """Ray's connection, authentication and unknown-job errors as one ClusterError that says the fix."""
        try:
            yield
        except AuthenticationError:
            where = f" (this process used the token from {self.token_source})" if self.token_source else ""
            raise ClusterError(
                f"The Ray cluster at {self.address} refused the request{where}. {TOKEN_HELP}"
            ) from None
        except ConnectionError as exc:
            raise ClusterError(
                f"No Ray job server answered at {self.address} ({first_line(exc)}). Give the head node's "
                f"dashboard address, e.g. --address http://HEAD:8265 (or export {ADDRESS_ENV}), and check that "
                "`ray start --head` runs there with its dashboard (it needs ray[default])."
            ) from None
        except RuntimeError as exc:
            if job_id and "does not exist" in str(exc):
                raise ClusterError(
                    f"The cluster at {self.address} has no job '{job_id}'. `rayeval jobs list` shows its jobs."
                ) from None
            raise


@contextmanager
def _address_variables_unset() -> Iterator[None]:
    """Ray's client takes RAY_API_SERVER_ADDRESS / RAY_ADDRESS over its argument; the argument is already
    the one chosen (`dashboard_address`), so hide them while the client resolves it."""
    saved = {name: os.environ.pop(name) for name in (ADDRESS_ENV, "RAY_ADDRESS") if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def exit_code(details: JobDetails) -> int:
    """A followed job's result as a process exit status: 0 when it succeeded, the driver's own code when it
    failed with one, else 1."""
    if JobStatus(details.status) == JobStatus.SUCCEEDED:
        return 0
    code = getattr(details, "driver_exit_code", None)
    return code if isinstance(code, int) and code > 0 else 1
