"""A LoRA adapter merged into its base model's weights (`--lora-merge`), against peft itself: the same weights as
peft's merge_and_unload, and the same greedy tokens as the adapter served unmerged by peft, for random
adapters with rank_pattern, alpha_pattern, LoRA bias (`lora_bias`) and trained base biases (`bias: all`); what
the merge does not do is refused by name, before anything is written. (vLLM serves no LoRA bias, so the
biased adapters are served by peft here; tests/cluster/sweep/test_lora_sweep.py sets merged against
vLLM-served adapters.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cluster.models import ensure_default_model, merged_checkpoint
from evaluators.errors import EvalInputError

PROMPTS = ["Write a haiku about the sea.", "List three prime numbers."]


@pytest.fixture(scope="module")
def biased_base(tmp_path_factory) -> Path:
    """The default model in float32 with random biases on its attention projections (attention_bias), a base
    whose linear layers have the biases `lora_bias` and `bias: all` change."""
    import torch
    from safetensors.torch import load_file, save_file

    source, folder = ensure_default_model(), tmp_path_factory.mktemp("biased") / "base"
    folder.mkdir()
    for item in source.iterdir():
        if item.name not in ("model.safetensors", "config.json"):
            os.link(item, folder / item.name)
    config = json.loads((source / "config.json").read_text()) | {
        "attention_bias": True,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    weights = {
        name: tensor.to(torch.float32) for name, tensor in load_file(source / "model.safetensors").items()
    }
    noise = torch.Generator().manual_seed(0)
    for name in [
        n for n in weights if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))
    ]:
        rows = weights[name].shape[0]
        weights[name.replace(".weight", ".bias")] = 0.05 * torch.randn(rows, generator=noise)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def random_adapter(base: Path, folder: Path, **options: object) -> Path:
    """A random LoRA adapter on `base` (A and B random, LoRA biases and trained base biases moved by noise)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, **options))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if name.endswith("bias"):  # LoRA biases start at zero, base biases at the base's: move both
                parameter.add_(0.05 * torch.randn_like(parameter))
    peft_model.save_pretrained(folder)
    return folder


def greedy_tokens(model: object, base: Path) -> list[list[int]]:
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out.append(model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1] :].tolist())
    return out


def test_merged_equals_peft_merged_and_served_with_patterns_and_biases(biased_base, tmp_path):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter = random_adapter(
        biased_base, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
        rank_pattern={"v_proj": 2, "layers.1.self_attn.q_proj": 6}, alpha_pattern={"o_proj": 3, "q_proj": 16},
        lora_bias=True, bias="all",
    )  # fmt: skip
    merged = merged_checkpoint(adapter, biased_base, "d1", tmp_path / "cache")
    ours = load_file(merged / "model.safetensors")
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(biased_base, dtype=torch.float32), adapter
    )
    served = greedy_tokens(peft_model, biased_base)  # the adapter unmerged, as peft serves it
    theirs = peft_model.merge_and_unload().state_dict()
    original = load_file(biased_base / "model.safetensors")
    changed = {n for n in ours if not torch.equal(ours[n], original[n])}
    assert any(n.endswith("q_proj.bias") for n in changed) and any(n.endswith("k_proj.bias") for n in changed)
    assert {n for n in theirs if n in original and not torch.equal(theirs[n], original[n])} == changed
    for name in changed:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name
    merged_model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    assert greedy_tokens(merged_model, biased_base) == served
    assert merged_checkpoint(adapter, biased_base, "d1", tmp_path / "cache") == merged  # made once


def test_the_merge_equals_peft_merge_and_unload_on_the_default_model(tmp_path):
    """The default model's weights are bfloat16: the merged tensors are kept in float32."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = Path(ensure_default_model())
    adapter = random_adapter(base, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"],
                             use_rslora=True)  # fmt: skip
    merged = merged_checkpoint(adapter, base, "d1", tmp_path / "cache")
    ours = load_file(merged / "model.safetensors")
    fresh = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    theirs = PeftModel.from_pretrained(fresh, adapter).merge_and_unload().state_dict()
    original = load_file(base / "model.safetensors")
    changed = [n for n in ours if ours[n].dtype == torch.float32]
    assert changed and all(("q_proj" in n or "down_proj" in n) for n in changed)
    for name in changed:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name
    assert all(torch.equal(ours[n], original[n]) for n in ours if n not in changed)
    assert (merged / "tokenizer.json").stat().st_ino == (base / "tokenizer.json").stat().st_ino


def test_modules_trained_whole_replace_the_base_modules_as_peft_merges_them(biased_base, tmp_path):
    """modules_to_save (`norm`) beside LoRA on q_proj: merged equals peft's merge_and_unload, and answers as
    peft serves the adapter. Which modules `norm` names is peft's rule and changed between its releases (a
    plain suffix took every `*_layernorm` too; later ones match at a dot, `model.norm` only): the merge follows
    the tensors peft saved, so the modules expected are the ones this peft wrapped."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_pretrained(biased_base, dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["norm"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    wrapped = {
        name.removeprefix("base_model.model.") + ".weight"
        for name, module in peft_model.named_modules()
        if type(module).__name__ == "ModulesToSaveWrapper"
    }
    assert "model.norm.weight" in wrapped
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "modules_to_save" in name:
                parameter.mul_(1 + 0.2 * torch.randn_like(parameter))
    adapter = tmp_path / "saved"
    peft_model.save_pretrained(adapter)
    merged = merged_checkpoint(adapter, biased_base, "m1", tmp_path / "cache")
    ours = load_file(merged / "model.safetensors")
    served = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(biased_base, dtype=torch.float32), adapter
    )
    tokens = greedy_tokens(served, biased_base)
    theirs = served.merge_and_unload().state_dict()
    original = load_file(biased_base / "model.safetensors")
    changed = {n for n in ours if not torch.equal(ours[n], original[n])}
    assert {n for n in changed if "norm" in n} == wrapped
    assert {n for n in changed if "norm" not in n} == {n for n in original if n.endswith("q_proj.weight")}
    for name in changed:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name
    assert (
        greedy_tokens(AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32), biased_base)
        == tokens
    )


def test_what_the_merge_does_not_do_is_refused_by_name(tmp_path):
    import torch
    from safetensors.torch import save_file

    base, cache = Path(ensure_default_model()), tmp_path / "cache"

    def adapter(name: str, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(
            json.dumps({"r": 2, "lora_alpha": 2, "peft_type": "LORA"} | config)
        )
        save_file(tensors, folder / "adapter_model.safetensors")
        return folder

    q = "base_model.model.model.layers.0.self_attn.q_proj"
    pair = {f"{q}.lora_A.weight": torch.ones(2, 576), f"{q}.lora_B.weight": torch.ones(576, 2)}
    cases = {
        "dora": ({"use_dora": True}, pair, "DoRA (use_dora)"),
        "saved": ({"modules_to_save": ["lm_head"]}, {"base_model.model.lm_head.weight": torch.ones(49152, 576)},
                  "a model with tied embeddings stores no output projection of its own"),
        "pissa": ({"init_lora_weights": "pissa_niter_4"}, pair, "initialised with pissa_niter_4"),
        "rank": ({"rank_pattern": {"q_proj": 8}}, pair, "have rank 2, but adapter_config.json gives it rank 8"),
        "tied": ({}, {"base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(2, 49152),
                      "base_model.model.model.embed_tokens.lora_embedding_B": torch.ones(576, 2)},
                 "changes model.embed_tokens.weight, one side of the base model's tied embeddings"),
        "other": ({}, {f"{q}.lora_magnitude_vector": torch.ones(576)}, "is not a LoRA A/B matrix"),
        "layers": ({}, {k.replace("layers.0", "layers.99"): v for k, v in pair.items()}, "lacks"),
    }  # fmt: skip
    for name, (config, tensors, message) in cases.items():
        with pytest.raises(EvalInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            merged_checkpoint(adapter(name, config, tensors), base, name, cache)
    assert not list(cache.glob("SmolLM2*"))  # nothing half-made is left
