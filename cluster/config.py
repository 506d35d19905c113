"""The run configuration: one pydantic model, filled from YAML and overridden by flags."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evaluators.data import NotUtf8, read_utf8
from evaluators.errors import EvalInputError

DEMO_LIMIT = 20


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskOptions(Strict):
    name: str = Field(min_length=1)
    enabled: bool = True
    limit: int | None = Field(None, ge=1, description="evaluate only the first N questions")
    num_fewshot: int | None = Field(None, ge=0)
    data_path: str | None = Field(
        None, min_length=1, description="local .jsonl/.json/.parquet or hf://org/name[:config]"
    )
    fewshot_path: str | None = Field(None, min_length=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)


class ModelOptions(Strict):
    path: str | None = Field(None, description="HF id or local folder; empty = the embedded SmolLM2-135M")
    revision: str | None = None
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="weights dtype, as vLLM names them"
    )
    max_model_len: int = Field(2048, ge=16)
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="tokens per engine step (prefill chunk); default: vLLM's offline default"
    )
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    chat_template: bool | None = Field(
        None, description="apply the tokenizer's chat template; default: if it has one"
    )
    enforce_eager: bool | None = Field(
        None, description="no torch.compile / CUDA graphs; default: eager on CPU, compiled on GPU"
    )
    pin_engine_core: bool = Field(
        True,
        description="GPU: each replica's vLLM engine-core process on CPU cores of its own (about 10 % faster)",
    )
    cpu_kv_cache_gib: int = Field(
        1, ge=1, description="KV cache GiB per replica on CPU (VLLM_CPU_KVCACHE_SPACE)"
    )


class SamplingOptions(Strict):
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, description="default: each task's own")
    seed: int = 1234


class ClusterOptions(Strict):
    address: str | None = Field(None, description="existing Ray cluster; empty = start a local one")
    replicas: int = Field(1, ge=1)
    device: Literal["auto", "cpu", "gpu"] = "auto"
    cpus_per_worker: float = Field(
        1.0, gt=0, description="logical Ray CPUs per engine worker (TP x PP workers)"
    )
    placement_timeout_s: float = Field(120.0, gt=0)

    @field_validator("address")
    @classmethod
    def _ray_address(cls, value: str | None) -> str | None:
        if value is not None:
            check_ray_address(value)
        return value


class LmEvalOptions(Strict):
    """Options for lm-eval tasks, named and defaulted as `lm_eval`'s own flags are."""

    include_path: list[str] = Field(default_factory=list, description="folders of extra lm-eval task YAMLs")
    apply_chat_template: bool = Field(False, description="render lm-eval prompts with the chat template")
    fewshot_as_multiturn: bool | None = Field(
        None, description="few-shot examples as chat turns; default: on with apply_chat_template"
    )
    system_instruction: str | None = None
    gen_kwargs: str | None = Field(
        None,
        description="override generation kwargs of generate_until tasks, e.g. temperature=0.7,do_sample=True",
    )
    max_gen_toks: int = Field(256, ge=1, description="default generation length (lm-eval's vLLM default)")
    bootstrap_iters: int = Field(100000, ge=0, description="lm-eval's bootstrap for non-mean metrics' stderr")
    confirm_run_unsafe_code: bool = False

    @field_validator("include_path", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("gen_kwargs")
    @classmethod
    def _gen_kwargs(cls, value: str | None) -> str | None:
        if value is not None:
            parse_gen_kwargs(value)
        return value


class JudgeOptions(Strict):
    """Who judges the judged tasks (alpaca_eval, arena_hard, healthbench, writingbench) and how fast.

    The API key is never part of the config: it is read from the environment variable `api_key_env`.
    """

    model: str | None = Field(
        None, description="local:PATH_OR_HF_ID (engine replicas in the cluster) or openai:MODEL (an API)"
    )
    replicas: int = Field(1, ge=1, description="local judge engine replicas, or API judge actors")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint; default: OpenAI's")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key")
    requests_per_second: float = Field(5.0, gt=0, description="API judges: cluster-wide request rate")
    max_concurrency: int = Field(8, ge=1, description="API judges: cluster-wide requests in flight")
    max_attempts: int = Field(6, ge=1, description="API judges: attempts per request (429, 5xx, timeouts)")
    timeout_s: float = Field(60.0, gt=0, description="API judges: seconds per attempt")
    second_pass_pause_s: float = Field(
        5.0,
        ge=0,
        description="API judges: seconds of quiet before judgments that failed on API errors are asked once more",
    )
    max_tokens: int | None = Field(None, ge=1, description="judge answer length; default: each task's own")
    temperature: float = Field(0.0, ge=0)
    max_model_len: int | None = Field(None, ge=16, description="local judge context; default: the model's")

    @field_validator("model")
    @classmethod
    def _kind_prefix(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("local:", "openai:")):
            raise ValueError(
                f"'{value}' names no judge kind: write local:PATH_OR_HF_ID for a judge model on the cluster's "
                "own engine replicas, or openai:MODEL for an OpenAI-compatible API (with --judge-base-url)"
            )
        if value is not None and not value.partition(":")[2].strip():
            kind = value.partition(":")[0]
            example = "local:Qwen/Qwen2.5-7B-Instruct" if kind == "local" else "openai:gpt-4.1-mini"
            raise ValueError(f"'{value}' has no model after the colon: write {kind}:MODEL, e.g. {example}")
        return value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        parsed = urlparse(value or "")
        if value is not None and (parsed.scheme not in ("http", "https") or not parsed.netloc):
            raise ValueError(
                f"'{value}' is not an http(s) URL: give the endpoint's full address, e.g. "
                "http://localhost:8000/v1 or https://api.example.com/v1"
            )
        return value

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str) -> str:
        if not ENV_NAME.match(value):
            raise ValueError(
                f"'{value}' is not an environment variable name: give the variable's name (letters, digits, "
                "underscores), e.g. OPENAI_API_KEY, never the key itself"
            )
        return value

    @property
    def kind(self) -> Literal["local", "openai"] | None:
        if self.model is None:
            return None
        return "local" if self.model.startswith("local:") else "openai"

    @property
    def target(self) -> str:
        """The path, hub id or API model name after the kind prefix."""
        return (self.model or "").partition(":")[2]


class RunConfig(Strict):
    model: ModelOptions = Field(default_factory=ModelOptions)
    tasks: list[TaskOptions] = Field(default_factory=lambda: [TaskOptions(name="ifeval")])
    limit: int | None = Field(None, ge=1, description="default per-task limit")
    num_fewshot: int | None = Field(None, ge=0)
    num_samples: int = Field(1, ge=1, description="N in mean@N")
    sampling: SamplingOptions = Field(default_factory=SamplingOptions)
    cluster: ClusterOptions = Field(default_factory=ClusterOptions)
    lm_eval: LmEvalOptions = Field(default_factory=LmEvalOptions)
    judge: JudgeOptions = Field(default_factory=JudgeOptions)
    output_dir: str = "runs"
    run_id: str | None = None

    @field_validator("tasks", mode="before")
    @classmethod
    def _names_or_mappings(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, dict):  # {ifeval: {limit: 5}, gsm8k: {}}
            return [{"name": name, **(opts or {})} for name, opts in value.items()]
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("tasks")
    @classmethod
    def _one_entry_each(cls, value: list[TaskOptions]) -> list[TaskOptions]:
        names = [t.name for t in value]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed twice: keep one entry per task")
        if not any(t.enabled for t in value):
            raise ValueError(
                "no task is enabled: name at least one, e.g. --tasks ifeval or `tasks: [ifeval]` "
                "(`rayeval tasks` lists them)"
            )
        return value

    @field_validator("run_id")
    @classmethod
    def _folder_name(cls, value: str | None) -> str | None:
        if value is not None and (value in ("", ".", "..") or "/" in value or "\\" in value):
            raise ValueError(
                f"'{value}' is not a folder name: a run id names one folder under output_dir, so it may not be "
                "empty, '.', '..' or hold a slash; e.g. --run-id qwen-gsm8k (put folders in --output-dir)"
            )
        return value

    def enabled_tasks(self) -> list[TaskOptions]:
        return [t for t in self.tasks if t.enabled]


def format_validation_error(
    error: ValidationError, source: str, flags: Mapping[str, str] | None = None
) -> str:
    """One paragraph naming each bad setting (and the flag that set it), its value, the rule, and the fix.

    `flags` maps the dotted settings given on the command line to their flags (`sampling.temperature` to
    `--temperature`).
    """
    problems = [_describe_problem(item, flags or {}) for item in error.errors()]
    them = "it" if len(problems) == 1 else "them"
    fix = (
        f"Fix {them}: `rayeval run --help` describes every flag"
        if source == COMMAND_LINE
        else f"Fix {them} in {source}: README.md shows a full config, `rayeval run --help` every setting"
    )
    return f"{source} has {len(problems)} invalid setting(s): " + "; ".join(problems) + f". {fix}."


COMMAND_LINE = "the command line"


def _describe_problem(item: Mapping[str, Any], flags: Mapping[str, str]) -> str:
    loc = tuple(item["loc"])
    field = ".".join(str(part) for part in loc) or "(top level)"
    named = f"`{field}`"
    flag = next((flags[k] for k in _prefixes(loc) if k in flags), None)
    if flag:
        named += f" ({flag})"
    if item["type"] == "extra_forbidden":
        return f"{named} is not a setting{_setting_hint(loc)}"
    if item["type"] == "missing":
        return f"{named} is required but missing"
    message = str(item["msg"]).removeprefix("Value error, ")
    message = message[:1].lower() + message[1:] + _type_hint(item, loc)
    if isinstance(item["input"], (list, dict)):
        return f"{named}: {message}"  # a whole section or list: the message says which part
    value = repr(item["input"])
    return f"{named} is {value if len(value) <= 60 else value[:57] + '...'}: {message}"


def _prefixes(loc: tuple[Any, ...]) -> list[str]:
    """`tasks.0.name` → tasks.0.name, tasks.0, tasks: the longest dotted prefix a flag set comes first."""
    parts = [str(p) for p in loc]
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _section_model(parts: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model of the section a location points into (list indices step into the item type)."""
    model: type[BaseModel] = RunConfig
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


def _setting_hint(loc: tuple[Any, ...]) -> str:
    """For an unknown key: the close name in its section, else where a setting of that name lives."""
    section = _section_model(loc[:-1])
    if section is None:
        return ""
    name, known = str(loc[-1]), list(section.model_fields)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean `{close[0]}`?)"
    elsewhere = [  # in a section of the run (not the per-task list: its options repeat the sections')
        f"{section_name}.{name}"
        for section_name, field in RunConfig.model_fields.items()
        if isinstance(field.annotation, type)
        and issubclass(field.annotation, BaseModel)
        and name in field.annotation.model_fields
    ]
    if elsewhere:
        return f" here (it belongs under `{elsewhere[0]}`)"
    return f" (the settings here are {', '.join(known)})"


def _type_hint(item: Mapping[str, Any], loc: tuple[Any, ...]) -> str:
    """The expected shape, for a value of the wrong kind where a section or the task list was expected."""
    if item["type"] == "model_type":
        section = _section_model(loc)
        keys = ", ".join(list(section.model_fields)[:4]) if section else "its settings"
        return f" (write it as a mapping of its settings: {keys}, ...)"
    if item["type"] == "list_type" and loc == ("tasks",):
        return " (write a list of task names or mappings, e.g. tasks: [ifeval, {name: gsm8k, limit: 100}])"
    return ""


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
    file_data: dict[str, Any],
    overrides: dict[str, Any],
    source: str,
    flags: Mapping[str, str] | None = None,
) -> RunConfig:
    """Merge flag overrides (dotted keys like `model.path`) into the file's settings and validate.

    `flags` names the flag of each override, for error messages.
    """
    merged = _deep_copy(file_data)
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
            target[leaf] = value
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise EvalInputError(format_validation_error(exc, source, flags)) from None


def _override_tasks(existing: Any, names: list[str]) -> list[Any]:
    """--tasks picks the task list; options a config file gave for the same task are kept."""
    by_name: dict[str, Any] = {}
    parsed = RunConfig._names_or_mappings(existing) if existing is not None else []
    for item in parsed if isinstance(parsed, list) else []:
        if isinstance(item, dict) and "name" in item:
            by_name[item["name"]] = item
    return [{**by_name.get(name, {}), "name": name, "enabled": True} for name in names]


def _deep_copy(data: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(data)) if data else {}


# --- checks of single values ------------------------------------------------------------------------------

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RAY_ADDRESS = re.compile(r"^(?:ray://)?(?P<host>[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})$")


def check_ray_address(value: str) -> None:
    """`auto`, `local`, host:port (the head's GCS) or ray://host:port (Ray client); ValueError otherwise."""
    if value in ("auto", "local"):
        return
    if value.startswith(("http://", "https://")):
        raise ValueError(
            f"'{value}' is a web address (the dashboard or job server); rayeval joins a cluster at its GCS: "
            "give host:6379, ray://host:10001 for Ray client, or auto on a cluster node"
        )
    match = RAY_ADDRESS.match(value)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ValueError(
            f"'{value}' is not a Ray address: give host:port of the head's GCS (e.g. 10.0.0.5:6379), "
            "ray://host:10001 for Ray client, or auto on a cluster node; leave it out to start a local cluster"
        )


class ValueKind(Enum):
    """What a generation kwarg's value must be, in words for messages."""

    BOOL = "true or false"
    INT = "a whole number"
    NUMBER = "a number"
    TEXT = "text"


@dataclass(frozen=True)
class GenKwarg:
    kind: ValueKind
    allowed: Callable[[float], bool] | None = None
    rule: str = ""


_TOKENS = GenKwarg(ValueKind.INT, lambda v: v >= 1, ">= 1")
_SWITCH = GenKwarg(ValueKind.BOOL)
# What `--gen-kwargs` may set: lm-eval's own generation keys (it normalises the max-token aliases) and the vLLM
# sampling fields RayEvalLM passes on to the engine. Anything else would fail inside the engine mid-run.
GEN_KWARGS: dict[str, GenKwarg] = {
    "do_sample": _SWITCH,
    "until": GenKwarg(ValueKind.TEXT),
    "temperature": GenKwarg(ValueKind.NUMBER, lambda v: v >= 0, ">= 0"),
    "top_p": GenKwarg(ValueKind.NUMBER, lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": GenKwarg(ValueKind.INT, lambda v: v >= -1, "-1 or 0 (off), or >= 1"),
    "min_p": GenKwarg(ValueKind.NUMBER, lambda v: 0 <= v <= 1, "in [0, 1]"),
    "max_gen_toks": _TOKENS,
    "max_new_tokens": _TOKENS,
    "max_tokens": _TOKENS,
    "max_completion_tokens": _TOKENS,
    "min_tokens": GenKwarg(ValueKind.INT, lambda v: v >= 0, ">= 0"),
    "repetition_penalty": GenKwarg(ValueKind.NUMBER, lambda v: v > 0, "> 0"),
    "presence_penalty": GenKwarg(ValueKind.NUMBER, lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "frequency_penalty": GenKwarg(ValueKind.NUMBER, lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "ignore_eos": _SWITCH,
    "skip_special_tokens": _SWITCH,
    "spaces_between_special_tokens": _SWITCH,
    "include_stop_str_in_output": _SWITCH,
}
# Keys rayeval sets itself: a gen kwarg of the same name would collide in the engine's sampling parameters.
GEN_KWARGS_SET_ELSEWHERE = {
    "seed": "use --seed (sample i of a question uses seed + i)",
    "n": "use --num-samples",
    "stop": "use until=TEXT",
}
GEN_KWARGS_FORMAT = "write comma-separated KEY=VALUE pairs, e.g. temperature=0.7,do_sample=true"


def parse_gen_kwarg_value(text: str) -> bool | int | float | str | None:
    """A value as lm-eval's `handle_arg_string` reads it: quoted text, true/false, none, int, float, else text."""
    arg = text.strip()
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in ("'", '"'):
        return arg[1:-1]
    lower = arg.lower()
    if lower in ("true", "false"):
        return lower == "true"
    if lower == "none":
        return None
    if arg.lstrip("+-").isdigit():
        return int(arg)
    try:
        return float(arg)
    except ValueError:
        return arg


def parse_gen_kwargs(text: str) -> dict[str, bool | int | float | str]:
    """`--gen-kwargs` split as lm-eval's `simple_parse_args_string` splits it (commas, then the first `=`),
    refusing what lm-eval would pass on silently and the engine reject later; ValueError names each bad pair."""
    problems, parsed = [], {}
    for piece in (p for p in text.strip().split(",") if p):
        key, sep, raw = piece.partition("=")
        problem = _pair_problem(piece, key, sep, raw, parsed)
        if problem:
            problems.append(problem)
        else:
            parsed[key] = parse_gen_kwarg_value(raw)
    if problems:
        raise ValueError(f"{'; '.join(problems)}; {GEN_KWARGS_FORMAT}")
    return parsed


def _pair_problem(piece: str, key: str, sep: str, raw: str, seen: Mapping[str, Any]) -> str | None:
    if not sep:
        return f"'{piece}' has no '=' and value"
    if not key:
        return f"'{piece}' has no key before '='"
    if key in GEN_KWARGS_SET_ELSEWHERE:
        return f"'{key}' is not a gen kwarg here: {GEN_KWARGS_SET_ELSEWHERE[key]}"
    if key not in GEN_KWARGS:
        close = difflib.get_close_matches(key.strip(), GEN_KWARGS, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(GEN_KWARGS)}"
        return f"'{key}' is not a generation kwarg ({hint})"
    if key in seen:
        return f"'{key}' is given twice"
    if not raw.strip():
        return f"'{key}' has no value after '='"
    return _value_problem(key, parse_gen_kwarg_value(raw), raw)


def _value_problem(key: str, value: Any, raw: str) -> str | None:
    spec = GEN_KWARGS[key]
    fits = {
        ValueKind.BOOL: isinstance(value, bool),
        ValueKind.INT: isinstance(value, int) and not isinstance(value, bool),
        ValueKind.NUMBER: isinstance(value, (int, float)) and not isinstance(value, bool),
        ValueKind.TEXT: isinstance(value, str),
    }[spec.kind]
    if fits and spec.kind is ValueKind.NUMBER:
        fits = math.isfinite(value)
    if not fits:
        quoted = " (quote it to keep it text, e.g. until='42')" if spec.kind is ValueKind.TEXT else ""
        return f"{key}={raw.strip()} must be {spec.kind.value}{quoted}"
    if spec.allowed is not None and not spec.allowed(value):
        return f"{key}={raw.strip()} must be {spec.rule}"
    return None
