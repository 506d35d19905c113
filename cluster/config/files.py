"""Reading a YAML run config and merging flag overrides into it; every way it can be wrong is one
EvalInputError naming the file, the setting and the fix."""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from cluster.config.errors import format_validation_error
from cluster.config.options import RunConfig
from evaluators.data import NotUtf8, read_utf8
from evaluators.errors import EvalInputError

ConfigT = TypeVar("ConfigT", bound=BaseModel)


def load_config_file(path: str) -> dict[str, Any]:
    """The settings of a YAML run config; every way the file can be wrong ends in one EvalInputError."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise EvalInputError(
            f"Config file {path} is a folder, not a file. Pass the YAML file itself, e.g. {path}/run.yaml."
        )
    if not file.is_file():
        raise EvalInputError(f"Config file {path} does not exist. Pass the path of a YAML run config.")
    try:
        data = yaml.safe_load(read_utf8(file)) or {}
    except NotUtf8 as exc:
        raise EvalInputError(f"Config file {path} is not UTF-8 text: {exc.problem}. {exc.fix}.") from None
    except yaml.YAMLError as exc:
        raise EvalInputError(_yaml_problem(path, exc)) from None
    if not isinstance(data, dict):
        raise EvalInputError(
            f"Config file {path} holds a YAML {type(data).__name__} at the top level, not a mapping of settings. "
            "Write one `setting: value` per line at the top, e.g. `tasks: [ifeval]` then `num_samples: 4`."
        )
    return data


def _yaml_problem(path: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    fix = (
        "Indent with spaces: YAML does not allow tab characters there."
        if "\\t" in problem
        else "Fix the syntax there: one `key: value` per line, nested settings indented with spaces."
    )
    return f"Config file {path} is not valid YAML{where}: {problem}. {fix}"


def build_config(
    file_data: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    source: str = "the config",
    flags: Mapping[str, str] | None = None,
    schema: type[ConfigT] = RunConfig,  # type: ignore[assignment]
) -> ConfigT:
    """Merge flag overrides (dotted keys like `model.path`) into the file's settings and validate them as
    `schema` (a run's config, or `rayeval serve`'s).

    `flags` names the flag of each override, for error messages.
    """
    merged = _plain(file_data)
    overrides = overrides or {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        if dotted == "tasks":
            merged["tasks"] = _override_tasks(merged.get("tasks"), value)
            continue
        target = merged
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                break  # the file wrote this section as a scalar: validation names it, the flag waits
        else:
            target[leaf] = _plain(value)
    try:
        return schema.model_validate(merged)
    except ValidationError as exc:
        command = getattr(schema, "help_command", "run")
        given = [dotted for dotted, value in overrides.items() if value is not None]
        raise EvalInputError(format_validation_error(exc, source, flags, command, given, schema)) from None


def _override_tasks(existing: Any, given: Any) -> list[Any]:
    """--tasks (or a Python caller's `tasks`) picks the task list: options a config file gave for the same
    task are kept, and options given with a task (`{"name": "ifeval", "limit": 5}`) laid over them."""
    by_name: dict[str, Any] = {}
    parsed = RunConfig._names_or_mappings(existing) if existing is not None else []
    for item in parsed if isinstance(parsed, list) else []:
        if isinstance(item, dict) and "name" in item:
            by_name[item["name"]] = item
    picked = RunConfig._names_or_mappings(given)
    if not isinstance(picked, list):
        return picked  # not a list of tasks: validation names it
    return [
        {**by_name.get(item["name"], {}), "enabled": True, **item}
        if isinstance(item, dict) and isinstance(item.get("name"), str)
        else item
        for item in picked
    ]


def dotted_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """Nested settings as build_config's overrides: `{"judge": {"model": M}}` is `{"judge.model": M}`;
    `tasks` whole (the override picks the run's tasks, as --tasks does, with any options given for each)."""
    flat: dict[str, Any] = {}
    for key, value in _plain(data).items():
        if key == "tasks":
            flat[key] = value
        elif isinstance(value, dict) and value:
            flat |= {f"{key}.{inner}": item for inner, item in dotted_settings(value).items()}
        else:
            flat[key] = value
    return flat


def _plain(value: Any) -> Any:
    """A copy of `value` as YAML would give it (dicts, lists, str, numbers), from what Python callers pass:
    enums (`RunMode.INFERENCE_ONLY`), paths, numpy numbers, tuples, pydantic models (`SamplingOptions(...)`)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, numbers.Number) and not isinstance(value, bool | int | float):
        return value.item() if hasattr(value, "item") else float(value)  # numpy's scalars
    return value
