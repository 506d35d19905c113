"""Models: where `--model` resolves to, the checks made before any engine starts, and prompt rendering with
the embedded default model's own tokenizer and chat template (real files, no engine)."""

from __future__ import annotations

import json

import pytest

from cluster.models import (
    DEFAULT_MODEL_NAME,
    PromptRenderer,
    ResolvedModel,
    check_context_length,
    check_model_folder,
    ensure_default_model,
    resolve_model,
)
from evaluators.errors import EvalInputError
from evaluators.tasks.base import ChatMessage, Prompt


def test_no_model_means_the_embedded_default():
    model = resolve_model(None, materialise=False)
    assert model.is_default and model.name == DEFAULT_MODEL_NAME and model.path.endswith(DEFAULT_MODEL_NAME)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, "has no config.json"),
        ({"config.json": "{not json"}, "is not valid JSON (line 1"),
        ({"config.json": "[1, 2]"}, "holds a JSON list, not an object"),
        ({"config.json": "{}"}, "no weights (*.safetensors, *.bin) files"),
        ({"config.json": "{}", "model.safetensors": ""}, "no tokenizer files"),
    ],
)
def test_an_incomplete_model_folder_is_named_with_what_it_lacks(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(EvalInputError, match="--model M") as raised:
        check_model_folder(tmp_path, "--model M")
    assert expected in str(raised.value)


def test_a_context_longer_than_the_model_reads_is_refused_with_its_limit(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    model = ResolvedModel("tiny", str(tmp_path), is_default=False)
    check_context_length(model, 512)
    with pytest.raises(
        EvalInputError, match="max_position_embeddings = 512. Give --max-model-len 512 or less"
    ):
        check_context_length(model, 513)


def test_prompts_render_with_the_models_chat_template_or_as_plain_text():
    model = resolve_model(str(ensure_default_model()))
    prompt = Prompt.user_turn("What is 2+2?")
    chat = PromptRenderer(model, chat_template=None).render(prompt)
    assert (
        chat.startswith("<|im_start|>")
        and "What is 2+2?" in chat
        and chat.endswith("<|im_start|>assistant\n")
    )
    assert PromptRenderer(model, chat_template=False).render(prompt) == "What is 2+2?"


def test_the_light_tokenizer_renders_what_autotokenizer_renders(tmp_path):
    """Rendering loads the plain fast tokenizer (no torch) where the folder has tokenizer.json: the text must
    equal AutoTokenizer's, here for the default model and for a copy whose template uses the special tokens
    and a system turn."""
    import shutil

    from transformers import AutoTokenizer

    default = ensure_default_model()
    variant = tmp_path / "variant"
    shutil.copytree(default, variant)
    (variant / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] | trim }}{{ eos_token }}"
        "{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
    )
    prompt = Prompt(
        messages=(ChatMessage("system", "Be brief."), ChatMessage("user", " What is 2+2? ")),
        text="What is 2+2?",
    )
    messages = [{"role": m.role, "content": m.content} for m in prompt.messages]
    for folder in (default, variant):
        rendered = PromptRenderer(resolve_model(str(folder)), chat_template=None).render(prompt)
        reference = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert rendered == reference
    assert rendered == "<|im_start|>[SYSTEM] Be brief.<|im_end|>[USER] What is 2+2?<|im_end|>[ASSISTANT]"


def test_a_node_without_the_default_models_folder_loads_its_own_copy_and_no_checkpoint_becomes_it(
    tmp_path, monkeypatch
):
    """The embedded default, resolved to its folder on the driver, is loaded on an engine's node from that
    node's own copy where the driver's folder is not there (`default_model_here`, which builds it where the
    node has none: here the node's cache already holds one, linked to this machine's); a checkpoint the engine
    moves to is never taken for the default."""
    from cluster.config import ModelOptions
    from cluster.engines import engine_settings
    from cluster.engines.settings import serving
    from cluster.models.default import default_model_here

    driver_folder = str(ensure_default_model())
    settings = engine_settings(ModelOptions(), driver_folder, "cpu")
    assert settings.embedded_default
    checkpoint = serving(settings, str(tmp_path / "step-100"))
    assert not checkpoint.embedded_default and checkpoint.model == str(tmp_path / "step-100")
    assert serving(checkpoint, driver_folder).embedded_default
    assert default_model_here(driver_folder) == driver_folder  # this node has it where the driver had it
    node_cache = tmp_path / "node-cache"
    (node_cache / "models").mkdir(parents=True)
    (node_cache / "models" / DEFAULT_MODEL_NAME).symlink_to(driver_folder)
    monkeypatch.setenv("RAYEVAL_CACHE", str(node_cache))
    elsewhere = "/home/someone-else/.cache/rayeval/models/" + DEFAULT_MODEL_NAME  # the driver's, not here
    assert default_model_here(elsewhere) == str(node_cache / "models" / DEFAULT_MODEL_NAME)
    assert not engine_settings(ModelOptions(), str(tmp_path / "step-100"), "cpu").embedded_default
