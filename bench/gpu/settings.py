"""What every process of the GPU benchmark shares: where it works, the environment variables that steer it
(set by the user or passed by the driver to each configuration's process), and how a configuration's process
is started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORK = Path(os.environ.get("RAYEVAL_BENCH_DIR", "/tmp/rayeval-gpu-bench"))
# RAYEVAL_BENCH_SMOKE=1: a tiny model and a few prompts on CPU, to check the script before a GPU lease.
SMOKE = os.environ.get("RAYEVAL_BENCH_SMOKE") == "1"
DEVICE = "cpu" if SMOKE else "gpu"
# Workload A generates this many times on the same engines (fresh random prompts each time, so prefix caching
# cannot help a repeat): the spread between repeats says how much of a difference between configurations is
# noise. `--repeats` sets it for the children.
A_REPEATS = int(os.environ.get("RAYEVAL_BENCH_REPEATS", "1"))
# `--budget-s`: the driver gives each configuration its share of the call's time left, as a `time.time()` the
# child reads here; a paired configuration then takes fewer than `--repeats` pairs rather than be cut off with
# none (a call's `timeout` would otherwise kill a pair half way), and the driver stops what overruns the call.
DEADLINE = float(os.environ["RAYEVAL_BENCH_DEADLINE"]) if "RAYEVAL_BENCH_DEADLINE" in os.environ else None
# Workload A's dtype on every side (`vllm.LLM`, AsyncLLM and rayeval alike), recorded in each row; workload B
# runs rayeval's `auto`, and its rows record what its engines resolved that to.
A_DTYPE = "bfloat16"
# The share of its GPU's memory one engine may take (vLLM's gpu_memory_utilization), for `vllm.LLM` and
# rayeval alike; the sides of a paired configuration that share a GPU each get their part of it through this
# variable (bench.gpu.placement).
GPU_MEMORY = float(os.environ.get("RAYEVAL_BENCH_GPU_MEMORY", "0.3" if SMOKE else "0.9"))
# Keep NVLink multicast off on shared hosts (the lent machine's rule), also in every child process.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def config_command(name: str) -> list[str]:
    """The command that runs configuration `name` in a process of its own and prints its JSON row. It finds
    this package as its parent did: through the working directory it inherits, or PYTHONPATH."""
    return [sys.executable, "-m", "bench.gpu", "--config", name]
