"""lm-eval's IFEval checker modules, loaded without lm-eval's task index.

The checkers live in `lm_eval/tasks/ifeval/` (instructions_util, instructions, instructions_registry, utils).
A plain `import lm_eval.tasks.ifeval.utils` first runs `lm_eval/tasks/__init__.py`, which builds lm-eval's
task manager and imports `datasets`, pandas and huggingface_hub with it: 1.7 of the 2.4 CPU-seconds the
checkers took to load in a fresh process on two cores, paid by every process that scores IFEval. The checkers
use none of it. Here `lm_eval.tasks.ifeval` is a package object whose path is that folder, and the four
modules are imported into it as usual, while `lm_eval.tasks` itself stays unimported: whoever imports it
later gets lm-eval's real package, and `from lm_eval.tasks.ifeval import ...` gets these same modules from
sys.modules (lm-eval's own ifeval task runs its `utils.py` again from its YAML; the checkers it calls are
these).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = "lm_eval.tasks.ifeval"
# its modules: sys.modules gets back what it held for them where their import fails
MODULES = ("instructions_util", "instructions", "instructions_registry", "utils")


def load_ifeval_checker_modules() -> ModuleType:
    """lm-eval's `lm_eval.tasks.ifeval.utils`, its three checker modules loaded with it. Where lm-eval's task
    package or these modules are imported already, a plain import of them."""
    if "lm_eval.tasks" in sys.modules or PACKAGE in sys.modules:
        return importlib.import_module(f"{PACKAGE}.utils")
    import lm_eval

    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(Path(lm_eval.__file__).parent / "tasks" / "ifeval")]
    names = [PACKAGE, *(f"{PACKAGE}.{module}" for module in MODULES)]
    before = {name: sys.modules[name] for name in names if name in sys.modules}
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    try:
        # Python's own import from here: the package's folder is its path; lm_eval.tasks is never asked for
        return importlib.import_module(f"{PACKAGE}.utils")
    except BaseException:
        for name in names:  # sys.modules as it was: nothing half-loaded stays behind for a later import
            if name in before:
                sys.modules[name] = before[name]
            else:
                sys.modules.pop(name, None)
        raise
