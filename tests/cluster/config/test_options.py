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
