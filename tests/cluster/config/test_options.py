"""The run configuration: defaults defined once on the fields, the run mode as an enum from YAML or flags,
and `cli(...)` metadata that names each flag once."""

from __future__ import annotations

import pytest

from cluster.config import RunConfig, RunMode, build_config
from evaluators.errors import EvalInputError


def test_the_run_mode_reads_from_yaml_text_and_is_an_enum():
    assert RunConfig().mode is RunMode.FULL
    assert build_config({"mode": "judge_only"}, {}, "run.yaml").mode is RunMode.JUDGE_ONLY
    assert build_config({}, {"mode": "inference_only"}, "flags").mode is RunMode.INFERENCE_ONLY
    with pytest.raises(EvalInputError, match="`mode` is 'judge'"):
        build_config({"mode": "judge"}, {}, "run.yaml")


def test_every_flag_is_named_once_and_every_flagged_setting_has_a_description():
    from cluster.cli.flags import config_flags

    flags = config_flags()
    names = [f.flag for f in flags] + [c[0] for f in flags for c in f.consts]
    assert len(names) == len(set(names))
    assert all(f.field.description for f in flags)
    assert {"model.dtype", "sampling.temperature", "judge.requests_per_second", "mode", "tasks"} <= {
        f.dest for f in flags
    }


def test_python_values_a_notebook_passes_are_taken_as_their_yaml_forms(tmp_path):
    """Enums, paths, numpy numbers, tuples and option models, as a notebook cell writes them."""
    import numpy as np

    from cluster.config import SamplingOptions

    config = build_config(
        {"mode": RunMode.INFERENCE_ONLY, "output_dir": tmp_path, "limit": np.int64(5), "tasks": ("ifeval",),
         "sampling": SamplingOptions(temperature=0.5)},
        {}, "the config",
    )  # fmt: skip
    assert (config.mode, config.output_dir, config.limit) == (RunMode.INFERENCE_ONLY, str(tmp_path), 5)
    assert type(config.limit) is int and [t.name for t in config.tasks] == ["ifeval"]
    assert config.sampling.temperature == 0.5
    adaptive = RunConfig(num_samples="auto", sampling=SamplingOptions(target_sem=0.02, temperature=0.7))
    assert adaptive.sampling.target_sem == 0.02  # the target given as a model counts, as one given as a dict


def saved_run(tmp_path, tasks: str) -> dict:
    """A run folder r1 under tmp_path whose config.yaml holds `tasks` (YAML), and a judge-only dict for it."""
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "config.yaml").write_text(
        f"{tasks}run_id: r1\nmodel: {{path: /models/m}}\nresolved_model_path: /x\n"
    )
    return {"mode": "judge_only", "run_id": "r1", "output_dir": str(tmp_path), "judge": {"model": "openai:j"}}


def test_a_judge_only_config_from_python_is_laid_over_the_runs_saved_config(tmp_path):
    """`cluster.evaluate({"mode": "judge_only", ...})` re-judges the run as `rayeval run --judge-only` does: its
    model, tasks and N from its config.yaml, the judge from the caller (a dict, or a RunConfig changed in place)."""
    from cluster.api import judge_only_settings

    given = saved_run(tmp_path, "tasks: [alpaca_eval]\nnum_samples: 3\n")
    as_model = RunConfig(mode="judge_only", run_id="r1", output_dir=str(tmp_path))
    as_model.judge.model = "openai:j"
    for settings in (given, as_model):
        stored = judge_only_settings(settings, build_config(given, {}, "the config"))
        config = stored.config(str(tmp_path), "r1")
        assert (config.mode, config.model.path, config.num_samples) == (RunMode.JUDGE_ONLY, "/models/m", 3)
        assert [t.name for t in config.tasks] == ["alpaca_eval"] and config.judge.model == "openai:j"
    assert judge_only_settings({}, RunConfig()) is None  # a full run starts from the settings given


def test_a_judge_only_config_from_python_keeps_the_options_given_with_each_task(tmp_path):
    """A task given with options (`{"name": "alpaca_eval", "limit": 5}`) keeps them over the saved entry's,
    which keeps its own (data_path); a task given by name keeps the saved entry whole."""
    from cluster.api import judge_only_settings

    given = saved_run(
        tmp_path,
        "tasks: [{name: alpaca_eval, data_path: /d/a.jsonl}, {name: arena_hard, limit: 9}, writingbench]\n",
    )
    as_model = RunConfig(**given, tasks=[{"name": "alpaca_eval", "limit": 5}, "arena_hard"])
    for settings in ({**given, "tasks": [{"name": "alpaca_eval", "limit": 5}, "arena_hard"]}, as_model):
        stored = judge_only_settings(settings, build_config(given, {}, "the config"))
        tasks = {t.name: t for t in stored.config(str(tmp_path), "r1").tasks}
        assert list(tasks) == ["alpaca_eval", "arena_hard"]
        assert (tasks["alpaca_eval"].limit, tasks["alpaca_eval"].data_path) == (5, "/d/a.jsonl")
        assert tasks["arena_hard"].limit == 9


def test_an_unknown_key_of_a_serve_or_up_config_is_named_against_that_configs_own_settings():
    from cluster.config import PoolConfig, ServeConfig

    with pytest.raises(EvalInputError) as served:
        build_config({"served_model_name": "m"}, schema=ServeConfig)
    assert "did you mean `served_name`?" in str(served.value) and "docs/RUNNING.md" not in str(served.value)
    with pytest.raises(EvalInputError, match=r"did you mean `idle_timeout_s`\?.*rayeval up --help"):
        build_config({"idle_timeout": "1h"}, schema=PoolConfig)


def test_a_serve_config_refuses_run_settings_a_served_model_ignores():
    from cluster.config import ServeConfig

    with pytest.raises(EvalInputError, match="model.think_end_token means nothing to a served model"):
        build_config({"model": {"think_end_token": "</think>"}}, schema=ServeConfig)
    with pytest.raises(EvalInputError, match="cluster.keep_warm_s, model.lora mean nothing"):
        build_config({"model": {"lora": "/a"}, "cluster": {"keep_warm_s": 60}}, schema=ServeConfig)
    assert build_config({"model": {"max_model_len": 1024}}, schema=ServeConfig).model.max_model_len == 1024
