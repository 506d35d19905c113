"""The command line (`main`) and the driver: it runs each configuration of a workload in a child process
(`--config NAME`, bench.gpu.configurations), one after the other, samples CPU and GPU use while each runs
(bench.gpu.samplers), shares the call's `--budget-s` among them and stops one that overruns it, and writes
every row, the ratios between rows and the host probe to $OUT/<workload>.json, every process's output to
$OUT/<workload>.log and the machine's description to $OUT/machine.txt."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import TextIO

import bench.gpu
from bench.gpu.configurations import CONFIGS, run_config
from bench.gpu.rows import result_row
from bench.gpu.samplers import CpuSampler, GpuSampler
from bench.gpu.settings import A_REPEATS, ROOT, SAFE_ENV, config_command
from bench.gpu.workloads import RANDOM_MODEL


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
    from bench.host_probe import host_probe

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
    row = (result_row(stdout) if returncode == 0 else None) or {"config": name, "error": stderr[-1500:]}
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
        child = subprocess.Popen(config_command(name), env=env, stdout=stdout, stderr=stderr)
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
        # every paired row's median ratio by its configuration's name (bench.gpu.layouts' among them)
        **{
            f"paired_{row['config']}_median": value["median"]
            for row in rows
            for key, value in row.items()
            if "_over_" in key and isinstance(value, dict) and "median" in value
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu",
        description=bench.gpu.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        from cluster.cli.app import configure_logging

        configure_logging(False)  # engine start times and the runner's request counts go to the log
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
