"""A replica whose engine dies reports the root error from the engine's own log, and where that log is.

The slow test crashes a real vLLM CPU engine for real: chunked prefill forced on, with seeded sampling
requests whose prompts are prefilled in chunks (vLLM then rewinds each request's generator by an offset,
which CPU generators refuse). It is the crash rayeval's CPU engines avoid by leaving chunked prefill off.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from cluster.engines import LogPlace, describe_failure, first_exception
from sharding.requests import SamplingSpec, build_group, make_request

VLLM_LOG = """\
(EngineCore pid=4388) INFO 11-27 12:52:40 [core.py:99] Waiting for requests
(Worker pid=4883) ERROR 11-27 12:52:44 [multiproc_executor.py:1063] WorkerProc hit an exception.
(Worker pid=4883) ERROR 11-27 12:52:44 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=4883) ERROR 11-27 12:52:44 [multiproc_executor.py:1063]   File "gpu_model_runner.py", line 3502, in _bookkeeping_sync
(Worker pid=4883) ERROR 11-27 12:52:44 [multiproc_executor.py:1063]     gen.set_offset(gen.get_offset() - 4)
(Worker pid=4883) ERROR 11-27 12:52:44 [multiproc_executor.py:1063] RuntimeError: CPU Generator does not use offset
(MainProcess pid=4388) ERROR 11-27 12:52:44 [async_llm.py:906] Traceback (most recent call last):
(MainProcess pid=4388) ERROR 11-27 12:52:44 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def test_the_first_exception_line_of_the_log_is_the_root_error():
    assert first_exception(VLLM_LOG.splitlines()) == "RuntimeError: CPU Generator does not use offset"
    assert first_exception(["FutureWarning: deprecated", "ValueError: outside a traceback"]) is None


def test_the_failure_names_the_root_error_and_the_log_after_its_mark(tmp_path):
    log = tmp_path / "worker.out"
    log.write_text("Traceback (most recent call last):\nOSError: from an earlier engine\n")
    mark = log.stat().st_size
    with log.open("a") as handle:
        handle.write(VLLM_LOG)
    described = describe_failure("EngineCore encountered an issue.", [LogPlace(str(log), mark)], "10.0.0.2")
    assert described == (
        f"RuntimeError: CPU Generator does not use offset; the engine's full log: {log} on node 10.0.0.2"
    )
    missing = describe_failure("engine gone", [LogPlace(str(tmp_path / "elsewhere.out"))])
    assert missing == f"engine gone; the engine's full log: {tmp_path / 'elsewhere.out'}"
    read_there = describe_failure(
        "engine gone", [LogPlace("/x.err")], "10.0.0.3", root="OSError: on its node"
    )
    assert read_there == "OSError: on its node; the engine's full log: /x.err on node 10.0.0.3"


def test_a_log_shorter_than_its_mark_was_rotated_and_is_read_from_its_start(tmp_path):
    log = tmp_path / "worker.err"
    log.write_text(VLLM_LOG)  # the file as it is after a rotation: everything in it came after the mark
    described = describe_failure("engine gone", [LogPlace(str(log), 10 * len(VLLM_LOG))])
    assert described.startswith("RuntimeError: CPU Generator does not use offset; ")


@pytest.mark.slow
def test_a_dead_engine_reports_its_root_error_and_log():
    from cluster.config import ClusterOptions, ModelOptions, RunConfig
    from cluster.engines import ReplicaPool, engine_settings
    from cluster.plan import build_model_plan
    from cluster.session import ray_session
    from sharding.dispatcher import ReplicaDead

    config = RunConfig(model=ModelOptions(max_model_len=512, max_num_batched_tokens=64, enforce_eager=True),
                       cluster=ClusterOptions(replicas=1, device="cpu"))  # fmt: skip
    plan = build_model_plan(config, device="cpu")
    settings = dataclasses.replace(
        engine_settings(config.model, plan.model.path, "cpu"), chunked_prefill=True
    )
    prompt = (
        "Tell me a long story about the sea and its sailors. " * 12
    )  # over 64 tokens: prefilled in chunks
    spec = SamplingSpec(temperature=0.8, max_tokens=8)
    group = build_group(
        prompt, [make_request(plan.model.path, prompt, spec, seed=7 + i, sample_index=i) for i in range(2)]
    )
    with ray_session(None, plan.replica, 1, verbose=False):
        pool = ReplicaPool(settings, plan.replica, 1, 1, verbose=False)
        try:
            pool.start(60)
            (replica,) = pool.replicas()
            with pytest.raises(ReplicaDead) as died:
                asyncio.run(replica.generate(group))
        finally:
            pool.shutdown()
    message = str(died.value)
    assert message.startswith("RuntimeError: CPU Generator does not use offset; the engine's full log: ")
    where, node = message.split("the engine's full log: ")[1].split(" on node ")
    log_files = where.split(" and ")
    assert log_files == list(pool.infos[0].log_files) and node == pool.infos[0].node_ip
    assert any("Traceback" in Path(path).read_text() for path in log_files)
