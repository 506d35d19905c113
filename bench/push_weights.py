"""Evaluation during training: a trainer's new weights onto warm replicas, three ways, on one local cluster.

    python bench/push_weights.py --out bench/results/push-weights-cpu.jsonl            # CPU, 5 steps
    python bench/push_weights.py --out ... --device gpu --model /models/random-1.1b --steps 3

A training loop (plain torch, the embedded SmolLM2-135M or --model, AdamW on four IFEval prompts) takes
--steps optimizer steps; after each one its weights reach --replicas replicas:
- `push`: `cluster.Evaluator.push_weights` (in memory), then `evaluate(step)` on the first --limit IFEval
  prompts (greedy, --max-tokens), as a training loop would; each push is made once the step before has been
  evaluated, so that it waits behind nothing, and the next step trains once it is served (with
  --train-while-pushing, at once: on a CPU the two then share the cores). Row per step: `trainer_blocked_s` (the call until it returns),
  `push_s` (the call until every replica serves the weights), `eval_s`.
- `new-engines`: the same weights (kept from the push turn) saved as a checkpoint (`save_pretrained`,
  safetensors) and new replicas started from step 1's: `save_s`, `start_s` (Ray's start included, as a
  run that starts its engines pays it) and each engine's own `engine_start_s`.
- `disk`: those replicas moved in place to each later step's saved checkpoint (`Evaluator.load_checkpoint`,
  the move `rayeval sweep` and `rayeval watch` make: vLLM's reload from the folder, with the sweep's reload
  check): `save_s`, `reload_s`, `disk_s` = their sum. Nothing is evaluated on these two sides.
Every row has the commit, the dtype, the model's size and this machine; the goal the issue sets is push_s <=
0.5 of disk_s and trainer_blocked_s < push_s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of, write_row  # noqa: E402


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--model", default=None, help="base model folder (default: the embedded SmolLM2-135M)"
    )
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", help="float32: where the sweep's checked reload passes")
    parser.add_argument(
        "--train-while-pushing",
        action="store_true",
        help="train the next step while the push loads (on CPU the two share the cores)",
    )
    parser.add_argument("--data-path", default=None, help="IFEval's prompts (a machine without its package)")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.4, help="the trainer shares the GPU"
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import cluster
    from cluster.models import ensure_default_model
    from tests.cluster.training.trainer import batches, train_step

    base = Path(args.model) if args.model else ensure_default_model()
    work = Path(tempfile.mkdtemp(prefix="push-bench-"))
    config = {
        "model": {"path": str(base), "dtype": args.dtype, "enforce_eager": args.device == "cpu",
                  "max_model_len": 2048, "gpu_memory_utilization": args.gpu_memory_utilization},
        "tasks": [{"name": "ifeval", "data_path": args.data_path}], "limit": args.limit, "sampling": {"max_tokens": args.max_tokens},
        "output_dir": str(work), "run_id": "push", "cluster": {"replicas": args.replicas, "device": args.device},
    }  # fmt: skip
    device = "cuda" if args.device == "gpu" else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    data = [{k: v.to(device) for k, v in b.items()} for b in batches(tokenizer, args.data_path)]
    common = {"commit": commit_of(), "model": base.name, "device": args.device, "replicas": args.replicas,
              "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
              "train_while_pushing": args.train_while_pushing}  # fmt: skip

    ev = cluster.Evaluator(config)
    common["dtype"] = ev.engines()[0]["dtype"]
    states, handles = [], []
    for step in range(1, args.steps + 1):
        train_step(model, optimizer, data[0])
        if device == "cuda":
            torch.cuda.synchronize()
        if handles:  # the queue empty, so that the push's time is its own, not a wait behind an evaluation
            handles[-1][1].result()
        push = ev.push_weights(step, model.state_dict())
        if not args.train_while_pushing:  # the push alone on the machine, as the disk side's moves are
            push.result()
        handles.append((push, ev.evaluate(step)))
        states.append({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
    push_rows(args, handles, common)
    ev.close()
    disk_side(args, config, base, states, work, common)
    shutil.rmtree(work, ignore_errors=True)


def push_rows(args, handles: list, common: dict) -> None:
    """A row per pushed step: how long the trainer was blocked, and the push's time from its call until every
    replica serves the weights (nothing was queued before it)."""
    for push, evaluation in handles:
        report, result = push.result(), evaluation.result()
        write_row(args.out, common | {"side": "push", "step": push.step,
                                      "trainer_blocked_s": round(push.trainer_blocked_s, 3),
                                      "push_s": round(report.serving_at - push.called_at, 3),
                                      "megabytes": round(report.megabytes, 1),
                                      "eval_s": round(result.report.finished_at - result.report.began_at, 3)})  # fmt: skip


def save(model, state: dict, base: Path, folder: Path) -> float:
    """The trainer's weights saved as a checkpoint the engines can load; the seconds it took."""
    from tests.cluster.training.trainer import save_checkpoint

    model.load_state_dict(state)
    began = time.perf_counter()
    save_checkpoint(model, base, folder)
    return time.perf_counter() - began


def disk_side(args, config: dict, base: Path, states: list[dict], work: Path, common: dict) -> None:
    """The same weights saved: new replicas started from step 1's checkpoint (`new-engines`), then moved to
    each later step's in place (`disk`) as a sweep moves them, on an evaluator of their own (a reload check
    calibrates on weights loaded from a folder, which pushed ones are not)."""
    import torch
    from transformers import AutoModelForCausalLM

    import cluster

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    first = work / "checkpoint-1"
    save_s = save(model, states[0], base, first)
    began = time.perf_counter()
    ev = cluster.Evaluator(config | {"model": config["model"] | {"path": str(first)}, "run_id": "disk"})
    engines = ev.engines()
    write_row(args.out, common | {"side": "new-engines", "step": 1, "save_s": round(save_s, 3),
                                  "start_s": round(time.perf_counter() - began, 3),
                                  "engine_start_s": [round(e["start_s"], 3) for e in engines]})  # fmt: skip
    for step, state in enumerate(states[1:], start=2):
        folder = work / f"checkpoint-{step}"
        save_s = save(model, state, base, folder)
        began = time.perf_counter()
        report = ev.load_checkpoint(step, folder).result()
        reload_s = time.perf_counter() - began
        write_row(args.out, common | {"side": "disk", "step": step, "save_s": round(save_s, 3),
                                      "reload_s": round(reload_s, 3), "disk_s": round(save_s + reload_s, 3),
                                      "loaded_by": sorted({e["loaded_by"] for e in ev.engines()}),
                                      "replicas_moved_s": round(report.serving_at - report.began_at, 3)})  # fmt: skip
    ev.close()


if __name__ == "__main__":
    main()
