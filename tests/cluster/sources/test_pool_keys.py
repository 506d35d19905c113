"""The plain parts of warm pools: which engine settings key a pool (and which do not), the differences a
dry run names, pool names, durations, and how long a run's engines stay warm by default. No Ray."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.cli import main
from cluster.config import ModelOptions, build_config, parse_duration
from cluster.engines import engine_settings
from cluster.engines.warm import (
    LEASE_S,
    PoolKey,
    PoolRecord,
    default_pool_name,
    free_name,
    model_files_fingerprint,
)
from evaluators.errors import EvalInputError


def settings(**options: object):
    return engine_settings(ModelOptions(**options), "/models/SmolLM2-135M-Instruct", "cpu")


def test_a_pool_is_keyed_by_every_setting_that_changes_outputs_and_no_other():
    base = settings(max_model_len=1024, dtype="float32")
    quieter = replace(
        base, log_stats=True, pin_engine_core=False, max_loras=4
    )  # how it runs, not what it says
    assert PoolKey.of(quieter) == PoolKey.of(base) and PoolKey.of(quieter).digest == PoolKey.of(base).digest
    for changed in (
        replace(base, dtype="bfloat16"),
        replace(base, max_model_len=768),
        replace(base, max_num_seqs=8),
        replace(base, enforce_eager=False),
        replace(base, model="/models/other"),
        replace(base, max_lora_rank=16),
        replace(base, tensor_parallel_size=2),
        replace(base, chunked_prefill=True),
    ):
        assert PoolKey.of(changed).digest != PoolKey.of(base).digest
    assert PoolKey.of(base).differences(PoolKey.of(replace(base, max_model_len=768, dtype="bfloat16"))) == [
        "dtype 'float32' (wanted 'bfloat16')",
        "max_model_len 1024 (wanted 768)",
    ]


def test_a_dtype_asked_as_auto_is_the_one_it_becomes_on_the_pools_nodes():
    from cluster.engines import EngineInfo
    from cluster.engines.placement import ReplicaPlan
    from cluster.engines.warm import PoolRecord

    def pool(dtype: str, auto_dtype: str) -> PoolRecord:
        engine = EngineInfo("replica-0", "node", 1, 1.0, 64, 1024, "0.32.0", dtype="x", auto_dtype=auto_dtype)
        on_cpu = settings(max_model_len=1024, dtype=dtype)
        return PoolRecord("p", PoolKey.of(on_cpu), on_cpu, ReplicaPlan({"CPU": 1.0}, 1), 0.5, 60.0,
                          engines={"replica-0": engine})  # fmt: skip

    def run(dtype: str) -> PoolKey:
        return PoolKey.of(settings(max_model_len=1024, dtype=dtype))

    no_bf16, bf16 = pool("float32", auto_dtype="float32"), pool("float32", auto_dtype="bfloat16")
    assert no_bf16.serves(run("auto")) and no_bf16.serves(run("float32"))  # one engine either way
    assert bf16.differences(run("auto")) == [
        "dtype 'float32' (wanted 'auto'; auto is 'bfloat16' on its nodes)"
    ]
    assert pool("auto", auto_dtype="float32").serves(run("float32"))
    assert pool("auto", auto_dtype="bfloat16").differences(run("float32")) == [
        "dtype 'auto' (wanted 'float32'; auto is 'bfloat16' on its nodes)"
    ]
    on_gpu = pool("auto", auto_dtype="")  # vLLM picks it from the model: only `auto` is the same
    assert on_gpu.serves(run("auto")) and on_gpu.differences(run("bfloat16")) == [
        "dtype 'auto' (wanted 'bfloat16')"
    ]


def test_replicas_a_run_starts_beside_a_pool_take_the_dtype_one_of_them_names():
    from cluster.sources.registry import beside_pool

    def dtype_beside(run: str, pool: str) -> str:
        return beside_pool(settings(dtype=run), settings(dtype=pool)).dtype

    # `auto` beside a float32 pool could become bfloat16 on another node: the extra replicas ask for float32
    assert dtype_beside("auto", "float32") == "float32"
    assert dtype_beside("float32", "auto") == "float32" and dtype_beside("auto", "auto") == "auto"
    assert beside_pool(settings(dtype="auto", max_num_seqs=8), settings(dtype="float32")).max_num_seqs == 8


def test_a_pool_with_lora_slots_serves_runs_with_an_adapter_of_its_rank_and_no_others():
    from cluster.config import PoolConfig
    from cluster.sources.pools import pool_engine_settings
    from cluster.sources.registry import with_lora_slots

    def pool(**fields: object):
        config = PoolConfig(model=ModelOptions(dtype="float32"), **fields)
        return pool_engine_settings(config, "/models/SmolLM2-135M-Instruct", "cpu")

    lora_pool = pool(lora_slots=4)
    assert (lora_pool.max_lora_rank, lora_pool.max_loras) == (16, 4)
    with_adapter = with_lora_slots(settings(dtype="float32", lora="/adapters/a"), 1, 16)
    without = with_lora_slots(settings(dtype="float32"), 1, 0)
    assert PoolKey.of(lora_pool) == PoolKey.of(with_adapter) != PoolKey.of(without)
    assert PoolKey.of(pool()) == PoolKey.of(without)  # no slots: LoRA off, as a run without an adapter
    assert PoolKey.of(lora_pool).differences(PoolKey.of(without)) == ["max_lora_rank 16 (wanted 0)"]


def test_a_local_judges_engines_take_neither_the_models_revision_nor_its_adapters_lora_layers():
    """A run with --lora and --revision judged by local:J: J's engines are those of `rayeval up --model J`
    (its key matches), with the run's engine settings otherwise (dtype) and the judge's own context."""
    from cluster.config import PoolConfig, RunConfig
    from cluster.judging import judge_engine_settings
    from cluster.sources.pools import pool_engine_settings

    judge = "/models/judge"
    run = RunConfig(
        model={"path": "/models/m", "dtype": "float32", "lora": "/adapters/a", "revision": "abc123"},
        judge={"model": f"local:{judge}", "max_model_len": 1024},
    )
    judged = judge_engine_settings(run, judge, "cpu")
    up = pool_engine_settings(
        PoolConfig(model=ModelOptions(dtype="float32", max_model_len=1024)), judge, "cpu"
    )
    assert PoolKey.of(judged) == PoolKey.of(up)
    assert (judged.revision, judged.max_lora_rank, judged.dtype, judged.max_model_len) == (
        None,
        0,
        "float32",
        1024,
    )


def test_a_pool_is_named_after_its_model_and_key():
    base = settings()
    assert default_pool_name(base) == f"SmolLM2-135M-Instruct-{PoolKey.of(base).digest}"
    assert default_pool_name(replace(base, model="Qwen/Qwen2.5-7B-Instruct")).startswith(
        "Qwen2.5-7B-Instruct-"
    )


def test_durations_read_as_people_write_them():
    assert [parse_duration(text, "--x") for text in ("90", "90s", "30m", "2h", "1d", "1.5m", "off", "0")] == [
        90, 90, 1800, 7200, 86400, 90, 0, 0,
    ]  # fmt: skip
    assert [parse_duration(text, "--x") for text in ("30min", "1h30m", "1d 2h")] == [1800, 5400, 93600]
    with pytest.raises(ValueError, match="'soon' is not a duration.*--x 30m.*or off"):
        parse_duration("soon", "--x")
    with pytest.raises(ValueError, match="give each number of --x its unit, e.g. 1h30m"):
        parse_duration("1h30", "--x")  # 30 seconds or 30 minutes? Said, not guessed
    with pytest.raises(ValueError, match="--x cannot be 'off' here"):
        parse_duration("off", "--x", off=False)  # where off means nothing, it is not offered either


def test_every_duration_setting_reads_the_same_way():
    # a timeout given as a duration; a setting that cannot be off says so rather than "should be > 0"
    config = build_config({}, {"judge.timeout_s": "1m", "endpoint.timeout_s": "10m",
                               "cluster.coordinator_idle_timeout_s": "1h30m"}, "t")  # fmt: skip
    assert (config.judge.timeout_s, config.endpoint.timeout_s) == (60, 600)
    assert config.cluster.coordinator_idle_timeout_s == 5400
    with pytest.raises(EvalInputError, match="--sync-interval cannot be 'off' here"):
        build_config({}, {"sync_interval_s": "off"}, "t")


def test_a_run_keeps_its_engines_warm_by_default_only_on_a_cluster_it_did_not_start(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert build_config({}, {}, "t").cluster.kept_warm_s is None  # the local cluster goes away with the run
    local = build_config({}, {"cluster.address": "local"}, "t").cluster  # the same: a cluster the run starts
    assert (local.address, local.kept_warm_s) == (None, None)
    assert build_config({}, {"cluster.address": "auto"}, "t").cluster.kept_warm_s == 600
    assert (
        build_config({}, {"cluster.address": "auto", "cluster.keep_warm_s": "off"}, "t").cluster.kept_warm_s
        is None
    )
    assert build_config({}, {"cluster.keep_warm_s": "30m"}, "t").cluster.kept_warm_s == 1800


def test_pool_commands_refuse_what_they_cannot_do(capsys):
    assert main(["down"]) == 2
    assert (
        "rayeval down needs the pools to stop (`rayeval pools` names them) or --all"
        in capsys.readouterr().err
    )
    assert main(["up", "--model", "openai:gpt-4.1", "--address", "auto"]) == 2
    assert "a warm pool holds engines of a model folder or hub id" in capsys.readouterr().err
    assert main(["up", "--idle-timeout", "later", "--address", "auto"]) == 2
    err = capsys.readouterr().err
    assert "'later' is not a duration" in err and "`rayeval up --help` describes every flag" in err
    assert main(["down", "p1", "--all"]) == 2  # --all would stop every pool, not the one named
    assert "give the pools to stop (p1) or --all, not both" in capsys.readouterr().err


def test_a_model_folder_written_again_in_place_is_another_key(tmp_path):
    folder = tmp_path / "final"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights of step 100")
    on = lambda: engine_settings(ModelOptions(max_model_len=1024), str(folder), "cpu")  # noqa: E731
    before = PoolKey.of(on())
    assert before == PoolKey.of(on()) and model_files_fingerprint(str(folder))
    (folder / "model.safetensors").write_bytes(b"weights of step 200")  # retrained to the same path
    after = PoolKey.of(on())
    assert after.digest != before.digest and default_pool_name(on()) != f"final-{before.digest}"
    assert before.differences(after) == [
        "the model folder's files changed since the pool started (sizes or times)"
    ]

    # where one side cannot see the folder (a hub id, a path on the cluster's nodes only), the key cannot tell;
    # nor between two machines' copies of it (each node's own download has its own times)
    def files(fingerprint: str) -> PoolKey:
        return PoolKey(tuple((n, fingerprint if n == "model_files" else v) for n, v in before.settings))

    assert model_files_fingerprint(str(tmp_path / "absent")) == "" and files("").differences(after) == []
    assert files("another-node:0123456789abcdef").differences(after) == []


def test_a_pool_started_under_a_taken_name_gets_the_next_free_one():
    assert free_name("smol-3f2a", set()) == "smol-3f2a"
    assert free_name("smol-3f2a", {"smol-3f2a"}) == "smol-3f2a-2"
    assert free_name("smol-3f2a", {"smol-3f2a", "smol-3f2a-2", "other"}) == "smol-3f2a-3"


def test_requests_with_one_run_id_hold_leases_of_their_own():
    from cluster.engines.placement import ReplicaPlan
    from cluster.sources import SourceRequest
    from cluster.sources.registry import lease_holder

    def request() -> SourceRequest:  # a judge of a run without --run-id, twice at once
        return SourceRequest(
            build_config({}, {}, "t"), settings(), ReplicaPlan({"CPU": 1.0}, 1), 1, "run-judge"
        )

    first, second = request(), request()
    assert first.lease_id.startswith("run-judge-") and second.lease_id.startswith("run-judge-")
    assert first.lease_id != second.lease_id  # one's release leaves the other's lease on the pool
    assert replace(first, count=2).lease_id == first.lease_id  # the same request's replicas beside a pool
    assert lease_holder(first.lease_id) == "run-judge"  # what `rayeval pools` shows as IN USE BY


def a_record() -> PoolRecord:
    from cluster.engines.placement import ReplicaPlan

    on_cpu = settings(dtype="float32")
    return PoolRecord("p", PoolKey.of(on_cpu), on_cpu, ReplicaPlan({"CPU": 1.0}, 1), 0.5, 60.0)


def test_a_pool_counts_the_leases_sending_to_it_and_forgets_the_lapsed_and_released():
    record, now = a_record(), 1000.0
    record.last_used = 0.0
    assert record.hold("a", now, sending=True) == 1
    assert record.hold("b", now + 1, sending=True) == 2  # a still sends
    assert record.hold("judge", now + 2, sending=False) == 3  # counted as if it sent, beside a and b
    assert record.hold("a", now + 3, sending=False) == 2  # a has finished generating: b and itself
    assert record.hold("b", now + 4, sending=True) == 1  # neither a nor the judge sends now
    record.let_go("b", now + 5)
    assert record.hold("b", now + 6, sending=True) == 1  # a renewal that lands after the release
    assert "b" not in record.leases and record.live_leases(now + 6) == ["a", "judge"]
    assert record.last_used == now + 4  # the last renewal: a killed run's pool is idle from its last one
    # a killed run's lease lapses (LEASE_S) and is forgotten, as is a release that old
    assert record.hold("c", now + 6 + LEASE_S, sending=True) == 1
    assert set(record.leases) == {"c"} and record.quiet == set() and set(record.released) == set()


def test_a_pool_record_pickled_before_the_lease_fields_reads_back_with_their_defaults():
    import pickle

    record = a_record()
    old = pickle.loads(pickle.dumps(record))
    for added in ("quiet", "released"):  # as an earlier version's registry saved it
        del old.__dict__[added]
    again = pickle.loads(pickle.dumps(old))
    assert again.quiet == set() and again.released == {} and again.hold("a", 1.0, sending=True) == 1
    assert again.name == "p" and again.idle_timeout_s == 60.0


def test_a_replaced_replicas_name_leads_to_the_live_one_and_the_record_stays_bounded():
    from cluster.engines.actor import EngineInfo
    from cluster.engines.warm import REPLACEMENTS_KEPT

    record = a_record()
    live = "replica-0"
    record.engines[live] = EngineInfo(live, "node", 1, 1.0, 64, 1024, "0")
    for n in range(1, REPLACEMENTS_KEPT + 10):  # replica-0 replaced, its replacement replaced, ...
        record.engines[f"replica-{n}"] = record.engines.pop(live)
        record.record_replacement(live, f"replica-{n}")
        live = f"replica-{n}"
    assert record.in_place_of("replica-20") is record.engines[live]  # every name points at the live one
    assert set(record.replaced_by.values()) == {live} and len(record.replaced_by) == REPLACEMENTS_KEPT
    assert record.in_place_of("replica-0") is None  # replaced more than REPLACEMENTS_KEPT replacements ago
    record.replaced_by = {"old": "older-1", "older-1": live}  # a chain, as a record saved before
    assert record.in_place_of("old") is record.engines[live]
    # two replicas' lines of replacements stay apart: replacing one moves only the names that led to it
    record.engines["other-1"] = EngineInfo("other-1", "node", 2, 1.0, 64, 1024, "0")
    record.replaced_by["other-0"] = "other-1"
    record.engines["next"] = record.engines.pop(live)
    record.record_replacement(live, "next")
    assert record.in_place_of("other-0") is record.engines["other-1"]
    assert record.in_place_of("old") is record.engines["next"]
    # a replica never replaced is in no one's place, its own neither (a run finding it dead starts one)
    assert record.in_place_of("other-1") is None and record.in_place_of("next") is None
    record.replaced_by.clear()
    assert record.in_place_of("next") is None
