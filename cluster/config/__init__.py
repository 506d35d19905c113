"""The run configuration: the pydantic model every entry point fills (`options`), reading it from YAML with
flag overrides (`files`), checks of single values (`values`) and validation errors a user can act on
(`errors`). Plain Python: importing it loads pydantic and PyYAML, nothing heavier."""

from cluster.config.errors import COMMAND_LINE, format_validation_error
from cluster.config.files import build_config, dotted_settings, load_config_file
from cluster.config.options import (
    CPU_MAX_NUM_SEQS,
    DEFAULT_KEEP_WARM_S,
    DEMO_LIMIT,
    DEMO_MAX_TOKENS,
    ENDPOINT_PREFIX,
    LORA_RANKS,
    ClusterOptions,
    EndpointOptions,
    JudgeOptions,
    LmEvalOptions,
    ModelOptions,
    OutputLayout,
    PoolConfig,
    RunConfig,
    RunMode,
    SamplingOptions,
    ServeConfig,
    TaskOptions,
    setting_flags,
)
from cluster.config.values import check_ray_address, format_duration, parse_duration, parse_gen_kwargs

__all__ = [
    "COMMAND_LINE",
    "CPU_MAX_NUM_SEQS",
    "DEFAULT_KEEP_WARM_S",
    "DEMO_LIMIT",
    "DEMO_MAX_TOKENS",
    "ClusterOptions",
    "ENDPOINT_PREFIX",
    "LORA_RANKS",
    "EndpointOptions",
    "JudgeOptions",
    "LmEvalOptions",
    "ModelOptions",
    "PoolConfig",
    "RunConfig",
    "OutputLayout",
    "RunMode",
    "SamplingOptions",
    "ServeConfig",
    "TaskOptions",
    "build_config",
    "check_ray_address",
    "dotted_settings",
    "format_duration",
    "format_validation_error",
    "load_config_file",
    "parse_duration",
    "parse_gen_kwargs",
    "setting_flags",
]
