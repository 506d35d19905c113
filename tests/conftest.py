from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (a failure found once is found again, and CI never meets
# a new random case the last run did not); no per-example deadline on a 2-core machine running engines.
settings.register_profile("rayeval", derandomize=True, deadline=None)
settings.load_profile("rayeval")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_gsm8k() -> Path:
    path = SHARED / "data" / "gsm8k" / "test.jsonl"
    assert path.is_file(), (
        f"the tests need ../shared/data/gsm8k/test.jsonl beside the checkout (looked at {path})"
    )
    return path


@pytest.fixture(scope="session")
def local_lm_eval_tasks(tmp_path_factory, shared_gsm8k) -> Path:
    """The local-data lm-eval tasks (tests/lm_eval_local.py) on GSM8K's first 200 rows, gsm8k_local's answers
    capped at 64 tokens, in one folder for the whole test run: lm-eval's task index over it is built by the
    first run that names it, read back by the rest."""
    from tests.lm_eval_local import write_local_tasks

    return write_local_tasks(tmp_path_factory.mktemp("lm_eval_local"), shared_gsm8k, max_gen_toks=64)


@pytest.fixture(scope="session")
def base_ifeval_run(tmp_path_factory) -> Path:
    """The embedded model's greedy IFEval run (the first BASE_IFEVAL_LIMIT questions, N = BASE_IFEVAL_SAMPLES)
    from one real local run, shared by the tests that compare adapters, sweeps and endpoints against the base
    model and by the greedy-N tests: one engine start for all of them."""
    from tests.runs import BASE_IFEVAL_ARGS, BASE_IFEVAL_LIMIT, BASE_IFEVAL_SAMPLES, rayeval

    out = tmp_path_factory.mktemp("base-ifeval")
    done = rayeval("run", *BASE_IFEVAL_ARGS, "--limit", str(BASE_IFEVAL_LIMIT), "--num-samples",
                   str(BASE_IFEVAL_SAMPLES), "--output-dir", str(out), "--run-id", "base")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "base"


@pytest.fixture(scope="session")
def base_ifeval_records(base_ifeval_run) -> list[dict]:
    """The base run's per-sample records: one per question (greedy)."""
    from tests.runs import BASE_IFEVAL_LIMIT, MODEL_DIR, records

    rows = records(base_ifeval_run / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert [r["doc_id"] for r in rows] == list(range(BASE_IFEVAL_LIMIT))
    return rows


EXIT_STATUS = pytest.StashKey[int]()


def whole_suite(config: pytest.Config) -> bool:
    """pytest was given no paths: the run is the suite's testpaths (`make test`, `.ci/run`)."""
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS


def needs_cluster(item: pytest.Item) -> bool:
    return item.nodeid.startswith("tests/cluster/")


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """In a run of the whole suite, the tests outside tests/cluster (plain Python: no cluster, no engine) go
    first, in their own order, while the shared cluster and its pools start beside them (below)."""
    if whole_suite(config):
        items.sort(key=needs_cluster)


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a run of the whole suite that has tests of tests/cluster selected, start the shared cluster now, in
    the background (tests/warm_cluster.py): its pools' engines start on the cores the plain tests leave idle."""
    config = session.config
    if whole_suite(config) and not config.option.collectonly and any(map(needs_cluster, session.items)):
        from tests.warm_cluster import start_in_background

        start_in_background()


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (`timeout`, a CI runner cancelling the job, `kill`) stops the test run as Ctrl-C does: pytest
    then still runs `pytest_sessionfinish`, which stops the shared cluster and the servers session fixtures
    started. Killed outright, the test process would leave them running (a `ray start` head with three warm
    pools, a SeaweedFS server) to fail the next run for memory. A second SIGTERM ends the process at once."""
    import os
    import signal

    main_process = os.getpid()

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getpid() != main_process:  # a child forked from this process: the default (it ends)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise KeyboardInterrupt(f"stopped by signal {signum} (SIGTERM)")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the test run's shared cluster (tests/warm_cluster.py), if a test started it, and Ray in this
    process, if a test joined it here; keep the session's exit status for `pytest_unconfigure`."""
    import sys

    from tests.warm_cluster import stop_warm_cluster

    stop_warm_cluster()
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    session.config.stash[EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process with pytest's exit status once every report is written (the terminal summary,
    --junitxml), without the interpreter's teardown. This process holds torch, Ray's gRPC and pyarrow's S3
    client (the AWS SDK) in-process; tearing those C extensions down at exit is not safe in every order, and a
    segfault there would replace the status of a run whose reports are already written. Nothing the tests
    made depends on that teardown: their clusters and servers stop in fixtures and in `pytest_sessionfinish`
    above."""
    import os
    import sys

    status = config.stash.get(EXIT_STATUS, None)
    if status is None:  # no session ran (--help, --version, a usage error): the normal exit
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3-compatible server on loopback for the test run (SeaweedFS: tests/object_store.py)."""
    from tests.object_store import object_store

    with object_store(tmp_path_factory.mktemp("s3")) as store:
        yield store
