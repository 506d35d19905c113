"""`rayeval run`'s setting flags come from the config's fields: each flag's default in --help is the field's
default, and a flag sets exactly the field it names."""

from __future__ import annotations

import enum

import pytest

from cluster.cli import build_parser
from cluster.cli.flags import PARSED_BY_THE_FIELD, config_flags, overrides
from cluster.config import RunConfig, RunMode, build_config, format_duration, parse_duration


@pytest.fixture(scope="module")
def run_help() -> str:
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    return " ".join(run.format_help().split())


def test_help_states_each_fields_own_default(run_help):
    defaults = RunConfig()
    assert f"(default {defaults.model.max_model_len})" in run_help
    assert (
        f"--judge-rps R API requests per second, for the whole cluster (default {defaults.judge.requests_per_second:g})"
        in run_help
    )
    assert f"(default {defaults.sampling.seed})" in run_help and "(default runs)" in run_help


def test_a_durations_default_is_shown_with_its_unit_as_the_flag_takes_it(run_help):
    """600 s reads 10m, as --endpoint-timeout 10m would set it (a bare 600 beside `5s` elsewhere was unclear)."""
    defaults = RunConfig()
    assert parse_duration(format_duration(defaults.endpoint.timeout_s), "--endpoint-timeout") == 600
    for flag, shown in (
        ("--endpoint-timeout", "10m"),
        ("--coordinator-idle-timeout", "1h"),
        ("--placement-timeout", "2m"),
        ("--sync-interval", "30s"),
        ("--judge-timeout", "1m"),
    ):
        after = run_help.split(f"{flag} DURATION ", 1)[1]  # its help: the first default after the flag
        assert after.split("(default ", 1)[1].startswith(f"{shown})"), flag
    assert [format_duration(s) for s in (0, 45, 90, 5400, 86400 + 60, 0.5)] == [
        "off", "45s", "1m30s", "1h30m", "1d1m", "0.5s"
    ]  # fmt: skip


def test_help_says_which_max_num_seqs_default_applies_on_cpu_and_on_gpu(run_help):
    from cluster.config import CPU_MAX_NUM_SEQS

    assert RunConfig().model.max_num_seqs is None  # the device decides (cluster.engines.engine_max_num_seqs)
    assert (
        "--max-num-seqs N sequences batched per engine step; the dispatcher keeps at least this many in flight "
        f"per replica (default: {CPU_MAX_NUM_SEQS} on CPU; on GPU what vllm.LLM uses on that card, e.g. 1024 "
        "on an H100, H200 or B200, 256 on an A100 or a smaller card)"
    ) in run_help


def test_each_flag_sets_the_field_it_names():
    parser = build_parser()
    for spec in config_flags():
        kind = spec.field.annotation
        if spec.consts or "bool" in str(kind) or "list" in str(kind) or "Literal" in str(kind):
            continue
        if isinstance(kind, type) and issubclass(
            kind, enum.Enum
        ):  # choices: test_enum_flags_take_their_values
            continue
        number = "int" in str(kind) or "float" in str(kind)
        as_written = spec.metavar in PARSED_BY_THE_FIELD  # a duration's text, for the field to read
        args = parser.parse_args(["run", spec.flag, "7" if number else "x"])
        expected = "7" if as_written else 7 if number else ["x"] if spec.dest == "tasks" else "x"
        assert overrides(args) == {spec.dest: expected}, spec.flag
        if as_written:
            value = build_config({}, overrides(args), "flags")
            for part in spec.dest.split("."):  # the field the flag sets, parsed there
                value = getattr(value, part)
            assert value == 7.0, spec.flag


def test_the_mode_flags_set_the_mode_and_exclude_each_other(capsys):
    parser = build_parser()
    config = build_config({}, overrides(parser.parse_args(["run", "--judge-only"])), "flags")
    assert config.mode is RunMode.JUDGE_ONLY
    assert overrides(parser.parse_args(["run", "--mode", "inference_only"])) == {"mode": "inference_only"}
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--judge-only", "--inference-only"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_enum_flags_take_their_values():
    parser = build_parser()
    for spec in config_flags():
        kind = spec.field.annotation
        if spec.consts or not (isinstance(kind, type) and issubclass(kind, enum.Enum)):
            continue
        for member in kind:
            assert overrides(parser.parse_args(["run", spec.flag, member.value])) == {spec.dest: member.value}
        with pytest.raises(SystemExit):
            parser.parse_args(["run", spec.flag, "no-such-value"])
