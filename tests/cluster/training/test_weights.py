"""What a push is checked against and how its tensors travel, without an engine: the base checkpoint's
names and shapes (`ModelTensors`), the packed buffer the engines' workers unpack, and the folder check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cluster.engines.pushed_weights import ALIGN, map_staged, pack, raw_tensor, stage_blobs, unpack, unstage
from cluster.models import ensure_default_model
from cluster.training.evaluator import _check_folder, _chunks
from cluster.training.weights import ModelTensors
from evaluators.errors import EvalInputError


@pytest.fixture(scope="module")
def tensors() -> ModelTensors:
    return ModelTensors.of_checkpoint(ensure_default_model())


@pytest.fixture(scope="module")
def state(tensors) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(ensure_default_model() / "model.safetensors"))


def test_the_checkpoints_tensors_are_read_from_its_headers_with_the_tied_output_optional(tensors, state):
    assert {n: tuple(t.shape) for n, t in state.items()} == {
        n: s for n, s in tensors.shapes.items() if n not in tensors.optional
    }
    assert tensors.optional == {"lm_head.weight"}  # tie_word_embeddings: the embeddings again
    assert tensors.shapes["lm_head.weight"] == tensors.shapes["model.embed_tokens.weight"]


def test_a_whole_state_dict_passes_with_or_without_the_tied_output(tensors, state):
    tensors.check(state)
    tensors.check({**state, "lm_head.weight": state["model.embed_tokens.weight"]})
    tensors.check({"model.norm.weight": state["model.norm.weight"]}, partial=True)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda s: {f"_orig_mod.{n}": t for n, t in s.items()},
            "without the wrapper's prefix '_orig_mod.' it is",
        ),
        (lambda s: {**s, "model.layers.99.mlp.up_proj.weight": torch.zeros(1)}, "its names look like"),
        (lambda s: {**s, "model.norm.weight": torch.zeros(5)}, "'model.norm.weight' has shape [5]"),
        (lambda s: {**s, "model.norm.weight": [0.0] * 576}, "is a list, not a torch tensor"),
        (lambda s: {n: t for n, t in s.items() if n != "model.norm.weight"}, "first 'model.norm.weight'"),
    ],
)
def test_a_bad_push_is_refused_naming_the_first_problem(tensors, state, change, expected):
    with pytest.raises(EvalInputError, match="push_weights") as refused:
        tensors.check(change(state))
    assert expected in str(refused.value)


def test_packed_tensors_come_back_equal_in_every_dtype_and_aligned():
    originals = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "ints": torch.arange(11, dtype=torch.int64).reshape(11, 1),
    }
    blob = pack(raw_tensor(n, t) for n, t in originals.items())
    back = dict(unpack(blob))
    assert list(back) == list(originals)
    for name, tensor in originals.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
        if tensor.numel():  # an empty tensor has no data (its pointer is 0)
            assert (
                back[name].data_ptr() % ALIGN == torch.frombuffer(blob, dtype=torch.uint8).data_ptr() % ALIGN
            )


def test_staged_buffers_map_back_to_the_same_tensors_and_are_removed_after(tmp_path: Path):
    originals = {"a": torch.randn(4, 3), "b": torch.arange(5, dtype=torch.int32)}
    blobs = [pack([raw_tensor(n, t)]) for n, t in originals.items()]
    paths = stage_blobs(blobs, str(tmp_path))
    assert paths is not None and [Path(p).read_bytes() for p in paths] == [b.tobytes() for b in blobs]
    back = dict(pair for mapped in map_staged(paths) for pair in unpack(mapped))
    assert all(torch.equal(back[n], t) for n, t in originals.items())
    unstage(paths)
    assert list(tmp_path.iterdir()) == []
    # no shared-memory folder on the node: the push travels in the engine's message instead
    assert stage_blobs(blobs, str(tmp_path / "missing")) is None


def test_a_raw_tensor_narrows_to_the_engines_dtype_where_it_lies_and_never_widens():
    wide, narrow, ints = torch.randn(6), torch.randn(4).to(torch.bfloat16), torch.arange(3)
    ((_, back),) = unpack(pack([raw_tensor("w", wide, "bfloat16")]))
    assert back.dtype == torch.bfloat16 and torch.equal(back, wide.to(torch.bfloat16))
    assert raw_tensor("n", narrow, "float32").dtype == "bfloat16"
    assert raw_tensor("i", ints, "bfloat16").dtype == "int64"
    assert raw_tensor("w", wide).dtype == "float32"  # the engines' dtype not known yet: as it is


def test_a_raw_tensor_of_a_non_contiguous_tensor_holds_its_values_in_order():
    tensor = torch.arange(12.0).reshape(3, 4).t()
    ((name, back),) = unpack(pack([raw_tensor("t", tensor)]))
    assert name == "t" and torch.equal(back, tensor)


def test_tensors_are_grouped_up_to_the_chunk_size(monkeypatch):
    import cluster.training.evaluator as evaluator

    monkeypatch.setattr(evaluator, "CHUNK_BYTES", 100)
    raws = [
        raw_tensor(str(i), torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate([60, 30, 20, 150, 10])
    ]
    assert [[r.name for r in group] for group in _chunks(raws)] == [["0", "1"], ["2"], ["3"], ["4"]]


def test_a_folder_with_finished_steps_needs_resume(tmp_path: Path):
    (tmp_path / "step_2").mkdir()
    (tmp_path / "step_2" / "summary.json").write_text(json.dumps({"tasks": {}}))
    with pytest.raises(EvalInputError, match=r"finished steps \[2\]: pass resume=True"):
        _check_folder(tmp_path, resume=False)
    _check_folder(tmp_path, resume=True)
    _check_folder(tmp_path / "new", resume=False)


def test_floating_tensors_go_in_the_engines_dtype_as_the_engine_would_round_them():
    from cluster.engines.pushed_weights import in_dtype

    originals = {"w": torch.randn(4, 3), "ids": torch.arange(5), "b": torch.randn(2).to(torch.bfloat16)}
    raws = in_dtype([raw_tensor(n, t) for n, t in originals.items()], "bfloat16")
    back = dict(unpack(pack(raws)))
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], originals["w"].to(torch.bfloat16))
    assert back["ids"].dtype == torch.int64 and torch.equal(back["ids"], originals["ids"])
    assert torch.equal(back["b"], originals["b"])
    assert in_dtype(raws, None) == raws


def test_an_evaluator_over_ray_client_is_refused_before_it_connects(tmp_path):
    """Its coordinator is placed on the trainer's node and watches the trainer's pid there: through a Ray
    client the trainer is on no node of the cluster. Refused before any connection (nothing listens there)."""
    import cluster

    config = {"cluster": {"address": "ray://127.0.0.1:9"}, "output_dir": str(tmp_path), "tasks": ["ifeval"]}
    with pytest.raises(
        EvalInputError, match=r"cluster.address ray://127.0.0.1:9: the Evaluator runs in the trainer"
    ):
        cluster.Evaluator(config)
