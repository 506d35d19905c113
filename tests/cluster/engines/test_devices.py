"""Whether this machine has a GPU, told without importing torch: a CPU build of torch, or NVML's count."""

from __future__ import annotations

import sys

import pytest


def test_a_cpu_build_of_torch_sees_no_gpu_without_being_imported():
    from importlib.metadata import version

    from cluster.engines.devices import local_gpus_visible

    if not version("torch").endswith("+cpu"):
        pytest.skip("torch here is not a CPU build")
    assert local_gpus_visible() is False


def test_a_gpu_machine_counts_its_gpus_through_nvml_without_importing_torch(monkeypatch):
    """A stand-in NVML and device files (this machine has no GPU): NVML's count decides, torch is not asked."""
    import importlib.metadata
    import types

    import cluster.engines.devices as devices

    calls = []
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlShutdown=lambda: calls.append("shutdown"),
    )
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.11.0+cu130")
    monkeypatch.setattr(devices, "gpu_device_files", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch would now fail
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices.local_gpus_visible() is True and calls == ["init", "shutdown"]
    nvml.nvmlDeviceGetCount = lambda: 0
    assert devices.local_gpus_visible() is False
