"""Large imports with Python's cyclic garbage collector paused, and what they made frozen after.

Importing vLLM makes hundreds of thousands of objects that live as long as the process (modules, classes,
functions, torch's operator registrations, transformers' lazy tables). The collector walks them again each
time allocations pass its thresholds during the import, and finds nothing to free: about a fifth of an
engine process's vLLM import on two cores (6.7 to 7.1 s, 5.4 to 5.7 s paused; docs/BENCHMARKS.md). Paused for
the import, the collector runs no pass; `gc.freeze()` then moves what the import made into the permanent
generation, so later passes in the engine's process skip it (and in the engine-core server, children forked
from it share those pages instead of copying them when a pass would touch their headers). vLLM's engine core
freezes its own heap after it starts, the same way.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No collection while inside; on the way out everything alive is frozen and the collector runs again
    if it ran before (a caller that had turned it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def import_with_collector_paused(*modules: str) -> None:
    """Import `modules` in this order, with the collector paused, unless every one is imported already (a
    process that imported them once, such as an engine actor rebuilding its engine, freezes nothing more:
    what its old engine left to collect stays collectable)."""
    if all(module in sys.modules for module in modules):
        return
    with collector_paused():
        for module in modules:
            importlib.import_module(module)
