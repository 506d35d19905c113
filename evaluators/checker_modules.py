"""lm-eval's IFEval checker modules, loaded without lm-eval's task index.

The checkers live in `lm_eval/tasks/ifeval/` (instructions_util, instructions, instructions_registry, utils).
A plain `import lm_eval.tasks.ifeval.utils` first runs `lm_eval/tasks/__init__.py`, which builds lm-eval's
task manager and imports `datasets`, pandas and huggingface_hub with it: 1.7 of the 2.4 CPU-seconds the
checkers took to load in a fresh process on two cores, paid by every process that scores IFEval. The checkers
use none of it. Here the four modules are executed from their files under their own names, beside an
`lm_eval.tasks.ifeval` package object, and `lm_eval.tasks` itself is left unimported: whoever imports it later
gets lm-eval's real package, and `from lm_eval.tasks.ifeval import ...` (lm-eval's own ifeval task among
them) gets these same modules from sys.modules.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = "lm_eval.tasks.ifeval"
# in the order they import one another
MODULES = ("instructions_util", "instructions", "instructions_registry", "utils")


def load_ifeval_checker_modules() -> ModuleType:
    """lm-eval's `lm_eval.tasks.ifeval.utils`, its three checker modules loaded with it. Where lm-eval's task
    package or these modules are imported already, a plain import of them."""
    if "lm_eval.tasks" in sys.modules or PACKAGE in sys.modules:
        from lm_eval.tasks.ifeval import utils

        return utils
    import lm_eval

    directory = Path(lm_eval.__file__).parent / "tasks" / "ifeval"
    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(directory)]
    package = importlib.util.module_from_spec(spec)
    loaded = [PACKAGE]
    sys.modules[PACKAGE] = package
    try:
        for name in MODULES:
            module_spec = importlib.util.spec_from_file_location(
                f"{PACKAGE}.{name}", directory / f"{name}.py"
            )
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"lm-eval's IFEval module {name}.py is not in {directory}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            loaded.append(module_spec.name)
            module_spec.loader.exec_module(module)
            setattr(package, name, module)
    except BaseException:
        for name in loaded:  # nothing half-loaded stays behind for a later import to find
            sys.modules.pop(name, None)
        raise
    return package.utils
