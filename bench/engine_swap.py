"""How long an engine takes to move to another full checkpoint: a new engine against vLLM's in-place weight
reload (what `rayeval sweep` does between checkpoints that share architecture and tokenizer), and whether
the reloaded engine answers as a new one on the same checkpoint does (greedy, identical texts).

    python bench/engine_swap.py --out bench/results/engine-swap-cpu.jsonl          # the default model, CPU
    python3 bench/engine_swap.py --model /tmp/rayeval-gpu-bench/random-model --out $OUT/swap.jsonl   # GPU

The second checkpoint is the first with every 2-D weight but the embeddings moved by 2 % noise (fixed seed).
One row per step: build, generate, reload, generate, new engine on the second checkpoint, generate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import time
from pathlib import Path


def perturbed_copy(source: Path, target: Path) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    noise = torch.Generator().manual_seed(0)
    for weights in sorted(source.glob("*.safetensors")):
        tensors = load_file(weights)
        for name, tensor in tensors.items():
            if tensor.ndim == 2 and "embed" not in name and "lm_head" not in name:
                tensors[name] = tensor + 0.02 * torch.randn(tensor.shape, generator=noise).to(tensor.dtype)
        save_file(tensors, target / weights.name, metadata={"format": "pt"})
    return target


def build(model: str, device: str):  # noqa: ANN201 - vLLM's AsyncLLM
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=model, dtype="float32" if device == "cpu" else "bfloat16", max_model_len=1024,
                           enforce_eager=device == "cpu", enable_prefix_caching=True,
                           enable_chunked_prefill=False if device == "cpu" else None)  # fmt: skip
    config = args.create_engine_config(UsageContext.LLM_CLASS)
    return AsyncLLM.from_vllm_config(config, usage_context=UsageContext.LLM_CLASS)


async def generate(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:  # noqa: ANN001
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )

    async def one(index: int, prompt: list[int]) -> list[int]:
        final = None
        async for output in engine.generate(
            TokensPrompt(prompt_token_ids=prompt), params, request_id=f"{index}-{time.time()}"
        ):
            final = output
        return list(final.outputs[0].token_ids)

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def shared_prefix(a: list[list[int]], b: list[list[int]]) -> float:
    """The mean share of each output that two sides agree on before their first different token."""
    shares = []
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        shares.append(same / max(1, len(x)))
    return round(sum(shares) / len(shares), 3)


async def measure(
    model: Path, device: str, prompts: list[list[int]], max_tokens: int, noise_floor: bool = False
) -> dict:
    other = perturbed_copy(model, model.parent / f"{model.name}-perturbed")
    began = time.perf_counter()
    engine = build(str(model), device)
    row: dict = {"build_s": round(time.perf_counter() - began, 2)}
    first = await generate(engine, prompts, max_tokens)
    began = time.perf_counter()
    try:
        await engine.collective_rpc("reload_weights", kwargs={"weights_path": str(other)})
        row["reload_call"] = "reload_weights(weights_path)"
    except Exception as exc:  # noqa: BLE001 - older vLLM: point the config at the new folder, then reload
        row["reload_weights_path_error"] = f"{type(exc).__name__}: {exc}"[:300]
        await engine.collective_rpc("update_config", args=({"model_config": {"model": str(other)}},))
        await engine.collective_rpc("reload_weights")
        row["reload_call"] = "update_config + reload_weights()"
    await engine.reset_prefix_cache()
    row["reload_s"] = round(time.perf_counter() - began, 2)
    reloaded = await generate(engine, prompts, max_tokens)
    began = time.perf_counter()
    engine.shutdown()
    engine = build(str(other), device)
    row["rebuild_s"] = round(time.perf_counter() - began, 2)  # shutting the old one down included
    fresh = await generate(engine, prompts, max_tokens)
    engine.shutdown()
    if noise_floor:  # a second new engine on the same checkpoint: how often two new engines agree at all
        engine = build(str(other), device)
        again = await generate(engine, prompts, max_tokens)
        engine.shutdown()
        row["identical_new_vs_new"] = sum(a == b for a, b in zip(fresh, again, strict=True))
        row["shared_prefix_new_vs_new"] = shared_prefix(fresh, again)
    row["shared_prefix_reloaded_vs_new"] = shared_prefix(reloaded, fresh)
    row["identical_reloaded_vs_new"] = sum(a == b for a, b in zip(reloaded, fresh, strict=True))
    row["identical_first_vs_reloaded"] = sum(a == b for a, b in zip(first, reloaded, strict=True))
    row["prompts"] = len(prompts)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="a model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument(
        "--device", choices=["cpu", "gpu"], default=None, help="default: gpu where torch sees one"
    )
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the row is appended to")
    parser.add_argument("--noise-floor", action="store_true",
                        help="also a second new engine on the second checkpoint: how often two new engines agree")  # fmt: skip
    args = parser.parse_args()
    # the engine core is a subprocess; this process may have touched CUDA (torch.cuda.is_available) by then
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    import numpy as np
    import torch

    device = args.device or ("gpu" if torch.cuda.is_available() else "cpu")
    if args.model is None:
        from cluster.models import ensure_default_model

        args.model = Path(ensure_default_model())
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "rayeval-engine-swap"
    work.mkdir(exist_ok=True)
    model = work / args.model.name
    if not model.exists():
        shutil.copytree(args.model, model)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    prompts = np.random.default_rng(0).integers(100, vocab - 100, size=(args.prompts, 128)).tolist()
    row = asyncio.run(measure(model, device, prompts, args.max_tokens, args.noise_floor))
    import vllm

    row |= {"device": device, "model": args.model.name, "vllm": vllm.__version__, "host": platform.node(),
            "date": time.strftime("%Y-%m-%d"), "max_tokens": args.max_tokens}  # fmt: skip
    print(json.dumps(row))
    with args.out.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
