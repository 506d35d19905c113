"""The GPU benchmark's placement of a paired configuration's sides (bench.gpu.placement), on any machine: a GPU
per side where there are enough, else the sides share, each with its part of the memory; and the GPUs a
process may hand to its children, read as CUDA reads CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest

from bench.gpu.placement import SidePlace, parse_visible_gpus, place_sides, side_env

NVIDIA_SMI_ONE = "GPU 0: NVIDIA H200 (UUID: GPU-0c1e)\n"
NVIDIA_SMI_TWO = NVIDIA_SMI_ONE + "GPU 1: NVIDIA H200 (UUID: GPU-77aa)\n"


def test_on_one_gpu_both_sides_share_it_with_half_the_memory_each():
    places = place_sides(["rayeval-1", "vllm"], ["0"], memory=0.9)
    assert places == {"rayeval-1": SidePlace("0", 0.45, True), "vllm": SidePlace("0", 0.45, True)}
    assert side_env(places["vllm"]) == {"RAYEVAL_BENCH_GPU_MEMORY": "0.45", "CUDA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize("gpus", [["0", "1"], ["2", "3", "5"], ["GPU-0c1e", "GPU-77aa"]])
def test_with_a_gpu_per_side_each_side_has_its_own_and_the_full_memory(gpus):
    places = place_sides(["rayeval-1", "vllm"], gpus, memory=0.9)
    assert places == {"rayeval-1": SidePlace(gpus[0], 0.9, False), "vllm": SidePlace(gpus[1], 0.9, False)}
    assert side_env(places["vllm"])["CUDA_VISIBLE_DEVICES"] == gpus[1]


def test_more_sides_than_gpus_share_them_in_turn():
    places = place_sides(["a", "b", "c"], ["0", "1"], memory=0.9)
    assert [(p.gpu, p.gpu_memory_utilization, p.shared) for p in places.values()] == [
        ("0", 0.45, True),
        ("1", 0.9, False),
        ("0", 0.45, True),
    ]


def test_no_gpu_is_refused():
    with pytest.raises(RuntimeError, match="no GPU is visible"):
        place_sides(["rayeval-1", "vllm"], [])


def test_the_visible_gpus_are_cuda_visible_devices_where_set_else_what_nvidia_smi_lists():
    assert parse_visible_gpus(None, NVIDIA_SMI_ONE) == ["0"]  # the one-GPU machine: no index 1
    assert parse_visible_gpus(None, NVIDIA_SMI_TWO) == ["0", "1"]
    assert parse_visible_gpus(None, "") == []
    assert parse_visible_gpus("3", NVIDIA_SMI_TWO) == ["3"]  # the process's own list wins
    assert parse_visible_gpus("2, 5", "") == ["2", "5"]
    assert parse_visible_gpus("1,-1,0", "") == ["1"]  # CUDA stops at the first invalid entry
    assert parse_visible_gpus("", NVIDIA_SMI_TWO) == []
