"""The rendered-prompt cache: a second renderer of the same tokenizer files answers from it without loading the
tokenizer, an edited template is never answered from the old file, and a broken cache file costs nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from cluster.models import PromptRenderer, ensure_default_model, resolve_model
from cluster.models.rendered import RenderedPrompts, tokenizer_digest
from evaluators.errors import EvalInputError
from evaluators.tasks.base import ChatMessage, Prompt

PROMPTS = [
    Prompt.user_turn("What is 2+2?"),
    Prompt(messages=(ChatMessage("system", "Be brief."), ChatMessage("user", "Name a prime.")), text="x"),
]


def _reference(folder, prompt: Prompt) -> str:
    from transformers import AutoTokenizer

    messages = [{"role": m.role, "content": m.content} for m in prompt.messages]
    return AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory):
    """A copy of the default model's folder, its weights linked (rendering never reads them)."""
    folder = tmp_path_factory.mktemp("model")
    for path in ensure_default_model().iterdir():
        if path.name.endswith(".safetensors"):
            (folder / path.name).symlink_to(path)
        elif path.is_file():
            shutil.copy(path, folder / path.name)
    return folder


def test_a_second_renderer_answers_from_the_cache_without_loading_the_tokenizer(model_copy, tmp_path):
    model = resolve_model(str(model_copy))
    first = PromptRenderer(model, chat_template=None, cache_dir=tmp_path)
    rendered = [first.render(p) for p in PROMPTS]
    assert rendered == [_reference(model_copy, p) for p in PROMPTS]

    second = PromptRenderer(model, chat_template=None, cache_dir=tmp_path)
    assert [second.render(p) for p in PROMPTS] == rendered
    assert second._tokenizer is None  # the has-template fact and both prompts came from the cache
    assert len(list(tmp_path.glob("*.sqlite"))) == 1
    # a prompt the cache lacks loads the tokenizer then
    assert second.render(Prompt.user_turn("Another?")) == _reference(model_copy, Prompt.user_turn("Another?"))
    assert second._tokenizer is not None
    # plain prompts never touch the template or the cache
    assert PromptRenderer(model, chat_template=False, cache_dir=tmp_path).render(PROMPTS[0]) == "What is 2+2?"


def test_an_edited_template_is_another_cache_and_renders_anew(model_copy, tmp_path):
    edited = tmp_path / "edited"
    shutil.copytree(model_copy, edited, symlinks=True)
    cache = tmp_path / "cache"
    before = PromptRenderer(resolve_model(str(edited)), chat_template=None, cache_dir=cache).render(
        PROMPTS[1]
    )
    old_digest = tokenizer_digest(edited)
    (edited / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert tokenizer_digest(edited) != old_digest
    after = PromptRenderer(resolve_model(str(edited)), chat_template=None, cache_dir=cache).render(PROMPTS[1])
    assert after == "<system>Be brief.<user>Name a prime.<assistant>" == _reference(edited, PROMPTS[1])
    assert after != before
    assert len(list(cache.glob("*.sqlite"))) == 2


def test_weights_are_not_read_for_the_digest(model_copy, tmp_path):
    folder = tmp_path / "with-weights"
    shutil.copytree(model_copy, folder, symlinks=True)
    digest = tokenizer_digest(folder)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").write_bytes(b"new weights")
    (folder / "optimizer.pt").write_bytes(b"state")
    assert tokenizer_digest(folder) == digest
    assert tokenizer_digest(tmp_path / "not-a-folder") is None


def test_a_broken_cache_file_renders_as_without_one(model_copy, tmp_path):
    model = resolve_model(str(model_copy))
    cache_file = tmp_path / f"{tokenizer_digest(model_copy)}.sqlite"
    cache_file.write_bytes(b"this is not an sqlite file" * 100)
    renderer = PromptRenderer(model, chat_template=None, cache_dir=tmp_path)
    assert renderer.render(PROMPTS[0]) == _reference(model_copy, PROMPTS[0])
    assert renderer.cache is not None and renderer.cache.get(PROMPTS[0].digest()) is None  # off, not failing


def test_a_cached_folder_without_a_template_still_refuses_chat_template(model_copy, tmp_path):
    folder = tmp_path / "plain"
    shutil.copytree(model_copy, folder, symlinks=True)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    model = resolve_model(str(folder))
    assert PromptRenderer(model, chat_template=None, cache_dir=tmp_path).render(PROMPTS[0]) == "What is 2+2?"
    assert RenderedPrompts.of_folder(folder, None, tmp_path).has_template() is False
    with pytest.raises(EvalInputError, match="--chat-template was asked for"):
        PromptRenderer(model, chat_template=True, cache_dir=tmp_path)


def test_renderers_in_threads_of_a_fresh_process_all_load(model_copy):
    """A sweep's or an RD-Agent round's runs render in threads: their first tokenizer loads meet in
    transformers' lazy import (which failed one of four runs of a round with "cannot import name")."""
    import subprocess
    import sys

    script = (
        "import threading, sys\n"
        "from cluster.models.prompts import chat_tokenizer\n"
        "errors = []\n"
        "def load():\n"
        "    try: chat_tokenizer(sys.argv[1])\n"
        "    except Exception as e: errors.append(repr(e))\n"
        "threads = [threading.Thread(target=load) for _ in range(8)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(errors)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(model_copy)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]
