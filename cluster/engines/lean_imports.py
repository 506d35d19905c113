"""Imported before vLLM in an engine's processes (the engine actor, and first among the engine-core server's
preloads, cluster.engines.forkserver): transformers is told that scikit-learn is not installed.

vLLM's import of its model config loads transformers' generation utilities, whose assisted-generation module
imports scikit-learn (and through it SciPy and pandas) wherever scikit-learn is installed, as it is beside
lm-eval. vLLM never runs transformers' assisted generation, and nothing else an engine process does needs
scikit-learn; skipping it takes about 0.5 s off each of the two vLLM imports of an engine start on two cores,
and those packages' memory off both processes. transformers decides with `is_sklearn_available`, which its
modules import from `transformers.utils`: both names are replaced before vLLM imports them. Where a
transformers release names it otherwise, this does nothing and scikit-learn is imported as before.
"""

from __future__ import annotations


def _not_installed() -> bool:
    return False


def skip_scikit_learn() -> None:
    try:
        import transformers.utils as utils
        import transformers.utils.import_utils as import_utils
    except ImportError:
        return
    for module in (utils, import_utils):
        if hasattr(module, "is_sklearn_available"):
            module.is_sklearn_available = _not_installed


skip_scikit_learn()
