"""A training run's checkpoints found on disk, and a LoRA adapter's checks before any engine starts. The good
adapter is a real one, made here with peft for the embedded default model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from cluster.models import (
    CheckpointKind,
    adapter_problem,
    find_checkpoints,
    model_module_names,
    step_of,
)
from cluster.models.default import ensure_default_model
from evaluators.errors import EvalInputError


@pytest.fixture(scope="module")
def base_model() -> Path:
    return Path(ensure_default_model())


@pytest.fixture(scope="module")
def adapter(base_model: Path, tmp_path_factory) -> Path:
    """A rank-4 LoRA adapter on q_proj and v_proj of the default model, saved by peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    folder = tmp_path_factory.mktemp("adapters") / "step_360"
    peft_model.save_pretrained(folder)
    return folder


def full_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_step_names_of_the_common_trainers():
    assert [step_of(n) for n in ("step_120", "step-120", "checkpoint-120", "global_step120")] == [120] * 4
    assert [step_of(n) for n in ("global_step_120", "iter_0000120", "ckpt120", "Checkpoint-7")] == [
        120,
        120,
        120,
        7,
    ]
    assert [step_of(n) for n in ("actor", "step_", "best", "120")] == [None] * 4


def test_checkpoints_are_found_by_their_files_and_ordered_by_step(tmp_path, adapter):
    full_model(tmp_path / "checkpoint-240")
    full_model(tmp_path / "global_step_120" / "actor" / "huggingface")  # verl's layout
    shutil.copytree(adapter, tmp_path / "step_360")
    (tmp_path / "step_480").mkdir()
    (tmp_path / "step_480" / "config.json").write_text("{}")  # still being written: no weights yet
    (tmp_path / "logs").mkdir()
    found = find_checkpoints(tmp_path)
    assert [(c.step, c.kind) for c in found] == [
        (120, CheckpointKind.FULL), (240, CheckpointKind.FULL), (360, CheckpointKind.LORA)
    ]  # fmt: skip
    assert found[0].path == tmp_path / "global_step_120" / "actor" / "huggingface"
    assert [c.step for c in find_checkpoints(tmp_path, steps=[360, 120])] == [120, 360]
    with pytest.raises(
        EvalInputError, match=r"--steps 600: no such checkpoint .* \(it has steps 120, 240, 360\)"
    ):
        find_checkpoints(tmp_path, steps=[600])


def test_a_step_twice_or_no_checkpoint_at_all_is_named(tmp_path):
    with pytest.raises(EvalInputError, match="No checkpoint under .* step_120, checkpoint-120"):
        find_checkpoints(tmp_path)
    full_model(tmp_path / "step_100")
    full_model(tmp_path / "checkpoint-100")
    with pytest.raises(EvalInputError, match="Step 100 has 2 checkpoints"):
        find_checkpoints(tmp_path)
    with pytest.raises(EvalInputError, match="does not exist"):
        find_checkpoints(tmp_path / "nothing")


def test_a_good_adapter_passes_and_each_broken_one_says_why(tmp_path, adapter, base_model):
    assert {"q_proj", "v_proj", "down_proj"} <= model_module_names(base_model)
    assert adapter_problem(adapter, base_model, max_lora_rank=16) is None

    def broken(name: str, change) -> str | None:  # noqa: ANN001 - a callable that edits the copy
        copy = shutil.copytree(adapter, tmp_path / name)
        change(copy)
        return adapter_problem(copy, base_model, max_lora_rank=16)

    def edit_config(**fields):  # noqa: ANN202 - returns the editing callable
        def change(folder: Path) -> None:
            config = json.loads((folder / "adapter_config.json").read_text())
            (folder / "adapter_config.json").write_text(json.dumps(config | fields))

        return change

    assert "is not readable JSON" in broken("json", lambda f: (f / "adapter_config.json").write_text("{r: 4"))
    assert "has no adapter_model" in broken("weights", lambda f: (f / "adapter_model.safetensors").unlink())
    assert "rank 64 is above the engine's max_lora_rank 16; raise --max-lora-rank to 64" in broken(
        "rank", edit_config(r=64)
    )
    assert "vLLM serves ranks up to 512: merge it" in broken("rank-1024", edit_config(r=1024))
    assert "holds no adapter_config.json" in broken("config", lambda f: (f / "adapter_config.json").unlink())
    assert "base_model_name_or_path is 'Qwen/Qwen2.5-7B'" in broken(
        "base", edit_config(base_model_name_or_path="Qwen/Qwen2.5-7B")
    )
    other_folder = broken("folder", edit_config(base_model_name_or_path=str(tmp_path)))
    assert (
        f"base_model_name_or_path is '{tmp_path}', a folder here other than the replicas' model"
        in other_folder
    )
    assert f"({base_model}); where both hold the same model, set it to the model's name" in other_folder
    assert "target_modules query_key_value are not modules" in broken(
        "targets", edit_config(target_modules=["query_key_value"])
    )
    assert "only LoRA adapters" in broken("ia3", edit_config(peft_type="IA3"))
    assert adapter_problem(adapter, base_model, max_lora_rank=2) is not None  # rank 4 over 2


def test_how_an_engine_moves_between_full_checkpoints(tmp_path, base_model):
    from cluster.models import SwapKind, swap_kind
    from tests.cluster.sweep.test_full_sweep import save_copy

    same = save_copy(tmp_path / "copy")
    layers = save_copy(tmp_path / "layers", perturb="layers")
    embeddings = save_copy(tmp_path / "embeddings", perturb="embeddings")
    assert swap_kind(same, same)[0] is SwapKind.NONE
    assert swap_kind(base_model, layers) == (SwapKind.RELOAD, "same architecture and tokenizer")
    assert swap_kind(layers, embeddings) == (
        SwapKind.REBUILD,
        "the tied embeddings changed (model.embed_tokens.weight)",
    )

    wider = tmp_path / "wider"
    shutil.copytree(same, wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 40, "_name_or_path": "x"}))
    assert swap_kind(same, wider) == (SwapKind.REBUILD, "config.json differs in num_hidden_layers")
    renamed = tmp_path / "renamed"
    shutil.copytree(same, renamed)
    (renamed / "config.json").write_text(json.dumps(config | {"_name_or_path": "elsewhere"}))
    assert swap_kind(same, renamed)[0] is SwapKind.RELOAD  # names and versions are not the model
    (renamed / "tokenizer.json").unlink()
    (renamed / "tokenizer.json").write_text("{}")
    assert swap_kind(same, renamed) == (SwapKind.REBUILD, "the tokenizer files differ")


def test_the_move_is_decided_on_the_tensors_in_any_format_and_naming(tmp_path):
    """.bin checkpoints and tied embeddings stored under another name: the decision reads the tensors
    themselves (where the embeddings were looked up by one name in safetensors files, two such checkpoints
    read as unchanged, and the engine kept its old output projection)."""
    from cluster.models import SwapKind, model_family, swap_kind
    from tests.cluster.sweep.test_full_sweep import save_copy

    bin_a = save_copy(tmp_path / "bin_a", "embeddings", seed=1, as_bin=True)
    bin_b = save_copy(tmp_path / "bin_b", "embeddings", seed=2, as_bin=True)
    assert not list(bin_a.glob("*.safetensors"))
    assert swap_kind(bin_a, bin_b) == (
        SwapKind.REBUILD,
        "the tied embeddings changed (model.embed_tokens.weight)",
    )
    # the same tensors in the other format read as the same: the move is a reload
    assert swap_kind(save_copy(tmp_path / "st_a", "embeddings", seed=1), bin_a)[0] is SwapKind.RELOAD

    head_a = save_copy(tmp_path / "head_a", "embeddings", seed=3, tied_as="lm_head.weight")
    head_b = save_copy(tmp_path / "head_b", "embeddings", seed=4, tied_as="lm_head.weight")
    assert swap_kind(head_a, head_b) == (SwapKind.REBUILD, "the tied embeddings changed (lm_head.weight)")
    kind, why = swap_kind(bin_b, head_a)
    assert kind is SwapKind.REBUILD and why.startswith("the checkpoints name their tensors differently")

    untied_a, untied_b = (linked(bin_a, tmp_path / "untied_a"), linked(bin_b, tmp_path / "untied_b"))
    assert swap_kind(untied_a, untied_b)[0] is SwapKind.RELOAD  # untied: reloaded like any other weight
    assert model_family(bin_a) == model_family(head_b) != model_family(untied_a)


def linked(source: Path, folder: Path) -> Path:
    """`source`'s files linked into `folder`, with config.json saying the embeddings are not tied."""
    folder.mkdir()
    for item in source.iterdir():
        if item.name != "config.json":
            (folder / item.name).hardlink_to(item)
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": False}))
    return folder


def test_a_replicas_node_uses_the_planned_adapter_at_its_path_or_its_staged_copy_and_never_other_files(
    tmp_path, monkeypatch
):
    """Looked for on the engine's node before vLLM is asked to load it: the same digest at the adapter's path,
    else in the copy the run staged in that node's cache; other files at the path are never used."""
    from cluster.models.checkpoints import (
        adapter_digest,
        adapter_files,
        adapter_folder_here,
        adapter_not_here,
        staged_adapter_dir,
    )
    from sharding.requests import Adapter

    monkeypatch.setenv("RAYEVAL_CACHE", str(tmp_path / "cache"))
    there = tmp_path / "step_480"
    there.mkdir()
    (there / "adapter_config.json").write_text('{"r": 4}')
    (there / "adapter_model.safetensors").write_bytes(b"planned weights")
    digest = hashlib.sha256(b"adapter_config.json" + b'{"r": 4}')
    digest.update(b"adapter_model.safetensors" + b"planned weights")
    planned = Adapter("step_480", str(there), digest.hexdigest()[:16])
    assert adapter_digest(adapter_files(there)) == planned.digest  # what load_adapter records
    assert adapter_folder_here(planned) == str(there)

    (there / "adapter_model.safetensors").write_bytes(b"retrained weights")  # another adapter at that path
    assert adapter_folder_here(planned) is None
    staged = staged_adapter_dir(planned)
    assert staged == tmp_path / "cache" / "adapters" / f"step_480-{planned.digest}"
    staged.mkdir(parents=True)
    (staged / "adapter_config.json").write_text('{"r": 4}')
    (staged / "adapter_model.safetensors").write_bytes(b"planned weights")
    assert adapter_folder_here(planned) == str(staged)

    assert str(adapter_not_here(planned, "10.0.0.2")) == (
        f"LoRA adapter step_480: {there} on this replica's node (10.0.0.2) is missing or holds other files than "
        "the run planned, and no copy was staged here; the run copies an adapter to its engines' nodes from "
        "where it is coordinated, which needs the folder there"
    )
