"""The run configuration: one pydantic model, filled from YAML and overridden by flags.

Each setting is defined once, here: its type, default, rule and description. A setting that `rayeval run`
offers as a flag says so with `cli(...)`, and the CLI builds the flag, its help (the description, with the
default) and its value type from the field (`cluster.cli.flags`).
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster.config.values import (
    check_env_name,
    check_listen_host,
    check_ray_address,
    duration_value,
    parse_gen_kwargs,
)
from evaluators.errors import EvalInputError
from evaluators.ranges import DatasetRange

# The embedded demo model on CPU (a quick look, not a benchmark): its first 20 questions, answers cut at 256
# tokens. Greedy SmolLM2-135M in float32 repeats itself to IFEval's 1,280-token limit on 16 of the 20 demo
# prompts, so the demo took 7.6 minutes on a 2-core machine instead of about 2.5. Explicit values win.
DEMO_LIMIT = 20
DEMO_MAX_TOKENS = 256
# --num-samples auto: the samples every question gets before adaptive N adds more (a spread needs two)
AUTO_SAMPLES = "auto"
ADAPTIVE_FIRST_SAMPLES = 2
# Sequences per engine step on CPU when --max-num-seqs is not given. On GPU the engine takes vLLM's offline
# default for the card (1024 on an H200): there, 64 made a 541 x 4 IFEval run's generation take 31.1 s
# against 20.5 s at 1024 (docs/BENCHMARKS.md).
CPU_MAX_NUM_SEQS = 64
DEFAULT_KEEP_WARM_S = 600.0  # a run on a `ray start` cluster leaves its engines warm this long


# the max_lora_rank values vLLM 0.32 takes (its LoRAConfig's MaxLoRARanks; an older vLLM on a GPU may stop at
# 256, and its own check says so when the engine starts)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class OutputLayout(StrEnum):
    """Folder layouts a run writes: rayeval's own always, another tool's beside it where asked."""

    RAYEVAL = "rayeval"
    OPENCOMPASS = "opencompass"


class RunMode(StrEnum):
    """What a run does: everything, generation only (judged tasks stay unjudged), or judging stored outputs."""

    FULL = "full"
    INFERENCE_ONLY = "inference_only"
    JUDGE_ONLY = "judge_only"


ENDPOINT_PREFIX = "openai:"  # --model openai:NAME: the model under test behind an OpenAI-compatible endpoint


def cli(
    flag: str,
    metavar: str | None = None,
    group: str | None = None,
    consts: tuple[tuple[str, str, str], ...] = (),
) -> dict[str, Any]:
    """Field metadata for a setting `rayeval run` offers: its flag, the placeholder of its value, the help
    group of a top-level setting (a section's settings share the section's group), and, for an enum, flags
    that each set one value: (flag, value, help)."""
    return {"cli": {"flag": flag, "metavar": metavar, "group": group, "consts": [list(c) for c in consts]}}


def setting_flags(schema: type[BaseModel]) -> dict[str, str]:
    """Each setting's flag by its dotted path (`sampling.temperature` → `--temperature`), in field order."""
    found: dict[str, str] = {}
    for name, field in schema.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        spec: Any = extra.get("cli")
        if spec is not None:
            found[name] = spec["flag"]
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found |= {f"{name}.{inner}": flag for inner, flag in setting_flags(field.annotation).items()}
    return found


def _check_test_range(value: str | None) -> str | None:
    """A dataset range must parse (`evaluators.ranges`) when the config is read, not when its task loads."""
    if value is not None:
        try:
            DatasetRange.parse(value)
        except EvalInputError as exc:
            raise ValueError(str(exc)) from None
    return value


def _no_penalty_is_unset(value: float | None) -> float | None:
    """A run's repetition_penalty of 1 is vLLM's none: kept as unset, so a watch's step settings see a run
    without the setting. (A task's own 1 stays: it overrides the run's penalty with none.)"""
    return None if value == 1.0 else value


class Strict(BaseModel):
    # no setting takes inf or nan (a temperature of inf passed, and failed in the engine)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _duration_setting(field: str, flag: str, off: bool = True) -> Any:
    """A before-validator reading setting `field` as a duration (`duration_value`; `off` as there), so each
    duration setting takes 90, 30m, 1h30m alike in one line."""

    def parse(value: Any) -> Any:
        return duration_value(value, flag, off)

    return field_validator(field, mode="before")(parse)


def _no_credentials(value: str | None) -> str | None:
    """A path or URI with a credential in it (USER:PASSWORD@, a secret query key): refused, never quoted, since
    config.yaml and messages would show it."""
    from cluster.storage.location import credentials_anywhere

    carried = credentials_anywhere(value) if value is not None else None
    if carried is not None:
        raise ValueError(
            f"the URI carries a credential ({carried}), which config.yaml and messages would show: give it the "
            "storage's own way (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, HF_TOKEN) and the URI without it"
        )
    return value


class TaskOptions(Strict):
    """One task's entry in `tasks:`; its options override the run's for this task."""

    name: str = Field(min_length=1)
    enabled: bool = True
    limit: int | None = Field(None, ge=1, description="evaluate only the first N questions")
    test_range: str | None = Field(None, description="the part of the dataset to evaluate, a Python slice")
    num_fewshot: int | None = Field(None, ge=0)
    data_path: str | None = Field(
        None, min_length=1, description="local .jsonl/.json/.parquet or hf://org/name[:config]"
    )
    fewshot_path: str | None = Field(None, min_length=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    repetition_penalty: float | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, ge=1)

    _range = field_validator("test_range")(_check_test_range)
    _paths = field_validator("data_path", "fewshot_path")(_no_credentials)


class ModelOptions(Strict):
    """The model under test and how each of its engine replicas is built."""

    path: str | None = Field(
        None,
        description="model folder or HF hub id (default: the embedded SmolLM2-135M-Instruct), or openai:NAME for "
        "model NAME behind an OpenAI-compatible endpoint (--base-url)",
        json_schema_extra=cli("--model", "PATH_OR_HF_ID | openai:NAME"),
    )
    revision: str | None = Field(
        None,
        description="model revision (branch, tag or commit) on the hub",
        json_schema_extra=cli("--revision", "REV"),
    )
    lora: str | None = Field(
        None,
        min_length=1,
        description="a LoRA adapter folder (peft's save_pretrained) to evaluate on the base model: checked before "
        "any engine starts, applied per request by vLLM's multi-LoRA engine",
        json_schema_extra=cli("--lora", "PATH"),
    )
    max_lora_rank: Literal[LORA_RANKS] = Field(
        16,
        description="the largest adapter rank the engines accept (vLLM's max_lora_rank)",
        json_schema_extra=cli("--max-lora-rank", "R"),
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto",
        description="weights dtype, as vLLM names it (default auto: the model's own on GPU; on CPU bfloat16 "
        "where the CPU computes it natively, else float32)",
        json_schema_extra=cli("--dtype"),
    )
    max_model_len: int = Field(
        2048,
        ge=16,
        description="context length per sequence; longer prompts fail and are counted",
        json_schema_extra=cli("--max-model-len", "TOKENS"),
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="sequences batched per engine step; the dispatcher keeps at least this many in flight per "
        f"replica (default: {CPU_MAX_NUM_SEQS} on CPU; on GPU what vllm.LLM uses on that card, e.g. 1024 on an "
        "H100, H200 or B200, 256 on an A100 or a smaller card)",
        json_schema_extra=cli("--max-num-seqs", "N"),
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=16,
        description="tokens per engine step, at least --max-model-len on CPU (no chunked prefill there) "
        "(default: what vllm.LLM uses on that device: on CPU 4096 per engine worker or --max-model-len if "
        "more, 16384 on an H100)",
        json_schema_extra=cli("--max-num-batched-tokens", "N"),
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="GPUs (or CPU workers) a replica's layers are split over",
        json_schema_extra=cli("--tensor-parallel-size", "N"),
    )
    pipeline_parallel_size: int = Field(
        1,
        ge=1,
        description="pipeline stages per replica",
        json_schema_extra=cli("--pipeline-parallel-size", "N"),
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="fraction of each GPU vLLM may use",
        json_schema_extra=cli("--gpu-memory-utilization", "F"),
    )
    cpu_kv_cache_gib: float = Field(
        1,
        gt=0,
        description="KV cache GiB per replica on CPU, allocated when the engine starts (fractions too: 0.25 "
        "holds about 11,600 tokens of the embedded model in bfloat16, half that in float32)",
        json_schema_extra=cli("--kv-cache-gib", "GIB"),
    )
    pin_engine_core: bool = Field(
        True,
        description="on GPUs, give each replica's vLLM engine-core process two CPU cores of its own, disjoint on "
        "a node (default on; --no-pin-engine-core on nodes shared with other CPU-heavy work)",
        json_schema_extra=cli("--pin-engine-core"),
    )
    chat_template: bool | None = Field(
        None,
        description="apply the tokenizer's chat template (default: when the tokenizer has one)",
        json_schema_extra=cli("--chat-template"),
    )
    think_end_token: str | None = Field(
        None,
        min_length=1,
        description="where a reasoning model's thinking ends (e.g. </think>): outputs are scored and judged on "
        "what follows its last occurrence, as lm-eval's think_end_token (the records keep the whole output)",
        json_schema_extra=cli("--think-end-token", "TEXT"),
    )
    enforce_eager: bool | None = Field(
        None,
        description="run the model eagerly: no torch.compile and no CUDA graphs (default: eager on CPU, where "
        "compiling costs more at start than it saves below ~22 minutes of generation; compiled on GPU)",
        json_schema_extra=cli("--enforce-eager"),
    )
    custom_all_reduce: bool | None = Field(
        None,
        description="GPU tensor parallel: vLLM's custom all-reduce kernel (peer access within one node) instead "
        "of NCCL's (default: on within one node, off for a replica over several nodes)",
        json_schema_extra=cli("--custom-all-reduce"),
    )

    _paths = field_validator("path", "lora")(_no_credentials)

    @property
    def is_endpoint(self) -> bool:
        """Whether the model is behind an OpenAI-compatible endpoint (`openai:NAME`), not run on our engines."""
        return (self.path or "").startswith(ENDPOINT_PREFIX)

    @property
    def endpoint_model(self) -> str:
        """The name the endpoint serves the model under (after `openai:`)."""
        return (self.path or "").removeprefix(ENDPOINT_PREFIX).strip() if self.is_endpoint else ""


class SamplingOptions(Strict):
    """How outputs are sampled; a task's own options win for that task."""

    temperature: float = Field(
        0.0,
        ge=0,
        description="sampling temperature (default 0 = greedy)",
        json_schema_extra=cli("--temperature"),
    )
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling", json_schema_extra=cli("--top-p", "P")
    )
    top_k: int | None = Field(
        None,
        ge=1,
        description="sample from the K most likely tokens only (vLLM's top_k; default: all)",
        json_schema_extra=cli("--top-k", "K"),
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0,
        description="vLLM's repetition_penalty: above 1 makes tokens already in the prompt or reply less likely, "
        "below 1 more (default: 1, none)",
        json_schema_extra=cli("--repetition-penalty", "R"),
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="max new tokens (default: each task's own; 256 in the embedded demo model's quick run, "
        "where no --limit is set; a reply also ends where the context, --max-model-len, is full)",
        json_schema_extra=cli("--max-tokens", "N"),
    )
    seed: int = Field(
        1234,
        ge=0,  # vLLM reads a seed of -1 as "unseeded"
        lt=2**32 - 2**20,  # lm-eval seeds numpy with it (below 2**32), the engines seed + sample index
        description="base seed; sample i of a question uses seed+i",
        json_schema_extra=cli("--seed"),
    )
    target_sem: float | None = Field(
        None,
        gt=0,
        description="adaptive N: after the first num_samples per question, draw more samples for the questions "
        "whose spread moves the error bar most until each metric's SEM is at most this "
        "(rayeval's own non-judged tasks)",
        json_schema_extra=cli("--target-sem", "X"),
    )
    max_samples: int = Field(
        16,
        ge=2,
        description="adaptive N: the most samples any question gets",
        json_schema_extra=cli("--max-samples", "K"),
    )

    _penalty = field_validator("repetition_penalty")(_no_penalty_is_unset)


class ClusterOptions(Strict):
    """Where the replicas run."""

    address: str | None = Field(
        None,
        description="connect to an existing Ray cluster (e.g. auto or ray://head:10001) instead of starting a "
        "local one (default: $RAY_ADDRESS when set, as it is for a Ray Job's command, else a local cluster; "
        "`local` starts one too)",
        json_schema_extra=cli("--address", "ADDR"),
    )
    replicas: int = Field(
        1,
        ge=1,
        description="engine replicas, each a full copy of the model",
        json_schema_extra=cli("--replicas", "N"),
    )
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="where engines run (default auto: GPU if the cluster has any)",
        json_schema_extra=cli("--device"),
    )
    cpus_per_worker: float = Field(
        1.0,
        gt=0,
        description="logical Ray CPUs per engine worker (TP x PP workers per replica)",
        json_schema_extra=cli("--cpus-per-worker", "N"),
    )
    placement_timeout_s: float = Field(
        120.0,
        gt=0,
        description="how long to wait for room for each replica's placement group (e.g. 120, 5m)",
        json_schema_extra=cli("--placement-timeout", "DURATION"),
    )
    replica_restarts: int = Field(
        2,
        ge=0,
        description="replacement replicas a run may start for replicas it loses (a node gone, an engine "
        "crash); each waits up to --placement-timeout for room (0: carry on with the replicas left)",
        json_schema_extra=cli("--replica-restarts", "N"),
    )
    max_in_flight: int | None = Field(
        None,
        ge=1,
        description="sequences this run keeps in flight on each replica (default: twice the engine's "
        "--max-num-seqs, a batch running and one waiting); fewer share a warm pool more lightly, and unlike "
        "--max-num-seqs this is the run's setting, not the engine's, so a warm pool still serves the run",
        json_schema_extra=cli("--max-in-flight", "N"),
    )
    coordinator_node: str | None = Field(
        None,
        min_length=1,
        description="a Ray-client run's coordinator, which writes the run folder, runs on this node: its IP "
        "address, hostname or Ray node id (default: the head node)",
        json_schema_extra=cli("--coordinator-node", "NODE"),
    )
    coordinator_idle_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="a Ray-client run's coordinator exits this long after its run ended when no client has "
        "fetched the result (its files stay; a rerun of the run id reads them back) (e.g. 1h, 600)",
        json_schema_extra=cli("--coordinator-idle-timeout", "DURATION"),
    )
    warm_pools: bool = Field(
        True,
        description="use a warm pool of the cluster whose engines have this run's settings (`rayeval pools` "
        "lists them) instead of starting engines; --no-warm-pools always starts the run's own",
        json_schema_extra=cli("--warm-pools"),
    )
    keep_warm_s: float | None = Field(
        None,
        ge=0,
        description="leave the run's engines up as a warm pool for the next run, stopped after this long "
        "unused (e.g. 30m, 2h, 600, off) (default: 10m on a cluster given by --address, off on the local "
        "cluster a command starts, which goes away with it)",
        json_schema_extra=cli("--keep-warm", "DURATION"),
    )
    forward_env: list[str] = Field(
        default_factory=list,
        description="an environment variable of this machine that the run's coordinator on the cluster "
        "needs (a Ray-client run; the judge's and endpoint's key variables and HF_TOKEN go already); its value "
        "is handed over in a call, never stored; repeat for more",
        json_schema_extra=cli("--env", "NAME"),
    )

    @model_validator(mode="before")
    @classmethod
    def _address_from_environment(cls, data: Any) -> Any:
        """A command that Ray runs as a job finds its cluster in RAY_ADDRESS, as `ray.init()` would. An http
        RAY_ADDRESS is a job server's (exported for `ray job submit`), not a cluster to join."""
        from_env = os.environ.get("RAY_ADDRESS", "")
        if (
            isinstance(data, dict)
            and data.get("address") is None
            and from_env
            and "://" not in from_env.replace("ray://", "")
        ):
            return {**data, "address": from_env}
        return data

    @field_validator("address")
    @classmethod
    def _ray_address(cls, value: str | None) -> str | None:
        if value is not None:
            check_ray_address(value)
        # `local` is a new cluster of this machine that goes away with the command: what leaving it out
        # starts, with rayeval's settings for it (its CPUs, no warm engines kept, the local checks)
        return None if value == "local" else value

    @property
    def kept_warm_s(self) -> float | None:
        """How long a run's engines stay up as a warm pool after it (None: they stop with it): --keep-warm,
        else DEFAULT_KEEP_WARM_S on a cluster given by address and off on a local cluster the command starts
        itself (it goes away with the command)."""
        value = self.keep_warm_s
        if value is None:
            value = DEFAULT_KEEP_WARM_S if self.address else 0.0
        return value if value > 0 else None

    _duration = _duration_setting("keep_warm_s", "--keep-warm")

    _idle_duration = _duration_setting("coordinator_idle_timeout_s", "--coordinator-idle-timeout", off=False)

    _placement_duration = _duration_setting("placement_timeout_s", "--placement-timeout", off=False)

    @field_validator("forward_env")
    @classmethod
    def _variable_names(cls, names: list[str]) -> list[str]:
        return [check_env_name(name, "HF_TOKEN") for name in names]  # values are read from this machine


class LmEvalOptions(Strict):
    """Options for lm-eval tasks, named and defaulted as `lm_eval`'s own flags are."""

    include_path: list[str] = Field(
        default_factory=list,
        description="folder of extra lm-eval task YAMLs (repeatable)",
        json_schema_extra=cli("--include-path", "DIR"),
    )
    apply_chat_template: bool = Field(
        False,
        description="render lm-eval tasks' prompts with the model's chat template (default off, as in lm-eval; "
        "rayeval's own tasks: --chat-template)",
        json_schema_extra=cli("--apply-chat-template"),
    )
    fewshot_as_multiturn: bool | None = Field(
        None,
        description="few-shot examples as chat turns (default: on with --apply-chat-template)",
        json_schema_extra=cli("--fewshot-as-multiturn"),
    )
    system_instruction: str | None = Field(
        None,
        description="lm-eval tasks: a system prompt (rayeval's own tasks render their prompts as their "
        "benchmark does)",
        json_schema_extra=cli("--system-instruction", "TEXT"),
    )
    gen_kwargs: str | None = Field(
        None,
        description="lm-eval tasks: override generate_until tasks' generation kwargs, e.g. "
        "temperature=0.7,do_sample=True (rayeval's own tasks take --temperature, --max-tokens...)",
        json_schema_extra=cli("--gen-kwargs", "K=V,..."),
    )
    max_gen_toks: int = Field(
        256,
        ge=1,
        description="generation length where a task sets none, as in lm-eval's vLLM backend",
        json_schema_extra=cli("--max-gen-toks", "N"),
    )
    bootstrap_iters: int = Field(
        100000,
        ge=0,
        description="lm-eval tasks: bootstrap rounds for the stderr of metrics that are not means (as lm_eval's "
        "--bootstrap_iters; 0: none)",
        json_schema_extra=cli("--bootstrap-iters", "N"),
    )
    confirm_run_unsafe_code: bool = Field(
        False,
        description="lm-eval tasks that execute the model's code (humaneval, mbpp): allow it, as lm_eval's "
        "--confirm_run_unsafe_code",
        json_schema_extra=cli("--confirm-run-unsafe-code"),
    )

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


def _check_http_url(value: str | None) -> str | None:
    from cluster.storage.location import credentials_in

    carried = credentials_in(value) if value is not None else None
    if carried is not None:
        raise ValueError(
            f"the URL carries a credential ({carried}), which config.yaml and the logs would record: "
            "give the key through its variable (--api-key-env) and the URL without it"
        )
    parsed = urlparse(value or "")
    if value is not None and (parsed.scheme not in ("http", "https") or not parsed.netloc):
        raise ValueError(
            f"'{value}' is not an http(s) URL: give the endpoint's full address, e.g. "
            "http://localhost:8000/v1 or https://api.example.com/v1"
        )
    return value


def _check_env_name(value: str | None) -> str | None:
    return None if value is None else check_env_name(value, "OPENAI_API_KEY")


class EndpointOptions(Strict):
    """How to reach the model under test when it is an OpenAI-compatible endpoint (`--model openai:NAME`):
    its requests go through the same dispatcher, store and reports as engine replicas, sent by API client
    actors under one cluster-wide rate limiter. The API key is read from the variable `api_key_env`."""

    base_url: str | None = Field(
        None,
        description="the endpoint's address, ending in /v1 (default: OpenAI's)",
        json_schema_extra=cli("--base-url", "URL"),
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="environment variable with the endpoint's API key (with --base-url it may be unset: a "
        "local server takes any key)",
        json_schema_extra=cli("--api-key-env", "VAR"),
    )
    max_concurrency: int = Field(
        64,
        ge=1,
        description="requests in flight to the endpoint, for the whole cluster",
        json_schema_extra=cli("--max-concurrency", "N"),
    )
    requests_per_second: float = Field(
        100.0,
        gt=0,
        description="requests per second to the endpoint, for the whole cluster",
        json_schema_extra=cli("--requests-per-second", "R"),
    )
    max_attempts: int = Field(
        8,
        ge=1,
        description="attempts per request on 429, 5xx, timeouts and dropped connections (waits between them "
        "double up to 30 s, so a served replica restarting within a minute costs no sample)",
        json_schema_extra=cli("--endpoint-max-attempts", "N"),
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        description="time per attempt before it counts as a timeout and is retried (e.g. 10m, 600)",
        json_schema_extra=cli("--endpoint-timeout", "DURATION"),
    )

    tokenizer: str | None = Field(
        None,
        min_length=1,
        description="the served model's tokenizer (a model folder or hub id), for lm-eval tasks, whose prompts "
        "are tokenised here (default: NAME itself where it names a model folder)",
        json_schema_extra=cli("--tokenizer", "PATH_OR_HF_ID"),
    )

    _base_url = field_validator("base_url")(_check_http_url)
    _key_env = field_validator("api_key_env")(_check_env_name)

    _timeout = _duration_setting("timeout_s", "--endpoint-timeout", off=False)


class JudgeOptions(Strict):
    """Who judges the judged tasks (alpaca_eval, arena_hard, healthbench, writingbench) and how fast.

    The API key is never part of the config: it is read from the environment variable `api_key_env`.
    """

    model: str | None = Field(
        None,
        description="local:M hosts judge model M on its own engine replicas; openai:M calls an "
        "OpenAI-compatible API",
        json_schema_extra=cli("--judge", "local:PATH_OR_ID | openai:MODEL"),
    )
    replicas: int = Field(
        1,
        ge=1,
        description="local judge engine replicas, or API judge actors",
        json_schema_extra=cli("--judge-replicas", "N"),
    )
    base_url: str | None = Field(
        None,
        description="OpenAI-compatible endpoint (/v1) (default: OpenAI's)",
        json_schema_extra=cli("--judge-base-url", "URL"),
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="environment variable with the API key",
        json_schema_extra=cli("--judge-api-key-env", "VAR"),
    )
    requests_per_second: float = Field(
        5.0,
        gt=0,
        description="API requests per second, for the whole cluster",
        json_schema_extra=cli("--judge-rps", "R"),
    )
    max_concurrency: int = Field(
        8,
        ge=1,
        description="API requests in flight, for the whole cluster",
        json_schema_extra=cli("--judge-max-concurrency", "N"),
    )
    max_attempts: int = Field(
        6,
        ge=1,
        description="API judges: attempts per request on 429, 5xx and timeouts",
        json_schema_extra=cli("--judge-max-attempts", "N"),
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        description="API judges: time per attempt before it counts as a timeout and is retried (e.g. 1m, 60)",
        json_schema_extra=cli("--judge-timeout", "DURATION"),
    )
    second_pass_pause_s: float = Field(
        5.0,
        ge=0,
        description="API judges: judgments that still failed after every retry are asked once more after this "
        "long quiet at the end of judging, so a short outage costs no sample (e.g. 5s, 1m; 0 or off: at once)",
        json_schema_extra=cli("--judge-second-pass-pause", "DURATION"),
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="judge answer length (default: each task's own)",
        json_schema_extra=cli("--judge-max-tokens", "N"),
    )
    temperature: float = Field(
        0.0,
        ge=0,
        description="judge sampling temperature",
        json_schema_extra=cli("--judge-temperature", "TEMPERATURE"),
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="local judge context (default: the model's)",
        json_schema_extra=cli("--judge-max-model-len", "TOKENS"),
    )

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

    _base_url = field_validator("base_url")(_check_http_url)
    _key_env = field_validator("api_key_env")(_check_env_name)

    _timeout = _duration_setting("timeout_s", "--judge-timeout", off=False)

    _pause = _duration_setting("second_pass_pause_s", "--judge-second-pass-pause")

    @property
    def kind(self) -> Literal["local", "openai"] | None:
        if self.model is None:
            return None
        return "local" if self.model.startswith("local:") else "openai"

    @property
    def target(self) -> str:
        """The path, hub id or API model name after the kind prefix."""
        return (self.model or "").partition(":")[2]


DEFAULT_TASKS = ("ifeval",)  # a run's tasks where it names none


class RunConfig(Strict):
    model: ModelOptions = Field(default_factory=ModelOptions)
    endpoint: EndpointOptions = Field(default_factory=EndpointOptions)
    tasks: list[TaskOptions] = Field(
        default_factory=lambda: [TaskOptions(name=name) for name in DEFAULT_TASKS],
        description="comma-separated task names (default ifeval; `rayeval tasks` lists them)",
        json_schema_extra=cli("--tasks", "NAMES", group="tasks"),
    )
    limit: int | None = Field(
        None,
        ge=1,
        description="evaluate the first N questions of each task (default: all; 20 for the embedded demo model)",
        json_schema_extra=cli("--limit", "N", group="tasks"),
    )
    test_range: str | None = Field(
        None,
        description="evaluate the part of each task's dataset this Python slice selects (OpenCompass's "
        "test_range), e.g. '[:100]', '[-100:]', '[:min(100, len(index_list)//2)]'; --limit then applies to it",
        json_schema_extra=cli("--test-range", "SLICE", group="tasks"),
    )
    num_fewshot: int | None = Field(
        None,
        ge=0,
        description="few-shot examples per prompt (default: each task's own)",
        json_schema_extra=cli("--num-fewshot", "K", group="tasks"),
    )
    num_samples: int = Field(
        1,
        ge=1,
        description="samples per question: scores are mean@N; `auto` starts at 2 and adds samples where they "
        "shrink the error bar most, up to --max-samples, until --target-sem is reached",
        json_schema_extra=cli("--num-samples", "N|auto", group="tasks"),
    )
    sampling: SamplingOptions = Field(default_factory=SamplingOptions)
    report: bool = Field(
        False,
        description="write the run's report page (report/index.html in the run folder; `rayeval view` writes it "
        "later too)",
        json_schema_extra=cli("--report"),
    )
    log_to: list[str] = Field(
        default_factory=list,
        description="also log the run's settings, numbers (per task and metric; a sweep's by step) and files to "
        "an experiment tracker: mlflow[:TRACKING_URI] or wandb[:PROJECT] (optional extras; WANDB_MODE=offline "
        "needs no network); repeat for more",
        json_schema_extra=cli("--log-to", "TRACKER"),
    )
    output_layout: OutputLayout = Field(
        OutputLayout.RAYEVAL,
        description="opencompass: also write OpenCompass's folder layout (summary CSV, results and predictions "
        "in percent) under --work-dir, for tools that read OpenCompass's results (RD-Agent)",
        json_schema_extra=cli("--output-layout"),
    )
    work_dir: str | None = Field(
        None,
        min_length=1,
        description="where --output-layout opencompass writes its timestamped folder (default: the run "
        "folder's opencompass/)",
        json_schema_extra=cli("--work-dir", "DIR"),
    )
    model_abbr: str | None = Field(
        None,
        min_length=1,
        description="the model's column and folder name in the OpenCompass layout (default: the model's name)",
        json_schema_extra=cli("--model-abbr", "NAME"),
    )
    pass_k: list[int] = Field(
        default_factory=list,
        description="pass@k to report in the OpenCompass layout for this k (needs --num-samples >= k); repeat "
        "for more",
        json_schema_extra=cli("--pass-k", "K"),
    )
    cluster: ClusterOptions = Field(default_factory=ClusterOptions)
    lm_eval: LmEvalOptions = Field(default_factory=LmEvalOptions)
    judge: JudgeOptions = Field(default_factory=JudgeOptions)
    mode: RunMode = Field(
        RunMode.FULL,
        description="full: generate and judge; inference_only: generate, judge nothing; judge_only: judge the "
        "stored outputs of run_id",
        json_schema_extra=cli(
            "--mode",
            group="judge",
            consts=(
                (
                    "--inference-only",
                    RunMode.INFERENCE_ONLY.value,
                    "generate outputs and stop: judged tasks are left unjudged (judge later with --judge-only)",
                ),
                (
                    "--judge-only",
                    RunMode.JUDGE_ONLY.value,
                    "judge the stored outputs of run --run-id without generating; its config.yaml is the base config",
                ),
            ),
        ),  # fmt: skip
    )
    output_dir: str = Field(
        "runs",
        description="where run folders go: a folder, or a URI on object storage (s3://BUCKET/PREFIX, gs://...; "
        "credentials from the writing node's environment or ~/.aws, AWS_ENDPOINT_URL for an S3-compatible store)",
        json_schema_extra=cli("--output-dir", "DIR|URI", group="output"),
    )
    sync_every: int = Field(
        200,
        ge=1,
        description="with --output-dir on object storage: upload the resume journal after this many new "
        "completions (or --sync-interval, whichever comes first); a crash loses at most what came since",
        json_schema_extra=cli("--sync-every", "N", group="output"),
    )
    sync_interval_s: float = Field(
        30.0,
        gt=0,
        description="with --output-dir on object storage: upload the resume journal at least this often "
        "(e.g. 30s, 5m)",
        json_schema_extra=cli("--sync-interval", "DURATION", group="output"),
    )
    run_id: str | None = Field(
        None,
        description="run folder name; reuse it to resume (default MODEL-TIMESTAMP)",
        json_schema_extra=cli("--run-id", "ID", group="output"),
    )

    _sync_duration = _duration_setting("sync_interval_s", "--sync-interval", off=False)

    @field_validator("output_dir")
    @classmethod
    def _output_location(cls, value: str) -> str:
        from cluster.storage.location import output_location

        return output_location(value)

    @model_validator(mode="before")
    @classmethod
    def _auto_samples(cls, data: Any) -> Any:
        """`num_samples: auto` is adaptive N from ADAPTIVE_FIRST_SAMPLES per question; it needs a target."""
        if not isinstance(data, dict) or data.get("num_samples") != AUTO_SAMPLES:
            return data
        sampling = data.get("sampling")
        target = (
            sampling.get("target_sem")
            if isinstance(sampling, dict)
            else getattr(sampling, "target_sem", None)
        )
        if target is None:
            raise ValueError(
                "num_samples 'auto' (--num-samples auto) needs sampling.target_sem (--target-sem X): the SEM "
                "at which to stop adding samples, e.g. --target-sem 0.02"
            )
        return {**data, "num_samples": ADAPTIVE_FIRST_SAMPLES}

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

    _range = field_validator("test_range")(_check_test_range)

    @field_validator("log_to")
    @classmethod
    def _known_trackers(cls, values: list[str]) -> list[str]:
        from cluster.exporters.export import check_log_to

        return [check_log_to(v) for v in values]

    @field_validator("run_id")
    @classmethod
    def _folder_name(cls, value: str | None) -> str | None:
        if value is not None and (value in ("", ".", "..") or "/" in value or "\\" in value):
            raise ValueError(
                f"'{value}' is not a folder name: a run id names one folder under output_dir, so it may not be "
                "empty, '.', '..' or hold a slash; e.g. --run-id qwen-gsm8k (put folders in --output-dir)"
            )
        return value

    @model_validator(mode="after")
    def _layout_settings_with_their_layout(self) -> RunConfig:
        given = [name for name in ("work_dir", "model_abbr", "pass_k") if getattr(self, name)]
        if given and self.output_layout is not OutputLayout.OPENCOMPASS:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags} set(s) the OpenCompass layout: add --output-layout opencompass")
        if any(k < 1 for k in self.pass_k):
            raise ValueError(
                f"--pass-k {min(self.pass_k)}: k counts samples, so it is at least 1 (e.g. --pass-k 1)"
            )
        too_many = [k for k in self.pass_k if isinstance(self.num_samples, int) and k > self.num_samples]
        if too_many:
            raise ValueError(
                f"--pass-k {too_many[0]} needs at least {too_many[0]} samples a question: raise --num-samples "
                f"(now {self.num_samples}) or lower k"
            )
        return self

    @model_validator(mode="after")
    def _endpoint_only_with_openai_model(self) -> RunConfig:
        if self.model.is_endpoint:
            if not self.model.endpoint_model:
                raise ValueError(
                    f"model.path '{self.model.path}' has no model after the colon: write openai:NAME with the "
                    "name the endpoint serves (its /v1/models lists them)"
                )
            if self.model.lora is not None:
                raise ValueError(
                    "model.lora (--lora) loads an adapter into rayeval's own engines, but the model is an endpoint "
                    "(openai:NAME): serve the adapter there (rayeval serve --lora NAME=PATH) and pass its name"
                )
        elif self.endpoint.tokenizer is not None:
            raise ValueError(
                f"endpoint.tokenizer (--tokenizer {self.endpoint.tokenizer}) is for a model behind an endpoint, but "
                "model.path names no such model: rayeval's engines use the model's own tokenizer"
            )
        elif self.endpoint.base_url is not None:
            raise ValueError(
                f"endpoint.base_url (--base-url {self.endpoint.base_url}) is for a model behind an endpoint, but "
                "model.path names no such model: pass --model openai:NAME with the name the endpoint serves"
            )
        return self

    def enabled_tasks(self) -> list[TaskOptions]:
        return [t for t in self.tasks if t.enabled]


class PoolConfig(Strict):
    """`rayeval up`: a warm pool of engine replicas on a running cluster, for the runs that follow."""

    help_command: ClassVar[str] = "up"  # whose --help describes its flags (errors.format_validation_error)
    model: ModelOptions = Field(default_factory=ModelOptions)
    cluster: ClusterOptions = Field(default_factory=ClusterOptions)
    name: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="the pool's name (default: the model folder's name and its settings' key)",
        json_schema_extra=cli("--name", "NAME", group="pool"),
    )
    idle_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="stop the pool after this long with no run using it (e.g. 30m, 2h, 600)",
        json_schema_extra=cli("--idle-timeout", "DURATION", group="pool"),
    )
    lora_slots: int = Field(
        0,
        ge=0,
        le=64,
        description="serve LoRA adapters named by the runs (`rayeval run --lora`, RD-Agent's candidates), up to "
        "this many in one batch; 0: LoRA off (vLLM's enable_lora and max_loras; adapters of rank up to "
        "--max-lora-rank)",
        json_schema_extra=cli("--lora-slots", "N", group="pool"),
    )

    _duration = _duration_setting("idle_timeout_s", "--idle-timeout", off=False)

    @model_validator(mode="before")
    @classmethod
    def _running_cluster(cls, data: Any) -> Any:
        """A pool outlives the command only on a cluster that does: `local` (a cluster of the command) is none."""
        cluster = data.get("cluster") if isinstance(data, dict) else None
        if isinstance(cluster, dict) and cluster.get("address") == "local":
            raise ValueError(
                "--address local starts a cluster that stops when `rayeval up` exits, its pool with it: "
                "start one with `ray start --head` and pass --address auto (or leave --address out)"
            )
        return data

    @model_validator(mode="after")
    def _engine_model(self) -> PoolConfig:
        if self.model.is_endpoint:
            raise ValueError(
                f"model.path '{self.model.path}' is an endpoint: a warm pool holds engines of a model folder or hub id"
            )
        return self

    def run_config(self) -> RunConfig:
        """The run config of the pool's model and cluster: the replica plan and device rules read it."""
        return RunConfig(model=self.model, cluster=self.cluster)


def _set_to_other_than_default(config: BaseModel, dotted: str) -> bool:
    """Whether `section.field` holds a value other than its default (`lora: null` given is none)."""
    section_name, _, name = dotted.partition(".")
    section = getattr(config, section_name)
    default = type(section).model_fields[name].get_default(call_default_factory=True)
    return name in section.model_fields_set and getattr(section, name) != default


class ServeConfig(Strict):
    """`rayeval serve`: the model (and each replica's engine, as `rayeval run` builds it) behind an
    OpenAI-compatible API on Ray Serve."""

    help_command: ClassVar[str] = "serve"  # whose --help describes its flags (errors.format_validation_error)
    # Settings of `rayeval run` that mean nothing to a served model: adapters are served by name (--lora
    # NAME=PATH), prompts come rendered by the API's own chat template, scoring is the client's, replicas
    # are placed and restarted by Serve. No flag sets them, and a config file that does is refused.
    not_served: ClassVar[frozenset[str]] = frozenset(
        {
            "model.lora",
            "model.chat_template",
            "model.pin_engine_core",
            "model.custom_all_reduce",
            "model.think_end_token",
            "cluster.replica_restarts",
            "cluster.coordinator_node",
            "cluster.coordinator_idle_timeout_s",
            "cluster.forward_env",
            "cluster.warm_pools",
            "cluster.keep_warm_s",
            "cluster.max_in_flight",
            "cluster.placement_timeout_s",
        }
    )
    model: ModelOptions = Field(default_factory=ModelOptions)
    cluster: ClusterOptions = Field(default_factory=ClusterOptions)
    served_name: str | None = Field(
        None,
        min_length=1,
        description="the model's name in the API (`model` of each request, /v1/models) (default: the model "
        "folder's name)",
        json_schema_extra=cli("--served-model-name", "NAME", group="serve"),
    )

    @model_validator(mode="after")
    def _served_settings_only(self) -> ServeConfig:
        given = [dotted for dotted in sorted(self.not_served) if _set_to_other_than_default(self, dotted)]
        if given:
            verb = "means" if len(given) == 1 else "mean"
            raise ValueError(
                f"{', '.join(given)} {verb} nothing to a served model (adapters are served with --lora NAME=PATH; "
                "the API's chat template renders prompts; Serve places and restarts replicas): leave them out of "
                "the config for `rayeval serve`"
            )
        return self

    @field_validator("served_name")
    @classmethod
    def _one_name(cls, value: str | None) -> str | None:
        if value is not None and ":" in value:
            raise ValueError(
                "a NAME:SUFFIX is read by Ray Serve as an adapter of NAME, so requests for it would find no model: "
                "give a name without ':' (e.g. judge-v1)"
            )
        return value

    host: str = Field(
        "127.0.0.1",
        description="the address Ray Serve's HTTP proxy listens on: 127.0.0.1 keeps the API to the machine it "
        "runs on (an SSH tunnel reaches it from elsewhere); 0.0.0.0 opens it to the network, to anyone who "
        "reaches the port unless --api-key-env is given. A cluster whose Serve already runs keeps its own "
        "host: a deploy that asks for another is refused",
        json_schema_extra=cli("--host", "ADDR", group="serve"),
    )
    port: int = Field(
        8000,
        ge=1,
        le=65535,
        description="the HTTP port of Ray Serve's proxy (a cluster whose Serve already runs keeps its own; the "
        "printed URL names the port in use)",
        json_schema_extra=cli("--port", "PORT", group="serve"),
    )
    api_key_env: str | None = Field(
        None,
        description="require an API key on every request (Authorization: Bearer KEY, as OpenAI clients send "
        "it; 401 otherwise), the key read from this environment variable where `rayeval serve` runs: only its "
        "SHA-256 digest reaches the cluster. Use a long random key (e.g. `openssl rand -hex 32`) (default: no "
        "key)",
        json_schema_extra=cli("--api-key-env", "VAR", group="serve"),
    )
    app_name: str = Field(
        "rayeval",
        min_length=1,
        description="the Serve application's name, for --status and --shutdown",
        json_schema_extra=cli("--app-name", "NAME", group="serve"),
    )
    adapters: list[str] = Field(
        default_factory=list,
        description="a LoRA adapter folder (peft's save_pretrained) served beside the base model under NAME "
        "(`model` of a request): a path (at that path on every node, or staged with --lora-store) or a URI "
        "on object storage (s3://...); repeat for more",
        json_schema_extra=cli("--lora", "NAME=PATH|URI", group="serve"),
    )
    lora_store: str | None = Field(
        None,
        description="stage the local --lora adapters on object storage under this URI (s3://BUCKET/PREFIX): "
        "each replica downloads them to its own disk, for clusters whose nodes share no disk (credentials: "
        "this machine's to upload, each node's own to download)",
        json_schema_extra=cli("--lora-store", "URI", group="serve"),
    )

    _key_env = field_validator("api_key_env")(_check_env_name)

    @field_validator("lora_store")
    @classmethod
    def _store_uri(cls, value: str | None) -> str | None:
        from cluster.storage.location import RemoteFolder, is_remote

        if value is None:
            return None
        if not is_remote(value):
            raise ValueError(f"'{value}' is not a URI on object storage: give one like s3://BUCKET/adapters")
        return RemoteFolder.parse(value, "--lora-store").uri

    @field_validator("host")
    @classmethod
    def _listen_host(cls, value: str) -> str:
        check_listen_host(value)
        return value

    @property
    def lora_modules(self) -> dict[str, str]:
        """The adapters by name: {NAME: PATH}."""
        return dict(entry.split("=", 1) for entry in self.adapters)

    @field_validator("adapters")
    @classmethod
    def _adapter_entries(cls, entries: list[str]) -> list[str]:
        from cluster.storage.location import credentials_anywhere

        names = []
        for entry in entries:
            if (carried := credentials_anywhere(entry)) is not None:  # before any message quotes the entry
                raise ValueError(
                    f"an adapter's URI carries a credential ({carried}), which messages and Serve's records "
                    "would show: give it the storage's own way (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws) "
                    "and the URI without it"
                )
            name, _, path = entry.partition("=")
            if not name or not path or ":" in name:
                raise ValueError(
                    f"'{entry}' is not NAME=PATH: give each adapter as --lora NAME=PATH, NAME without ':' "
                    "(Ray Serve reads 'base:suffix' as its own cloud adapters)"
                )
            from cluster.storage.location import is_remote

            if not is_remote(path) and not Path(path).expanduser().is_dir():  # a URI is read where it is
                raise ValueError(
                    f"adapter '{name}': {path} is not a folder; give the folder peft saved it to, or its URI "
                    "on object storage (s3://...)"
                )
            names.append(name)
        if len(set(names)) < len(names):
            raise ValueError(f"adapter names repeat ({', '.join(names)}): give each adapter its own NAME")
        return entries

    @model_validator(mode="after")
    def _engine_model(self) -> ServeConfig:
        if self.model.is_endpoint:
            raise ValueError(
                f"model.path '{self.model.path}' is an endpoint already: serve a model folder or hub id"
            )
        return self
