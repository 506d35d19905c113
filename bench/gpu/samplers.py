"""What the driver samples while a configuration runs (it is otherwise idle, so sampling steals nothing from
the configuration): every thread's CPU time and every logical CPU's counters from /proc (`CpuSampler`), and
each GPU's utilisation, SM clock and power from nvidia-smi (`GpuSampler`). Each reports over a row's
generation window [began_at, ended_at]."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.gpu.settings import SMOKE


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
