"""The run configuration: one pydantic model, filled from YAML and overridden by flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evaluators.errors import EvalInputError

DEMO_LIMIT = 20


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskOptions(Strict):
    name: str
    enabled: bool = True
    limit: int | None = Field(None, ge=1, description="evaluate only the first N questions")
    num_fewshot: int | None = Field(None, ge=0)
    data_path: str | None = Field(None, description="local .jsonl/.json/.parquet or hf://org/name[:config]")
    fewshot_path: str | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)


class ModelOptions(Strict):
    path: str | None = Field(None, description="HF id or local folder; empty = the embedded SmolLM2-135M")
    revision: str | None = None
    dtype: str = "auto"
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
    enforce_eager: bool = False
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
        if value is not None and not value.partition(":")[2]:
            raise ValueError(f"'{value}' has no model after the colon")
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

    def enabled_tasks(self) -> list[TaskOptions]:
        return [t for t in self.tasks if t.enabled]


def format_validation_error(error: ValidationError, source: str) -> str:
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        problems.append(f"`{field}`: {item['msg']}")
    return f"{source} has {len(problems)} invalid field(s): " + "; ".join(problems) + "."


def load_config_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise EvalInputError(f"Config file {path} does not exist. Pass the path of a YAML run config.")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise EvalInputError(
            f"Config file {path} is not valid YAML: {exc}. Fix the syntax and try again."
        ) from exc
    if not isinstance(data, dict):
        raise EvalInputError(
            f"Config file {path} must hold a mapping of settings, not a {type(data).__name__}."
        )
    return data


def build_config(file_data: dict[str, Any], overrides: dict[str, Any], source: str) -> RunConfig:
    """Merge flag overrides (dotted keys like `model.path`) into the file's settings and validate."""
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
        target[leaf] = value
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise EvalInputError(format_validation_error(exc, source)) from None


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
