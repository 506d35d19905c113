"""Pydantic validation errors as one paragraph a user can act on: each bad setting, the flag that set it,
its value, the rule, and the fix (a close name for a typo, the section a misplaced setting belongs in)."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from cluster.config.options import RunConfig, setting_flags

COMMAND_LINE = "the command line"


def format_validation_error(
    error: ValidationError,
    source: str,
    flags: Mapping[str, str] | None = None,
    command: str = "run",
    given: Collection[str] = (),
    schema: type[BaseModel] = RunConfig,
) -> str:
    """One paragraph naming each bad setting (and the flag that sets it), its value, the rule, and the fix.

    `flags` maps dotted settings to their flags (`sampling.temperature` to `--temperature`); `given`: the
    dotted settings the command line set (a problem there is the command line's, not `source`'s);
    `command`: the rayeval command whose `--help` describes them; `schema`: the config validated (a run's,
    `rayeval serve`'s, `rayeval up`'s), whose settings an unknown key's hint names.
    """
    items = error.errors()
    problems = [_describe_problem(item, flags or {}, schema) for item in items]
    by_flag = [any(key in given for key in _prefixes(tuple(item["loc"]))) for item in items]
    them = "it" if len(problems) == 1 else "them"
    if source == COMMAND_LINE or all(by_flag):
        where, fix = COMMAND_LINE, f"Fix {them}: `rayeval {command} --help` describes every flag"
    else:
        where = f"{source} and the command line" if any(by_flag) else source
        full = "docs/RUNNING.md shows a full config, " if schema is RunConfig else ""
        fix = f"Fix {them} in {where}: {full}`rayeval {command} --help` every setting"
    have = "have" if where.endswith(" and the command line") else "has"
    return f"{where} {have} {len(problems)} invalid setting(s): " + "; ".join(problems) + f". {fix}."


def _describe_problem(item: Mapping[str, Any], flags: Mapping[str, str], schema: type[BaseModel]) -> str:
    loc = tuple(item["loc"])
    field = ".".join(str(part) for part in loc) or "(top level)"
    named = f"`{field}`"
    flag = next((flags[k] for k in _prefixes(loc) if k in flags), None)
    if flag:
        named += f" ({flag})"
    if item["type"] == "extra_forbidden":
        return f"{named} is not a setting{_setting_hint(loc, schema)}"
    if item["type"] == "missing":
        return f"{named} is required but missing"
    message = str(item["msg"]).removeprefix("Value error, ")
    if not loc:  # a rule over several settings: its message names them (--pass-k, --num-samples)
        return message
    message = message[:1].lower() + message[1:] + _type_hint(item, loc, schema)
    # a variable's name may be a key pasted in its place (api_key_env, forward_env): never quoted either
    names_a_variable = any(str(part).endswith("_env") for part in loc)
    if isinstance(item["input"], (list, dict)) or _carries_credential(item["input"]) or names_a_variable:
        return f"{named}: {message}"  # a whole section or list: the message says which part; a secret: never
    value = repr(item["input"])
    return f"{named} is {value if len(value) <= 60 else value[:57] + '...'}: {message}"


def _carries_credential(value: Any) -> bool:
    from cluster.storage.location import credentials_anywhere

    return isinstance(value, str) and credentials_anywhere(value) is not None


def _prefixes(loc: tuple[Any, ...]) -> list[str]:
    """`tasks.0.name` → tasks.0.name, tasks.0, tasks: the longest dotted prefix a flag set comes first."""
    parts = [str(p) for p in loc]
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _section_model(parts: tuple[Any, ...], schema: type[BaseModel]) -> type[BaseModel] | None:
    """The pydantic model of the section a location points into (list indices step into the item type)."""
    model: type[BaseModel] = schema
    for part in parts:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = [t for t in (field.annotation, *get_args(field.annotation)) if isinstance(t, type)]
        nested = [t for t in inner if issubclass(t, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _setting_hint(loc: tuple[Any, ...], schema: type[BaseModel]) -> str:
    """For an unknown key: the close name in its section, else where a setting of that name lives, else the
    setting whose flag it spells (`rps` under judge for --judge-rps, `kv_cache_gib` for --kv-cache-gib)."""
    section = _section_model(loc[:-1], schema)
    if section is None:
        return ""
    name, known = str(loc[-1]), list(section.model_fields)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean `{close[0]}`?)"
    elsewhere = [  # in a section of the run (not the per-task list: its options repeat the sections')
        f"{section_name}.{name}"
        for section_name, field in schema.model_fields.items()
        if isinstance(field.annotation, type)
        and issubclass(field.annotation, BaseModel)
        and name in field.annotation.model_fields
    ]
    under = "_".join(str(part) for part in loc[:-1] if not isinstance(part, int))
    spelled = {name, f"{under}_{name}"}
    by_flag = [(d, f) for d, f in setting_flags(schema).items() if f.lstrip("-").replace("-", "_") in spelled]
    if elsewhere and (not by_flag or by_flag[0][0] == elsewhere[0]):
        return f" here (it belongs under `{elsewhere[0]}`)"
    if by_flag:
        return f" ({by_flag[0][1]} is `{by_flag[0][0]}` in a config)"
    return f" (the settings here are {', '.join(known)})"


def _type_hint(item: Mapping[str, Any], loc: tuple[Any, ...], schema: type[BaseModel]) -> str:
    """The expected shape, for a value of the wrong kind where a section or the task list was expected."""
    if item["type"] == "model_type":
        section = _section_model(loc, schema)
        keys = ", ".join(list(section.model_fields)[:4]) if section else "its settings"
        return f" (write it as a mapping of its settings: {keys}, ...)"
    if item["type"] == "list_type" and loc == ("tasks",):
        return " (write a list of task names or mappings, e.g. tasks: [ifeval, {name: gsm8k, limit: 100}])"
    return ""
