"""`rayeval run`'s setting flags, built from the config's fields: each field that carries `cli(...)` metadata
(cluster.config.options) becomes one flag whose destination is the field's dotted path, whose value type,
choices and help come from the field, and whose help ends with the field's default. Nothing here restates a
default or a rule."""

from __future__ import annotations

import argparse
import enum
import functools
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from cluster.config import RunConfig, format_duration, setting_flags

# Help groups in the order `--help` shows them: title, and the paragraph under it.
GROUPS: dict[str, tuple[str, str | None]] = {
    "model": ("model and engine", None),
    "endpoint": (
        "model endpoint",
        "With --model openai:NAME the model under test is an OpenAI-compatible endpoint (a `rayeval serve`, a "
        "`vllm serve`, a hosted API): chat prompts go to /chat/completions, plain ones to /completions. Its API "
        "key is read from the environment variable --api-key-env names, never from a flag.",
    ),
    "tasks": ("tasks and sampling", None),
    "lm_eval": (
        "lm-eval tasks",
        "Any lm-eval task, group or tag runs by its lm-eval name (rayeval's own tasks win a name clash; "
        "lm_eval:NAME forces lm-eval's). These options mean what lm_eval's flags of the same name mean.",
    ),
    "judge": (
        "judge",
        "Judged tasks (alpaca_eval, arena_hard, healthbench, writingbench) need a judge. Judging starts on the "
        "first finished outputs while the rest are generating. An API key is read from the environment "
        "variable --judge-api-key-env names, never from a flag.",
    ),
    "cluster": ("cluster", None),
    "output": ("output", None),
}
# The help group of each config section's flags.
SECTION_GROUPS = {
    "model": "model",
    "endpoint": "endpoint",
    "sampling": "tasks",
    "lm_eval": "lm_eval",
    "judge": "judge",
    "cluster": "cluster",
}


# Values a flag passes on as written, for the setting's own validator to read (`30m` for a duration).
PARSED_BY_THE_FIELD = frozenset({"DURATION"})


@dataclass(frozen=True)
class ConfigFlag:
    """One setting's flag: where its value goes in the config (`dest`, dotted) and how argparse reads it."""

    dest: str
    flag: str
    group: str
    field: FieldInfo
    metavar: str | None
    consts: tuple[tuple[str, str, str], ...]


def config_flags(schema: type[BaseModel] = RunConfig) -> list[ConfigFlag]:
    """Every setting a command offers (`rayeval run`'s by default), in field order: the top-level ones, then
    each section's."""
    return list(_flags(schema, prefix="", group=None))


def _flags(model: type[BaseModel], prefix: str, group: str | None) -> Iterator[ConfigFlag]:
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        spec: Any = extra.get("cli")
        if spec is not None:
            consts = tuple((flag, value, help_) for flag, value, help_ in spec["consts"])
            yield ConfigFlag(
                prefix + name,
                spec["flag"],
                spec["group"] or group or "output",
                field,
                spec["metavar"],
                consts,
            )
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _flags(field.annotation, f"{prefix}{name}.", SECTION_GROUPS.get(name, group))


def add_config_flags(
    groups: dict[str, argparse._ArgumentGroup],
    schema: type[BaseModel] = RunConfig,
    skip: frozenset[str] = frozenset(),
) -> None:
    """The flags of `schema`'s settings, each in its help group; `skip` names settings (dotted) left out."""
    for spec in config_flags(schema):
        if spec.dest in skip:
            continue
        group = groups[spec.group]
        kwargs = _argparse_kwargs(spec)
        if spec.consts:
            exclusive = group.add_mutually_exclusive_group()
            exclusive.add_argument(spec.flag, dest=spec.dest, **kwargs)
            for flag, value, help_ in spec.consts:
                exclusive.add_argument(flag, dest=spec.dest, action="store_const", const=value, help=help_)
        else:
            group.add_argument(spec.flag, dest=spec.dest, **kwargs)


ENGINE_MODEL_HELP = (
    "model folder or HF hub id whose engines to start (default: the embedded SmolLM2-135M-Instruct); not an "
    "openai:NAME endpoint"
)


def set_help(parser: argparse.ArgumentParser, flag: str, text: str, metavar: str | None = None) -> None:
    """Say what a shared setting's flag means for this command (a pool or a Serve app starts engines: its
    --model is never an endpoint)."""
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    action.help = text
    action.metavar = metavar or action.metavar


def flag_names(schema: type[BaseModel] = RunConfig) -> dict[str, str]:
    """Each setting's flag by its dotted path (`sampling.temperature` → `--temperature`), for messages."""
    return setting_flags(schema)


def overrides(args: argparse.Namespace, schema: type[BaseModel] = RunConfig) -> dict[str, Any]:
    """The settings the command line gave, by dotted path; --tasks is split into names."""
    given = vars(args)
    values = {
        spec.dest: given[spec.dest] for spec in config_flags(schema) if given.get(spec.dest) is not None
    }
    if "tasks" in values:
        values["tasks"] = [n.strip() for n in values["tasks"].split(",") if n.strip()]
    return values


def _argparse_kwargs(spec: ConfigFlag) -> dict[str, Any]:
    kind = _value_type(spec.field.annotation)
    kwargs: dict[str, Any] = {"help": _help(spec.field, spec.metavar == "DURATION"), "default": None}
    if kind is not bool and not isinstance(kind, tuple):
        kwargs["metavar"] = spec.metavar or spec.flag.lstrip("-").upper()
    if kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif kind is list:
        kwargs["action"] = "append"
    elif isinstance(kind, tuple):
        kwargs["choices"] = list(kind)
        if all(isinstance(choice, int) for choice in kind):  # numeric choices (a Literal of ints)
            kwargs["type"] = int
    elif kind in (int, float) and spec.metavar not in PARSED_BY_THE_FIELD:
        kwargs["type"] = kind
    if spec.metavar and "|" in spec.metavar and kind is int:  # a count or a word (--num-samples N|auto)
        words = [w for w in spec.metavar.split("|") if w.islower()]
        kwargs["type"] = functools.partial(_int_or_word, words)
    return kwargs


def _int_or_word(words: list[str], text: str) -> int | str:
    if text in words:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is neither a whole number nor {' / '.join(words)}"
        ) from None


def _value_type(annotation: Any) -> Any:
    """bool, int, float, str, list (a repeatable flag), or a tuple of choices (a Literal or an enum)."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _value_type(options[0])
    if typing.get_origin(annotation) is Literal:
        return tuple(options)
    if typing.get_origin(annotation) is list:
        item = options[0]
        # a list of sections (the tasks) is given as one comma-separated string
        return str if isinstance(item, type) and issubclass(item, BaseModel) else list
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return tuple(member.value for member in annotation)
    return annotation


def _help(field: FieldInfo, duration: bool = False) -> str:
    """The field's description and, unless it states one, its default (a duration's in s, m, h)."""
    text = field.description or ""
    if "default" in text:
        return text
    default = field.get_default(call_default_factory=True)
    if default is None or default == []:
        return text
    if isinstance(default, bool):
        shown = "on" if default else "off"
    elif isinstance(default, enum.Enum):
        shown = default.value
    elif duration:
        shown = format_duration(float(default))
    else:
        shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f"{text} (default {shown})"
