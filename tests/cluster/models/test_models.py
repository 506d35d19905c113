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
