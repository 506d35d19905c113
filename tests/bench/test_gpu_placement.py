"""The GPU benchmark's placement of a paired configuration's sides (bench.gpu.placement), on any machine: a GPU
per side where there are enough, else the sides share, each with its part of the memory; and the GPUs a
process may hand to its children, read as CUDA reads CUDA_VISIBLE_DEVICES; sides that each lay their engines over
every GPU (bench.gpu.layouts), and the layout names those configurations take."""

from __future__ import annotations

import pytest

from bench.gpu.layouts import Layout, gpus_for, is_layout_config, scaling_sides
from bench.gpu.placement import SidePlace, parse_visible_gpus, place_sides, share_every_gpu, side_env

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


def test_layout_sides_each_see_every_gpu_with_half_the_memory():
    # layout-2x2-vs-1x4 on four GPUs: both sides on all four, started in turn (take_turns waits on equal `gpu`)
    places = share_every_gpu(["2x2", "1x4"], ["0", "1", "2", "3"], memory=0.9)
    assert places == {"2x2": SidePlace("0,1,2,3", 0.45, True), "1x4": SidePlace("0,1,2,3", 0.45, True)}
    assert side_env(places["1x4"])["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    with pytest.raises(RuntimeError, match="no GPU is visible"):
        share_every_gpu(["2x2"], [])


def test_layout_names_parse_to_replicas_and_tensor_parallel_and_route_to_their_runner():
    assert (
        Layout.parse("2x2") == Layout(2, 2) and Layout.parse("4x1").gpus == 4 and str(Layout(1, 4)) == "1x4"
    )
    for bad in ("2", "x4", "0x2", "2x-1", "ax2"):
        with pytest.raises(ValueError, match="REPLICASxTENSOR_PARALLEL"):
            Layout.parse(bad)
    routed = ("rayeval-4-vs-1", "ifeval-4-vs-1", "rayeval-2-vs-1", "layout-2x2-vs-1x4", "rayeval-turns-2x2")
    assert all(is_layout_config(name) for name in (*routed, "rayeval-1-turns"))
    assert not any(is_layout_config(name) for name in ("rayeval-1", "rayeval-tp2", "ifeval-2", "vllm-2-vs-1"))


def test_a_layout_wider_than_the_visible_gpus_is_refused_by_name(monkeypatch):
    monkeypatch.setattr("bench.gpu.layouts.visible_gpus", lambda: ["0"])
    with pytest.raises(RuntimeError, match="layout-2x2-vs-1x4 needs 4 GPUs and this machine shows 1"):
        gpus_for("layout-2x2-vs-1x4", 4)


def test_scaling_sides_are_one_replica_and_n_and_stay_apart_where_n_is_one():
    assert scaling_sides("rayeval", 4) == ("rayeval-1", "rayeval-4")
    # rayeval-1-vs-1 on a one-GPU machine: an A/A pair, two sides (one name for both lost a side's turns)
    assert scaling_sides("ifeval", 1) == ("ifeval-1", "ifeval-1-again")
