"""The KV-cache block size of a CPU engine: what the prefix cache keeps of a repeated batch, and what decoding costs.

vLLM's prefix cache keeps full blocks only. Its CPU default block is 128 tokens, longer than IFEval's prompts
with the chat template (about 70 tokens), so a warm engine prefilled a batch it had just served again.
Each turn is a fresh process with one vLLM engine built as rayeval builds CPU engines (eager, no chunked
prefill, prefix caching on, max_num_seqs 64, 0.5 GiB of KV cache, the dtype `--dtype auto` resolves to here)
at one block size; block sizes alternate over the turns. In each turn, with the embedded SmolLM2 and IFEval's
prompts in the model's chat template:

- `first_s`: IFEval's first 20 prompts, 4 tokens each (greedy): the prefill, nothing cached;
- `again_s`: the same 20 prompts again, twice: what a warm pool's second run prefills;
- `decode_s`: 20 other prompts, 512 tokens each (the end of text ignored), three times over fresh prompts:
  the decode speed at that block size.

    python bench/cpu_block_size.py --out bench/results/cpu-block-size-native-bf16.jsonl --repeats 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rows import commit_of, write_row  # noqa: E402
from bench.serve_speed import chat_messages  # noqa: E402

PROMPTS = 20


def one_turn(block_size: int) -> dict:
    """One engine at `block_size`: the timings of the module docstring, in seconds."""
    from vllm import LLM, SamplingParams

    from cluster.config import ModelOptions
    from cluster.engines import engine_dtype, engine_settings
    from cluster.models import ensure_default_model

    model = str(ensure_default_model())
    dtype = engine_dtype(engine_settings(ModelOptions(), model, "cpu"))
    llm = LLM(model, dtype=dtype, max_model_len=1024, enforce_eager=True, enable_prefix_caching=True,
              enable_chunked_prefill=False, block_size=block_size, kv_cache_memory_bytes=512 << 20,
              max_num_seqs=64)  # fmt: skip

    def timed(prompts: list[str], tokens: int) -> tuple[float, list]:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        began = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return round(time.perf_counter() - began, 3), outputs

    # the first 20, then three batches of 20 others, in the model's chat template (rendered before any timing)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
               for chat in chat_messages(PROMPTS * 4)]  # fmt: skip
    first = prompts[:PROMPTS]
    row: dict = {"dtype": dtype}
    row["first_s"], outputs = timed(first, 4)
    row["prompt_tokens"] = sum(len(output.prompt_token_ids) for output in outputs)
    row["again_s"] = [timed(first, 4)[0], timed(first, 4)[0]]
    row["decode_s"] = [timed(prompts[PROMPTS * k : PROMPTS * (k + 1)], 512)[0] for k in (1, 2, 3)]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="JSONL file the rows are appended to")
    parser.add_argument("--block-sizes", default="128,32", help="comma-separated; alternated over the turns")
    parser.add_argument("--repeats", type=int, default=2, help="turns per block size")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a turn's own process
    args = parser.parse_args()
    if args.one:
        print("ROW " + json.dumps(one_turn(args.one)), flush=True)
        return
    if args.out is None:
        parser.error("--out is required")
    sizes = [int(s) for s in args.block_sizes.split(",")]
    for turn in range(args.repeats):
        for size in sizes if turn % 2 == 0 else sizes[::-1]:
            done = subprocess.run([sys.executable, __file__, "--one", str(size)], capture_output=True, text=True,
                                  check=False, cwd=ROOT)  # fmt: skip
            rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
            if not rows:
                sys.exit(f"block size {size}: the engine's process failed:\n{done.stderr[-3000:]}")
            write_row(args.out, {"bench": "cpu-block-size", "block_size": size, "turn": turn,
                                 "prompts": PROMPTS, **json.loads(rows[0]), "commit": commit_of()})  # fmt: skip


if __name__ == "__main__":
    main()
