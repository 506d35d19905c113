"""A LoRA adapter merged into the default model's weights: the same weights as peft's own merge_and_unload,
every other file of the base model linked, and the folder made once."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.models import ensure_default_model, merged_checkpoint
from evaluators.errors import EvalInputError


def test_the_merge_equals_peft_merge_and_unload(tmp_path):
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = Path(ensure_default_model())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(tmp_path / "adapter")

    merged = merged_checkpoint(tmp_path / "adapter", base, "d1", tmp_path / "cache")
    ours = load_file(merged / "model.safetensors")
    fresh = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    theirs = PeftModel.from_pretrained(fresh, tmp_path / "adapter").merge_and_unload().state_dict()
    original = load_file(base / "model.safetensors")
    changed = [n for n in ours if not torch.equal(ours[n], original[n])]
    assert changed and all(("q_proj" in n or "down_proj" in n) for n in changed)
    for name in changed:
        expected = theirs[name].to(original[name].dtype)
        assert torch.allclose(ours[name].float(), expected.float(), atol=1e-2), name
    assert (merged / "tokenizer.json").stat().st_ino == (base / "tokenizer.json").stat().st_ino
    assert merged_checkpoint(tmp_path / "adapter", base, "d1", tmp_path / "cache") == merged  # made once


def test_an_adapter_of_another_model_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    adapter = tmp_path / "other"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 2, "peft_type": "LORA"}')
    save_file(
        {
            "base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight": torch.zeros(2, 576),
            "base_model.model.model.layers.99.self_attn.q_proj.lora_B.weight": torch.zeros(576, 2),
        },
        adapter / "adapter_model.safetensors",
    )
    with pytest.raises(EvalInputError, match="targets weights the base model"):
        merged_checkpoint(adapter, Path(ensure_default_model()), "d2", tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("SmolLM2*"))  # nothing half-made is left
