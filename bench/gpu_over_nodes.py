"""One model over two Ray nodes against the same model on one node, on the lent 2-GPU machine.

Two layouts of one tensor-parallel-2 replica of the random 1.1B Llama (bench/gpu/workloads.py), each in its
own Ray cluster on this host and its own process:

- `over-nodes`: a CPU-only head and two worker raylets with one GPU each (each raylet sees only its own GPU
  through CUDA_VISIBLE_DEVICES). No node holds 2 GPUs, so rayeval places the replica as two {GPU: 1} bundles
  over the two nodes and runs vLLM's Ray executor on them.
- `one-node`: one raylet with both GPUs: one {GPU: 2} bundle and vLLM's mp executor (rayeval's default).

Both go through rayeval's real request runner (cluster.run.RequestRunner: placement, engine actors,
dispatcher). Each side generates the same 200 random-token prompts greedily (256 tokens in, 256 out,
`ignore_eos`) for the agreement check, then `--repeats` passes of 1,024 fresh prompts for throughput.

    python3 bench/gpu_over_nodes.py --out $OUT     # both sides, then $OUT/over-nodes.json with the comparison
    python3 bench/gpu_over_nodes.py --out $OUT --sides one-node-nccl,over-nodes --batch-invariant
                                                   # vLLM's batch-invariant mode on both: the layout alone
    RAYEVAL_BENCH_SMOKE=1 python3 bench/gpu_over_nodes.py --out /tmp/o   # CPU plumbing check: TP=1, no GPUs

A row per side (engine start, generation seconds, tokens/s per pass, the executor and the nodes each bundle
went to) and the agreement (identical texts out of 200) go to $OUT/over-nodes.json; bench/results/ keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu.settings import SAFE_ENV, SMOKE  # noqa: E402

AGREEMENT_PROMPTS = 8 if SMOKE else 200
THROUGHPUT_PROMPTS = 8 if SMOKE else 1024
# one-node-nccl: the one-node replica with vLLM's custom all-reduce off, so both layouts reduce through NCCL and
# what differs is the layout alone (over nodes, custom all-reduce is off by necessity).
SIDES = ("over-nodes", "one-node", "one-node-nccl")


@contextmanager
def _node_env(gpus: str, host_ip: str):
    """The environment a raylet started in this process (ray.cluster_utils) reads and hands its workers:
    CUDA_VISIBLE_DEVICES, so each worker raylet has its own GPU, and VLLM_HOST_IP, so vLLM's Ray executor,
    which wants one IP per node, sees the raylets sharing this host as distinct (127.0.0.x are all this host)."""
    before = {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "VLLM_HOST_IP")}
    os.environ.update(CUDA_VISIBLE_DEVICES=gpus, VLLM_HOST_IP=host_ip)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _cluster(side: str):
    from ray.cluster_utils import Cluster

    cpus = 4
    if SMOKE:  # no GPUs: two CPU workers, and a TP=1 replica on one of them
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(2 if side == "over-nodes" else 1):
            cluster.add_node(num_cpus=2)
        return cluster
    if side.startswith("one-node"):
        with _node_env("0,1", "127.0.0.1"):
            return Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "num_gpus": 2})
    with _node_env("", "127.0.0.1"):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "num_gpus": 0})
    for gpu in (0, 1):
        with _node_env(str(gpu), f"127.0.0.{gpu + 2}"):
            cluster.add_node(num_cpus=cpus, num_gpus=1)
    return cluster


def run_side(side: str) -> dict:
    """One layout, in this process: its cluster, one TP=2 replica through rayeval's runner, every pass."""
    import ray

    from bench.gpu.workloads import rayeval_a_plan, rayeval_a_requests
    from cluster.run import RequestRunner

    os.environ.update(SAFE_ENV)
    os.environ.setdefault(
        "RAY_AUTH_MODE", "disabled"
    )  # token auth is tested on CPU; here it is one more part
    cluster = _cluster(side)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n.get("Alive")}
    plan = rayeval_a_plan(replicas=1, tp=1 if SMOKE else 2)
    if side == "one-node-nccl":
        plan.config.model.custom_all_reduce = False
    runner = RequestRunner(plan, None, progress=False)
    passes = []
    try:
        for index in range(1 + int(os.environ.get("RAYEVAL_BENCH_REPEATS", "3"))):
            requests = rayeval_a_requests(runner.model_path, repeat=index)
            requests = requests[: AGREEMENT_PROMPTS if index == 0 else THROUGHPUT_PROMPTS]
            before = runner.stats.generation_s
            results = runner.run(requests, label=side)
            seconds = runner.stats.generation_s - before
            tokens = sum(c.output_tokens for c in results.values())
            failed = [c.error for c in results.values() if not c.ok]
            passes.append({"requests": len(results), "seconds": round(seconds, 3), "tokens": tokens,
                           "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
                           "failed": len(failed), "first_error": failed[0] if failed else None})  # fmt: skip
            if index == 0:
                texts = {r.request_id: results[r.request_id].text for r in requests}
    finally:
        runner.close()
        ray.shutdown()
        cluster.shutdown()
    engine = runner.stats.engines[0]
    return {
        "side": side,
        "nodes": {
            node[:8]: {k: v for k, v in res.items() if k in ("CPU", "GPU")} for node, res in nodes.items()
        },
        "executor": engine.executor,
        "bundle_nodes": [n[:8] for n in engine.nodes],
        "engine_start_s": round(engine.start_s, 1),
        "vllm_version": engine.vllm_version,
        "agreement_pass": passes[0],
        "throughput_passes": passes[1:],
        "texts": texts,
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _agreement(texts: dict[str, str], reference: dict[str, str]) -> dict:
    """Identical texts, and how far into each text the two agree (characters of common prefix, as a share)."""
    same = sum(texts.get(rid) == text for rid, text in reference.items())
    shares = []
    for rid, text in reference.items():
        other = texts.get(rid, "")
        prefix = next(
            (i for i, (a, b) in enumerate(zip(text, other, strict=False)) if a != b),
            min(len(text), len(other)),
        )
        shares.append(prefix / max(len(text), len(other), 1))
    return {"identical": same, "prompts": len(reference), "share": round(same / len(reference), 4),
            "mean_common_prefix": round(sum(shares) / len(shares), 4)}  # fmt: skip


def compare(rows: dict[str, dict]) -> dict:
    rates = {side: [p["tokens_per_s"] for p in row["throughput_passes"] if p["tokens_per_s"]]
             for side, row in rows.items()}  # fmt: skip
    medians = {side: _median(values) for side, values in rates.items() if values}
    result: dict = {"tokens_per_s": rates, "median_tokens_per_s": medians}
    if "over-nodes" in rows:
        result["agreement_of_over_nodes_with"] = {
            side: _agreement(rows["over-nodes"]["texts"], row["texts"])
            for side, row in rows.items()
            if side != "over-nodes"
        }
    if "one-node" in rows and "one-node-nccl" in rows:
        result["agreement_of_one_node_with_one_node_nccl"] = _agreement(
            rows["one-node"]["texts"], rows["one-node-nccl"]["texts"]
        )
    if "over-nodes" in medians and "one-node" in medians:
        result["over_nodes_over_one_node"] = round(medians["over-nodes"] / medians["one-node"], 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for the rows, over-nodes.json and logs"
    )
    parser.add_argument(
        "--sides", default=",".join(SIDES), help=f"comma-separated, in order (default {','.join(SIDES)})"
    )
    parser.add_argument("--side", choices=SIDES, help="run one side in this process (what the driver calls)")
    parser.add_argument("--repeats", type=int, default=3, help="throughput passes per side (default 3)")
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="VLLM_BATCH_INVARIANT=1 on every side: "
        "batch-invariant kernels and deterministic NCCL settings, so greedy texts differ only by layout",
    )
    parser.add_argument(
        "--compare", nargs="+", type=Path, metavar="ROW_JSON", help="compare saved side rows only"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.side:
        print("ROW " + json.dumps(run_side(args.side)), flush=True)
        return 0
    if args.compare:
        rows = {row["side"]: row for row in (json.loads(path.read_text()) for path in args.compare)}
    else:
        rows = _run_sides(args.sides.split(","), args.repeats, args.out, args.batch_invariant)
    summary = {"rows": {s: {k: v for k, v in r.items() if k != "texts"} for s, r in rows.items()},
               "comparison": compare(rows), "date": time.strftime("%Y-%m-%d"), "smoke": SMOKE,
               "batch_invariant": args.batch_invariant}  # fmt: skip
    (args.out / "over-nodes.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["comparison"]), flush=True)
    return 0


def _run_sides(sides: list[str], repeats: int, out: Path, batch_invariant: bool) -> dict[str, dict]:
    """Each side in a process of its own; its row (texts included) also goes to OUT/<side>.row.json."""
    rows: dict[str, dict] = {}
    # RAY_AUTH_MODE: Ray reads it on import; token auth is tested on CPU, here it would be one more part
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAYEVAL_BENCH_REPEATS=str(repeats), PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))  # fmt: skip
    if batch_invariant:  # the raylets a side starts inherit it, and with them every engine worker
        env["VLLM_BATCH_INVARIANT"] = "1"
    for side in sides:
        began = time.perf_counter()
        with open(out / f"{side}.log", "w") as log:
            done = subprocess.run([sys.executable, __file__, "--side", side, "--out", str(out)],
                                  stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)  # fmt: skip
            log.write(done.stdout)
        found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        if not found:
            print(f"{side}: no row (exit {done.returncode}); see {out / f'{side}.log'}", flush=True)
            continue
        rows[side] = json.loads(found[-1]) | {"process_wall_s": round(time.perf_counter() - began, 1)}
        (out / f"{side}.row.json").write_text(json.dumps(rows[side]))
        print(side, {k: v for k, v in rows[side].items() if k != "texts"}, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
