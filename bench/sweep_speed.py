"""A training run's checkpoints: one `rayeval sweep` against one `rayeval run` per checkpoint, wall time.

    python bench/sweep_speed.py --out bench/results/sweep-speed.jsonl              # both kinds
    python bench/sweep_speed.py --kinds lora --adapters 4 --out ...                   # one

Every side is a `rayeval` process as a user starts it (process start to exit, Ray start and engine start
included), on the same tasks, prompts, sampling and engine settings, each into a fresh output folder.
`lora`: K LoRA adapters of the embedded default model (peft, rank 8, random weights, fixed seeds) against K
runs with `--lora`, swept as LoRA adapters and again with `--lora-merge`. `full`: five saved copies of the default model (layers moved by 2 % noise, a different
seed each) on two replicas against five runs with `--model`. The separate runs come first, then the sweep;
rows are appended to --out with the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ["--tasks", "ifeval", "--limit", "64", "--max-tokens", "128", "--no-progress"]


def make_adapters(folder: Path, count: int) -> list[Path]:
    import torch

    from cluster.models import ensure_default_model

    try:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
    except ImportError:  # the GPU machine has no peft: write the same files peft writes
        return [
            write_adapter(folder / f"step_{(i + 1) * 100}", Path(ensure_default_model()), i)
            for i in range(count)
        ]
    paths = []
    for index in range(count):
        torch.manual_seed(index)
        model = AutoModelForCausalLM.from_pretrained(ensure_default_model(), dtype=torch.float32)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                            init_lora_weights=False)  # fmt: skip
        path = folder / f"step_{(index + 1) * 100}"
        get_peft_model(model, config).save_pretrained(path)
        paths.append(path)
    return paths


def write_adapter(path: Path, base: Path, seed: int) -> Path:
    """A rank-8 LoRA adapter on q/k/v/o of the model at `base`, random A and B (peft's names and config)."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv = hidden // heads * config.get("num_key_value_heads", heads)
    shapes = {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (hidden, hidden),
    }
    noise = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(8, fan_in, generator=noise) / fan_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, 8, generator=noise) * 0.01
    path.mkdir(parents=True)
    save_file(tensors, path / "adapter_model.safetensors")
    adapter = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
               "bias": "none", "target_modules": list(shapes), "base_model_name_or_path": str(base),
               "fan_in_fan_out": False, "modules_to_save": None}  # fmt: skip
    (path / "adapter_config.json").write_text(json.dumps(adapter))
    return path


def make_checkpoints(folder: Path, count: int) -> list[Path]:
    import torch
    from safetensors.torch import load_file, save_file

    from cluster.models import ensure_default_model

    source = Path(ensure_default_model())
    weights = load_file(source / "model.safetensors")
    paths = []
    for index in range(count):
        path = folder / f"step_{(index + 1) * 100}"
        path.mkdir(parents=True)
        for item in source.iterdir():
            if item.name != "model.safetensors":
                os.link(item, path / item.name)
        noise = torch.Generator().manual_seed(index)
        moved = {
            name: tensor + 0.02 * torch.randn(tensor.shape, generator=noise).to(tensor.dtype)
            if tensor.ndim == 2 and "embed" not in name
            else tensor
            for name, tensor in weights.items()
        }
        save_file(moved, path / "model.safetensors", metadata={"format": "pt"})
        paths.append(path)
    return paths


def timed(args: list[str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"rayeval {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - began


def measure(kind: str, count: int, replicas: int, work: Path) -> dict:
    run_dir = work / f"{kind}-run"
    out = work / f"{kind}-out"
    common = [*WORKLOAD, "--replicas", str(replicas), "--output-dir", str(out)]
    checkpoints = make_adapters(run_dir, count) if kind == "lora" else make_checkpoints(run_dir, count)
    separate = []
    for path in checkpoints:
        which = ["--lora", str(path)] if kind == "lora" else ["--model", str(path)]
        separate.append(timed(["run", *which, *common, "--run-id", f"separate-{path.name}"]))
    sweep = timed(["sweep", str(run_dir), *common, "--run-id", "sweep"])
    summary = json.loads((out / "sweep" / "sweep.json").read_text())
    merged = {}
    if kind == "lora":  # the same adapters merged into the base weights, run as full checkpoints
        merge_s = timed(["sweep", str(run_dir), *common, "--run-id", "sweep-merged", "--lora-merge"])
        merged = {
            "sweep_lora_merge_s": round(merge_s, 1),
            "ratio_lora_merge": round(merge_s / sum(separate), 3),
        }
    return {
        "kind": kind,
        "checkpoints": count,
        "replicas": replicas,
        "workload": " ".join(WORKLOAD),
        "separate_s": [round(s, 1) for s in separate],
        "separate_total_s": round(sum(separate), 1),
        "sweep_s": round(sweep, 1),
        "ratio": round(sweep / sum(separate), 3),
        "engine_starts": summary["engine_starts"],
        "loaded_by": [s["loaded_by"] for s in summary["steps"]],
        **merged,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default="lora,full", help="lora, full or both (default)")
    parser.add_argument("--adapters", type=int, default=4, help="LoRA adapters (default 4)")
    parser.add_argument("--checkpoints", type=int, default=5, help="full checkpoints (default 5)")
    parser.add_argument("--lora-replicas", type=int, default=1, help="replicas for the LoRA side (default 1)")
    parser.add_argument("--full-replicas", type=int, default=2, help="replicas for the full side (default 2)")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rayeval-sweep-bench-") as folder:
        for kind in args.kinds.split(","):
            count, replicas = (
                (args.adapters, args.lora_replicas)
                if kind == "lora"
                else (args.checkpoints, args.full_replicas)
            )
            row = measure(kind, count, replicas, Path(folder))
            row |= {"host": platform.node(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
            print(json.dumps(row), flush=True)
            with args.out.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
