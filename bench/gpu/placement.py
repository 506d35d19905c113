"""Which GPU each side of a paired configuration runs on, and how much of that GPU's memory its engine may take.

With a GPU per side, each side has its own and the engine its full share (`GPU_MEMORY`). With fewer, the sides
share the GPUs in turn (side i on GPU i mod n) and each engine on a shared GPU gets an equal part of that share.
Sides that each lay engines over every GPU (bench.gpu.layouts: 2 replicas of tensor parallel 2 against one of
4 on four GPUs) all see every GPU, with an equal part of the share each (`share_every_gpu`). Where GPUs are shared,
the sides' engines start one after the other, since vLLM sizes its KV cache from the memory it sees free
and would count another engine's allocations made during its start as its own. The turns themselves never
overlap (bench/paired.py), so the sides do not compete for the GPU while one of them is measured.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from bench.gpu.settings import GPU_MEMORY, SMOKE

SMOKE_GPU = (
    "cpu"  # RAYEVAL_BENCH_SMOKE=1: the sides' "GPU" (they run on CPU; CUDA_VISIBLE_DEVICES is not set)
)


@dataclass(frozen=True)
class SidePlace:
    gpu: str  # the side's CUDA_VISIBLE_DEVICES: one GPU or several, named as the parent's list names them
    gpu_memory_utilization: float  # of that GPU, for the side's engine
    shared: bool  # another side's engine is on the same GPU


def place_sides(roles: list[str], gpus: list[str], memory: float = GPU_MEMORY) -> dict[str, SidePlace]:
    """Each role's GPU and memory share: a GPU of its own while there are enough, else GPU i mod n."""
    if not gpus:
        raise RuntimeError("no GPU is visible to this process (CUDA_VISIBLE_DEVICES, nvidia-smi -L)")
    chosen = {role: gpus[index % len(gpus)] for index, role in enumerate(roles)}
    sharing = {gpu: sum(1 for g in chosen.values() if g == gpu) for gpu in set(chosen.values())}
    return {
        role: SidePlace(gpu, round(memory / sharing[gpu], 3), sharing[gpu] > 1)
        for role, gpu in chosen.items()
    }


def share_every_gpu(roles: list[str], gpus: list[str], memory: float = GPU_MEMORY) -> dict[str, SidePlace]:
    """Each role on every GPU with an equal part of the memory share (its engines start after the others')."""
    if not gpus:
        raise RuntimeError("no GPU is visible to this process (CUDA_VISIBLE_DEVICES, nvidia-smi -L)")
    every = ",".join(gpus)
    return {role: SidePlace(every, round(memory / len(roles), 3), len(roles) > 1) for role in roles}


def parse_visible_gpus(cuda_visible_devices: str | None, nvidia_smi_list: str) -> list[str]:
    """The GPUs a process may use, as a child's CUDA_VISIBLE_DEVICES names them: the entries of the
    process's own CUDA_VISIBLE_DEVICES where it is set (up to the first empty or negative one, where CUDA
    stops reading), else the index of every GPU `nvidia-smi -L` lists."""
    if cuda_visible_devices is not None:
        visible = []
        for entry in (e.strip() for e in cuda_visible_devices.split(",")):
            if not entry or entry.startswith("-"):
                break
            visible.append(entry)
        return visible
    listed = [line for line in nvidia_smi_list.splitlines() if line.startswith("GPU ")]
    return [str(index) for index in range(len(listed))]


def visible_gpus() -> list[str]:
    """This process's GPUs (`parse_visible_gpus`); on a smoke run, one stand-in for the CPU."""
    if SMOKE:
        return [SMOKE_GPU]
    listing = ""
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            listing = ""
    return parse_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), listing)


def side_env(place: SidePlace) -> dict[str, str]:
    """The variables a side's process gets for its place (no CUDA_VISIBLE_DEVICES on a smoke run)."""
    env = {"RAYEVAL_BENCH_GPU_MEMORY": str(place.gpu_memory_utilization)}
    if place.gpu != SMOKE_GPU:
        env["CUDA_VISIBLE_DEVICES"] = place.gpu
    return env
