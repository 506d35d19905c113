"""An RD-Agent-shaped benchmark round: K candidate LoRA adapters of one base model on GSM8K, through rayeval's
`run_benchmarks` (one call: one engine, the adapters served side by side by vLLM's multi-LoRA engine, or with
--lora-merge each merged into the base model and run in turn, the engine reloaded in place) against
the same through lm-eval's vLLM backend one adapter at a time (what RD-Agent's lm-eval contract runs: a new
engine per adapter), on the same machine, in paired turns.

    python bench/rdagent_round.py --out bench/results/rdagent-round-cpu.jsonl
    python bench/rdagent_round.py --out ... --candidates 4 --questions 50 --repeats 2
    python bench/rdagent_round.py --out ... --lora-merge      # rayeval merges each adapter (lora_merge=True)

Both sides: the embedded SmolLM2-135M-Instruct in the dtype rayeval resolves (bench/dtypes.py), random peft
adapters (r=8 on q_proj and v_proj, seeded per candidate), GSM8K's first N questions of ../shared/data (lm-eval's
own gsm8k task on that data, tests/lm_eval_local.py, against rayeval's gsm8k: the same "Question: ...\\nAnswer:"
prompt and stop strings), the chat template (lm-eval's --apply_chat_template), greedy, 256 tokens at most,
max_model_len 2048, max_num_seqs 64, eager, 1 GiB KV cache, max LoRA rank 8. Each side is timed as a process,
start to exit; rows record each candidate's accuracy on both sides (they should agree) and the output tokens.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.dtypes import dtype_fields  # noqa: E402
from bench.lm_eval_speed import run_lm_eval  # noqa: E402
from bench.rows import commit_of, write_row  # noqa: E402
from tests.lm_eval_local import write_local_tasks  # noqa: E402

GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
ENGINE = {
    "enforce_eager": True,
    "max_model_len": 2048,
    "max_num_seqs": 64,
    "cpu_kv_cache_gib": 1,
    "max_lora_rank": 8,
}

ROUND = """
import json, sys
from cluster.integrations.rdagent import run_benchmarks
calls, settings = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if __name__ == "__main__":
    print(json.dumps(run_benchmarks(calls, **settings)))
"""


def make_adapters(folder: Path, count: int) -> list[Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from cluster.models import ensure_default_model

    adapters = []
    for index in range(count):
        torch.manual_seed(index)
        model = AutoModelForCausalLM.from_pretrained(ensure_default_model(), dtype=torch.float32)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        peft_model = get_peft_model(model, config)
        with torch.no_grad():  # small random deltas: candidates that answer differently, not gibberish
            for name, parameter in peft_model.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(0.02)
        target = folder / f"candidate-{index}" / "adapter"
        peft_model.save_pretrained(target)
        adapters.append(target)
    return adapters


def rayeval_side(adapters: list[Path], questions: int, dtype: str, work: Path, lora_merge: bool) -> dict:
    from cluster.models import ensure_default_model

    calls = [{"workspace_path": str(work / a.parent.name), "model_path": str(a), "model_name": str(ensure_default_model()),
              "benchmark_name": "gsm8k", "gpu_count": 0, "test_range": f"[:{questions}]"} for a in adapters]  # fmt: skip
    settings = {"data_paths": {"gsm8k": str(GSM8K)},
                "config": {"model": {**ENGINE, "dtype": dtype}, "sampling": {"temperature": 0.0, "top_p": 1.0}},
                "lora_merge": lora_merge}  # fmt: skip
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", ROUND, json.dumps(calls), json.dumps(settings)], capture_output=True,
                          text=True, cwd=REPO, check=False)  # fmt: skip
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"rayeval's round failed:\n{done.stderr[-3000:]}")
    results = json.loads(done.stdout.strip().splitlines()[-1])
    tokens = 0
    for adapter in adapters:
        summary = work / adapter.parent.name / "benchmark_results" / "rayeval" / "ft-gsm8k" / "summary.json"
        tokens += json.loads(summary.read_text())["run"]["tokens"]["output_tokens"]
    return {"wall_s": round(wall, 2), "accuracy": [r["accuracy_summary"]["gsm8k"]["accuracy"] for r in results],
            "output_tokens": tokens}  # fmt: skip


def lm_eval_side(adapters: list[Path], questions: int, dtype: str, work: Path, lora_merge: bool) -> dict:
    """`lora_merge` is rayeval's setting: lm-eval serves each adapter through vLLM's LoRA layers, as RD-Agent's
    lm-eval contract runs it."""
    from transformers import AutoTokenizer

    from cluster.models import ensure_default_model

    tasks = write_local_tasks(work / "tasks", GSM8K, rows=questions)
    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    began = time.perf_counter()
    accuracy, tokens, walls = [], 0, []
    for adapter in adapters:
        engine = (
            f",enable_lora=True,max_lora_rank=8,lora_local_path={adapter},enforce_eager=True,dtype={dtype}"
        )
        row = run_lm_eval(str(ensure_default_model()), tasks, questions, 1, work, 3600, tasks=("gsm8k_local",),
                          engine_args=engine, chat=True)  # fmt: skip
        if "error" in row:
            raise SystemExit(f"lm-eval failed on {adapter}: {row['error']}\n{row.get('log_tail', '')}")
        walls.append(round(row["wall_s"], 2))
        accuracy.append(round(100 * row["results"]["gsm8k_local"]["exact_match,flexible-extract"], 2))
        tokens += sum(len(tokenizer(text).input_ids) for text in row["outputs"]["gsm8k_local"])
    return {"wall_s": round(time.perf_counter() - began, 2), "accuracy": accuracy, "output_tokens": tokens,
            "wall_per_adapter_s": walls}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1, help="paired turns, the order of the sides rotated")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--lora-merge", action="store_true", help="rayeval's side merges each adapter first")
    args = parser.parse_args()
    fields = dtype_fields(args.dtype, "cpu")
    commit = commit_of()
    with tempfile.TemporaryDirectory(prefix="rdagent-round-") as folder:
        adapters = make_adapters(Path(folder), args.candidates)
        sides = {"rayeval-run_benchmarks": rayeval_side, "lm-eval-vllm-one-at-a-time": lm_eval_side}
        names = list(sides)
        for turn in range(args.repeats):
            for name in names[turn % 2 :] + names[: turn % 2]:
                work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=folder))
                row = sides[name](adapters, args.questions, fields["dtype"], work, args.lora_merge)
                write_row(args.out, {"side": name, "turn": turn, "candidates": args.candidates,
                                     "lora_merge": args.lora_merge,
                                     "questions": args.questions, **row, **fields, "commit": commit,
                                     "date": time.strftime("%Y-%m-%d %H:%M")})  # fmt: skip


if __name__ == "__main__":
    main()
