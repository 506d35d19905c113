"""Does this host slow two replicas' engine cores when both run? (issue 5, round 6)

vLLM's engine core is a Python loop that launches the model's CUDA graphs and waits for each step's sampled
tokens; on small models it, not the GPU, sets the pace. Round 6 saw each of two replicas take 52 % longer per
wave than one replica alone on the same lease, both engine cores at a full core, on code that scaled 2.08x
on another lease. This probe measures the two things such replicas share below vLLM, without vLLM or rayeval:

- `cpu`: a fixed stretch of pure-Python dict work on each replica's engine-core vCPUs (where rayeval pins them);
- `gpu`: a loop of tiny kernel launches, each followed by a host sync, one GPU per process (the GPU driver,
  the PCIe path, the launch latency).

Two child processes, started once, take turns by the wall clock: in every round child 0 works alone, then
child 1 alone, then both at once, so alone and together are measured seconds apart (on one lease a vCPU's
speed drifted up to 2x from one run to the next, docs/BENCHMARKS.md round 6). `slowdown_pct` compares the
medians of together and alone; `late_slots` counts slots a child entered late (work longer than a slot).

    python3 bench/host_probe.py            # both probes where there are 2 GPUs, else the CPU probe; JSON out
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# argv: cpus (comma-separated), child index (= GPU index), first slot's wall-clock time, slot seconds, rounds,
# kind ("cpu" or "gpu"). Prints {"alone": [s, ...], "together": [s, ...], "late_slots": n}.
CHILD = """
import json, os, sys, time
cpus, index, start_at, slot_s, rounds, kind = sys.argv[1:7]
os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
index, start_at, slot_s, rounds = int(index), float(start_at), float(slot_s), int(rounds)
if kind == "gpu":
    import torch
    torch.cuda.set_device(index)
    x = torch.zeros(256, device="cuda")
    def work():
        for _ in range(6000):
            x.add_(1)
            x.sum().item()
else:
    def work():
        table = {}
        for i in range(2_000_000):
            table[i & 1023] = table.get((i * 7) & 1023, 0) + i
work()
times, late = {"alone": [], "together": []}, 0
for r in range(rounds):
    for slot, who in enumerate(("0", "1", "both")):
        if who not in (str(index), "both"):
            continue
        at = start_at + (3 * r + slot) * slot_s
        if time.time() > at + 0.02:
            late += 1
        while time.time() < at:
            time.sleep(0.0005)
        began = time.perf_counter()
        work()
        times["alone" if who != "both" else "together"].append(round(time.perf_counter() - began, 4))
print(json.dumps({**times, "late_slots": late}))
"""


def probe(
    kind: str, cpu_sets: list[list[int]], rounds: int = 4, slot_s: float = 1.0, lead_s: float = 1.0
) -> dict:
    """`kind` ("cpu" or "gpu") on two children pinned to `cpu_sets`; see the module's docstring."""
    start_at = f"{time.time() + lead_s:.3f}"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                ",".join(map(str, cpus)),
                str(index),
                start_at,
                str(slot_s),
                str(rounds),
                kind,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for index, cpus in enumerate(cpu_sets)
    ]
    results = []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            return {"error": err[-500:]}
        results.append(json.loads(out))
    alone = [t for result in results for t in result["alone"]]
    together = [t for result in results for t in result["together"]]

    def spread(times: list[float]) -> list[float]:
        return [min(times), round(statistics.median(times), 4), max(times)]

    return {
        "alone_s": [result["alone"] for result in results],
        "together_s": [result["together"] for result in results],
        "alone_min_median_max_s": spread(alone),
        "together_min_median_max_s": spread(together),
        "slowdown_pct": round(100 * (statistics.median(together) / statistics.median(alone) - 1), 1),
        "late_slots": sum(result["late_slots"] for result in results),
    }


def gpu_count() -> int:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines()) if done.returncode == 0 else 0


def host_probe() -> dict:
    """The CPU probe on the vCPUs rayeval gives two replicas' engine cores, and the GPU probe where the host
    has two GPUs (about 10 s and 20 s); empty where there are too few vCPUs for two engine cores."""
    from cluster.engines import engine_core_cpus

    allowed = sorted(os.sched_getaffinity(0))
    cpu_sets = [engine_core_cpus(index, 2, allowed) for index in range(2)]
    if not all(cpu_sets):
        return {}
    found: dict = {"engine_core_cpus": cpu_sets, "cpu": probe("cpu", cpu_sets)}
    if gpu_count() >= 2:
        found["gpu"] = probe("gpu", cpu_sets, lead_s=15.0)  # importing torch and starting CUDA come first
    return found


if __name__ == "__main__":
    print(json.dumps(host_probe()))
